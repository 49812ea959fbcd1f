package middleware_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/model/openaitest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
	"github.com/natsagent/natsagent/internal/tools"
)

// childDelegator starts children that run until the test finishes them;
// the subagent service itself is tested over JetStream in
// internal/subagents, this stands in for it at the chain's boundary.
type childDelegator struct {
	mu   sync.Mutex
	done map[string]bool
}

func (d *childDelegator) StartSubagent(_ context.Context, _ string, req *protocol.SubagentStart) (*protocol.SubagentStarted, error) {
	return &protocol.SubagentStarted{RunID: "child_" + req.Parent.ToolCallID, ThreadID: "t_" + req.Parent.ToolCallID, Subagent: req.Subagent, Status: protocol.StatusRunning}, nil
}

func (d *childDelegator) status(q protocol.SubagentQuery) *protocol.SubagentStatus {
	d.mu.Lock()
	defer d.mu.Unlock()
	st := &protocol.SubagentStatus{RunID: q.RunID, ThreadID: "t", Subagent: "researcher", Status: protocol.StatusRunning}
	if d.done[q.RunID] {
		st.Status, st.Result = protocol.StatusSuccess, "Three sources found."
	}
	return st
}

func (d *childDelegator) SubagentStatus(_ context.Context, _ string, q protocol.SubagentQuery) (*protocol.SubagentStatus, error) {
	return d.status(q), nil
}

func (d *childDelegator) CancelSubagent(_ context.Context, _ string, q protocol.SubagentQuery) (*protocol.SubagentStatus, error) {
	return d.status(q), nil
}

func (d *childDelegator) AwaitSubagent(_ context.Context, _ string, q protocol.SubagentQuery, _ time.Duration, _ func(string)) (*protocol.SubagentStatus, error) {
	d.mu.Lock()
	d.done[q.RunID] = true
	d.mu.Unlock()
	return d.status(q), nil
}

// DeerFlow DurableContext: a summary that cuts the start of a subagent
// still running does not make the lead forget it. Every request while it
// runs lists it in the trailing context, before and after the summary,
// until the run collects it.
func TestSubagentLedger_SurvivesACompactionWhileTheChildRuns(t *testing.T) {
	const startAt, awaitAt = 0, 7
	e := newCCEnv(t, func(n int, req *openaitest.Request) openaitest.Reply {
		switch {
		case n == startAt:
			return openaitest.ToolCall(middleware.SubagentStartTool, `{"subagent_type":"researcher","description":"Find three sources on tidal power"}`)
		case n < awaitAt:
			return openaitest.ToolCall("echo", fmt.Sprintf(`{"step":%d,"pad":%q}`, n, fill("pad", 150)))
		case n == awaitAt:
			// The id the model read in the ledger, not in the
			// summarized start result.
			last := req.Messages[len(req.Messages)-1].Content
			i := strings.Index(last, "run_id ")
			id := strings.Fields(last[i+len("run_id "):])[0]
			return openaitest.ToolCall(middleware.SubagentAwaitTool, fmt.Sprintf(`{"run_id":%q}`, id))
		}
		return openaitest.Text("The researcher found three sources.")
	}, nil)
	subs, err := middleware.NewSubagents(middleware.Subagents{}, middleware.Env{Kind: middleware.KindLead, Subagents: []middleware.SubagentInfo{{Name: "researcher", Description: "Finds sources."}}})
	if err != nil {
		t.Fatal(err)
	}
	chain, _ := ccChain(t, `{"trigger_messages": 8, "keep": {"messages": 3}}`, middleware.ContextLimits{Window: 100000}, middleware.Retry{}, subs)
	st := &state.State{}
	host := &eventHost{}
	rt := &middleware.Runtime{RunID: "r1", ThreadID: "h1", Tenant: "default", Agent: "test", Tools: echoTool(t), Logger: zap.NewNop(), Emit: host.Emit,
		Subagents: &childDelegator{done: map[string]bool{}}}
	out := agent.Execute(context.Background(), &agent.Run{
		Runtime: rt, Chain: chain, Model: e.m, ModelName: "test-model", System: "You are a test agent.",
		MaxSteps: 20, State: st, Input: []model.Message{user("u1", "Research tidal power with the researcher.")}, Host: host, ToolEnv: tools.Env{Files: files.NewMemory()},
	})
	if out.Status != protocol.StatusSuccess {
		t.Fatalf("run ended %+v", out)
	}
	e.checkStrict()
	if len(e.summaries()) == 0 {
		t.Fatal("no summary was made; the test needs one while the child runs")
	}
	reqs := e.mains()
	if len(reqs) != awaitAt+2 {
		t.Fatalf("%d main calls, want %d", len(reqs), awaitAt+2)
	}
	const child = "child_"
	summarized := false
	for i := startAt + 1; i <= awaitAt; i++ {
		last := reqs[i].Messages[len(reqs[i].Messages)-1]
		if last.Role != "user" || !strings.Contains(last.Content, "<subagents_running>") || !strings.Contains(last.Content, "run_id "+child) ||
			!strings.Contains(last.Content, "Find three sources on tidal power") {
			t.Fatalf("call %d does not list the running child last: %+v", i, last)
		}
		if !hasMessage(reqs[i], func(m openaitest.Message) bool {
			return m.Role == "assistant" && len(m.ToolCalls) > 0 && m.ToolCalls[0].Function.Name == middleware.SubagentStartTool
		}) {
			summarized = true
		}
	}
	if !summarized {
		t.Fatal("no request lost the subagent_start call to a summary; the test proves nothing")
	}
	// Collected: the ledger is gone.
	if last := reqs[awaitAt+1].Messages[len(reqs[awaitAt+1].Messages)-1]; strings.Contains(last.Content, "<subagents_running>") {
		t.Fatalf("the collected child is still listed: %s", last.Content)
	}
	if strings.Contains(reqs[startAt].Messages[len(reqs[startAt].Messages)-1].Content, "<subagents_running>") {
		t.Fatal("the first call lists a child before any started")
	}
}
