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

// The runs of a profile ask the registry for the same names and share
// one set and one spec list; a tool registered later is in the next set.
func TestRegistrySelect_SharesUntilRegister(t *testing.T) {
	r := NewRegistry()
	a, err := r.Select([]string{"current_time", "ls"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := r.Select([]string{"current_time", "ls"})
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Error("two selections of the same names built two sets")
	}
	specs := a.Specs()
	if len(specs) != 2 || specs[0].Name != "current_time" || specs[1].Name != "ls" {
		t.Fatalf("specs %v", specs)
	}
	if &b.Specs()[0] != &specs[0] || cap(specs) != len(specs) {
		t.Errorf("Specs is not the set's one list with no room to append into (len %d, cap %d)", len(specs), cap(specs))
	}
	if _, err := r.Select([]string{"nope"}); err == nil {
		t.Error("an unknown tool was selected")
	}

	r.Register(Func(model.ToolSpec{Name: "ls", Description: "replaced"}, func(context.Context, json.RawMessage) (string, error) { return "", nil }))
	c, err := r.Select([]string{"current_time", "ls"})
	if err != nil {
		t.Fatal(err)
	}
	if c == a || c.Specs()[1].Description != "replaced" {
		t.Errorf("a selection after Register kept the old set: %q", c.Specs()[1].Description)
	}
}
