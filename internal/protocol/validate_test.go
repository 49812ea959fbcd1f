package protocol

import (
	"errors"
	"strings"
	"testing"
)

func TestValidToken(t *testing.T) {
	good := []string{"a", "A-b_9", strings.Repeat("x", 128)}
	bad := []string{"", "a.b", "a b", "a*", "a>", "ü", "a/b", "..", strings.Repeat("x", 129), "a\x00"}
	for _, s := range good {
		if !ValidToken(s) {
			t.Errorf("%q rejected", s)
		}
	}
	for _, s := range bad {
		if ValidToken(s) {
			t.Errorf("%q accepted: it would break a subject or key", s)
		}
	}
}

func TestDecodeRunRequest(t *testing.T) {
	req, err := DecodeRunRequest([]byte(`{"run_id":"r1","thread_id":"t1","input":{"messages":[{"role":"user","content":"hi"}]},"metadata":{"n":12345678901234567}}`), 0)
	if err != nil {
		t.Fatal(err)
	}
	if req.Tenant != DefaultTenant || req.Agent != DefaultAgent || req.MultitaskStrategy != StrategyEnqueue {
		t.Fatalf("defaults not filled: %+v", req)
	}
	if n := req.Metadata["n"]; n == nil || strings.TrimSpace(toString(n)) != "12345678901234567" {
		t.Fatalf("metadata number lost precision: %v", n)
	}
	cases := []struct {
		body, field, msg string
	}{
		{`{"run_id":"r1","thread_id":"t1"}`, "input", "is required"},
		{`{"run_id":"r1","thread_id":"t1","input":{"messages":[]}}`, "input.messages", "at least one"},
		{`{"run_id":"r1","thread_id":"t1","input":{"messages":[{"role":"user","content":"x"}]},"command":{"resume":1}}`, "command", "exclusive"},
		{`{"run_id":"r1","thread_id":"t1","command":{"resume":null}}`, "command", "needs resume, update or goto"},
		{`{"run_id":"r1","thread_id":"t1","command":{"goto":"end"}}`, "command.goto", "not a node"},
		{`{"run_id":"r1","thread_id":"t1","command":{"update":{"todos":[]}}}`, "command.update.todos", "kept by the agent"},
		{`{"run_id":"r1","thread_id":"t1","command":{"update":{"messages":[{"role":"tool","content":"x"}]}}}`, "command.update.messages[0].role", "tools"},
		{`{"run_id":"r1","thread_id":"t1","input":{"messages":[{"role":"user","content":"x"}]},"webhook":"file:///etc/passwd"}`, "webhook", "http or https"},
		{`{"run_id":"r1","thread_id":"t1","input":{"messages":[{"role":"user","content":"x"}]},"config":{"tool_approval_mode":"sometimes"}}`, "config.tool_approval_mode", "always_ask"},
		{`{"run_id":"r.1","thread_id":"t1","input":{"messages":[{"role":"user","content":"x"}]}}`, "run_id", "not a valid id"},
		{`{"run_id":"r1","thread_id":"t1","tenant":"a b","input":{"messages":[{"role":"user","content":"x"}]}}`, "tenant", "not a valid id"},
		{`{"run_id":"r1","thread_id":"t1","input":{"messages":[{"role":"tool","content":"x"}]}}`, "input.messages[0].role", "produced by the agent"},
		{`{"run_id":"r1","thread_id":"t1","input":{"messages":[{"role":"wizard","content":"x"}]}}`, "input.messages[0].role", "not a valid role"},
		{`{"run_id":"r1","thread_id":"t1","multitask_strategy":"merge","input":{"messages":[{"role":"user","content":"x"}]}}`, "multitask_strategy", "not one of"},
		{`{"run_id":"r1","thread_id":"t1","config":{"max_steps":-1},"input":{"messages":[{"role":"user","content":"x"}]}}`, "config.max_steps", "out of range: use 1 to 10000"},
		{`{"run_id":"r1","thread_id":"t1","config":{"max_steps":9223372036854775807},"input":{"messages":[{"role":"user","content":"x"}]}}`, "config.max_steps", "out of range: use 1 to 10000"},
		{`{"run_id":"r1","thread_id":"t1","config":{"timeout_seconds":9223372036854775807},"input":{"messages":[{"role":"user","content":"x"}]}}`, "config.timeout_seconds", "use 1 to 604800 seconds"},
		{`{"run_id":"r1","thread_id":"t1","config":{"timeout_seconds":9300000000},"input":{"messages":[{"role":"user","content":"x"}]}}`, "config.timeout_seconds", "use 1 to 604800 seconds"},
		{`{"run_id":"r1","thread_id":"t1","config":{"timeout_seconds":-1},"input":{"messages":[{"role":"user","content":"x"}]}}`, "config.timeout_seconds", "out of range"},
		{`{"run_id":"r1","thread_id":"t1","config":{"timeout_seconds":9223372036854775808},"input":{"messages":[{"role":"user","content":"x"}]}}`, "", "not valid JSON"},
		{`{"run_id":"r1","thread_id":"t1","parent":{"run_id":"p 1","thread_id":"x"},"input":{"messages":[{"role":"user","content":"x"}]}}`, "parent.run_id", "not a valid id"},
		{`{"run_id": "r1"`, "", "not valid JSON"},
		{`{"run_id":"r1"} {"x":1}`, "", "data after"},
		{"{\"run_id\":\"r1\xff\"}", "run_id", "UTF-8"},
		{"{\"run_id\":\"r1\"\xff}", "", "UTF-8"},
	}
	for _, c := range cases {
		_, err := DecodeRunRequest([]byte(c.body), 0)
		var ve *ValidationError
		if !errors.As(err, &ve) || !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: error %v, want a ValidationError", c.body, err)
			continue
		}
		if ve.Field != c.field || !strings.Contains(ve.Message, c.msg) {
			t.Errorf("%s: field %q message %q, want field %q and %q", c.body, ve.Field, ve.Message, c.field, c.msg)
		}
	}
	big := `{"run_id":"r1","thread_id":"t1","input":{"messages":[{"role":"user","content":"` + strings.Repeat("a", 2000) + `"}]}}`
	if _, err := DecodeRunRequest([]byte(big), 1000); err == nil || !strings.Contains(err.Error(), "over the limit") {
		t.Errorf("oversized: %v", err)
	}
}

func toString(v any) string {
	if s, ok := v.(interface{ String() string }); ok {
		return s.String()
	}
	return ""
}

func TestTerminalStatuses(t *testing.T) {
	for _, s := range []Status{StatusSuccess, StatusError, StatusCancelled, StatusInterrupted, StatusSteered, StatusRejected, StatusTimeout} {
		if !s.Terminal() {
			t.Errorf("%s must be terminal", s)
		}
	}
	for _, s := range []Status{StatusPending, StatusRunning} {
		if s.Terminal() {
			t.Errorf("%s must not be terminal", s)
		}
	}
}

func TestKindOf(t *testing.T) {
	cases := map[string]string{
		EventRunQueued: KindLifecycle, EventRunFinished: KindLifecycle, EventMessageDelta: KindMessages,
		EventToolFinished: KindTools, "thread.titled": KindUpdates, "usage.model": KindUsage, "loop.detected": KindCustom,
	}
	for typ, kind := range cases {
		if got := KindOf(typ); got != kind {
			t.Errorf("KindOf(%s) = %s, want %s", typ, got, kind)
		}
	}
}
