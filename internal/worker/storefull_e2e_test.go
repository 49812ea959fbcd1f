package worker

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/testdeploy"
	"github.com/natsagent/natsagent/internal/tools"
)

// smallStore is the JetStream file store of the recovery tests: room for
// the provisioning (the dead-letter stream reserves its 1 MiB) and a few
// runs, filled up by file uploads.
const smallStore = 6 << 20

// newSmallHarness runs natsagent on a server whose JetStream file store
// holds smallStore bytes (max_file_store), with a short ack wait and few
// deliveries: a run that spent deliveries on a full store would use them
// all up within seconds.
func newSmallHarness(t *testing.T) *harness {
	t.Helper()
	srv := natstest.StartWith(t, bus.EmbeddedConfig{MaxStore: smallStore})
	d := testdeploy.StartOn(t, srv, bus.Settings{AckWait: 2 * time.Second, MaxDeliver: 3, DLQMaxBytes: 1 << 20})
	return &harness{t: t, srv: d.Server, nc: d.NC, js: d.JS, settings: d.Settings, names: d.Settings.Names, stores: d.Stores, tools: tools.NewRegistry()}
}

// fillStore publishes to a stream of its own until the server refuses
// for lack of room (as the file uploads did that filled a production
// store), and returns a function that purges it (frees the space).
func (h *harness) fillStore(t *testing.T) func() {
	t.Helper()
	ctx := context.Background()
	filler, err := h.js.CreateStream(ctx, jetstream.StreamConfig{Name: "FILLER", Subjects: []string{"filler"}})
	if err != nil {
		t.Fatal(err)
	}
	blob := make([]byte, 64<<10)
	for i := 0; ; i++ {
		if i > 1000 {
			t.Fatal("the store never filled")
		}
		if _, err := h.js.Publish(ctx, "filler", blob); err != nil {
			if _, full := bus.IsStoreFull(err); !full {
				t.Fatalf("fill: %v", err)
			}
			break
		}
	}
	return func() {
		if err := filler.Purge(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// gatedModel calls the tool "step" once a gate opens, then answers.
func gatedModel(gate <-chan struct{}, entered chan<- struct{}) *model.Scripted {
	return model.NewScripted(func(_ int, req *model.Request) model.Reply {
		if last := req.Messages[len(req.Messages)-1]; last.Role == model.RoleTool {
			return model.Reply{Text: "done: " + last.Content}
		}
		entered <- struct{}{}
		<-gate
		return model.Reply{ToolCalls: []model.ToolCall{{ID: "c1", Name: "step", Arguments: "{}"}}}
	})
}

func (h *harness) registerStep() {
	h.tools.Register(tools.Func(model.ToolSpec{Name: "step"}, func(context.Context, json.RawMessage) (string, error) {
		return "stepped", nil
	}))
}

// The server's store fills up (file uploads) while three runs are in the
// middle of their work: their checkpoints, lease renewals and events are
// refused with "insufficient resources". They wait, each holding its
// request (no delivery is spent: max_deliver is 3 and the ack wait 2 s),
// for longer than several ack waits. Once the uploads are deleted the runs
// finish where they were, every thread is free, and a new run on each
// thread finishes too. The test reports the store-full recovery time.
func TestStoreFullRecoveryWaitingRuns(t *testing.T) {
	h := newSmallHarness(t)
	h.registerStep()
	gate, entered := make(chan struct{}), make(chan struct{}, 3)
	rec := &fullRecorder{}
	h.startWorker(gatedModel(gate, entered), func(c *Config) { c.Metrics = rec; c.StoreFullWait = 5 * time.Minute })
	threads := []string{"t1", "t2", "t3"}
	watchers := map[string]*watcher{}
	for _, th := range threads {
		watchers[th] = h.watch("default", th, "r-"+th)
		h.submit(request(th, "r-"+th, "work"))
	}
	for _, th := range threads {
		natstest.Recv(t, entered, "the first model call of a run of "+th)
	}
	free := h.fillStore(t)
	close(gate)

	testdeploy.WaitFor(t, 30*time.Second, "the runs' writes refused for lack of room", func() bool {
		return rec.count(h.names.CheckpointsBucket()) > 0 && rec.total() >= 3
	})
	time.Sleep(4 * h.settings.AckWait) // the runs wait, their requests held
	h.requireDeliveredOnce(t)
	for _, th := range threads {
		if w := watchers[th]; w.count(protocol.EventRunFinished) != 0 {
			t.Fatalf("run of %s ended while the store was full: %v", th, w.types())
		}
		if r := h.run("default", "r-"+th); r.Status != protocol.StatusRunning || r.Attempt != 1 {
			t.Fatalf("run of %s is %s at attempt %d while waiting", th, r.Status, r.Attempt)
		}
	}

	freed := time.Now()
	free()
	for _, th := range threads {
		fin := watchers[th].finished(t, 60*time.Second)
		if fin.Status != protocol.StatusSuccess || fin.Output == nil || fin.Output.Content != "done: stepped" {
			t.Fatalf("run of %s ended %s (%s) with %+v", th, fin.Status, fin.Error, fin.Output)
		}
	}
	waitingDone := time.Since(freed)
	for _, th := range threads {
		// The events refused while the store was full were stored once
		// there was room, before run.finished: seq has no gaps.
		evs := watchers[th].all()
		seen := map[uint64]bool{}
		for _, ev := range evs {
			seen[ev.Seq] = true
		}
		last := evs[len(evs)-1]
		if last.Type != protocol.EventRunFinished || len(seen) != len(evs) || !seen[1] || !seen[last.Seq] || uint64(len(seen)) != last.Seq {
			t.Fatalf("run of %s: events %v with seqs not 1..%d once each", th, watchers[th].types(), last.Seq)
		}
	}
	for _, th := range threads {
		if r := h.run("default", "r-"+th); r.Attempt != 1 {
			t.Fatalf("run of %s needed %d attempts", th, r.Attempt)
		}
	}
	nextDone := h.nextRunsFinish(t, threads)
	t.Logf("store-full recovery: waiting runs finished %s after space was freed; new runs on the same threads %s after", waitingDone.Round(time.Millisecond), (waitingDone + nextDone).Round(time.Millisecond))
}

// The same, with a store_full_wait shorter than the outage: each run stops
// waiting and ends "error" with stop_reason store_full. Its end cannot be
// written either (the whole server is full), so the worker holds it until
// it can: once space is freed the run is recorded store_full, its thread
// is idle, and the thread's next run finishes.
func TestStoreFullRecoveryEndedRuns(t *testing.T) {
	h := newSmallHarness(t)
	h.registerStep()
	gate, entered := make(chan struct{}), make(chan struct{}, 2)
	rec := &fullRecorder{}
	h.startWorker(gatedModel(gate, entered), func(c *Config) { c.Metrics = rec; c.StoreFullWait = time.Second })
	threads := []string{"t1", "t2"}
	watchers := map[string]*watcher{}
	for _, th := range threads {
		watchers[th] = h.watch("default", th, "r-"+th)
		h.submit(request(th, "r-"+th, "work"))
	}
	for _, th := range threads {
		natstest.Recv(t, entered, "the first model call of a run of "+th)
	}
	free := h.fillStore(t)
	close(gate)
	testdeploy.WaitFor(t, 30*time.Second, "the runs' writes refused for lack of room", func() bool {
		return rec.total() >= 3
	})
	time.Sleep(4 * h.settings.AckWait)
	h.requireDeliveredOnce(t)

	freed := time.Now()
	free()
	for _, th := range threads {
		fin := watchers[th].finished(t, 60*time.Second)
		if fin.Status != protocol.StatusError || fin.StopReason != protocol.StopStoreFull {
			t.Fatalf("run of %s ended %s (%s): %s", th, fin.Status, fin.StopReason, fin.Error)
		}
		th, _, err := h.stores.Threads.Get(context.Background(), "default", th)
		if err != nil || th.Lease != nil || th.Status != protocol.ThreadIdle {
			t.Fatalf("thread after a store_full end: %+v (%v)", th, err)
		}
	}
	endedDone := time.Since(freed)
	nextDone := h.nextRunsFinish(t, threads)
	t.Logf("store-full recovery: runs ended store_full %s after space was freed; new runs on the same threads %s after", endedDone.Round(time.Millisecond), (endedDone + nextDone).Round(time.Millisecond))
}

// nextRunsFinish submits a run on each thread and waits for them all to
// succeed; it returns how long that took.
func (h *harness) nextRunsFinish(t *testing.T, threads []string) time.Duration {
	t.Helper()
	began := time.Now()
	for _, th := range threads {
		w := h.watch("default", th, "next-"+th)
		h.submit(request(th, "next-"+th, "again"))
		if fin := w.finished(t, 60*time.Second); fin.Status != protocol.StatusSuccess {
			t.Fatalf("next run of %s ended %s: %s", th, fin.Status, fin.Error)
		}
	}
	return time.Since(began)
}
