package middleware

import (
	"context"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/model"
)

func TestDynamicContext(t *testing.T) {
	d, err := NewDynamicContext(DynamicContext{Timezone: "Asia/Tokyo"})
	if err != nil {
		t.Fatal(err)
	}
	d.now = func() time.Time { return time.Date(2026, 1, 1, 20, 0, 0, 0, time.UTC) }
	rt, _ := newRuntime("r1")
	for _, tc := range []struct{ system, want string }{
		{"sys", "sys\n\n<current_date>2026-01-02, Friday</current_date>"},
		{"", "<current_date>2026-01-02, Friday</current_date>"},
	} {
		req := &ModelRequest{System: tc.system, Messages: []model.Message{user("u1", "what day is it?")}}
		var next captureNext
		if _, err := d.WrapModelCall(context.Background(), rt, req, next.handle); err != nil {
			t.Fatal(err)
		}
		got := next.last(t)
		if got.System != tc.want {
			t.Errorf("system = %q, want %q", got.System, tc.want)
		}
		if req.System != tc.system || len(got.Messages) != 1 {
			t.Errorf("the caller's request changed or messages were added: %+v", got.Messages)
		}
	}
	if _, err := NewDynamicContext(DynamicContext{Timezone: "Mars/Olympus"}); err == nil {
		t.Error("unknown time zone accepted")
	}
}
