package worker

import (
	"context"
	"slices"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/events"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/testdeploy"
)

// Issue 9 (seq has no gaps): a worker dies after a node loss swallowed
// one of its events (here: the stream holds its seq n+2 but not n+1).
// The worker that takes the run over marks the missing seq with
// event.lost, so the run's seqs run from 1 to run.finished without a gap.
func TestTakeoverMarksTheEventsTheDeadWorkerLost(t *testing.T) {
	h := newRedeliveryHarness(t) // the dead worker's run is redelivered
	stuck := make(chan struct{})
	dying := model.NewScripted(func(n int, req *model.Request) model.Reply {
		close(stuck)
		return model.Reply{Delay: time.Hour} // frozen mid-call
	})
	a := h.startWorker(dying, nil)
	w := h.watch("default", "t1", "r1")
	h.submit(request("t1", "r1", "work"))
	natstest.Recv(t, stuck, "the frozen model call of run r1")
	// What the worker stored before the model call (run.queued,
	// run.started; thread.titled goes out live) is published without
	// waiting: stored before the last seq is read. Under load it was not
	// yet, and a late event took the very seq forged below (seqs 1 2 3 3).
	testdeploy.WaitFor(t, 10*time.Second, "the events before the model call", func() bool {
		return w.count(protocol.EventRunStarted) == 1
	})

	ctx := context.Background()
	pub, err := events.NewPublisher(ctx, h.js, h.names, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	last, err := pub.LastSeq(ctx, "default", "t1", "r1")
	if err != nil || last == 0 {
		t.Fatalf("last seq %d, %v", last, err)
	}
	// The dying worker's event last+2 was stored, last+1 was not.
	m, err := pub.Msg("default", "t1", "r1", 1, last+2, protocol.EventMessageDelta, map[string]string{"message_id": "m", "delta": "x"}, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	a.nc.Close()

	h.startWorker(model.NewFixed(model.Reply{Text: "done"}), nil)
	if fin := w.finished(t, 20*time.Second); fin.Status != protocol.StatusSuccess {
		t.Fatalf("run ended %s", fin.Status)
	}
	var seqs []uint64
	lost := 0
	for _, ev := range w.all() {
		seqs = append(seqs, ev.Seq)
		if ev.Type == protocol.EventLost {
			lost++
			if ev.Seq != last+1 || ev.Attempt != 2 {
				t.Errorf("event.lost at seq %d attempt %d, want seq %d attempt 2", ev.Seq, ev.Attempt, last+1)
			}
		}
	}
	if lost != 1 {
		t.Errorf("%d event.lost events, want 1: %v", lost, w.types())
	}
	slices.Sort(seqs)
	for i, s := range seqs {
		if s != uint64(i+1) {
			t.Fatalf("seqs %v: want 1 to %d once each", seqs, len(seqs))
		}
	}
}
