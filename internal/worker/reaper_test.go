package worker

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/testdeploy"
	"github.com/natsagent/natsagent/internal/tools"
)

// hangingModel blocks every call until its context ends, and signals each
// call on started.
func hangingModel(started chan<- struct{}) *model.Scripted {
	return model.NewScripted(func(int, *model.Request) model.Reply {
		started <- struct{}{}
		return model.Reply{Delay: time.Hour}
	})
}

// sweeping starts workers whose lease sweep runs often and considers a
// lease stale after staleAfter.
func sweeping(staleAfter time.Duration) func(*Config) {
	return func(c *Config) {
		c.StaleLease = staleAfter
		c.ReapEvery = 100 * time.Millisecond
	}
}

// A run whose worker died and whose request left the runs stream (here an
// operator deleted it) will never be redelivered: the lease sweep ends it
// as an error that says so, publishes its one run.finished and frees the
// thread.
func TestReaperEndsRunWhoseRequestIsGone(t *testing.T) {
	h := newHarnessWith(t, bus.Settings{AckWait: time.Second, MaxDeliver: 5}) // the dead worker's request is found unheld
	started := make(chan struct{}, 4)
	a := h.startWorker(hangingModel(started), nil)
	w := h.watch("default", "t1", "orphan")
	seq := h.submit(request("t1", "orphan", "work"))
	natstest.Recv(t, started, "the model call of run orphan")
	a.nc.Close()
	st, err := h.js.Stream(context.Background(), h.names.RunsStream())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteMsg(context.Background(), seq); err != nil {
		t.Fatal(err)
	}

	h.startWorker(textModel("fine", 1, 0), sweeping(1500*time.Millisecond))
	fin := w.finished(t, 15*time.Second)
	if fin.Status != protocol.StatusError || !strings.Contains(fin.Error, "no longer in the runs stream") {
		t.Fatalf("run ended %s: %q", fin.Status, fin.Error)
	}
	if rec := h.run("default", "orphan"); rec.Status != protocol.StatusError || rec.Error != fin.Error {
		t.Fatalf("record %+v", rec)
	}
	th, _, err := h.stores.Threads.Get(context.Background(), "default", "t1")
	if err != nil || th.Lease != nil {
		t.Fatalf("thread still leased: %+v (%v)", th, err)
	}
	next := h.watch("default", "t1", "next")
	h.submit(request("t1", "next", "hello"))
	if fin := next.finished(t, 10*time.Second); fin.Status != protocol.StatusSuccess {
		t.Fatalf("next run %s: %s", fin.Status, fin.Error)
	}
	time.Sleep(300 * time.Millisecond) // a second sweep must not finish it again
	if n := w.count(protocol.EventRunFinished); n != 1 {
		t.Fatalf("%d run.finished events, want 1", n)
	}
}

// The server gave up on a request (MaxDeliver deliveries) while no worker
// listened to its advisory, so nothing dead-lettered it: the work-queue
// stream keeps it, the consumer never delivers it again, and it blocks its
// thread. The lease sweep sees the run was started MaxDeliver times by
// workers now gone, ends it, dead-letters and removes the request.
func TestReaperDeadLettersExhaustedRequestWhoseAdvisoryWasLost(t *testing.T) {
	h := newHarnessWith(t, bus.Settings{AckWait: time.Second, MaxDeliver: 2}) // both deliveries run out within the test
	started := make(chan struct{}, 4)
	exceeded := make(chan struct{}, 1)
	sub, err := h.nc.Subscribe(maxDeliveriesSubject(h.names), func(*nats.Msg) { exceeded <- struct{}{} })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	w := h.watch("default", "t1", "doomed")
	seq := h.submit(request("t1", "doomed", "crash me"))
	for range 2 {
		wh := h.startWorker(hangingModel(started), nil)
		natstest.Recv(t, started, "the model call of a delivery of run doomed")
		wh.nc.Close() // the worker dies mid-run
	}
	// No worker runs when the second delivery's ack wait ends: the server
	// gives up and sends its advisory to nobody (this test only watches).
	select {
	case <-exceeded:
	case <-time.After(natstest.Patience):
		t.Fatal("no max-deliveries advisory")
	}
	cons, err := h.js.Consumer(context.Background(), h.names.RunsStream(), bus.RunsConsumer)
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	st, err := h.js.Stream(context.Background(), h.names.RunsStream())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.GetMsg(context.Background(), seq); err != nil || info.NumAckPending != 0 {
		t.Fatalf("precondition: request still stored (%v) and no longer pending (%d pending)", err, info.NumAckPending)
	}

	h.startWorker(textModel("fine", 1, 0), sweeping(time.Second))
	h.maxDeliveriesEnded(t, w, seq)
}

// The sweep never races redelivery: a lease it considers stale long before
// the holder's request is redelivered (stale after 100 ms, ack wait 2 s)
// is left alone while the request is still queued, and the run continues
// from its checkpoint on the next worker.
func TestReaperLeavesRunsPendingRedeliveryAlone(t *testing.T) {
	h := newRedeliveryHarness(t) // the dead worker's run is redelivered
	var toolRuns atomic.Int32
	h.tools.Register(tools.Func(model.ToolSpec{Name: "side_effect"}, func(context.Context, json.RawMessage) (string, error) {
		toolRuns.Add(1)
		return "done once", nil
	}))
	stuck := make(chan struct{})
	dying := model.NewScripted(func(n int, _ *model.Request) model.Reply {
		if n == 0 {
			return model.Reply{ToolCalls: []model.ToolCall{{ID: "c1", Name: "side_effect", Arguments: "{}"}}}
		}
		close(stuck)
		return model.Reply{Delay: time.Hour}
	})
	a := h.startWorker(dying, nil)
	w := h.watch("default", "t1", "r1")
	h.submit(request("t1", "r1", "do the thing"))
	natstest.Recv(t, stuck, "the second model call of run r1")
	a.nc.Close()

	healthy := model.NewScripted(func(_ int, req *model.Request) model.Reply {
		return model.Reply{Text: "finished after " + req.Messages[len(req.Messages)-1].Content}
	})
	h.startWorker(healthy, sweeping(100*time.Millisecond))
	fin := w.finished(t, 20*time.Second)
	if fin.Status != protocol.StatusSuccess || fin.Output.Content != "finished after done once" {
		t.Fatalf("run ended %s (%q) with %+v", fin.Status, fin.Error, fin.Output)
	}
	if n := toolRuns.Load(); n != 1 {
		t.Fatalf("the tool ran %d times", n)
	}
	if rec := h.run("default", "r1"); rec.Attempt != 2 {
		t.Fatalf("record attempt %d, want 2 (continued by redelivery)", rec.Attempt)
	}
}

// dlqEntries returns the dead letters of the request stored at seq, on
// any dead-letter subject.
func (h *harness) dlqEntries(t *testing.T, seq uint64) []*jetstream.RawStreamMsg {
	t.Helper()
	st, err := h.js.Stream(context.Background(), h.names.DLQStream())
	if err != nil {
		t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for next := uint64(1); ; {
		m, err := st.GetMsg(context.Background(), next, jetstream.WithGetMsgSubject(h.names.DLQSubjects()))
		if err != nil {
			return out
		}
		if m.Header.Get(HeaderDLQStreamSeq) == strconv.FormatUint(seq, 10) {
			out = append(out, m)
		}
		next = m.Sequence + 1
	}
}

// A request terminated by a client other than a worker (an operator's
// tool, say) never went through natsagent's dead-lettering: the
// termination advisory puts it in the dead-letter stream, as a marker with
// the reason when the work-queue stream already removed its body.
func TestTerminatedRequestIsDeadLettered(t *testing.T) {
	h := newHarness(t)
	started := make(chan struct{}, 1)
	// One slot, taken by a hanging run: the worker pulls nothing more.
	h.startWorker(hangingModel(started), func(c *Config) { c.Concurrency = 1 })
	h.submit(request("t0", "busy", "hang"))
	natstest.Recv(t, started, "the model call of run busy")

	seq := h.submit(request("t1", "refused", "hello"))
	cons, err := h.js.Consumer(context.Background(), h.names.RunsStream(), bus.RunsConsumer)
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for m := range batch.Messages() {
		n++
		if meta, _ := m.Metadata(); meta == nil || meta.Sequence.Stream != seq {
			t.Fatalf("fetched %+v, want the request at %d", meta, seq)
		}
		if err := m.TermWithReason("operator: refused by policy"); err != nil {
			t.Fatal(err)
		}
	}
	if n != 1 {
		t.Fatalf("fetched %d requests", n)
	}
	var entries []*jetstream.RawStreamMsg
	testdeploy.WaitFor(t, 5*time.Second, "a dead letter of the terminated request", func() bool {
		entries = h.dlqEntries(t, seq)
		return len(entries) > 0
	})
	if len(entries) != 1 || !strings.Contains(entries[0].Header.Get(HeaderDLQReason), "operator: refused by policy") {
		t.Fatalf("dead letters %d, first reason %q", len(entries), entries[0].Header.Get(HeaderDLQReason))
	}
}

// natsagent copies a request to the dead-letter stream before it
// terminates it; the termination advisory that follows adds nothing: the
// request has exactly one dead letter, with its body.
func TestOwnTerminationsDeadLetteredOnce(t *testing.T) {
	h := newHarness(t)
	h.startWorker(textModel("fine", 1, 0), nil)
	adv := make(chan uint64, 4)
	sub, err := h.nc.Subscribe(terminatedSubject(h.names), func(m *nats.Msg) {
		var a struct {
			StreamSeq uint64 `json:"stream_seq"`
		}
		_ = json.Unmarshal(m.Data, &a)
		adv <- a.StreamSeq
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	w := h.watch("default", "t1", "bad")
	data := []byte(`{"run_id": "bad", "thread_id": `)
	seq := h.publishRaw(h.names.RunSubject("default", "t1"), data, "bad")
	if fin := w.finished(t, 10*time.Second); fin.Status != protocol.StatusError {
		t.Fatalf("run ended %s", fin.Status)
	}
	select {
	case s := <-adv:
		if s != seq {
			t.Fatalf("advisory for %d, want %d", s, seq)
		}
	case <-time.After(natstest.Patience):
		t.Fatal("no termination advisory")
	}
	// The worker handled the same advisory; give it time to (not) add.
	time.Sleep(500 * time.Millisecond)
	entries := h.dlqEntries(t, seq)
	if len(entries) != 1 || string(entries[0].Data) != string(data) {
		t.Fatalf("%d dead letters for the request, want 1 copy of its body", len(entries))
	}
}

// A run started once whose request then used up its deliveries without
// starting again (here a client takes the deliveries and hands each back,
// as workers did whose writes a full store refused) is stranded: the
// consumer never delivers it again, its ack floor stays below it, the
// advisory went to nobody, and its lease holds the thread. The lease sweep
// finds that no worker holds the request at two looks two ack waits apart
// while the consumer waits for work, settles the run, dead-letters and
// removes the request, and the thread's next run runs.
func TestReaperSettlesRequestExhaustedByDeliveriesThatNeverStarted(t *testing.T) {
	h := newHarnessWith(t, bus.Settings{AckWait: time.Second, MaxDeliver: 4}) // four deliveries run out within the test
	ctx := context.Background()
	exceeded := make(chan struct{}, 1)
	sub, err := h.nc.Subscribe(maxDeliveriesSubject(h.names), func(*nats.Msg) { exceeded <- struct{}{} })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	started := make(chan struct{}, 4)
	a := h.startWorker(hangingModel(started), nil)
	w := h.watch("default", "t1", "stranded")
	seq := h.submit(request("t1", "stranded", "work"))
	natstest.Recv(t, started, "the model call of run stranded")
	a.nc.Close() // the worker dies mid-run, holding the thread's lease

	cons, err := h.js.Consumer(ctx, h.names.RunsStream(), bus.RunsConsumer)
	if err != nil {
		t.Fatal(err)
	}
	delivered := uint64(1)
	deadline := time.Now().Add(30 * time.Second)
	for delivered < 4 {
		if time.Now().After(deadline) {
			t.Fatalf("only %d deliveries", delivered)
		}
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(3*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			meta, err := m.Metadata()
			if err != nil {
				t.Fatal(err)
			}
			delivered = meta.NumDelivered
			if err := m.Nak(); err != nil {
				t.Fatal(err)
			}
		}
	}
	// One more pull makes the server notice the last delivery was its
	// last (it gives up when it would deliver again).
	if batch, err := cons.Fetch(1, jetstream.FetchMaxWait(2*time.Second)); err == nil {
		for range batch.Messages() {
			t.Fatal("a request was delivered past max_deliver")
		}
	}
	select {
	case <-exceeded:
	case <-time.After(natstest.Patience):
		t.Fatal("no max-deliveries advisory")
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rec := h.run("default", "stranded")
	if info.NumAckPending != 0 || info.AckFloor.Stream >= seq || rec.Status != protocol.StatusRunning || rec.Attempt != 1 {
		t.Fatalf("precondition: %d pending, ack floor %d (request %d), run %s at attempt %d", info.NumAckPending, info.AckFloor.Stream, seq, rec.Status, rec.Attempt)
	}

	h.startWorker(textModel("fine", 1, 0), sweeping(time.Second))
	fin := w.finished(t, 30*time.Second)
	if fin.Status != protocol.StatusError || !strings.Contains(fin.Error, "after 4 deliveries") {
		t.Fatalf("run ended %s: %q", fin.Status, fin.Error)
	}
	h.waitRunsStreamEmpty(t) // removed after its copy was stored
	if n := len(h.dlqEntries(t, seq)); n != 1 {
		t.Fatalf("the exhausted request was dead-lettered %d times, want 1", n)
	}
	th, _, err := h.stores.Threads.Get(ctx, "default", "t1")
	if err != nil || th.Lease != nil {
		t.Fatalf("thread still leased: %+v (%v)", th, err)
	}
	next := h.watch("default", "t1", "next")
	h.submit(request("t1", "next", "hello"))
	if fin := next.finished(t, 15*time.Second); fin.Status != protocol.StatusSuccess {
		t.Fatalf("next run %s: %s", fin.Status, fin.Error)
	}
}
