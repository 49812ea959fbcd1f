package worker

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/testdeploy"
)

// Fold-4 edge (a): a worker released r1's thread (its summary in
// last_run) and died before r1's record; before r1's request came back, a
// steer run took the thread and finished, replacing last_run. r1 must
// not run again: the steer's release records r1 from the summary first,
// and r1's redelivery finds its record ended.
func TestSteerAfterADeadReleaseDoesNotRunTheFirstRunAgain(t *testing.T) {
	const ackWait = 8 * time.Second
	h := newHarnessWith(t, bus.Settings{AckWait: ackWait, MaxDeliver: 5})
	ctx := context.Background()
	w1 := h.watch(protocol.DefaultTenant, "t1", "r1")
	seq := h.submit(request("t1", "r1", "first"))
	// The dead worker holds r1's delivery: it comes back an ack wait later.
	cons, err := h.js.Consumer(ctx, h.names.RunsStream(), bus.RunsConsumer)
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		if md, _ := m.Metadata(); md == nil || md.Sequence.Stream != seq {
			t.Fatalf("fetched %v, want r1's request (seq %d)", md, seq)
		}
	}
	// What its release left: no lease, r1's summary.
	now := time.Now().UTC()
	last := &protocol.Run{RunID: "r1", ThreadID: "t1", Tenant: protocol.DefaultTenant, Agent: protocol.DefaultAgent,
		Status: protocol.StatusSuccess, Attempt: 1, CreatedAt: now, StartedAt: &now, FinishedAt: &now,
		Output: &model.Message{Role: model.RoleAssistant, Content: "from last_run"}, Worker: "gone", Epoch: 1, MsgSeq: seq, Seq: 1}
	th := &protocol.Thread{ThreadID: "t1", Tenant: protocol.DefaultTenant, CreatedAt: now, UpdatedAt: now, Status: protocol.ThreadIdle,
		Epoch: 1, LastRunID: "r1", RecentRuns: []string{"r1"}, LastRun: last}
	if _, err := h.stores.Threads.Put(ctx, th, 0); err != nil {
		t.Fatal(err)
	}

	var r1Calls, calls atomic.Int32
	m := model.Func(func(ctx context.Context, req *model.Request, onDelta func(model.Delta)) (*model.Response, error) {
		calls.Add(1)
		if req.LastUserContent() == "first" {
			r1Calls.Add(1)
		}
		return &model.Response{Message: model.Message{Role: model.RoleAssistant, Content: "ran"}}, nil
	})
	h.startWorker(m, nil)
	w2 := h.watch(protocol.DefaultTenant, "t1", "r2")
	steer := request("t1", "r2", "second")
	steer.MultitaskStrategy = protocol.StrategySteer
	h.submit(steer)
	if d := w2.finished(t, 30*time.Second); d.Status != protocol.StatusSuccess {
		t.Fatalf("steer run %+v", d)
	}
	if got := h.threadRecord(protocol.DefaultTenant, "t1").LastRun; got == nil || got.RunID != "r2" {
		t.Fatalf("last_run after the steer: %+v", got)
	}

	// r1's delivery comes back after the ack wait.
	d := w1.finished(t, 10*ackWait)
	if d.Status != protocol.StatusSuccess || d.Output == nil || d.Output.Content != "from last_run" {
		t.Fatalf("r1 run.finished %+v", d)
	}
	testdeploy.WaitFor(t, 5*ackWait, "r1's request acked", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0
	})
	if n := r1Calls.Load(); n != 0 {
		t.Fatalf("r1 called the model %d times after its end: it ran again", n)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("model called %d times, want once (r2)", n)
	}
	if rec := h.run(protocol.DefaultTenant, "r1"); rec.Status != protocol.StatusSuccess || rec.MsgSeq != seq {
		t.Fatalf("r1 record %+v", rec)
	}
	if n := w1.count(protocol.EventRunFinished); n != 1 {
		t.Fatalf("%d run.finished for r1, want 1", n)
	}
}

// Fold-4 edge (b): a cancel that lands between the read that decides to
// start a pending run and the lease the run takes (so the cancel sees no
// lease to signal) still stops the run: it ends cancelled, its model call
// cut short, and the thread's summary agrees with its record.
func TestCancelRacingTheLeaseTakeStopsTheRun(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	var wh *workerHandle
	var once atomic.Bool
	cancelled := make(chan error, 1)
	testHookLooked = func(j *job) {
		if j.req.RunID == "r1" && once.CompareAndSwap(false, true) {
			_, err := wh.w.cancelRun(ctx, j.req.Tenant, j.req.ThreadID, j.req.RunID, false)
			cancelled <- err
		}
	}
	t.Cleanup(func() { testHookLooked = nil })
	completed := make(chan struct{}, 1)
	m := model.Func(func(ctx context.Context, req *model.Request, onDelta func(model.Delta)) (*model.Response, error) {
		if err := callRunsOut(ctx, completed); err != nil {
			return nil, err
		}
		return &model.Response{Message: model.Message{Role: model.RoleAssistant, Content: "ran"}}, nil
	})
	wh = h.startWorker(m, nil)
	w := h.watch(protocol.DefaultTenant, "t1", "r1")
	h.submit(request("t1", "r1", "hello"))
	if err := <-cancelled; err != nil {
		t.Fatalf("cancel: %v", err)
	}
	d := w.finished(t, 30*time.Second)
	if d.Status != protocol.StatusCancelled {
		t.Fatalf("run ended %s, want cancelled", d.Status)
	}
	// The run took the lease: its release says how it ended.
	testdeploy.WaitFor(t, time.Minute, "the run's release of the thread", func() bool {
		th, _, err := h.stores.Threads.Get(ctx, protocol.DefaultTenant, "t1")
		return err == nil && th.Lease == nil && th.LastRun != nil && th.LastRun.RunID == "r1"
	})
	select {
	case <-completed:
		t.Fatal("the cancelled run's model call ran to its end")
	default:
	}
	if last := h.threadRecord(protocol.DefaultTenant, "t1").LastRun; last != nil && last.Status != protocol.StatusCancelled {
		t.Fatalf("the thread says its last run ended %s; the record says cancelled", last.Status)
	}
	if n := w.count(protocol.EventRunFinished); n != 1 {
		t.Fatalf("%d run.finished, want 1", n)
	}
}

// The same race on a thread that exists, where the run takes its lease
// after its look (admit), not with it: the cancel ends the pending run's
// record while the run decides, sees no lease, and lists the run on the
// thread (cancelled_runs); the run's lease write then finds it listed and
// the run never starts. Without the cancel's write of the thread record
// the run would take the lease, read nothing more, and run to its end.
func TestCancelRacingTheLeaseTakeOnAnExistingThread(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	var wh *workerHandle
	var once atomic.Bool
	cancelled := make(chan error, 1)
	testHookLooked = func(j *job) {
		if j.req.RunID == "r1" && once.CompareAndSwap(false, true) {
			_, err := wh.w.cancelRun(ctx, j.req.Tenant, j.req.ThreadID, j.req.RunID, false)
			cancelled <- err
		}
	}
	t.Cleanup(func() { testHookLooked = nil })
	var r1Calls atomic.Int32
	completed := make(chan struct{}, 1)
	m := model.Func(func(ctx context.Context, req *model.Request, onDelta func(model.Delta)) (*model.Response, error) {
		if req.LastUserContent() == "second" {
			r1Calls.Add(1)
			if err := callRunsOut(ctx, completed); err != nil {
				return nil, err
			}
		}
		return &model.Response{Message: model.Message{Role: model.RoleAssistant, Content: "ran"}}, nil
	})
	wh = h.startWorker(m, nil)
	w0 := h.watch(protocol.DefaultTenant, "t1", "r0")
	h.submit(request("t1", "r0", "first"))
	if d := w0.finished(t, 30*time.Second); d.Status != protocol.StatusSuccess {
		t.Fatalf("r0 ended %s", d.Status)
	}

	w := h.watch(protocol.DefaultTenant, "t1", "r1")
	h.submit(request("t1", "r1", "second"))
	if err := <-cancelled; err != nil {
		t.Fatalf("cancel: %v", err)
	}
	if d := w.finished(t, 30*time.Second); d.Status != protocol.StatusCancelled {
		t.Fatalf("run ended %s, want cancelled", d.Status)
	}
	cons, err := h.js.Consumer(ctx, h.names.RunsStream(), bus.RunsConsumer)
	if err != nil {
		t.Fatal(err)
	}
	testdeploy.WaitFor(t, time.Minute, "r1's request acked", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0
	})
	select {
	case <-completed:
		t.Fatal("the cancelled run's model call ran to its end")
	default:
	}
	if n := r1Calls.Load(); n != 0 {
		t.Fatalf("the cancelled run called the model %d times; it must not start", n)
	}
	th := h.threadRecord(protocol.DefaultTenant, "t1")
	if th.Lease != nil || !th.RunCancelled("r1") {
		t.Fatalf("thread after the cancel: lease %+v, cancelled_runs %v", th.Lease, th.CancelledRuns)
	}
	if last := th.LastRun; last == nil || last.RunID != "r0" {
		t.Fatalf("the thread's last run is %+v, want r0", last)
	}
	if rec := h.run(protocol.DefaultTenant, "r1"); rec.Status != protocol.StatusCancelled {
		t.Fatalf("r1's record says %s", rec.Status)
	}
	if n := w.count(protocol.EventRunFinished); n != 1 {
		t.Fatalf("%d run.finished, want 1", n)
	}
	// The thread takes runs as before.
	w2 := h.watch(protocol.DefaultTenant, "t1", "r2")
	h.submit(request("t1", "r2", "third"))
	if d := w2.finished(t, 30*time.Second); d.Status != protocol.StatusSuccess {
		t.Fatalf("r2 ended %s", d.Status)
	}
}

// A cancel that sees a run's lease signals the lease's worker, which may
// not have registered the run as running yet (between its lease write and
// its start): the signal is kept and the run stops as it starts.
func TestCancelSignalledBeforeTheRunRegistersStopsIt(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	var wh *workerHandle
	var once atomic.Bool
	testHookLeased = func(j *job) {
		if j.req.RunID != "r1" || !once.CompareAndSwap(false, true) {
			return
		}
		wh.w.cancelIfStarted(ctx, j.req.Tenant, j.req.ThreadID, j.req.RunID, "", false)
		waitCancelKept(t, wh, j)
	}
	t.Cleanup(func() { testHookLeased = nil })
	completed := make(chan struct{}, 1)
	m := model.Func(func(ctx context.Context, req *model.Request, onDelta func(model.Delta)) (*model.Response, error) {
		if err := callRunsOut(ctx, completed); err != nil {
			return nil, err
		}
		return &model.Response{Message: model.Message{Role: model.RoleAssistant, Content: "ran"}}, nil
	})
	wh = h.startWorker(m, nil)
	w := h.watch(protocol.DefaultTenant, "t1", "r1")
	h.submit(request("t1", "r1", "hello"))
	if d := w.finished(t, 30*time.Second); d.Status != protocol.StatusCancelled {
		t.Fatalf("run ended %s, want cancelled", d.Status)
	}
	select {
	case <-completed:
		t.Fatal("the cancelled run's model call ran to its end")
	default:
	}
	wh.w.mu.Lock()
	left := len(wh.w.cancelAsked)
	wh.w.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d kept cancel signals left after the run took its own", left)
	}
}

// A cancel of a run no worker has seen, on a thread that does not exist
// yet, creates the thread record (so a lease guess finds the run
// cancelled) with the owner the run's first lease would have given it,
// and the creation index key names that owner: the owner's searches,
// which read only keys naming them, list the thread.
func TestCancelBeforeTheFirstRunOwnsTheNewThread(t *testing.T) {
	h := newHarness(t)
	started := make(chan struct{}, 2)
	m := model.NewScripted(func(n int, req *model.Request) model.Reply {
		started <- struct{}{}
		return model.Reply{Text: strings.Repeat("y ", 500), Pieces: 500, PieceDelay: 20 * time.Millisecond}
	})
	h.startWorker(m, func(c *Config) { c.Concurrency = 1 })
	h.submit(request("busy", "first", "go"))
	natstest.Recv(t, started, "the model call of run first")

	req := request("fresh", "queued", "later")
	req.Principal = &protocol.Principal{User: "alice"}
	h.submit(req)
	if r, e := h.cancel("default", "fresh", "queued"); e != nil || r.Status != protocol.StatusCancelled {
		t.Fatalf("cancel: %+v %+v", r, e)
	}
	ctx := context.Background()
	th, _, err := h.stores.Threads.Get(ctx, "default", "fresh")
	if err != nil {
		t.Fatal(err)
	}
	if th.Owner != "alice" || !th.RunCancelled("queued") {
		t.Fatalf("thread owner %q, cancelled runs %v", th.Owner, th.CancelledRuns)
	}
	kvb, err := h.js.KeyValue(ctx, h.names.ThreadsBucket())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kvb.Get(ctx, kv.CreatedKey("default", "fresh", "alice")); err != nil {
		t.Fatalf("the creation index key naming alice: %v", err)
	}
}

// callRunsOut is a model call that answers after 20 s unless its run is
// stopped first (ctx's error); one that ran to its end says so on
// completed.
func callRunsOut(ctx context.Context, completed chan<- struct{}) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(20 * time.Second):
	}
	completed <- struct{}{}
	return nil
}

// A cancel that reaches the lease's worker before the run registers as
// running (the worker keeps the signal and answers that it runs nothing
// yet) then finds the run ended cancelled by that signal: the answer is
// cancelled, not a conflict saying the run had already finished. Before,
// the gateway's rollback cancel answered 409 "already finished with
// status cancelled" for a run its own request had cancelled (seen under
// stress-ng --cpu 6 in gateway TestCancelRollback, 1 of 40).
func TestCancelThatTheRunTookAsItStartedAnswersCancelled(t *testing.T) {
	h := newHarness(t)
	var wh *workerHandle
	var once atomic.Bool
	kept := make(chan struct{})
	testHookLeased = func(j *job) {
		if j.req.RunID != "r1" || !once.CompareAndSwap(false, true) {
			return
		}
		waitCancelKept(t, wh, j)
		close(kept)
	}
	t.Cleanup(func() { testHookLeased = nil })
	var w *watcher
	testHookCancelUnanswered = func(run string) {
		if run != "r1" {
			return
		}
		// The run takes the kept signal and ends before the cancel
		// goes on.
		<-kept
		w.finished(t, 30*time.Second)
	}
	t.Cleanup(func() { testHookCancelUnanswered = nil })
	m := model.Func(func(ctx context.Context, req *model.Request, onDelta func(model.Delta)) (*model.Response, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	wh = h.startWorker(m, nil)
	w = h.watch(protocol.DefaultTenant, "t1", "r1")
	h.submit(request("t1", "r1", "hello"))
	testdeploy.WaitFor(t, 30*time.Second, "the run's lease", func() bool {
		th, _, err := h.stores.Threads.Get(context.Background(), protocol.DefaultTenant, "t1")
		return err == nil && th.Lease != nil && th.Lease.RunID == "r1"
	})
	reply, e := h.cancel(protocol.DefaultTenant, "t1", "r1")
	if e != nil {
		t.Fatalf("cancel answered %+v, want cancelled", e.Error)
	}
	if reply.Status != protocol.StatusCancelled {
		t.Fatalf("cancel answered %s, want cancelled", reply.Status)
	}
	if d := w.finished(t, 30*time.Second); d.Status != protocol.StatusCancelled {
		t.Fatalf("run ended %s, want cancelled", d.Status)
	}
}

// waitCancelKept waits until wh's worker keeps a cancel signal for j's
// run, which has not registered as running yet (runningOrAsked).
func waitCancelKept(t *testing.T, wh *workerHandle, j *job) {
	t.Helper()
	key := bus.Key(j.req.Tenant, j.req.RunID)
	testdeploy.WaitFor(t, 30*time.Second, "the cancel signal kept for the run", func() bool {
		wh.w.mu.Lock()
		defer wh.w.mu.Unlock()
		_, ok := wh.w.cancelAsked[key]
		return ok
	})
}
