package worker

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
)

// TestRunningRunHasNoRecordItsLeaseSaysIt: protocol v2 writes no record
// when a run starts. While a plain-published run runs, agent_runs has no
// key for it, the thread's lease carries its attempt, and the view answers
// it running; at the end the release carries last_run and the terminal
// record has the attempt's fields.
func TestRunningRunHasNoRecordItsLeaseSaysIt(t *testing.T) {
	h := newHarness(t)
	release := make(chan struct{})
	m := model.NewScripted(func(int, *model.Request) model.Reply {
		<-release
		return model.Reply{Text: "done"}
	})
	h.startWorker(m, nil)
	ctx := context.Background()
	w := h.watch(protocol.DefaultTenant, "t1", "r1")
	seq := h.submit(request("t1", "r1", "hi"))

	var view *protocol.Run
	deadline := time.Now().Add(30 * time.Second)
	for {
		v, _, err := h.stores.RunView(ctx, protocol.DefaultTenant, "t1", "r1")
		if err == nil && v.Status == protocol.StatusRunning {
			view = v
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the run never read running: %v, %v", v, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, _, err := h.stores.Runs.Get(ctx, protocol.DefaultTenant, "r1"); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("a running run has a record (err %v): v2 writes none at start", err)
	}
	th, _, err := h.stores.Threads.Get(ctx, protocol.DefaultTenant, "t1")
	if err != nil {
		t.Fatal(err)
	}
	if th.Lease == nil || th.Lease.Attempt != 1 || th.Lease.Agent != protocol.DefaultAgent || th.Lease.CreatedAt == nil {
		t.Fatalf("lease %+v: want attempt 1, the agent and created_at", th.Lease)
	}
	if view.Attempt != 1 || view.StartedAt == nil || view.Worker == "" || view.Epoch != th.Lease.Epoch || view.MsgSeq != seq || view.Agent != protocol.DefaultAgent {
		t.Fatalf("running view %+v", view)
	}

	close(release)
	if d := w.finished(t, 30*time.Second); d.Status != protocol.StatusSuccess {
		t.Fatalf("run ended %s: %s", d.Status, d.Error)
	}
	rec := h.run(protocol.DefaultTenant, "r1")
	if rec.Status != protocol.StatusSuccess || rec.Attempt != 1 || rec.StartedAt == nil || rec.Worker != view.Worker || rec.Epoch != view.Epoch || rec.MsgSeq != seq {
		t.Fatalf("terminal record %+v", rec)
	}
	th, _, err = h.stores.Threads.Get(ctx, protocol.DefaultTenant, "t1")
	if err != nil {
		t.Fatal(err)
	}
	if th.Lease != nil || th.LastRun == nil || th.LastRun.RunID != "r1" || th.LastRun.Status != protocol.StatusSuccess || th.LastRun.Seq != rec.Seq {
		t.Fatalf("released thread: lease %+v, last_run %+v", th.Lease, th.LastRun)
	}
	if w.count(protocol.EventRunFinished) != 1 || w.count(protocol.EventRunQueued) != 0 {
		t.Fatalf("events %v", w.types())
	}
}

// TestRunFinishedFromLastRun: a worker that released the thread (with the
// run's last_run) and stopped before the terminal record is finished by
// the next delivery from last_run: the record and one run.finished are
// written, and the model is never called again.
func TestRunFinishedFromLastRun(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	w := h.watch(protocol.DefaultTenant, "t1", "r1")
	seq := h.submit(request("t1", "r1", "hi"))
	// What the dead worker's release left: no lease, the run's summary.
	now := time.Now().UTC()
	last := &protocol.Run{RunID: "r1", ThreadID: "t1", Tenant: protocol.DefaultTenant, Agent: protocol.DefaultAgent,
		Status: protocol.StatusSuccess, Attempt: 1, CreatedAt: now, StartedAt: &now, FinishedAt: &now,
		Output: &model.Message{Role: model.RoleAssistant, Content: "from last_run"}, Worker: "gone", Epoch: 1, MsgSeq: seq, Seq: 1}
	th := &protocol.Thread{ThreadID: "t1", Tenant: protocol.DefaultTenant, CreatedAt: now, UpdatedAt: now, Status: protocol.ThreadIdle,
		Epoch: 1, LastRunID: "r1", RecentRuns: []string{"r1"}, LastRun: last}
	if _, err := h.stores.Threads.Put(ctx, th, 0); err != nil {
		t.Fatal(err)
	}
	if v, _, err := h.stores.RunView(ctx, protocol.DefaultTenant, "t1", "r1"); err != nil || v.Status != protocol.StatusSuccess {
		t.Fatalf("the view of a run with only last_run: %+v, %v", v, err)
	}
	var calls atomic.Int32
	m := model.NewScripted(func(int, *model.Request) model.Reply {
		calls.Add(1)
		return model.Reply{Text: "ran again"}
	})
	h.startWorker(m, nil)
	d := w.finished(t, 30*time.Second)
	if d.Status != protocol.StatusSuccess || d.Output == nil || d.Output.Content != "from last_run" {
		t.Fatalf("run.finished %+v", d)
	}
	rec := h.run(protocol.DefaultTenant, "r1")
	if rec.Status != protocol.StatusSuccess || rec.Output == nil || rec.Output.Content != "from last_run" || rec.MsgSeq != seq || rec.Epoch != 1 {
		t.Fatalf("record %+v", rec)
	}
	// The request is acked: a second run of the thread starts and ends.
	w2 := h.watch(protocol.DefaultTenant, "t1", "r2")
	h.submit(request("t1", "r2", "again"))
	if d := w2.finished(t, 30*time.Second); d.Status != protocol.StatusSuccess {
		t.Fatalf("next run %+v", d)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("model called %d times, want once (r2 only): r1 ran again", n)
	}
	if n := w.count(protocol.EventRunFinished); n != 1 {
		t.Fatalf("%d run.finished for r1", n)
	}
}
