package worker

import (
	"bytes"
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/bus"
)

// waiter is the set of runs in this worker waiting for one thread, and the
// core subscription that wakes them when a run of the thread finishes.
type waiter struct {
	sub  *nats.Subscription
	jobs map[*job]struct{}
}

var finishedMarker = []byte(`"type":"run.finished"`)

// wait parks the job until its thread may be free: a run of the thread
// finished (seen on the thread's lifecycle events, from any worker), a
// poll interval passed, or the worker began draining. A waiting run gives
// its slot back, so runs of other threads keep running. When the worker
// already holds MaxWaiting waiting runs, wait refuses (returns false) and
// the caller hands the request back to the stream instead of hoarding it.
func (j *job) wait(ctx context.Context, hasSlot *bool) bool {
	w := j.w
	key := bus.Key(j.req.Tenant, j.req.ThreadID)
	w.mu.Lock()
	if w.waiting >= w.cfg.MaxWaiting {
		w.mu.Unlock()
		return false
	}
	w.waiting++
	wt := w.waiters[key]
	if wt == nil {
		wt = &waiter{jobs: make(map[*job]struct{})}
		sub, err := w.nc.Subscribe(w.names.ThreadLifecycle(j.req.Tenant, j.req.ThreadID), func(m *nats.Msg) {
			if bytes.Contains(m.Data, finishedMarker) {
				w.wakeThread(j.req.Tenant, j.req.ThreadID)
			}
		})
		if err != nil {
			j.log.Warn("subscribe to thread events failed; polling", zap.Error(err))
		}
		wt.sub = sub
		w.waiters[key] = wt
	}
	wt.jobs[j] = struct{}{}
	w.mu.Unlock()

	if *hasSlot {
		<-w.slots
		*hasSlot = false
	}
	t := time.NewTimer(jitter(w.cfg.WaitPoll))
	select {
	case <-j.wake:
	case <-t.C:
	case <-ctx.Done():
	}
	t.Stop()

	w.mu.Lock()
	delete(wt.jobs, j)
	if len(wt.jobs) == 0 {
		if wt.sub != nil {
			_ = wt.sub.Unsubscribe()
		}
		delete(w.waiters, key)
	}
	w.waiting--
	w.mu.Unlock()

	w.slots <- struct{}{}
	*hasSlot = true
	return true
}

// wakeThread wakes this worker's runs waiting for a thread.
func (w *Worker) wakeThread(tenant, thread string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	wt := w.waiters[bus.Key(tenant, thread)]
	if wt == nil {
		return
	}
	for j := range wt.jobs {
		select {
		case j.wake <- struct{}{}:
		default:
		}
	}
}
