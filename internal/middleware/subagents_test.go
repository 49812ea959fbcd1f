package middleware

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
)

// stubDelegator answers like a service whose children are all busy or
// unknown; the NATS side is tested in internal/subagents.
type stubDelegator struct{ starts []*protocol.SubagentStart }

func (d *stubDelegator) StartSubagent(_ context.Context, _ string, req *protocol.SubagentStart) (*protocol.SubagentStarted, error) {
	d.starts = append(d.starts, req)
	return nil, &protocol.SubagentError{Code: protocol.CodeBusy, ThreadID: req.ThreadID, ActiveRunID: "r-active", Message: "busy"}
}

func (d *stubDelegator) SubagentStatus(context.Context, string, protocol.SubagentQuery) (*protocol.SubagentStatus, error) {
	return nil, &protocol.SubagentError{Code: protocol.CodeNotFound, Message: "no subagent run x."}
}

func (d *stubDelegator) CancelSubagent(context.Context, string, protocol.SubagentQuery) (*protocol.SubagentStatus, error) {
	return nil, errors.New("unused")
}

func (d *stubDelegator) AwaitSubagent(context.Context, string, protocol.SubagentQuery, time.Duration, func(string)) (*protocol.SubagentStatus, error) {
	return nil, errors.New("unused")
}

func TestSubagentsOffersToolsToALead(t *testing.T) {
	s, err := NewSubagents(Subagents{}, Env{Kind: KindLead, Subagents: []SubagentInfo{{Name: "researcher", Description: "Finds\nfacts."}}})
	if err != nil {
		t.Fatal(err)
	}
	rt, _ := newRuntime("r1")
	var next captureNext
	// Without a delegator (no service in the process) nothing is offered.
	if _, err := s.WrapModelCall(context.Background(), rt, &ModelRequest{System: "sys", Tools: specs("current_time")}, next.handle); err != nil {
		t.Fatal(err)
	}
	if got := specNames(next.last(t).Tools); !slices.Equal(got, []string{"current_time"}) {
		t.Errorf("offered %v without a delegator", got)
	}
	rt.Subagents = &stubDelegator{}
	if _, err := s.WrapModelCall(context.Background(), rt, &ModelRequest{System: "sys", Tools: specs("current_time")}, next.handle); err != nil {
		t.Fatal(err)
	}
	req := next.last(t)
	if got := specNames(req.Tools); !slices.Equal(got, append([]string{"current_time"}, SubagentTools...)) {
		t.Errorf("offered %v", got)
	}
	if !strings.HasPrefix(req.System, "sys\n\n") || !strings.Contains(req.System, "- researcher: Finds facts.") {
		t.Errorf("system prompt %q", req.System)
	}
}

// The lead's tools: a busy thread is a "busy" answer, never an error or a
// queue; another run's child is unknown; an unknown subagent is named.
func TestSubagentsToolAnswers(t *testing.T) {
	s, _ := NewSubagents(Subagents{}, Env{Kind: KindLead, Subagents: []SubagentInfo{{Name: "researcher"}}})
	rt, _ := newRuntime("r1")
	d := &stubDelegator{}
	rt.Subagents = d
	call := func(name, args string) *ToolResult {
		t.Helper()
		res, err := s.WrapToolCall(context.Background(), rt, &ToolCall{Call: model.ToolCall{ID: "c1", Name: name, Arguments: args}, State: &state.State{}}, func(context.Context, *ToolCall) (*ToolResult, error) {
			t.Fatalf("%s reached the tool handler", name)
			return nil, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	res := call(SubagentStartTool, `{"description":"more","subagent_type":"researcher","thread_id":"sub_1"}`)
	if !strings.Contains(res.Message.Content, `"status": "busy"`) || !strings.Contains(res.Message.Content, "r-active") {
		t.Errorf("busy start answered %q", res.Message.Content)
	}
	if st := d.starts[0]; st.Parent != (protocol.Parent{RunID: "r1", ThreadID: "h1", ToolCallID: "c1"}) || st.ThreadID != "sub_1" {
		t.Errorf("start request %+v", st)
	}
	if res := call(SubagentStatusTool, `{"run_id":"x"}`); res.Message.Status != model.ToolStatusError || !strings.Contains(res.Message.Content, "Only subagents started by this run") {
		t.Errorf("status of an unknown child: %+v", res.Message)
	}
	if res := call(TaskTool, `{"description":"x","subagent_type":"coder"}`); res.Message.Status != model.ToolStatusError || !strings.Contains(res.Message.Content, "you can start are: researcher") {
		t.Errorf("unknown subagent: %+v", res.Message)
	}
	if len(d.starts) != 1 {
		t.Errorf("%d starts, want 1", len(d.starts))
	}
}

// In a subagent's chain the tools are neither offered nor run, and
// neither is ask_clarification (deer-flow #4159).
func TestSubagentsRefusedInASubagent_DeerFlow4159(t *testing.T) {
	s, _ := NewSubagents(Subagents{}, Env{Kind: KindSubagent, Subagents: []SubagentInfo{{Name: "researcher"}}})
	rt, _ := newRuntime("r1")
	rt.Subagents = &stubDelegator{}
	var next captureNext
	if _, err := s.WrapModelCall(context.Background(), rt, &ModelRequest{Tools: specs("current_time", TaskTool, ClarificationTool)}, next.handle); err != nil {
		t.Fatal(err)
	}
	if got := specNames(next.last(t).Tools); !slices.Equal(got, []string{"current_time"}) {
		t.Errorf("a subagent was offered %v", got)
	}
	for _, name := range append([]string{ClarificationTool}, SubagentTools...) {
		res, err := s.WrapToolCall(context.Background(), rt, &ToolCall{Call: model.ToolCall{ID: "c", Name: name, Arguments: "{}"}}, func(context.Context, *ToolCall) (*ToolResult, error) {
			t.Fatalf("%s ran in a subagent", name)
			return nil, nil
		})
		if err != nil || res.Message.Status != model.ToolStatusError || !strings.Contains(res.Message.Content, "not available to a subagent") {
			t.Errorf("%s: %+v, %v", name, res, err)
		}
	}
}
