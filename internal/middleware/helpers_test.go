package middleware

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/model/openaitest"
	"github.com/natsagent/natsagent/internal/state"
)

// Transcript builders shared by the tests of this package.

func user(id, content string) model.Message {
	return model.Message{ID: id, Role: model.RoleUser, Content: content}
}

func asst(id, content string, calls ...model.ToolCall) model.Message {
	return model.Message{ID: id, Role: model.RoleAssistant, Content: content, ToolCalls: calls}
}

func call(id, name, args string) model.ToolCall {
	return model.ToolCall{ID: id, Name: name, Arguments: args}
}

func result(id, callID, name, content string) model.Message {
	return model.Message{ID: id, Role: model.RoleTool, ToolCallID: callID, Name: name, Content: content, Status: model.ToolStatusSuccess}
}

func system(content string) model.Message {
	return model.Message{Role: model.RoleSystem, Content: content}
}

// inRun tags messages with the run that produced them, as the loop does.
func inRun(runID string, ms ...model.Message) []model.Message {
	out := make([]model.Message, len(ms))
	for i, m := range ms {
		m = m.Clone()
		if m.Meta == nil {
			m.Meta = map[string]any{}
		}
		m.Meta["run_id"] = runID
		out[i] = m
	}
	return out
}

// wire converts a request the way the OpenAI client sends it, so the strict
// validator of openaitest can judge it.
func wire(sys string, msgs []model.Message, tools ...string) *openaitest.Request {
	req := &openaitest.Request{Model: "test"}
	if sys != "" {
		req.Messages = append(req.Messages, openaitest.Message{Role: model.RoleSystem, Content: sys})
	}
	for _, m := range msgs {
		w := openaitest.Message{Role: m.Role, Content: m.Content, Name: m.Name, ToolCallID: m.ToolCallID}
		for _, c := range m.ToolCalls {
			w.ToolCalls = append(w.ToolCalls, openaitest.ToolCallMsg{
				ID: c.ID, Type: "function", Function: openaitest.FunctionCall{Name: c.Name, Arguments: c.Arguments},
			})
		}
		req.Messages = append(req.Messages, w)
	}
	for _, n := range tools {
		req.Tools = append(req.Tools, openaitest.Tool{Type: "function", Function: openaitest.Function{Name: n}})
	}
	return req
}

// mustValidate fails the test when a strict provider would reject the
// transcript.
func mustValidate(t *testing.T, sys string, msgs []model.Message, tools ...string) {
	t.Helper()
	if problems := openaitest.Validate(wire(sys, msgs, tools...)); len(problems) > 0 {
		t.Fatalf("strict provider would reject the transcript:\n  %s\ntranscript:\n%s", strings.Join(problems, "\n  "), dump(msgs))
	}
}

func dump(msgs []model.Message) string {
	var b strings.Builder
	for i, m := range msgs {
		data, _ := json.Marshal(m)
		fmt.Fprintf(&b, "  %d %s\n", i, data)
	}
	return b.String()
}

// event is one rt.Emit call.
type event struct {
	Type string
	Data any
}

// events records what a runtime emits.
type events struct {
	mu  sync.Mutex
	all []event
}

func (e *events) emit(t string, d any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.all = append(e.all, event{t, d})
}

func (e *events) ofType(t string) []event {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []event
	for _, ev := range e.all {
		if ev.Type == t {
			out = append(out, ev)
		}
	}
	return out
}

func newRuntime(runID string) (*Runtime, *events) {
	ev := &events{}
	return &Runtime{RunID: runID, ThreadID: "h1", Tenant: "default", Emit: ev.emit}, ev
}

// captureNext is a model handler recording the requests it receives; err,
// when set, fails the call.
type captureNext struct {
	reqs []*ModelRequest
	err  error
}

func (c *captureNext) handle(ctx context.Context, req *ModelRequest) (*ModelResponse, error) {
	c.reqs = append(c.reqs, req.Clone())
	if c.err != nil {
		return nil, c.err
	}
	return &ModelResponse{Response: &model.Response{Message: asst("", "ok"), FinishReason: model.FinishStop}}, nil
}

func (c *captureNext) last(t *testing.T) *ModelRequest {
	t.Helper()
	if len(c.reqs) == 0 {
		t.Fatal("the model handler was never called")
	}
	return c.reqs[len(c.reqs)-1]
}

func stateOf(msgs ...model.Message) *state.State {
	return &state.State{Messages: msgs}
}

// jsonRoundTrip returns st after json.Marshal and json.Unmarshal, as a
// checkpoint replay sees it.
func jsonRoundTrip(t *testing.T, st *state.State) *state.State {
	t.Helper()
	data, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var out state.State
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatal(err)
	}
	return &out
}
