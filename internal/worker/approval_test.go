package worker

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/model/openaitest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/tools"
)

// recordingTool counts the calls of a tool and keeps their arguments.
type recordingTool struct {
	mu   sync.Mutex
	args []string
}

func (r *recordingTool) register(h *harness, name string) {
	h.tools.Register(tools.Func(model.ToolSpec{Name: name, Parameters: json.RawMessage(`{"type":"object"}`)}, func(ctx context.Context, args json.RawMessage) (string, error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.args = append(r.args, string(args))
		return name + " done with " + string(args), nil
	}))
}

func (r *recordingTool) calls() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.args...)
}

func resumeRequest(thread, run string, resume any) *protocol.RunRequest {
	raw, _ := json.Marshal(resume)
	return &protocol.RunRequest{RunID: run, ThreadID: thread, Tenant: protocol.DefaultTenant, Agent: protocol.DefaultAgent,
		Command: &protocol.Command{Resume: raw}}
}

func (h *harness) threadRecord(tenant, thread string) *protocol.Thread {
	h.t.Helper()
	th, _, err := h.stores.Threads.Get(context.Background(), tenant, thread)
	if err != nil {
		h.t.Fatal(err)
	}
	return th
}

// Two parallel sensitive calls and a harmless one: the run stops before
// anything runs; a resume approves one and rejects the other, and the
// harmless call runs with the approved one. Every request the strict
// provider sees is valid (deepagentsjs #150: no dangling id).
func TestApprovalParallelCallsOneRejected(t *testing.T) {
	h := newHarness(t)
	var writes, searches recordingTool
	writes.register(h, "write_file")
	searches.register(h, "search")
	srv, m := strictModel(t, func(req *openaitest.Request) openaitest.Reply {
		last := req.LastMessage()
		if last.Role == "user" {
			return openaitest.Reply{ToolCalls: []openaitest.Call{
				{ID: "w1", Name: "write_file", Arguments: `{"path":"/a.txt","content":"A"}`},
				{ID: "s1", Name: "search", Arguments: `{"query":"x"}`},
				{ID: "w2", Name: "write_file", Arguments: `{"path":"/b.txt","content":"B"}`},
			}}
		}
		return openaitest.Text("all done")
	})
	h.startWorker(m, nil)

	w1 := h.watch("default", "t1", "ask")
	h.submit(request("t1", "ask", "write two files"))
	fin := w1.finished(t, 10*time.Second)
	if fin.Status != protocol.StatusInterrupted || fin.Interrupt == nil || fin.Interrupt.Kind != protocol.InterruptApproval {
		t.Fatalf("first run ended %s with %+v", fin.Status, fin.Interrupt)
	}
	reqs := fin.Interrupt.ActionRequests
	if len(reqs) != 2 || reqs[0].ToolCallID != "w1" || reqs[1].ToolCallID != "w2" || reqs[0].Name != "write_file" {
		t.Fatalf("action requests %+v", reqs)
	}
	if len(writes.calls())+len(searches.calls()) != 0 {
		t.Fatal("a tool ran before the person decided")
	}
	if th := h.threadRecord("default", "t1"); th.Status != protocol.ThreadInterrupted {
		t.Fatalf("thread status %s", th.Status)
	}
	if r := h.run("default", "ask"); r.Interrupt == nil || len(r.Interrupt.ActionRequests) != 2 {
		t.Fatalf("run record interrupt %+v", r.Interrupt)
	}

	w2 := h.watch("default", "t1", "decide")
	h.submit(resumeRequest("t1", "decide", protocol.Resume{Decisions: []protocol.Decision{
		{Type: protocol.DecisionApprove},
		{Type: protocol.DecisionReject, Message: "b.txt must stay as it is"},
	}}))
	fin = w2.finished(t, 10*time.Second)
	if fin.Status != protocol.StatusSuccess || fin.Output.Content != "all done" {
		t.Fatalf("resume ended %s: %s %+v", fin.Status, fin.Error, fin.Output)
	}
	if got := writes.calls(); len(got) != 1 || !strings.Contains(got[0], "/a.txt") {
		t.Fatalf("write_file ran %v, want only the approved /a.txt", got)
	}
	if len(searches.calls()) != 1 {
		t.Fatalf("the harmless sibling ran %d times", len(searches.calls()))
	}
	var rejected *model.Message
	for _, msg := range h.threadState("default", "t1") {
		if msg.Role == model.RoleTool && msg.ToolCallID == "w2" {
			rejected = &msg
		}
	}
	if rejected == nil || rejected.Status != model.ToolStatusError || !strings.Contains(rejected.Content, "b.txt must stay as it is") {
		t.Fatalf("rejected call's result %+v", rejected)
	}
	if v := srv.Violations(); len(v) != 0 {
		t.Fatalf("invalid requests: %v", v)
	}
	if th := h.threadRecord("default", "t1"); th.Status != protocol.ThreadIdle {
		t.Fatalf("thread status after the resume %s", th.Status)
	}
}

// A resume with the wrong number of decisions fails with a clear error and
// the thread keeps waiting; the corrected resume then works. An edit runs
// the person's arguments and says so; respond answers without running.
func TestApprovalDecisionCountEditAndRespond(t *testing.T) {
	h := newHarness(t)
	var writes, edits recordingTool
	writes.register(h, "write_file")
	edits.register(h, "edit_file")
	srv, m := strictModel(t, func(req *openaitest.Request) openaitest.Reply {
		if req.LastMessage().Role == "user" {
			return openaitest.Reply{ToolCalls: []openaitest.Call{
				{ID: "w1", Name: "write_file", Arguments: `{"path":"/draft.md","content":"v1"}`},
				{ID: "e1", Name: "edit_file", Arguments: `{"path":"/x","old_string":"a","new_string":"b"}`},
			}}
		}
		return openaitest.Text("ok")
	})
	h.startWorker(m, nil)
	w := h.watch("default", "t1", "ask")
	h.submit(request("t1", "ask", "draft it"))
	if fin := w.finished(t, 10*time.Second); fin.Status != protocol.StatusInterrupted {
		t.Fatalf("ended %s", fin.Status)
	}

	wBad := h.watch("default", "t1", "bad")
	h.submit(resumeRequest("t1", "bad", protocol.Resume{Decisions: []protocol.Decision{{Type: protocol.DecisionApprove}}}))
	fin := wBad.finished(t, 10*time.Second)
	if fin.Status != protocol.StatusError || !strings.Contains(fin.Error, "1 decisions for 2 tool calls") {
		t.Fatalf("mismatched resume ended %s: %q", fin.Status, fin.Error)
	}
	if th := h.threadRecord("default", "t1"); th.Status != protocol.ThreadInterrupted {
		t.Fatalf("after a failed resume the thread is %s, want still interrupted", th.Status)
	}
	if len(writes.calls())+len(edits.calls()) != 0 {
		t.Fatal("a tool ran on a failed resume")
	}

	wGood := h.watch("default", "t1", "good")
	h.submit(resumeRequest("t1", "good", protocol.Resume{Decisions: []protocol.Decision{
		{Type: protocol.DecisionEdit, Arguments: json.RawMessage(`{"path":"/draft.md","content":"v2 from the person"}`)},
		{Type: protocol.DecisionRespond, Message: "I already made that edit myself."},
	}}))
	if fin := wGood.finished(t, 10*time.Second); fin.Status != protocol.StatusSuccess {
		t.Fatalf("corrected resume ended %s: %s", fin.Status, fin.Error)
	}
	if got := writes.calls(); len(got) != 1 || !strings.Contains(got[0], "v2 from the person") {
		t.Fatalf("write_file ran with %v, want the edited arguments", got)
	}
	if len(edits.calls()) != 0 {
		t.Fatal("a responded call ran")
	}
	results := map[string]model.Message{}
	for _, msg := range h.threadState("default", "t1") {
		if msg.Role == model.RoleTool {
			results[msg.ToolCallID] = msg
		}
	}
	if r := results["w1"]; !strings.HasPrefix(r.Content, middleware.EditNotice) {
		t.Fatalf("edited call's result %q does not say it was edited", r.Content)
	}
	if r := results["e1"]; r.Content != "I already made that edit myself." || r.Status != model.ToolStatusSuccess {
		t.Fatalf("responded call's result %+v", r)
	}
	if v := srv.Violations(); len(v) != 0 {
		t.Fatalf("invalid requests: %v", v)
	}
}

// In always_trust mode nothing stops; a new message instead of a resume
// answers the waiting calls as not run and the thread goes on.
func TestApprovalAlwaysTrustAndNewMessageInstead(t *testing.T) {
	h := newHarness(t)
	var writes recordingTool
	writes.register(h, "write_file")
	srv, m := strictModel(t, func(req *openaitest.Request) openaitest.Reply {
		if last := req.LastMessage(); last.Role == "user" && strings.HasPrefix(last.Content, "write") {
			return openaitest.Reply{ToolCalls: []openaitest.Call{{Name: "write_file", Arguments: `{"path":"/f","content":"x"}`}}}
		}
		return openaitest.Text("fine")
	})
	h.startWorker(m, nil)
	trusted := request("t1", "trusted", "write it")
	trusted.Config.ToolApprovalMode = protocol.ApprovalAlwaysTrust
	w := h.watch("default", "t1", "trusted")
	h.submit(trusted)
	if fin := w.finished(t, 10*time.Second); fin.Status != protocol.StatusSuccess || len(writes.calls()) != 1 {
		t.Fatalf("always_trust run ended %s after %d writes", fin.Status, len(writes.calls()))
	}

	w2 := h.watch("default", "t2", "ask")
	h.submit(request("t2", "ask", "write again"))
	if fin := w2.finished(t, 10*time.Second); fin.Status != protocol.StatusInterrupted {
		t.Fatalf("default-mode run ended %s", fin.Status)
	}
	w3 := h.watch("default", "t2", "instead")
	h.submit(request("t2", "instead", "never mind, just say hi"))
	if fin := w3.finished(t, 10*time.Second); fin.Status != protocol.StatusSuccess {
		t.Fatalf("new message ended %s: %s", fin.Status, fin.Error)
	}
	if len(writes.calls()) != 1 {
		t.Fatal("the abandoned call ran")
	}
	if th := h.threadRecord("default", "t2"); th.Status != protocol.ThreadIdle {
		t.Fatalf("thread %s", th.Status)
	}
	if v := srv.Violations(); len(v) != 0 {
		t.Fatalf("invalid requests: %v", v)
	}
}

// ask_clarification with a sibling listed first: the sibling never runs,
// whatever the order (deer-flow #4906); the run ends interrupted with the
// question; the resume's answer reaches the model as the tool's result.
func TestClarificationWithSiblingAndResume(t *testing.T) {
	h := newHarness(t)
	var searches recordingTool
	searches.register(h, "search")
	srv, m := strictModel(t, func(req *openaitest.Request) openaitest.Reply {
		last := req.LastMessage()
		switch {
		case last.Role == "user":
			return openaitest.Reply{ToolCalls: []openaitest.Call{
				{ID: "s1", Name: "search", Arguments: `{"query":"flights"}`},
				{ID: "q1", Name: "ask_clarification", Arguments: `{"question":"Which city do you fly from?","type":"missing_info","options":["Paris","Lyon"]}`},
			}}
		case last.Role == "tool" && strings.Contains(last.Content, "The person answered: Lyon"):
			return openaitest.Text("Booking from Lyon.")
		}
		return openaitest.Text("unexpected: " + last.Content)
	})
	h.startWorker(m, nil)
	w := h.watch("default", "t1", "ask")
	h.submit(request("t1", "ask", "book me a flight"))
	fin := w.finished(t, 10*time.Second)
	if fin.Status != protocol.StatusInterrupted || fin.Interrupt == nil || fin.Interrupt.Kind != protocol.InterruptClarification ||
		fin.Interrupt.Question != "Which city do you fly from?" || len(fin.Interrupt.Options) != 2 {
		t.Fatalf("ended %s with %+v", fin.Status, fin.Interrupt)
	}
	if len(searches.calls()) != 0 {
		t.Fatal("the sibling of the question ran")
	}
	w2 := h.watch("default", "t1", "answer")
	h.submit(resumeRequest("t1", "answer", protocol.Resume{Answer: "Lyon"}))
	if fin := w2.finished(t, 10*time.Second); fin.Status != protocol.StatusSuccess || fin.Output.Content != "Booking from Lyon." {
		t.Fatalf("resume ended %s: %s %+v", fin.Status, fin.Error, fin.Output)
	}
	if v := srv.Violations(); len(v) != 0 {
		t.Fatalf("invalid requests: %v", v)
	}
}
