package natsagent_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/natsagent/natsagent"
	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/testdeploy"
	"github.com/natsagent/natsagent/natsagenttest"
)

func bg(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), natsagenttest.Timeout)
	t.Cleanup(cancel)
	return ctx
}

// Submit, Follow (deltas included), Wait and the read side: records, runs
// of a thread, state, usage.
func TestClient_SubmitFollowWaitAndRead(t *testing.T) {
	d := natsagenttest.Start(t, natsagent.Config{},
		natsagenttest.Reply{Text: "one two three", Usage: &natsagenttest.Usage{PromptTokens: 11, CompletionTokens: 3, TotalTokens: 14}},
		natsagenttest.Text("again"),
	)
	ctx := bg(t)
	c := d.Client
	evs, err := c.Follow(ctx, "th1", "r1", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer evs.Close()
	sub, err := c.Submit(ctx, natsagent.RunRequest{RunID: "r1", ThreadID: "th1", Input: natsagent.UserInput("count")})
	if err != nil {
		t.Fatal(err)
	}
	if sub.Duplicate || sub.Sequence == 0 {
		t.Errorf("submitted %+v", sub)
	}
	var deltas strings.Builder
	var finished *natsagent.FinishedData
	for finished == nil {
		ev, err := evs.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		deltas.WriteString(ev.Delta())
		finished = ev.Finished()
	}
	if finished.Status != natsagent.StatusSuccess || finished.Output == nil || finished.Output.Content != "one two three" {
		t.Errorf("run.finished %+v", finished)
	}
	if deltas.String() != "one two three" {
		t.Errorf("deltas made %q", deltas.String())
	}
	run, err := c.Wait(ctx, "th1", "r1")
	if err != nil || run.Status != natsagent.StatusSuccess {
		t.Fatalf("wait: %+v, %v", run, err)
	}
	// The same request again is a duplicate, and runs nothing.
	again, err := c.Submit(ctx, natsagent.RunRequest{RunID: "r1", ThreadID: "th1", Input: natsagent.UserInput("count")})
	if err != nil || !again.Duplicate {
		t.Errorf("resubmitted: %+v, %v", again, err)
	}
	// A second run without an id gets one.
	sub2, err := c.Submit(ctx, natsagent.RunRequest{ThreadID: "th1", Input: natsagent.UserInput("more")})
	if err != nil || sub2.RunID == "" {
		t.Fatalf("second run: %+v, %v", sub2, err)
	}
	if _, err := c.Wait(ctx, "th1", sub2.RunID); err != nil {
		t.Fatal(err)
	}

	th, err := c.Thread(ctx, "th1")
	if err != nil || th.ThreadID != "th1" {
		t.Fatalf("thread: %+v, %v", th, err)
	}
	runs, err := c.Runs(ctx, "th1")
	if err != nil || len(runs) != 2 {
		t.Fatalf("runs: %d, %v", len(runs), err)
	}
	threads, err := c.Threads(ctx)
	if err != nil || len(threads) != 1 {
		t.Errorf("threads: %d, %v", len(threads), err)
	}
	st, err := c.State(ctx, "th1")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(st.Messages); n != 4 || st.Messages[3].Content != "again" {
		t.Errorf("state has %d messages: %+v", n, st.Messages)
	}
	u, err := c.RunUsage(ctx, "r1")
	if err != nil || u.Total.Input != 11 || u.Total.Output != 3 {
		t.Errorf("run usage %+v, %v", u, err)
	}
	tu, err := c.ThreadUsage(ctx, "th1")
	if err != nil || tu.Total.Input < 11 {
		t.Errorf("thread usage %+v, %v", tu, err)
	}
	if _, err := c.Run(ctx, "nope"); !errors.Is(err, natsagent.ErrNotFound) {
		t.Errorf("a missing run: %v", err)
	}
}

// A client acts as one tenant: it cannot submit as another, nor read
// another tenant's records.
func TestClient_TenantIsolation(t *testing.T) {
	d := natsagenttest.Start(t, natsagent.Config{}, natsagenttest.Text("secret answer"))
	ctx := bg(t)
	res := d.Ask("shared", "", "hello")
	natsagenttest.RequireStatus(t, res, natsagent.StatusSuccess)

	other, err := natsagent.NewClient(d.Conn, &natsagent.ClientConfig{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Run(ctx, res.Run.RunID); !errors.Is(err, natsagent.ErrNotFound) {
		t.Errorf("tenant acme read default's run: %v", err)
	}
	if _, err := other.State(ctx, "shared"); !errors.Is(err, natsagent.ErrNotFound) {
		t.Errorf("tenant acme read default's thread: %v", err)
	}
	if _, err := other.Submit(ctx, natsagent.RunRequest{ThreadID: "x", Tenant: "default", Input: natsagent.UserInput("hi")}); err == nil {
		t.Error("tenant acme submitted as default")
	}
	for _, bad := range []string{"a.b", "a*", "", "../x", "a b"} {
		if _, err := other.Submit(ctx, natsagent.RunRequest{ThreadID: bad, Input: natsagent.UserInput("hi")}); err == nil {
			t.Errorf("thread id %q accepted", bad)
		}
		if _, err := other.Run(ctx, bad); err == nil || errors.Is(err, natsagent.ErrNotFound) {
			t.Errorf("run id %q not refused as invalid: %v", bad, err)
		}
	}
	forged := natsagent.RunRequest{ThreadID: "x", Input: natsagent.UserInput("hi"), Principal: &protocol.Principal{User: "admin", Roles: []string{"admin"}}}
	if _, err := d.Client.Submit(ctx, forged); err == nil || !strings.Contains(err.Error(), "principal") {
		t.Errorf("a request naming its own principal: %v", err)
	}
	child := natsagent.RunRequest{ThreadID: "x", Input: natsagent.UserInput("hi"), Parent: &protocol.Parent{RunID: res.Run.RunID, ThreadID: "shared", ToolCallID: "c1"}}
	if _, err := d.Client.Submit(ctx, child); err == nil || !strings.Contains(err.Error(), "parent") {
		t.Errorf("a request naming a parent: %v", err)
	}
	if _, err := natsagent.NewClient(d.Conn, &natsagent.ClientConfig{Tenant: "a.>"}); err == nil {
		t.Error("a tenant with wildcards was accepted")
	}
}

// Approve answers an approval interrupt; Cancel stops a running run.
func TestClient_ApproveAndCancel(t *testing.T) {
	d := natsagenttest.Start(t, natsagent.Config{Agents: []natsagent.Agent{{
		Name:     "careful",
		Tools:    []natsagent.Tool{addTool},
		Settings: map[string]any{"tool_approval": map[string]any{"tools": []string{"add"}}},
	}}},
		natsagenttest.ToolCall("add", `{"a":1,"b":1}`),
		natsagenttest.Text("It is 2."),
		natsagenttest.Reply{Text: "slow", Delay: time.Hour},
	)
	ctx := bg(t)
	res := d.Ask("th", "careful", "1+1?")
	natsagenttest.RequireStatus(t, res, natsagent.StatusInterrupted)
	natsagenttest.RequireEvent(t, res, natsagent.EventApprovalRequested)

	if _, err := d.Client.Approve(ctx, "th"); err == nil {
		t.Error("no decision for one waiting call was accepted")
	}
	if _, err := d.Client.Approve(ctx, "th", natsagent.Decision{Type: "maybe"}); err == nil {
		t.Error("an unknown decision was accepted")
	}
	sub, err := d.Client.Approve(ctx, "th", natsagent.Decision{Type: natsagent.DecisionApprove})
	if err != nil {
		t.Fatal(err)
	}
	run, err := d.Client.Wait(ctx, "th", sub.RunID)
	if err != nil || run.Status != natsagent.StatusSuccess || run.Output.Content != "It is 2." {
		t.Fatalf("after approval: %+v, %v", run, err)
	}
	if _, err := d.Client.Approve(ctx, "th", natsagent.Decision{Type: natsagent.DecisionApprove}); err == nil {
		t.Error("approved a thread that waits for nothing")
	}

	// The third reply hangs: cancel the run while the model is called.
	sub, err = d.Client.Submit(ctx, natsagent.RunRequest{ThreadID: "th", Agent: "careful", Input: natsagent.UserInput("slow")})
	if err != nil {
		t.Fatal(err)
	}
	for {
		rec, err := d.Client.Run(ctx, sub.RunID)
		if err == nil && rec.Status == natsagent.StatusRunning && len(d.ModelRequests()) == 3 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the run never reached the model")
		case <-time.After(20 * time.Millisecond):
		}
	}
	status, err := d.Client.Cancel(ctx, "th", sub.RunID)
	if err != nil {
		t.Fatal(err)
	}
	run, err = d.Client.Wait(ctx, "th", sub.RunID)
	if err != nil || run.Status != natsagent.StatusCancelled {
		t.Errorf("after cancel (%s): %+v, %v", status, run, err)
	}
	if _, err := d.Client.Cancel(ctx, "th", "no-such-run"); !errors.Is(err, natsagent.ErrNotFound) {
		t.Errorf("cancel of a missing run: %v", err)
	}
}

// Files written by a run are read through the client.
func TestClient_Files(t *testing.T) {
	d := natsagenttest.Start(t, natsagent.Config{},
		natsagenttest.ToolCall("write_file", `{"path":"/notes/a.txt","content":"hello file"}`),
		natsagenttest.Text("written"),
	)
	ctx := bg(t)
	// write_file asks for approval unless the run trusts its tools.
	res := d.Submit(natsagent.RunRequest{ThreadID: "fth", Input: natsagent.UserInput("write it"),
		Config: natsagent.RunConfig{ToolApprovalMode: "always_trust"}})
	natsagenttest.RequireStatus(t, res, natsagent.StatusSuccess)
	list, err := d.Client.Files(ctx, "fth")
	if err != nil || len(list) != 1 || list[0].Path != "/notes/a.txt" {
		t.Fatalf("files %+v, %v", list, err)
	}
	data, err := d.Client.ReadFile(ctx, "fth", "/notes/a.txt")
	if err != nil || string(data) != "hello file" {
		t.Errorf("read %q, %v", data, err)
	}
	if _, err := d.Client.ReadFile(ctx, "fth", "/nope"); !errors.Is(err, natsagent.ErrNotFound) {
		t.Errorf("a missing file: %v", err)
	}
	other, err := natsagent.NewClient(d.Conn, &natsagent.ClientConfig{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.ReadFile(ctx, "fth", "/notes/a.txt"); err == nil {
		t.Error("tenant acme read default's file")
	}
	if _, err := d.Client.ReadFile(ctx, "fth", "/../../default/other/x"); err == nil {
		t.Error("a path escaping the thread was read")
	}
}

// A run no worker has taken yet is read from its request (pending); its id
// on another thread is refused; a client's runs open with run.queued.
func TestClient_QueuedRunAndTakenRunID(t *testing.T) {
	dep := testdeploy.Start(t, bus.Settings{})
	ctx := bg(t)
	c, err := natsagent.NewClient(dep.NC, nil)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := c.Submit(ctx, natsagent.RunRequest{RunID: "q1", ThreadID: "qa", Agent: "chatbot", Input: natsagent.UserInput("hi")})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := c.Run(ctx, "q1")
	if err != nil || rec.Status != natsagent.StatusPending || rec.ThreadID != "qa" || rec.Agent != "chatbot" || rec.MsgSeq != sub.Sequence {
		t.Fatalf("a queued run reads %+v, %v", rec, err)
	}
	// RunOf, which names the thread, reads it too (a run handed back
	// between workers looks the same: no record, no lease, its request in
	// the stream); on another thread it is not found.
	if rec, err := c.RunOf(ctx, "qa", "q1"); err != nil || rec.Status != natsagent.StatusPending || rec.MsgSeq != sub.Sequence {
		t.Fatalf("RunOf of a queued run: %+v, %v", rec, err)
	}
	if _, err := c.RunOf(ctx, "qb", "q1"); !errors.Is(err, natsagent.ErrNotFound) {
		t.Errorf("RunOf of q1 on thread qb: %v", err)
	}
	// Another tenant does not see it.
	other, err := natsagent.NewClient(dep.NC, &natsagent.ClientConfig{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.RunOf(ctx, "qa", "q1"); !errors.Is(err, natsagent.ErrNotFound) {
		t.Errorf("tenant acme read default's queued run with RunOf: %v", err)
	}
	if _, err := other.Run(ctx, "q1"); !errors.Is(err, natsagent.ErrNotFound) {
		t.Errorf("tenant acme read default's queued run: %v", err)
	}
	// The same id on another thread is refused; on its thread it is a
	// duplicate.
	if _, err := c.Submit(ctx, natsagent.RunRequest{RunID: "q1", ThreadID: "qb", Input: natsagent.UserInput("hi")}); !errors.Is(err, natsagent.ErrRunIDTaken) || !strings.Contains(err.Error(), "thread qa") {
		t.Errorf("run id of thread qa reused on qb: %v", err)
	}
	if again, err := c.Submit(ctx, natsagent.RunRequest{RunID: "q1", ThreadID: "qa", Input: natsagent.UserInput("hi")}); err != nil || !again.Duplicate {
		t.Errorf("a retry: %+v, %v", again, err)
	}
	// Another tenant's run of the same id is its own.
	if s, err := other.Submit(ctx, natsagent.RunRequest{RunID: "q1", ThreadID: "qb", Input: natsagent.UserInput("hi")}); err != nil || s.Duplicate {
		t.Errorf("tenant acme's run q1: %+v, %v", s, err)
	}
	// The request says who submitted it, so the worker announces the run.
	m, err := dep.JS.Stream(ctx, dep.Settings.Names.RunsStream())
	if err != nil {
		t.Fatal(err)
	}
	raw, err := m.GetMsg(ctx, sub.Sequence)
	if err != nil || raw.Header.Get(protocol.HeaderSubmitter) != natsagent.DefaultClientName {
		t.Errorf("request headers %v, %v", raw.Header, err)
	}
}

// FollowThread sees every run of a thread; RunOf refuses a run of another
// thread; Checkpoints reads the thread's chain; FinishedEvent stands for a
// run whose events expired; DeleteRun and DeleteThread remove them.
func TestClient_ThreadFollowHistoryAndDelete(t *testing.T) {
	d := natsagenttest.Start(t, natsagent.Config{}, natsagenttest.Text("one"), natsagenttest.Text("two"))
	ctx := bg(t)
	c := d.Client
	evs, err := c.FollowThread(ctx, "ft", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer evs.Close()
	first := d.Ask("ft", "", "a")
	second := d.Ask("ft", "", "b")
	natsagenttest.RequireStatus(t, second, natsagent.StatusSuccess)
	var finished []string
	var types []string
	for len(finished) < 2 {
		ev, err := evs.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		types = append(types, ev.Type)
		var env protocol.Event
		if err := json.Unmarshal(ev.Raw(), &env); err != nil || env.Type != ev.Type || env.RunID != ev.RunID {
			t.Fatalf("raw %s of %+v: %v", ev.Raw(), ev.Event, err)
		}
		if ev.Finished() != nil {
			finished = append(finished, ev.RunID)
		}
	}
	if finished[0] != first.Run.RunID || finished[1] != second.Run.RunID || types[0] != natsagent.EventRunQueued {
		t.Errorf("thread events: finished %v, types %v", finished, types)
	}
	if _, err := c.RunOf(ctx, "elsewhere", first.Run.RunID); !errors.Is(err, natsagent.ErrNotFound) {
		t.Errorf("RunOf with another thread: %v", err)
	}
	if r, err := c.RunOf(ctx, "ft", first.Run.RunID); err != nil || r.Status != natsagent.StatusSuccess {
		t.Errorf("RunOf: %+v, %v", r, err)
	}
	chain, err := c.Checkpoints(ctx, "ft")
	if err != nil || len(chain) == 0 || chain[len(chain)-1].RunID != second.Run.RunID || chain[0].RunID != first.Run.RunID {
		t.Fatalf("checkpoints: %d, %v", len(chain), err)
	}
	fin, err := natsagent.FinishedEvent(first.Run)
	if err != nil || fin.Type != natsagent.EventRunFinished || fin.Finished().Output.Content != "one" {
		t.Fatalf("finished event %+v, %v", fin, err)
	}
	if _, err := natsagent.FinishedEvent(&natsagent.Run{Status: natsagent.StatusPending}); err == nil {
		t.Error("a run.finished for a pending run")
	}
	if _, err := c.DeleteRun(ctx, "ft", first.Run.RunID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RunOf(ctx, "ft", first.Run.RunID); !errors.Is(err, natsagent.ErrNotFound) {
		t.Errorf("a deleted run reads %v", err)
	}
	if _, err := c.DeleteThread(ctx, "ft", nil); err != nil {
		t.Fatal(err)
	}
	// The leader answers a deleted thread at once: one read, not a wait
	// for a write in flight (2 s a miss before).
	gets, err := d.Conn.SubscribeSync("$JS.API.STREAM.MSG.GET.KV_" + bus.DefaultNames().ThreadsBucket())
	if err != nil {
		t.Fatal(err)
	}
	defer gets.Unsubscribe()
	if err := d.Conn.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Thread(ctx, "ft"); !errors.Is(err, natsagent.ErrNotFound) {
		t.Errorf("a deleted thread reads %v", err)
	}
	if err := d.Conn.Flush(); err != nil {
		t.Fatal(err)
	}
	if n, _, _ := gets.Pending(); n != 1 {
		t.Errorf("reading a deleted thread took %d leader reads, want 1", n)
	}
	if _, err := c.DeleteThread(ctx, "a.b", nil); err == nil {
		t.Error("a thread id with a dot was sent")
	}
}
