package tools

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/model"
)

func TestCurrentTime(t *testing.T) {
	ct := CurrentTime()
	call := func(args string) (string, error) {
		res, err := ct.Call(context.Background(), &Call{Name: "current_time", Args: json.RawMessage(args)})
		if err != nil {
			return "", err
		}
		return res.Content, nil
	}
	out, err := call(`{}`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := time.Parse(time.RFC1123Z, out)
	if err != nil || time.Since(got) > time.Minute || !strings.HasSuffix(out, "+0000") {
		t.Fatalf("UTC time %q (%v)", out, err)
	}
	out, err = call(`{"timezone":"Asia/Tokyo"}`)
	if err != nil || !strings.HasSuffix(out, "+0900") {
		t.Fatalf("Tokyo time %q (%v): the zone database must be built in", out, err)
	}
	for _, bad := range []string{`{"timezone":"Mars/Olympus"}`, `{"timezone":"../../etc/passwd"}`, `[1,2]`} {
		if _, err := call(bad); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

func TestRegistryAndSet(t *testing.T) {
	r := NewRegistry()
	if _, err := r.Select([]string{"current_time", "nope"}); err == nil || !strings.Contains(err.Error(), `unknown tool "nope"`) || !strings.Contains(err.Error(), "current_time") {
		t.Fatalf("unknown tool: %v", err)
	}
	set, err := r.Select([]string{"current_time"})
	if err != nil || set.Get("current_time") == nil || set.Get("other") != nil || len(set.Specs()) != 1 {
		t.Fatalf("set %v %v", set, err)
	}
	dup := Func(model.ToolSpec{Name: "x"}, nil)
	if _, err := NewSet(dup, dup); err == nil {
		t.Fatal("two tools with one name must be refused")
	}
	if _, err := NewSet(Func(model.ToolSpec{}, nil)); err == nil {
		t.Fatal("an unnamed tool must be refused")
	}
	var none *Set
	if none.Get("x") != nil || none.Names() != nil || none.Specs() != nil {
		t.Fatal("a nil set has no tools")
	}
}
