package middleware_test

import (
	"context"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
)

// clarifyRun runs a lead chain's essentials with clarification on a
// scripted model that asks one question, then answers.
func clarifyRun(t *testing.T, c middleware.Clarification) (agent.Outcome, *state.State, *memHost, *model.Scripted, *middleware.Chain) {
	t.Helper()
	cl, err := middleware.NewClarification(c)
	if err != nil {
		t.Fatal(err)
	}
	chain := newChain(t, middleware.ToolErrorGuard{}, middleware.ToolCallRepair{}, cl)
	scripted := model.NewScripted(func(n int, req *model.Request) model.Reply {
		if n == 0 {
			return model.Reply{ToolCalls: []model.ToolCall{{ID: "c1", Name: middleware.ClarificationTool, Arguments: `{"question":"Which region?","options":["north","south"]}`}}}
		}
		return model.Reply{Text: "I assumed the north region: done."}
	})
	st := &state.State{}
	host := &memHost{base: st.Clone()}
	rt := &middleware.Runtime{RunID: "r1", ThreadID: "h1", Tenant: "default", Agent: "test", Tools: echoTool(t), Logger: zap.NewNop(), Emit: host.Emit}
	out := agent.Execute(context.Background(), &agent.Run{Runtime: rt, Chain: chain, Model: scripted, ModelName: "test-model", System: "sys",
		MaxSteps: 5, State: st, Input: []model.Message{{ID: "u1", Role: model.RoleUser, Content: "Report the figures."}}, Host: host})
	if err := host.Checkpoint(context.Background(), out.Pending); err != nil {
		t.Fatal(err)
	}
	mustAcceptAll(t, scripted.Requests())
	return out, st, host, scripted, chain
}

// deer-flow §5.6 #42 (#2350): a retried clarification replaces its
// message instead of adding a second one: the question's result has an
// id derived from the tool call, so a replayed checkpoint or a tool call
// run again (a redelivery) upserts it.
func TestClarification_Case42_RetryReplacesItsMessage(t *testing.T) {
	out, st, host, _, chain := clarifyRun(t, middleware.Clarification{})
	if out.Status != protocol.StatusInterrupted || out.Interrupt == nil || out.Interrupt.Kind != protocol.InterruptClarification {
		t.Fatalf("outcome %+v", out)
	}
	answers := func(st *state.State) []model.Message {
		var out []model.Message
		for _, m := range st.Messages {
			if m.Role == model.RoleTool && m.ToolCallID == "c1" {
				out = append(out, m)
			}
		}
		return out
	}
	if got := answers(st); len(got) != 1 || got[0].ID != "clarification_c1" {
		t.Fatalf("answers to the question: %+v", got)
	}
	// The call run again, as a redelivered run does, and its checkpoints
	// replayed twice: still one message, in its place.
	rt := &middleware.Runtime{RunID: "r1", ThreadID: "h1", Tenant: "default", Tools: echoTool(t), Logger: zap.NewNop()}
	last := st.Messages[middleware.LastAssistant(st)]
	res, err := chain.ToolCall(rt, func(context.Context, *middleware.ToolCall) (*middleware.ToolResult, error) {
		t.Fatal("ask_clarification reached the tool set")
		return nil, nil
	})(context.Background(), &middleware.ToolCall{Call: last.ToolCalls[0], State: st})
	if err != nil || res.Interrupt == nil {
		t.Fatalf("retried call: %+v, %v", res, err)
	}
	retried := res.Message
	retried.Role, retried.ToolCallID, retried.Name = model.RoleTool, "c1", middleware.ClarificationTool
	replayed := host.replay()
	for _, u := range host.checkpoints {
		replayed.Apply(u)
	}
	replayed.Apply(state.Update{Messages: []model.Message{retried}})
	if got := answers(replayed); len(got) != 1 || got[0].ID != "clarification_c1" {
		t.Fatalf("after a retry and a replay, answers to the question: %+v", got)
	}
	mustAcceptAll(t, []*model.Request{{Messages: replayed.Messages}})
}

// deer-flow §5.6 #43: with clarification disabled (no person present),
// the question is answered "go on with your best judgment" and the run
// goes on to its answer instead of pausing.
func TestClarification_Case43_DisabledGoesOn(t *testing.T) {
	out, st, _, scripted, _ := clarifyRun(t, middleware.Clarification{Disabled: true})
	if out.Status != protocol.StatusSuccess || out.Interrupt != nil || scripted.Calls() != 2 {
		t.Fatalf("outcome %+v after %d calls", out, scripted.Calls())
	}
	if _, ok := st.Values[middleware.InterruptValue]; ok {
		t.Fatalf("an interrupt was recorded: %s", st.Values[middleware.InterruptValue])
	}
	reqs := scripted.Requests()
	last := reqs[1].Messages[len(reqs[1].Messages)-1]
	if last.Role != model.RoleTool || last.ToolCallID != "c1" || !strings.Contains(last.Content, "best judgment") {
		t.Fatalf("the model was told %+v", last)
	}
}
