package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/model/openaitest"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
	"github.com/natsagent/natsagent/internal/testdeploy"
	"github.com/natsagent/natsagent/internal/tools"
)

// strictModel is the OpenAI-compatible client against the strict test
// server: every request a run sends is checked like a strict provider
// would.
func strictModel(t *testing.T, h openaitest.Handler) (*openaitest.Server, model.Model) {
	t.Helper()
	srv := openaitest.NewServer(t, h)
	m, err := model.NewOpenAI(model.OpenAIConfig{BaseURL: srv.URL(), APIKey: "test", Model: "strict"})
	if err != nil {
		t.Fatal(err)
	}
	return srv, m
}

// A run cancelled in the middle of a tool call leaves the thread valid:
// the next run's request is accepted by a strict provider
// (deer-flow #1754/#1766: interrupted tool execution, then a new message).
func TestCancelledMidToolThenValidNextRequest(t *testing.T) {
	h := newHarness(t)
	toolStarted := make(chan struct{}, 1)
	h.tools.Register(tools.Func(model.ToolSpec{Name: "slow", Parameters: json.RawMessage(`{"type":"object"}`)}, func(ctx context.Context, _ json.RawMessage) (string, error) {
		toolStarted <- struct{}{}
		<-ctx.Done()
		return "", ctx.Err()
	}))
	srv, m := strictModel(t, func(req *openaitest.Request) openaitest.Reply {
		if req.LastMessage().Content == "use the slow tool" {
			return openaitest.Reply{ToolCalls: []openaitest.Call{{Name: "slow", Arguments: "{}"}, {Name: "current_time", Arguments: "{}"}}}
		}
		return openaitest.Text("next answer")
	})
	h.startWorker(m, nil)
	w1 := h.watch("default", "t1", "a")
	h.submit(request("t1", "a", "use the slow tool"))
	natstest.Recv(t, toolStarted, "the slow tool of run a")
	if r, e := h.cancel("default", "t1", "a"); e != nil || r.Status != protocol.StatusCancelled {
		t.Fatalf("cancel: %+v %+v", r, e)
	}
	w1.finished(t, 10*time.Second)

	w2 := h.watch("default", "t1", "b")
	h.submit(request("t1", "b", "something else"))
	if fin := w2.finished(t, 10*time.Second); fin.Status != protocol.StatusSuccess {
		t.Fatalf("next run %s: %s (violations %v)", fin.Status, fin.Error, srv.Violations())
	}
	if v := srv.Violations(); len(v) != 0 {
		t.Fatalf("strict provider saw invalid requests: %v", v)
	}
	// Both calls of the interrupted batch are answered in the thread.
	answered := 0
	for _, m := range h.threadState("default", "t1") {
		if m.Role == model.RoleTool {
			answered++
		}
	}
	if answered != 2 {
		t.Fatalf("%d tool results in the thread, want 2", answered)
	}
}

// A thread whose history holds a tool call that was never answered (a
// crash mid-batch in an older version, a hand-edited state) still gets a
// valid request: repair answers the call with an error result in the
// request only (deer-flow §5.1 #1, deepagents #5546: status error).
func TestDanglingToolCallRepairedInRequest(t *testing.T) {
	h := newHarness(t)
	srv, m := strictModel(t, func(req *openaitest.Request) openaitest.Reply {
		return openaitest.Text("fine")
	})
	h.startWorker(m, nil)

	// Write a thread whose head has an unanswered tool call.
	ctx := context.Background()
	d := &kv.Delta{ID: "e0-1", RunID: "old", Step: 1, Update: state.Update{Messages: []model.Message{
		{ID: "u1", Role: model.RoleUser, Content: "earlier"},
		{ID: "a1", Role: model.RoleAssistant, ToolCalls: []model.ToolCall{{ID: "call_x", Name: "current_time", Arguments: "{}"}}},
	}}}
	if _, err := h.stores.Checkpoints.Put(ctx, "default", "t1", d); err != nil {
		t.Fatal(err)
	}
	if _, err := h.stores.Threads.Put(ctx, &protocol.Thread{ThreadID: "t1", Tenant: "default", Status: protocol.ThreadIdle, Head: "e0-1"}, 0); err != nil {
		t.Fatal(err)
	}
	w := h.watch("default", "t1", "r")
	h.submit(request("t1", "r", "go on"))
	if fin := w.finished(t, 10*time.Second); fin.Status != protocol.StatusSuccess {
		t.Fatalf("run %s: %s (violations %v)", fin.Status, fin.Error, srv.Violations())
	}
	reqs := srv.Requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests", len(reqs))
	}
	var patched *openaitest.Message
	for i, m := range reqs[0].Messages {
		if m.Role == "tool" && m.ToolCallID == "call_x" {
			patched = &reqs[0].Messages[i]
		}
	}
	if patched == nil || !strings.Contains(patched.Content, "interrupted") {
		t.Fatalf("the dangling call was not answered in the request: %+v", reqs[0].Messages)
	}
	// State is untouched by the repair: the old call is still unanswered
	// there, and the new run's messages follow it.
	var stored int
	for _, m := range h.threadState("default", "t1") {
		if m.Role == model.RoleTool {
			stored++
		}
	}
	if stored != 0 {
		t.Fatalf("repair wrote %d tool results into state; it must be request-only", stored)
	}
}

// A run steered while its tool batch runs ends at the batch's end and the
// steer run's request is valid for a strict provider.
func TestSteeredMidToolThenValidNextRequest(t *testing.T) {
	h := newHarness(t)
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	h.tools.Register(tools.Func(model.ToolSpec{Name: "wait", Parameters: json.RawMessage(`{"type":"object"}`)}, func(ctx context.Context, _ json.RawMessage) (string, error) {
		started <- struct{}{}
		<-release
		return "waited", nil
	}))
	srv, m := strictModel(t, func(req *openaitest.Request) openaitest.Reply {
		if req.LastMessage().Content == "wait please" {
			return openaitest.Reply{ToolCalls: []openaitest.Call{{Name: "wait", Arguments: "{}"}}}
		}
		return openaitest.Text("steered ok")
	})
	wh := h.startWorker(m, nil)
	w1 := h.watch("default", "t1", "a")
	h.submit(request("t1", "a", "wait please"))
	natstest.Recv(t, started, "the wait tool of run a")
	w2 := h.watch("default", "t1", "s")
	req := request("t1", "s", "change of plan")
	req.MultitaskStrategy = protocol.StrategySteer
	h.submit(req)
	// The batch ends once run a knows of the steer: a steer that reaches
	// it after the batch finds it done, not mid-tool.
	testdeploy.WaitFor(t, 30*time.Second, "run a to learn of the steer", func() bool { return wh.steered("default", "a") })
	close(release)
	if fin := w1.finished(t, 10*time.Second); fin.Status != protocol.StatusSteered {
		t.Fatalf("first run %s", fin.Status)
	}
	if fin := w2.finished(t, 10*time.Second); fin.Status != protocol.StatusSuccess {
		t.Fatalf("steer run %s: %s", fin.Status, fin.Error)
	}
	if v := srv.Violations(); len(v) != 0 {
		t.Fatalf("invalid requests: %v", v)
	}
}

// A run the loop guard stops ends incomplete with loop_capped on its
// record and its run.finished, not a success, and leaves no raw tool call
// behind (deer-flow #4176, #2319).
func TestLoopCappedRunReportsStopReason(t *testing.T) {
	h := newHarness(t)
	srv, m := strictModel(t, func(req *openaitest.Request) openaitest.Reply {
		return openaitest.Reply{ToolCalls: []openaitest.Call{{Name: "current_time", Arguments: `{"timezone":"UTC"}`}}}
	})
	h.startWorker(m, nil)
	w := h.watch("default", "t1", "loopy")
	h.submit(request("t1", "loopy", "what time is it"))
	fin := w.finished(t, 15*time.Second)
	if fin.Status != protocol.StatusIncomplete || fin.StopReason != protocol.StopLoopCapped ||
		fin.IncompleteDetails == nil || fin.IncompleteDetails.Reason != protocol.StopLoopCapped {
		t.Fatalf("run ended %s with stop reason %q (%+v), want incomplete with loop_capped", fin.Status, fin.StopReason, fin.IncompleteDetails)
	}
	if fin.Output == nil || len(fin.Output.ToolCalls) != 0 || !strings.Contains(fin.Output.Content, "[FORCED STOP]") {
		t.Fatalf("output %+v", fin.Output)
	}
	// message.completed shows the message as stored, without the stripped
	// tool calls.
	var lastCompleted model.Message
	for _, ev := range w.all() {
		if ev.Type == protocol.EventMessageCompleted {
			var m model.Message
			if err := json.Unmarshal(ev.Data, &m); err != nil {
				t.Fatal(err)
			}
			lastCompleted = m
		}
	}
	if len(lastCompleted.ToolCalls) != 0 || !strings.Contains(lastCompleted.Content, "[FORCED STOP]") {
		t.Fatalf("last message.completed %+v", lastCompleted)
	}
	if rec := h.run("default", "loopy"); rec.Status != protocol.StatusIncomplete || rec.StopReason != protocol.StopLoopCapped ||
		rec.IncompleteDetails == nil || rec.IncompleteDetails.Reason != protocol.StopLoopCapped {
		t.Fatalf("record %s, stop reason %q, %+v", rec.Status, rec.StopReason, rec.IncompleteDetails)
	}
	if n := srv.Count(); n != 5 {
		t.Fatalf("%d model calls, want 5 (the 5th identical call set stops)", n)
	}
	if v := srv.Violations(); len(v) != 0 {
		t.Fatalf("invalid requests: %v", v)
	}
	// The 4th request carried the loop warning after the tool results.
	req4 := srv.Requests()[3]
	last := req4.Messages[len(req4.Messages)-1]
	if last.Role != "user" || !strings.Contains(last.Content, "[LOOP DETECTED]") {
		t.Fatalf("4th request ends with %+v", last)
	}
}

// A run cut by max_steps ends incomplete on an answer that says it was
// cut, with no tool call left unanswered: the next run on the thread
// sends a transcript a strict provider accepts.
func TestMaxStepsRunEndsIncompleteAndThreadContinues(t *testing.T) {
	h := newHarness(t)
	srv, m := strictModel(t, func(req *openaitest.Request) openaitest.Reply {
		if req.LastMessage().Content == "and now?" {
			return openaitest.Text("continued")
		}
		return openaitest.Reply{ToolCalls: []openaitest.Call{{Name: "current_time", Arguments: fmt.Sprintf(`{"timezone":"UTC","n":%d}`, len(req.Messages))}}}
	})
	h.startWorker(m, nil)
	w := h.watch("default", "t1", "capped")
	req := request("t1", "capped", "keep calling tools")
	req.Config.MaxSteps = 2
	h.submit(req)
	fin := w.finished(t, 15*time.Second)
	if fin.Status != protocol.StatusIncomplete || fin.StopReason != protocol.StopMaxSteps ||
		fin.IncompleteDetails == nil || fin.IncompleteDetails.Reason != protocol.StopMaxSteps {
		t.Fatalf("run ended %s (%s, %+v), want incomplete with max_steps", fin.Status, fin.StopReason, fin.IncompleteDetails)
	}
	if fin.Output == nil || len(fin.Output.ToolCalls) != 0 || !strings.Contains(fin.Output.Content, "[STOPPED: max_steps]") {
		t.Fatalf("output %+v, want the cut answer without tool calls", fin.Output)
	}
	if rec := h.run("default", "capped"); rec.Status != protocol.StatusIncomplete || rec.Output == nil || rec.IncompleteDetails == nil {
		t.Fatalf("record %s output %+v details %+v", rec.Status, rec.Output, rec.IncompleteDetails)
	}
	w2 := h.watch("default", "t1", "next")
	h.submit(request("t1", "next", "and now?"))
	if fin := w2.finished(t, 15*time.Second); fin.Status != protocol.StatusSuccess || fin.Output.Content != "continued" {
		t.Fatalf("next run %s: %s %+v", fin.Status, fin.Error, fin.Output)
	}
	if n := srv.Count(); n != 3 {
		t.Fatalf("%d model calls, want 3 (2 steps, then the next run)", n)
	}
	if v := srv.Violations(); len(v) != 0 {
		t.Fatalf("invalid requests: %v", v)
	}
}
