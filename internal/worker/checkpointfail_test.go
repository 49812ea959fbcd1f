package worker

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/metrics"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/testdeploy"
	"github.com/natsagent/natsagent/internal/tools"
)

// A checkpoint the store refuses for another reason than a full store
// (here: the bucket's max message size; in a cluster: a node lost
// mid-write) does not end the run as an error: the run is
// handed back and the next attempt continues from the last checkpoint
// that was saved, once the store takes writes again.
func TestRefusedCheckpointHandsTheRunBack(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	var toolRuns atomic.Int32
	h.tools.Register(tools.Func(model.ToolSpec{Name: "step"}, func(context.Context, json.RawMessage) (string, error) {
		toolRuns.Add(1)
		return "stepped", nil
	}))
	// Slow answers leave the test time to reopen the store between the
	// second attempt's start and its first checkpoint.
	m := model.NewScripted(func(n int, req *model.Request) model.Reply {
		if last := req.Messages[len(req.Messages)-1]; last.Role == model.RoleTool {
			return model.Reply{Text: "done: " + last.Content, Delay: time.Second}
		}
		return model.Reply{Text: "working", Delay: time.Second, ToolCalls: []model.ToolCall{{ID: "c1", Name: "step", Arguments: "{}"}}}
	})

	// The checkpoints bucket refuses every write, as too large.
	stream, err := h.js.Stream(ctx, "KV_"+h.names.CheckpointsBucket())
	if err != nil {
		t.Fatal(err)
	}
	open := stream.CachedInfo().Config
	full := open
	full.MaxMsgSize = 1
	if _, err := h.js.UpdateStream(ctx, full); err != nil {
		t.Fatal(err)
	}

	h.startWorker(m, nil)
	w := h.watch("default", "t1", "r1")
	h.submit(request("t1", "r1", "take one step"))

	testdeploy.WaitFor(t, 20*time.Second, "a second attempt after the refused checkpoint", func() bool {
		for _, ev := range w.all() {
			if ev.Type == protocol.EventRunFinished {
				t.Fatalf("the run ended (%s) instead of being handed back: %v", string(ev.Data), w.types())
			}
			if ev.Type == protocol.EventRunStarted && ev.Attempt == 2 {
				return true
			}
		}
		return false
	})
	if _, err := h.js.UpdateStream(ctx, open); err != nil {
		t.Fatal(err)
	}

	fin := w.finished(t, 20*time.Second)
	if fin.Status != protocol.StatusSuccess || fin.Output == nil || fin.Output.Content != "done: stepped" {
		t.Fatalf("run ended %s with %+v", fin.Status, fin.Output)
	}
	if n := toolRuns.Load(); n != 1 {
		t.Fatalf("the tool ran %d times, want 1", n)
	}
	time.Sleep(300 * time.Millisecond)
	if n := w.count(protocol.EventRunFinished); n != 1 {
		t.Fatalf("%d run.finished events, want 1", n)
	}
	if rec := h.run("default", "r1"); rec.Status != protocol.StatusSuccess || rec.Attempt < 2 {
		t.Fatalf("record %s attempt %d", rec.Status, rec.Attempt)
	}
}

// A checkpoint bucket at its max bytes refuses the run's writes with
// "maximum bytes exceeded": the run waits for room holding its request (no
// delivery is spent, nothing is handed back) and goes on from where it was
// once the bucket takes writes again.
func TestFullCheckpointBucketWaitsForRoom(t *testing.T) {
	h := newRedeliveryHarness(t) // the wait outlasts three ack waits: heartbeats hold the request
	ctx := context.Background()
	var toolRuns atomic.Int32
	h.tools.Register(tools.Func(model.ToolSpec{Name: "step"}, func(context.Context, json.RawMessage) (string, error) {
		toolRuns.Add(1)
		return "stepped", nil
	}))
	m := model.NewScripted(func(n int, req *model.Request) model.Reply {
		if last := req.Messages[len(req.Messages)-1]; last.Role == model.RoleTool {
			return model.Reply{Text: "done: " + last.Content}
		}
		return model.Reply{Text: "working", ToolCalls: []model.ToolCall{{ID: "c1", Name: "step", Arguments: "{}"}}}
	})

	bucket := "KV_" + h.names.CheckpointsBucket()
	open := h.fillStream(t, bucket)
	rec := &fullRecorder{}
	h.startWorker(m, func(c *Config) { c.Metrics = rec; c.StoreFullWait = time.Minute })
	w := h.watch("default", "t1", "r1")
	h.submit(request("t1", "r1", "take one step"))

	testdeploy.WaitFor(t, 20*time.Second, "the run's checkpoint refused for lack of room", func() bool {
		return rec.count(h.names.CheckpointsBucket()) >= 2
	})
	// Three ack waits later the request was delivered once: it is held,
	// not handed back.
	time.Sleep(3 * h.settings.AckWait)
	h.requireDeliveredOnce(t)
	if w.count(protocol.EventRunFinished) != 0 {
		t.Fatalf("the run ended while the store was full: %v", w.types())
	}
	if _, err := h.js.UpdateStream(ctx, open); err != nil {
		t.Fatal(err)
	}

	fin := w.finished(t, 30*time.Second)
	if fin.Status != protocol.StatusSuccess || fin.Output == nil || fin.Output.Content != "done: stepped" {
		t.Fatalf("run ended %s with %+v", fin.Status, fin.Output)
	}
	if n := toolRuns.Load(); n != 1 {
		t.Fatalf("the tool ran %d times, want 1", n)
	}
	if rec := h.run("default", "r1"); rec.Status != protocol.StatusSuccess || rec.Attempt != 1 {
		t.Fatalf("record %s attempt %d, want success at attempt 1", rec.Status, rec.Attempt)
	}
}

// A store that stays full past the worker's store_full_wait ends the run
// "error" with stop_reason store_full, and gives the thread back idle; the
// next run of the thread runs once there is room.
func TestStoreFullPastTheWaitEndsTheRun(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	bucket := "KV_" + h.names.CheckpointsBucket()
	open := h.fillStream(t, bucket)
	rec := &fullRecorder{}
	h.startWorker(textModel("hello there", 2, 0), func(c *Config) { c.Metrics = rec; c.StoreFullWait = 2 * time.Second })
	w := h.watch("default", "t1", "r1")
	h.submit(request("t1", "r1", "hi"))

	fin := w.finished(t, 30*time.Second)
	if fin.Status != protocol.StatusError || fin.StopReason != protocol.StopStoreFull || !strings.Contains(fin.Error, h.names.CheckpointsBucket()) {
		t.Fatalf("run ended %s (%s): %q", fin.Status, fin.StopReason, fin.Error)
	}
	if r := h.run("default", "r1"); r.Status != protocol.StatusError || r.StopReason != protocol.StopStoreFull || r.Attempt != 1 {
		t.Fatalf("record %s %s attempt %d", r.Status, r.StopReason, r.Attempt)
	}
	th, _, err := h.stores.Threads.Get(ctx, "default", "t1")
	if err != nil {
		t.Fatal(err)
	}
	if th.Lease != nil || th.Status != protocol.ThreadIdle {
		t.Fatalf("thread %s with lease %+v after the run ended", th.Status, th.Lease)
	}
	if rec.count(h.names.CheckpointsBucket()) == 0 {
		t.Fatal("no store-full refusal counted for the checkpoints bucket")
	}
	h.waitRunsStreamEmpty(t)

	if _, err := h.js.UpdateStream(ctx, open); err != nil {
		t.Fatal(err)
	}
	next := h.watch("default", "t1", "r2")
	h.submit(request("t1", "r2", "again"))
	if fin := next.finished(t, 30*time.Second); fin.Status != protocol.StatusSuccess {
		t.Fatalf("the next run of the thread ended %s: %s", fin.Status, fin.Error)
	}
}

// fillStream sets stream's max bytes to 1 (a KV bucket discards new
// writes: every write is refused) and returns its configuration before.
func (h *harness) fillStream(t *testing.T, stream string) jetstream.StreamConfig {
	t.Helper()
	ctx := context.Background()
	st, err := h.js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	open := st.CachedInfo().Config
	full := open
	full.MaxBytes = 1
	if _, err := h.js.UpdateStream(ctx, full); err != nil {
		t.Fatal(err)
	}
	return open
}

// requireDeliveredOnce fails unless the runs consumer never redelivered a
// request.
func (h *harness) requireDeliveredOnce(t *testing.T) {
	t.Helper()
	c, err := h.js.Consumer(context.Background(), h.names.RunsStream(), bus.RunsConsumer)
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.NumRedelivered != 0 {
		t.Fatalf("the consumer redelivered %d requests (delivered %+v)", info.NumRedelivered, info.Delivered)
	}
}

// fullRecorder counts store-full refusals by stream or bucket.
type fullRecorder struct {
	metrics.Nop
	mu sync.Mutex
	n  map[string]int
}

func (r *fullRecorder) StoreFull(store string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = map[string]int{}
	}
	r.n[store]++
}

func (r *fullRecorder) count(store string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[store]
}

func (r *fullRecorder) total() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.n {
		n += c
	}
	return n
}
