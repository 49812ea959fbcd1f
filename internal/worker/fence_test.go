package worker

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
)

// Issue 7 (one active run per thread): a worker that cannot renew its
// run's lease (the threads bucket answers nothing, as in a node loss)
// stops the run before the server could give the request to another
// worker, instead of running on beside the worker that takes over. The
// run is continued by the next delivery once the bucket answers again.
func TestLeaseThatCannotBeRenewedStopsTheRun(t *testing.T) {
	ackWait := 2 * time.Second
	h := newHarnessWith(t, bus.Settings{AckWait: ackWait, MaxDeliver: 5})
	var calls atomic.Int32
	started := make(chan struct{})
	stopped := make(chan time.Time, 1)
	m := model.Func(func(ctx context.Context, req *model.Request, onDelta func(model.Delta)) (*model.Response, error) {
		if calls.Add(1) == 1 {
			close(started)
			<-ctx.Done() // a long model call, ended only by its context
			stopped <- time.Now()
			return nil, ctx.Err()
		}
		return &model.Response{Message: model.Message{Role: model.RoleAssistant, Content: "done"}}, nil
	})
	h.startWorker(m, nil)
	w := h.watch("default", "t1", "r1")
	h.submit(request("t1", "r1", "work"))
	<-started

	ctx := context.Background()
	st, err := h.js.Stream(ctx, "KV_"+h.names.ThreadsBucket())
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	away := cfg
	away.Subjects = []string{"elsewhere.>"}
	if _, err := h.js.UpdateStream(ctx, away); err != nil {
		t.Fatal(err)
	}
	broken := time.Now()
	select {
	case at := <-stopped:
		// The fence is three quarters of the ack wait after the last
		// renewal, which came before the bucket broke.
		t.Logf("run stopped %s after the lease could no longer be renewed (ack wait %s)", at.Sub(broken).Round(time.Millisecond), ackWait)
	case <-time.After(10 * ackWait):
		t.Fatal("the run went on although its lease could not be renewed for five ack waits")
	}
	if _, err := h.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	fin := w.finished(t, 10*ackWait)
	if fin.Status != protocol.StatusSuccess || fin.Output == nil || fin.Output.Content != "done" {
		t.Fatalf("run ended %s with %+v", fin.Status, fin.Output)
	}
	if rec := h.run("default", "r1"); rec.Attempt != 2 {
		t.Fatalf("record attempt %d, want 2 (the next delivery continued the run)", rec.Attempt)
	}
	if n := w.count(protocol.EventRunFinished); n != 1 {
		t.Fatalf("%d run.finished events, want 1", n)
	}
}
