package subagents_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/testdeploy"
	"github.com/natsagent/natsagent/internal/worker"
)

// leadDelegates is a lead that sends calls on a person's message and
// answers with the tool results once they are in.
func leadDelegates(calls ...model.ToolCall) func(context.Context, *model.Request) model.Reply {
	return func(_ context.Context, req *model.Request) model.Reply {
		if answered(req) {
			return model.Reply{Text: "lead done: " + toolResults(req)}
		}
		return model.Reply{Text: "delegating", ToolCalls: calls}
	}
}

// Two task calls of one response run as two child runs at the same time,
// on two workers: each child's answer waits until both are in their model
// call, which only two workers can do (the lead's worker has one free slot).
// The lead's stream tells the children's ids, and they share its workdir.
func TestParallelChildrenSpreadOverTwoWorkers(t *testing.T) {
	e := newEnv(t)
	var inAnswer atomic.Int32
	both := make(chan struct{})
	var once sync.Once
	s := newScript(map[string]func(context.Context, *model.Request) model.Reply{
		"lead": leadDelegates(taskCall("task_a", "researcher", "alpha facts"), taskCall("task_b", "researcher", "beta facts")),
		"researcher": func(ctx context.Context, req *model.Request) model.Reply {
			if !answered(req) {
				// Slow enough that the lead follows the child before its
				// first step.
				return model.Reply{Text: "looking", Delay: 300 * time.Millisecond, ToolCalls: []model.ToolCall{{ID: "clock", Name: "current_time", Arguments: "{}"}}}
			}
			if inAnswer.Add(1) == 2 {
				once.Do(func() { close(both) })
			}
			alone := blockUntilTimeout(ctx, both, 15*time.Second)
			if alone {
				return model.Reply{Text: "answered alone"}
			}
			return model.Reply{Text: "found: " + req.LastUserContent()}
		},
	})
	var mu sync.Mutex
	workdirs := map[string]files.Workdir{}
	var opened []string
	withFiles := func(c *worker.Config) {
		c.Files = func(tenant, thread string) files.Workdir {
			mu.Lock()
			defer mu.Unlock()
			opened = append(opened, thread)
			if workdirs[thread] == nil {
				workdirs[thread] = files.NewMemory()
			}
			return workdirs[thread]
		}
	}
	e.startWorker("wa", s.model(), 2, withFiles)
	lead := e.watch("t1", "lead1")
	e.submit("t1", "lead1", "research alpha and beta")
	e.waitStatus("lead1", 10*time.Second, protocol.StatusRunning)
	e.startWorker("wb", s.model(), 1, withFiles)

	fin := lead.finished(t, 30*time.Second)
	if fin.Status != protocol.StatusSuccess {
		t.Fatalf("lead ended %s: %s", fin.Status, fin.Error)
	}
	for _, want := range []string{"found: alpha facts", "found: beta facts"} {
		if !strings.Contains(fin.Output.Content, want) {
			t.Errorf("lead output %q lacks %q", fin.Output.Content, want)
		}
	}
	workers := map[string]bool{}
	for _, call := range []string{"task_a", "task_b"} {
		thread, run := child("t1", "lead1", "researcher", call)
		rec := e.record(run)
		if rec == nil || rec.Status != protocol.StatusSuccess || rec.ThreadID != thread {
			t.Fatalf("child of %s: %+v", call, rec)
		}
		if rec.Parent == nil || rec.Parent.RunID != "lead1" || rec.Parent.ThreadID != "t1" || rec.Parent.ToolCallID != call || rec.Agent != "researcher" {
			t.Errorf("child of %s has parent %+v, agent %s", call, rec.Parent, rec.Agent)
		}
		workers[rec.Worker] = true
	}
	if !workers["wa"] || !workers["wb"] {
		t.Errorf("children ran on workers %v, want one on each", workers)
	}

	started := lead.subagentEvents(protocol.EventSubagentStarted)
	finished := lead.subagentEvents(protocol.EventSubagentFinished)
	if len(started) != 2 || len(finished) != 2 {
		t.Fatalf("events: %v", lead.types())
	}
	for _, d := range started {
		thread, run := child("t1", "lead1", "researcher", d.ToolCallID)
		if d.RunID != run || d.ThreadID != thread || d.Subagent != "researcher" {
			t.Errorf("subagent.started %+v, want run %s thread %s", d, run, thread)
		}
	}
	for _, d := range finished {
		if d.Status != protocol.StatusSuccess {
			t.Errorf("subagent.finished %+v", d)
		}
	}
	progress := lead.subagentEvents(protocol.EventSubagentProgress)
	if !slices.ContainsFunc(progress, func(d protocol.SubagentEventData) bool { return strings.HasPrefix(d.Line, "calls current_time") }) {
		t.Errorf("no progress line for the children's tool calls: %+v", progress)
	}

	// Files are shared: a child opens its parent's workdir, never its own.
	mu.Lock()
	defer mu.Unlock()
	for _, th := range opened {
		if th != "t1" {
			t.Errorf("a run opened the workdir of thread %s; children must use their parent's (t1)", th)
		}
	}
}

// blockUntilTimeout waits for ch; it reports true when the wait gave up.
func blockUntilTimeout(ctx context.Context, ch <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
		return false
	case <-ctx.Done():
		return true
	case <-t.C:
		return true
	}
}

// A lead whose worker dies while its child runs (the connection closed,
// nothing cleaned up) is taken over by another worker: it runs the pending
// task call again with the same tool call id, finds the same child by its
// derived ids and returns its answer. The child ran once, and its usage is
// in the lead's exactly once.
func TestLeadCrashWithChildInFlight_DeerFlow4758(t *testing.T) {
	e := newRedeliveryEnv(t) // the dead worker's lead is redelivered to wb
	gate := make(chan struct{})
	var gateOnce sync.Once
	open := func() { gateOnce.Do(func() { close(gate) }) }
	t.Cleanup(open)
	fns := map[string]func(context.Context, *model.Request) model.Reply{
		"lead": func(ctx context.Context, req *model.Request) model.Reply {
			r := leadDelegates(taskCall("task_x", "researcher", "the long job"))(ctx, req)
			r.Usage = &model.Usage{PromptTokens: 1000, CompletionTokens: 50}
			return r
		},
		"researcher": func(ctx context.Context, req *model.Request) model.Reply {
			if err := blockUntil(ctx, gate); err != nil {
				return model.Reply{Err: err}
			}
			return model.Reply{Text: "long job done", Usage: &model.Usage{PromptTokens: 300, CompletionTokens: 30}}
		},
	}
	a := newScript(fns)
	b := newScript(fns)

	crashing := e.startWorker("wa", a.model(), 1, nil)
	lead := e.watch("t1", "lead1")
	e.submit("t1", "lead1", "do the long job")
	childThread, childRun := child("t1", "lead1", "researcher", "task_x")
	// The child waits in the stream: the lead holds wa's only slot.
	e.waitStatus(childRun, 10*time.Second, protocol.StatusPending)
	e.startWorker("wb", b.model(), 3, nil)
	rec := e.waitStatus(childRun, 10*time.Second, protocol.StatusRunning)
	if rec.Worker != "wb" {
		t.Fatalf("child runs on %s", rec.Worker)
	}
	crashing.nc.Close()

	// wb takes the lead over; then the child may finish.
	testdeploy.WaitFor(t, 30*time.Second, "the lead's takeover", func() bool {
		r := e.record("lead1")
		return r != nil && r.Attempt >= 2 && r.Worker == "wb"
	})
	open()
	fin := lead.finished(t, 30*time.Second)
	if fin.Status != protocol.StatusSuccess || !strings.Contains(fin.Output.Content, "long job done") {
		t.Fatalf("lead ended %s with %+v (%s)", fin.Status, fin.Output, fin.Error)
	}
	childRec := e.record(childRun)
	if childRec.Status != protocol.StatusSuccess || childRec.Attempt != 1 {
		t.Errorf("child ended %s after %d attempts, want success after 1", childRec.Status, childRec.Attempt)
	}
	if n := a.count("researcher") + b.count("researcher"); n != 1 {
		t.Errorf("the child's model was called %d times, want once", n)
	}
	ids, err := e.stores.Threads.RunIDs(context.Background(), protocol.DefaultTenant, childThread)
	if err != nil || len(ids) != 1 || ids[0] != childRun {
		t.Errorf("child thread runs %v (%v), want only %s", ids, err, childRun)
	}
	starts := lead.subagentEvents(protocol.EventSubagentStarted)
	if len(starts) != 2 || starts[0].RunID != childRun || starts[1].RunID != childRun || !starts[1].Existing {
		t.Errorf("subagent.started events %+v, want the same child twice, the second existing", starts)
	}

	// Usage: the child's calls count in the lead's total once, under the
	// child's run id; each thread keeps its own.
	leadRec := e.record("lead1")
	u := leadRec.Usage
	if u == nil || len(u.Children) != 1 {
		t.Fatalf("lead usage %+v", u)
	}
	kid, ok := u.Children[childRun]
	if !ok || kid.Input != 300 || kid.Output != 30 {
		t.Errorf("lead usage children %+v", u.Children)
	}
	if u.Total.Input != u.Own.Input+300 || u.Total.Output != u.Own.Output+30 {
		t.Errorf("lead total %+v, own %+v", u.Total.TokenCounts, u.Own.TokenCounts)
	}
	// Each thread's totals are on its record (protocol v2).
	var leadThread, childUsage *protocol.ThreadUsage
	testdeploy.WaitFor(t, 5*time.Second, "usage on the thread records", func() bool {
		lt, _, err1 := e.stores.Threads.Get(context.Background(), protocol.DefaultTenant, "t1")
		ct, _, err2 := e.stores.Threads.Get(context.Background(), protocol.DefaultTenant, childThread)
		if err1 != nil || err2 != nil || lt.Usage == nil || ct.Usage == nil {
			return false
		}
		leadThread, childUsage = lt.Usage, ct.Usage
		return true
	})
	if leadThread.Total.Input != u.Total.Input {
		t.Errorf("lead thread usage %d input tokens, want the lead's total %d", leadThread.Total.Input, u.Total.Input)
	}
	if childUsage.Total.Input != 300 {
		t.Errorf("child thread usage %d input tokens, want 300", childUsage.Total.Input)
	}
}

// Cancelling a lead cancels its running child; steering a lead does too.
func TestCancelCascade(t *testing.T) {
	for _, how := range []string{"cancel", "steer"} {
		t.Run(how, func(t *testing.T) {
			e := newEnv(t)
			s := newScript(map[string]func(context.Context, *model.Request) model.Reply{
				"lead": func(ctx context.Context, req *model.Request) model.Reply {
					if req.LastUserContent() == "never mind" {
						return model.Reply{Text: "ok, stopped"}
					}
					return leadDelegates(taskCall("task_1", "researcher", "forever"))(ctx, req)
				},
				"researcher": func(ctx context.Context, req *model.Request) model.Reply {
					return model.Reply{Delay: time.Hour}
				},
			})
			e.startWorker("wa", s.model(), 4, nil)
			lead := e.watch("t1", "lead1")
			e.submit("t1", "lead1", "start something long")
			_, childRun := child("t1", "lead1", "researcher", "task_1")
			e.waitStatus(childRun, 10*time.Second, protocol.StatusRunning)
			want := protocol.StatusCancelled
			if how == "cancel" {
				e.cancel("t1", "lead1")
			} else {
				want = protocol.StatusSteered
				e.submitReq(&protocol.RunRequest{RunID: "steer1", ThreadID: "t1", MultitaskStrategy: protocol.StrategySteer,
					Input: &protocol.Input{Messages: []model.Message{{Role: model.RoleUser, Content: "never mind"}}}})
			}
			if fin := lead.finished(t, 20*time.Second); fin.Status != want {
				t.Fatalf("lead ended %s, want %s", fin.Status, want)
			}
			e.waitStatus(childRun, 20*time.Second, protocol.StatusCancelled)
			if how == "steer" {
				e.waitStatus("steer1", 20*time.Second, protocol.StatusSuccess)
			}
		})
	}
}

// One child failing does not cancel its sibling: the lead gets an error
// result for one and the answer of the other (deepagents #694).
func TestSiblingFailureDoesNotCancelOthers_Deepagents694(t *testing.T) {
	e := newEnv(t)
	s := newScript(map[string]func(context.Context, *model.Request) model.Reply{
		"lead": leadDelegates(taskCall("bad", "failing", "break"), taskCall("good", "researcher", "work")),
		"failing": func(context.Context, *model.Request) model.Reply {
			return model.Reply{Err: fmt.Errorf("provider exploded")}
		},
		"researcher": func(context.Context, *model.Request) model.Reply {
			// Still working when its sibling fails.
			return model.Reply{Text: "good work", Delay: 500 * time.Millisecond}
		},
	})
	e.startWorker("wa", s.model(), 4, nil)
	lead := e.watch("t1", "lead1")
	e.submit("t1", "lead1", "two things")
	fin := lead.finished(t, 20*time.Second)
	if fin.Status != protocol.StatusSuccess {
		t.Fatalf("lead ended %s: %s", fin.Status, fin.Error)
	}
	var bad, good *model.Message
	for _, m := range e.messages("t1") {
		if m.Role == model.RoleTool {
			switch m.ToolCallID {
			case "bad":
				bad = &m
			case "good":
				good = &m
			}
		}
	}
	if bad == nil || bad.Status != model.ToolStatusError || !strings.Contains(bad.Content, "ended error") || !strings.Contains(bad.Content, "provider exploded") {
		t.Errorf("failing child's result: %+v", bad)
	}
	if good == nil || good.Status != model.ToolStatusSuccess || !strings.Contains(good.Content, "good work") {
		t.Errorf("sibling's result: %+v", good)
	}
	_, goodRun := child("t1", "lead1", "researcher", "good")
	if rec := e.record(goodRun); rec.Status != protocol.StatusSuccess {
		t.Errorf("sibling ended %s", rec.Status)
	}
}

// A subagent is offered neither the delegation tools nor the ones that
// need a person, and an explicit call to any of them is refused with an
// error result it can act on (deer-flow #4159).
func TestSubagentCannotCallHiddenTools_DeerFlow4159(t *testing.T) {
	e := newEnv(t)
	var offered []string
	var mu sync.Mutex
	s := newScript(map[string]func(context.Context, *model.Request) model.Reply{
		"lead": leadDelegates(taskCall("t", "researcher", "try to nest")),
		"researcher": func(_ context.Context, req *model.Request) model.Reply {
			if answered(req) {
				return model.Reply{Text: "could not: " + toolResults(req)}
			}
			mu.Lock()
			for _, spec := range req.Tools {
				offered = append(offered, spec.Name)
			}
			mu.Unlock()
			return model.Reply{ToolCalls: []model.ToolCall{
				taskCall("nested", "researcher", "recurse"),
				{ID: "ask", Name: "ask_clarification", Arguments: `{"question":"which one?"}`},
				{ID: "start", Name: "subagent_start", Arguments: `{"description":"x","subagent_type":"researcher"}`},
				{ID: "write", Name: "write_file", Arguments: `{"path":"/a.txt","content":"x"}`},
			}}
		},
	})
	e.startWorker("wa", s.model(), 4, nil)
	lead := e.watch("t1", "lead1")
	e.submit("t1", "lead1", "nest")
	if fin := lead.finished(t, 20*time.Second); fin.Status != protocol.StatusSuccess {
		t.Fatalf("lead ended %s: %s", fin.Status, fin.Error)
	}
	mu.Lock()
	for _, name := range []string{"task", "subagent_start", "subagent_status", "subagent_cancel", "subagent_await", "ask_clarification", "write_file"} {
		if slices.Contains(offered, name) {
			t.Errorf("the subagent was offered %s: %v", name, offered)
		}
	}
	mu.Unlock()
	childThread, childRun := child("t1", "lead1", "researcher", "t")
	if rec := e.record(childRun); rec.Status != protocol.StatusSuccess {
		t.Fatalf("child ended %s: %s", rec.Status, rec.Error)
	}
	results := map[string]model.Message{}
	for _, m := range e.messages(childThread) {
		if m.Role == model.RoleTool {
			results[m.ToolCallID] = m
		}
	}
	for _, id := range []string{"nested", "ask", "start", "write"} {
		m, ok := results[id]
		if !ok || m.Status != model.ToolStatusError {
			t.Errorf("call %s: %+v", id, m)
		}
	}
	for _, id := range []string{"nested", "ask", "start"} {
		if !strings.Contains(results[id].Content, "not available to a subagent") {
			t.Errorf("call %s refused with %q", id, results[id].Content)
		}
	}
	// Nothing nested: no grandchild exists.
	_, nested := child(childThread, childRun, "researcher", "nested")
	if rec := e.record(nested); rec != nil {
		t.Errorf("a subagent started a subagent: %+v", rec)
	}
}

// A child whose last assistant message is empty answers with its last
// non-empty text (deepagents #3406).
func TestEmptyFinalMessageUsesLastText_Deepagents3406(t *testing.T) {
	e := newEnv(t)
	s := newScript(map[string]func(context.Context, *model.Request) model.Reply{
		"lead": leadDelegates(taskCall("t", "researcher", "answer then stop")),
		"researcher": func(_ context.Context, req *model.Request) model.Reply {
			if answered(req) {
				return model.Reply{Text: ""}
			}
			return model.Reply{Text: "the answer is 42", ToolCalls: []model.ToolCall{{ID: "clock", Name: "current_time", Arguments: "{}"}}}
		},
	})
	e.startWorker("wa", s.model(), 4, nil)
	lead := e.watch("t1", "lead1")
	e.submit("t1", "lead1", "ask")
	fin := lead.finished(t, 20*time.Second)
	if fin.Status != protocol.StatusSuccess || !strings.Contains(fin.Output.Content, "the answer is 42") {
		t.Fatalf("lead ended %s with %q", fin.Status, fin.Output.Content)
	}
}

// The subagent limit end to end: a response asking for five children
// starts three; the run's total (set to 4) lets one more start, then a
// response that only delegates ends the run subagent_limit_capped.
func TestSubagentLimitEndToEnd_DeerFlow3857(t *testing.T) {
	e := newEnv(t)
	e.setLead(func(p *agent.Profile) {
		p.Middleware.Settings = map[string]json.RawMessage{"subagent_limit": json.RawMessage(`{"max_per_run":4}`)}
	})
	turn := func(req *model.Request) int {
		n := 0
		for _, m := range req.Messages {
			if m.Role == model.RoleAssistant {
				n++
			}
		}
		return n
	}
	s := newScript(map[string]func(context.Context, *model.Request) model.Reply{
		"lead": func(_ context.Context, req *model.Request) model.Reply {
			var calls []model.ToolCall
			switch turn(req) {
			case 0:
				for i := range 5 {
					calls = append(calls, taskCall(fmt.Sprintf("a%d", i), "researcher", fmt.Sprintf("job %d", i)))
				}
			case 1:
				calls = []model.ToolCall{taskCall("b0", "researcher", "job b0"), taskCall("b1", "researcher", "job b1")}
			default:
				calls = []model.ToolCall{taskCall("c0", "researcher", "job c0")}
			}
			return model.Reply{Text: fmt.Sprintf("turn %d", turn(req)), ToolCalls: calls}
		},
		"researcher": func(_ context.Context, req *model.Request) model.Reply {
			return model.Reply{Text: "done " + req.LastUserContent()}
		},
	})
	e.startWorker("wa", s.model(), 8, nil)
	lead := e.watch("t1", "lead1")
	e.submit("t1", "lead1", "delegate a lot")
	fin := lead.finished(t, 30*time.Second)
	if fin.Status != protocol.StatusIncomplete || fin.StopReason != protocol.StopSubagentLimitCapped {
		t.Fatalf("lead ended %s (%s), want incomplete with stop_reason subagent_limit_capped", fin.Status, fin.StopReason)
	}
	if !strings.Contains(fin.Output.Content, "[SUBAGENT LIMIT REACHED]") || !strings.Contains(fin.Output.Content, "turn 2") {
		t.Errorf("final answer %q", fin.Output.Content)
	}
	if rec := e.record("lead1"); rec.StopReason != protocol.StopSubagentLimitCapped {
		t.Errorf("record stop_reason %q", rec.StopReason)
	}
	if n := s.count("researcher"); n != 4 {
		t.Errorf("%d children ran, want 4", n)
	}
	for call, ran := range map[string]bool{"a0": true, "a2": true, "a3": false, "a4": false, "b0": true, "b1": false, "c0": false} {
		_, run := child("t1", "lead1", "researcher", call)
		if got := e.record(run) != nil; got != ran {
			t.Errorf("child of %s exists: %v, want %v", call, got, ran)
		}
	}
	var refused []string
	for _, m := range e.messages("t1") {
		if m.Role == model.RoleTool && m.Status == model.ToolStatusError && strings.Contains(m.Content, "SUBAGENT LIMIT") {
			refused = append(refused, m.ToolCallID)
		}
	}
	if fmt.Sprint(refused) != "[a3 a4 b1]" {
		t.Errorf("refused calls %v", refused)
	}
	if n := len(lead.subagentEvents(protocol.EventSubagentLimited)); n != 3 {
		t.Errorf("%d subagent.limited events, want 3", n)
	}
}

// A worker that shuts down while its lead waits in task hands the lead
// over without answering "not completed": the child goes on, the lead is
// told it moved, and on the next worker it collects the answer with
// subagent_await.
func TestGracefulHandOffKeepsChildRunning(t *testing.T) {
	e := newEnv(t)
	gate := make(chan struct{})
	var gateOnce sync.Once
	open := func() { gateOnce.Do(func() { close(gate) }) }
	t.Cleanup(open)
	fns := map[string]func(context.Context, *model.Request) model.Reply{
		"lead": func(_ context.Context, req *model.Request) model.Reply {
			if !answered(req) {
				return model.Reply{ToolCalls: []model.ToolCall{taskCall("task_h", "researcher", "slow job")}}
			}
			msgs := conversation(req)
			last := msgs[len(msgs)-1]
			if last.Name == middleware.TaskTool {
				var moved struct {
					Status string `json:"status"`
					RunID  string `json:"run_id"`
				}
				if json.Unmarshal([]byte(last.Content), &moved) == nil && moved.Status == "running" {
					// The trailing context lists the child still running.
					if ctx := req.Messages[len(req.Messages)-1]; ctx.Name != model.ContextMessageName || !strings.Contains(ctx.Content, "run_id "+moved.RunID) {
						t.Errorf("the request does not end with the ledger of the running child: %+v", ctx)
					}
					return model.Reply{ToolCalls: []model.ToolCall{{ID: "await_h", Name: middleware.SubagentAwaitTool, Arguments: fmt.Sprintf(`{"run_id":%q}`, moved.RunID)}}}
				}
			}
			return model.Reply{Text: "lead done: " + toolResults(req)}
		},
		"researcher": func(ctx context.Context, req *model.Request) model.Reply {
			if err := blockUntil(ctx, gate); err != nil {
				return model.Reply{Err: err}
			}
			return model.Reply{Text: "slow job done"}
		},
	}
	s := newScript(fns)
	a := e.startWorker("wa", s.model(), 1, nil)
	lead := e.watch("t1", "lead1")
	e.submit("t1", "lead1", "go")
	_, childRun := child("t1", "lead1", "researcher", "task_h")
	e.waitStatus(childRun, 10*time.Second, protocol.StatusPending)
	e.startWorker("wb", s.model(), 3, nil)
	e.waitStatus(childRun, 10*time.Second, protocol.StatusRunning)

	a.cancel() // graceful: the lead is handed over at its next safe boundary
	select {
	case <-a.done:
	case <-time.After(natstest.Patience):
		t.Fatal("worker wa did not stop")
	}
	testdeploy.WaitFor(t, natstest.Patience, "the lead to move to wb", func() bool {
		// No view while handed back: no lease, no record, and the
		// request not yet taken again.
		r := e.record("lead1")
		return r != nil && r.Worker == "wb" && r.Status == protocol.StatusRunning
	})
	open()
	fin := lead.finished(t, 30*time.Second)
	if fin.Status != protocol.StatusSuccess || !strings.Contains(fin.Output.Content, "slow job done") {
		t.Fatalf("lead ended %s with %+v (%s)", fin.Status, fin.Output, fin.Error)
	}
	if rec := e.record(childRun); rec.Status != protocol.StatusSuccess || rec.Attempt != 1 {
		t.Errorf("child ended %s after %d attempts", rec.Status, rec.Attempt)
	}
	if n := s.count("researcher"); n != 1 {
		t.Errorf("child model called %d times", n)
	}
	var awaited bool
	for _, m := range e.messages("t1") {
		if m.Role == model.RoleTool && m.ToolCallID == "await_h" && strings.Contains(m.Content, "slow job done") {
			awaited = true
		}
	}
	if !awaited {
		t.Error("the lead did not collect the answer with subagent_await after the hand-off")
	}
}

// A lead cancelled while its worker is dead (the cancel fences the dead
// worker out) has its running child cancelled too: the child is derived
// from the lead's last checkpoint.
func TestCancelLeadWhoseWorkerDied(t *testing.T) {
	e := newEnv(t)
	s := newScript(map[string]func(context.Context, *model.Request) model.Reply{
		"lead":       leadDelegates(taskCall("task_d", "researcher", "forever")),
		"researcher": func(context.Context, *model.Request) model.Reply { return model.Reply{Delay: time.Hour} },
	})
	a := e.startWorker("wa", s.model(), 1, nil)
	e.submit("t1", "lead1", "go")
	_, childRun := child("t1", "lead1", "researcher", "task_d")
	e.waitStatus(childRun, 10*time.Second, protocol.StatusPending)
	e.startWorker("wb", s.model(), 1, nil) // one slot: the child's
	e.waitStatus(childRun, 10*time.Second, protocol.StatusRunning)
	a.nc.Close()
	// Once the server has dropped wa's subscriptions: a cancel racing them
	// would wait for wa's reply until its timeout.
	testdeploy.WaitFor(t, 5*time.Second, "wa's subscriptions to go", func() bool {
		_, err := e.nc.Request(e.names.WorkerControl("wa"), nil, 100*time.Millisecond)
		return errors.Is(err, nats.ErrNoResponders)
	})
	e.cancel("t1", "lead1")
	if rec := e.waitStatus("lead1", 10*time.Second, protocol.StatusCancelled); rec.Worker != "wa" {
		t.Errorf("the lead was taken over by %s before the cancel", rec.Worker)
	}
	e.waitStatus(childRun, 20*time.Second, protocol.StatusCancelled)
}
