package worker

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/metrics/prom"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/testdeploy"
	"github.com/natsagent/natsagent/internal/tools"
)

// fenceCase is a worker whose first model call runs until its context
// ends (it reports when on stopped) and whose next call answers "done".
type fenceCase struct {
	h       *harness
	wh      *workerHandle
	w       *watcher
	started chan struct{}
	stopped chan time.Time
}

const fenceAckWait = 2 * time.Second

func newFenceCase(t *testing.T) *fenceCase {
	c := &fenceCase{h: newHarnessWith(t, bus.Settings{AckWait: fenceAckWait, MaxDeliver: 5}), started: make(chan struct{}), stopped: make(chan time.Time, 1)}
	var calls atomic.Int32
	m := model.Func(func(ctx context.Context, req *model.Request, onDelta func(model.Delta)) (*model.Response, error) {
		if calls.Add(1) == 1 {
			close(c.started)
			<-ctx.Done() // a long model call, ended only by its context
			c.stopped <- time.Now()
			return nil, ctx.Err()
		}
		return &model.Response{Message: model.Message{Role: model.RoleAssistant, Content: "done"}}, nil
	})
	c.wh = c.h.startWorker(m, nil)
	c.w = c.h.watch("default", "t1", "r1")
	c.h.submit(request("t1", "r1", "work"))
	natstest.Recv(t, c.started, "the model call of run r1")
	return c
}

// stopsAndContinues waits for the first call to be stopped, mends what
// the test broke, and checks the next delivery finished the run.
func (c *fenceCase) stopsAndContinues(t *testing.T, broken time.Time, mend func()) {
	t.Helper()
	select {
	case at := <-c.stopped:
		t.Logf("run stopped %s after the fault (ack wait %s)", at.Sub(broken).Round(time.Millisecond), fenceAckWait)
	case <-time.After(10 * fenceAckWait):
		t.Fatal("the run went on for five ack waits")
	}
	mend()
	fin := c.w.finished(t, 10*fenceAckWait)
	if fin.Status != protocol.StatusSuccess || fin.Output == nil || fin.Output.Content != "done" {
		t.Fatalf("run ended %s with %+v", fin.Status, fin.Output)
	}
	if rec := c.h.run("default", "r1"); rec.Attempt != 2 {
		t.Fatalf("record attempt %d, want 2 (the next delivery continued the run)", rec.Attempt)
	}
	if n := c.w.count(protocol.EventRunFinished); n != 1 {
		t.Fatalf("%d run.finished events, want 1", n)
	}
}

// Issue 7 (one active run per thread): a worker that cannot renew its
// run's lease (the threads bucket answers nothing, as in a node loss)
// stops the run before the server could give the request to another
// worker, instead of running on beside the worker that takes over.
func TestLeaseThatCannotBeRenewedStopsTheRun(t *testing.T) {
	c := newFenceCase(t)
	ctx := context.Background()
	st, err := c.h.js.Stream(ctx, "KV_"+c.h.names.ThreadsBucket())
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	away := cfg
	away.Subjects = []string{"elsewhere.>"}
	if _, err := c.h.js.UpdateStream(ctx, away); err != nil {
		t.Fatal(err)
	}
	c.stopsAndContinues(t, time.Now(), func() {
		if _, err := c.h.js.UpdateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	})
}

// Issue 16 (livelock under overload): a run whose lease renewals are
// slow but not lost (its renewer held, as a starved machine holds it)
// pauses instead of stopping, keeps the model call it is in, and goes on
// once a renewal is confirmed: it finishes once, on its first attempt,
// with its tool run once. Stopping it, as the fence did, had the next
// delivery redo its work on a machine just as slow, and stop again.
func TestSlowLeaseRenewalPausesTheRunInsteadOfStoppingIt(t *testing.T) {
	const ackWait = 4 * time.Second
	h := newHarnessWith(t, bus.Settings{AckWait: ackWait, MaxDeliver: 5})
	rec, err := prom.New(prom.Options{Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	var toolRuns atomic.Int32
	var toolAt atomic.Int64
	h.tools.Register(tools.Func(model.ToolSpec{Name: "step"}, func(context.Context, json.RawMessage) (string, error) {
		toolRuns.Add(1)
		toolAt.Store(time.Now().UnixNano())
		return "stepped", nil
	}))
	answer := make(chan struct{})
	cancelled := make(chan struct{}, 1)
	var calls atomic.Int32
	m := model.Func(func(ctx context.Context, req *model.Request, onDelta func(model.Delta)) (*model.Response, error) {
		if calls.Add(1) > 1 {
			return &model.Response{Message: model.Message{Role: model.RoleAssistant, Content: "done"}}, nil
		}
		select {
		case <-answer:
		case <-ctx.Done():
			cancelled <- struct{}{}
			return nil, ctx.Err()
		}
		return &model.Response{Message: model.Message{Role: model.RoleAssistant, ToolCalls: []model.ToolCall{{ID: "c1", Name: "step", Arguments: "{}"}}}}, nil
	})
	wh := h.startWorker(m, func(c *Config) { c.Metrics = rec })
	w := h.watch("default", "t1", "r1")
	h.submit(request("t1", "r1", "take one step"))

	var lease *leaseHandle
	testdeploy.WaitFor(t, minFinish, "the run's first model call", func() bool {
		if j := wh.w.runningJob("default", "r1"); j != nil && calls.Load() == 1 {
			j.hold.Lock()
			lease = j.lease
			j.hold.Unlock()
		}
		return lease != nil
	})

	// Hold the renewer: every write of the lease waits for its lock.
	lease.mu.Lock()
	testdeploy.WaitFor(t, 2*ackWait, "the run to pause", lease.pausedNow)
	if !lease.live() {
		t.Fatal("the paused run counts as stopped")
	}
	// A safe boundary waits while the run is paused.
	fctx, fcancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	err = lease.Fenced(fctx)
	fcancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Fenced while paused returned %v, want it to wait", err)
	}
	close(answer) // the model answers while the run is paused
	time.Sleep(ackWait / 8)
	if n := toolRuns.Load(); n != 0 {
		t.Fatal("a tool ran while the run was paused")
	}
	resumed := time.Now()
	lease.mu.Unlock()

	fin := w.finished(t, 10*ackWait)
	if fin.Status != protocol.StatusSuccess || fin.Output == nil || fin.Output.Content != "done" {
		t.Fatalf("run ended %s with %+v", fin.Status, fin.Output)
	}
	select {
	case <-cancelled:
		t.Fatal("the pause cancelled the model call in flight")
	default:
	}
	if n := toolRuns.Load(); n != 1 || time.Unix(0, toolAt.Load()).Before(resumed) {
		t.Fatalf("tool ran %d times (last at %v, resumed at %v), want once after the pause", n, time.Unix(0, toolAt.Load()), resumed)
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("%d model calls, want 2 (nothing run again)", n)
	}
	if r := h.run("default", "r1"); r.Attempt != 1 {
		t.Fatalf("record attempt %d, want 1 (the run was not stopped and taken again)", r.Attempt)
	}
	if n := w.count(protocol.EventRunFinished); n != 1 {
		t.Fatalf("%d run.finished events, want 1", n)
	}
	if n := w.count(protocol.EventToolFinished); n != 1 {
		t.Fatalf("%d tool.finished events, want 1", n)
	}
	if v := counterValue(t, rec.Registry(), "natsagent_lease_fence_pauses_total", nil); v != 1 {
		t.Fatalf("lease_fence_pauses_total = %v, want 1", v)
	}
	if v := counterValue(t, rec.Registry(), "natsagent_lease_fence_stops_total", nil); v != 0 {
		t.Fatalf("lease_fence_stops_total = %v, want 0", v)
	}
}

// counterValue sums the counter name's series whose labels include want.
func counterValue(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue series
				}
			}
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}
