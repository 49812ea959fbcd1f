package middleware

import (
	"context"
	"strings"
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

// The system prompt keeps the date the run started on, so its cached
// prefix holds; a run still going the next day is told in its trailing
// context.
func TestDynamicContext_DateFixedForTheRun(t *testing.T) {
	d, err := NewDynamicContext(DynamicContext{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 1, 23, 59, 0, 0, time.UTC)
	d.now = func() time.Time { return now }
	rt, _ := newRuntime("r1")
	var next captureNext
	call := func() *ModelRequest {
		t.Helper()
		if _, err := d.WrapModelCall(context.Background(), rt, &ModelRequest{System: "sys"}, next.handle); err != nil {
			t.Fatal(err)
		}
		return next.last(t)
	}
	first := call()
	if _, ok := ContextMessage(first); ok {
		t.Fatalf("the first call has a trailing context: %v", first.Context)
	}
	now = now.Add(2 * time.Minute)
	second := call()
	if second.System != first.System {
		t.Fatalf("the system prompt changed at midnight: %q", second.System)
	}
	ctx, ok := ContextMessage(second)
	if !ok || !strings.Contains(ctx.Content, "<current_date>2026-01-02, Friday</current_date>") || ctx.Role != model.RoleUser {
		t.Fatalf("trailing context after midnight: %+v", ctx)
	}
	// Another run starts with the new date in its system prompt.
	rt2, _ := newRuntime("r2")
	if _, err := d.WrapModelCall(context.Background(), rt2, &ModelRequest{System: "sys"}, next.handle); err != nil {
		t.Fatal(err)
	}
	if got := next.last(t); got.System != "sys\n\n<current_date>2026-01-02, Friday</current_date>" || len(got.Context) != 0 {
		t.Fatalf("next run: %q %v", got.System, got.Context)
	}
}
