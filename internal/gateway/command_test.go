package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
	"github.com/natsagent/natsagent/internal/testdeploy"
)

// finish creates a background run and waits, by polling its record, until
// it is terminal (the record, whatever /wait answers with).
func (e *env) finish(thread string, body any) protocol.Run {
	e.t.Helper()
	rec := e.do("POST", "/threads/"+thread+"/runs", body).expect(e.t, http.StatusOK).run(e.t)
	return e.awaitRun(thread, rec.RunID)
}

// awaitRun polls a run's record until it is terminal.
func (e *env) awaitRun(thread, run string) protocol.Run {
	e.t.Helper()
	var rec protocol.Run
	testdeploy.WaitFor(e.t, 30*time.Second, "run "+run+" finished", func() bool {
		rec = e.do("GET", "/threads/"+thread+"/runs/"+run, nil).expect(e.t, http.StatusOK).run(e.t)
		return rec.Status.Terminal()
	})
	return rec
}

func cmd(kv ...any) map[string]any {
	c := map[string]any{}
	for i := 0; i+1 < len(kv); i += 2 {
		c[kv[i].(string)] = kv[i+1]
	}
	return map[string]any{"command": c}
}

// A clarification is answered by a plain string, as LangGraph clients send
// command.resume; the answer reaches the model.
func TestResumeWithString(t *testing.T) {
	e := newEnv(t, clarifyingModel())
	first := e.finish("t1", input("book a flight"))
	if first.Status != protocol.StatusInterrupted || first.Interrupt == nil {
		t.Fatalf("first run %+v", first)
	}
	done := e.finish("t1", cmd("resume", "Lyon"))
	if done.Status != protocol.StatusSuccess || done.Output == nil || !strings.Contains(done.Output.Content, "The person answered: Lyon") {
		t.Fatalf("resumed run %+v", done)
	}
}

// A resume of an interrupt no built-in middleware raises (a custom one)
// passes with any JSON value, as sent, for its middleware to read;
// approval and clarification values are checked against what waits.
func TestCheckResumeByKind(t *testing.T) {
	s := &Server{}
	th := &protocol.Thread{ThreadID: "t"}
	waiting := func(in protocol.Interrupt) *state.State {
		v, _ := json.Marshal(in)
		return &state.State{Values: map[string]json.RawMessage{middleware.InterruptValue: v}}
	}
	custom := waiting(protocol.Interrupt{Kind: "form"})
	clar := waiting(protocol.Interrupt{Kind: protocol.InterruptClarification, Question: "Which city?"})
	appr := waiting(protocol.Interrupt{Kind: protocol.InterruptApproval, ActionRequests: []protocol.ActionRequest{{ToolCallID: "c1", Name: "bash"}}, AllowedDecisions: []string{"approve", "reject"}})
	for _, c := range []struct {
		st     *state.State
		resume string
		ok     bool
	}{
		{custom, `{"email":"a@b.c"}`, true},
		{custom, `"yes"`, true},
		{custom, `[1,2]`, true},
		{clar, `"Lyon"`, true},
		{clar, `{"answer":"Lyon"}`, true},
		{clar, `{"email":"x"}`, false},
		{appr, `{"decisions":[{"type":"approve"}]}`, true},
		{appr, `"yes"`, false},
		{appr, `{"decisions":[]}`, false},
		{&state.State{}, `"yes"`, false},
	} {
		req := &protocol.RunRequest{Command: &protocol.Command{Resume: json.RawMessage(c.resume)}}
		err := s.checkResume(c.st, req, th)
		if (err == nil) != c.ok {
			t.Errorf("resume %s: err %v, want ok=%v", c.resume, err, c.ok)
		}
	}
}

// command.update appends messages given in LangChain's shape and sets the
// title; the run then goes on with a model call that sees them.
func TestCommandUpdateAppendsAndContinues(t *testing.T) {
	e := newEnv(t, echoModel())
	e.finish("u1", input("hi"))
	done := e.finish("u1", cmd("update", map[string]any{
		"messages": []map[string]any{{"type": "human", "id": "m-upd", "content": []map[string]any{{"type": "text", "text": "second"}}}},
		"title":    "Renamed",
	}))
	if done.Status != protocol.StatusSuccess || done.Output == nil || done.Output.Content != "echo: second" {
		t.Fatalf("update run %+v", done)
	}
	th, _, err := e.stores.Threads.Get(context.Background(), "default", "u1")
	if err != nil {
		t.Fatal(err)
	}
	st, _, err := e.stores.Checkpoints.Load(context.Background(), "default", "u1", th.Head)
	if err != nil {
		t.Fatal(err)
	}
	i := st.Index("m-upd")
	if i < 0 || st.Messages[i].Role != "user" || st.Messages[i].Content != "second" || st.Messages[i].Meta["run_id"] != done.RunID {
		t.Fatalf("updated message not appended as the run's user message: %+v", st.Messages)
	}
	var title string
	if ok, _ := st.Value(middleware.TitleValue, &title); !ok || title != "Renamed" {
		t.Fatalf("title %q", title)
	}

	// Refused with the field named: keys a middleware keeps, tool calls,
	// tool results, an id the thread has, goto nowhere.
	for name, c := range map[string]map[string]any{
		"command.update.approved_tool_calls":    cmd("update", map[string]any{"approved_tool_calls": []string{"x"}}),
		"command.update.messages[0].tool_calls": cmd("update", map[string]any{"messages": []map[string]any{{"type": "ai", "content": "", "tool_calls": []map[string]any{{"id": "c", "name": "bash", "args": map[string]any{}}}}}}),
		"command.update.messages[0].role":       cmd("update", map[string]any{"messages": []map[string]any{{"role": "tool", "content": "x"}}}),
		"command.update.messages[0].id":         cmd("update", map[string]any{"messages": []map[string]any{{"role": "user", "id": "m-upd", "content": "again"}}}),
		"command.goto":                          cmd("goto", "__end__"),
	} {
		err := e.do("POST", "/threads/u1/runs", c).expect(t, http.StatusBadRequest).apiError(t)
		if err.Field != name {
			t.Errorf("%s: field %q (%s)", name, err.Field, err.Message)
		}
	}
	if err := e.do("POST", "/threads/u1/runs", cmd("resume", "x", "goto", "model")).expect(t, http.StatusBadRequest).apiError(t); err.Field != "command.goto" {
		t.Errorf("resume with goto: %+v", err)
	}
}

// command.goto model calls the model on the thread as it is (no new
// input); goto tools with no tool calls waiting is 409.
func TestCommandGoto(t *testing.T) {
	e := newEnv(t, echoModel())
	e.finish("g1", input("hi"))
	again := e.finish("g1", cmd("goto", "model"))
	if again.Status != protocol.StatusSuccess || again.Output == nil || again.Output.Content != "echo: echo: hi" {
		t.Fatalf("goto model %+v", again)
	}
	if err := e.do("POST", "/threads/g1/runs", cmd("goto", "tools")).expect(t, http.StatusConflict).apiError(t); !strings.Contains(err.Message, "no tool calls waiting") {
		t.Fatalf("goto tools: %+v", err)
	}
	var empty map[string]any
	_ = json.Unmarshal([]byte(`{}`), &empty)
	if err := e.do("POST", "/threads/g1/runs", map[string]any{"command": empty}).expect(t, http.StatusBadRequest).apiError(t); err.Field != "command" {
		t.Fatalf("empty command: %+v", err)
	}
}
