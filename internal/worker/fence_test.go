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
	<-c.started
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

// The same when the lease renews but the request's in-progress signals
// go unanswered (the runs stream's consumer lost with a node): the server
// would deliver the request again an ack wait after the last one it took.
func TestUnconfirmedHeartbeatsStopTheRun(t *testing.T) {
	c := newFenceCase(t)
	w := c.wh.w
	for _, sub := range w.subs {
		if sub.Subject == w.progressInbox+".*.*" {
			if err := sub.Unsubscribe(); err != nil {
				t.Fatal(err)
			}
		}
	}
	c.stopsAndContinues(t, time.Now(), func() {})
}
