package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/protocol"
)

// A write that JetStream refuses for lack of room (bus.IsStoreFull: the
// server's or account's store is full, or a stream or bucket is at its max
// bytes) stored nothing, and the same write succeeds once an operator
// frees space. A run that meets one keeps its request: it stays held by
// the worker, whose heartbeats keep it in progress, so no delivery is
// spent, while the write is tried again with a growing pause. When room
// comes back within Config.StoreFullWait the run goes on; when it does not,
// the run ends "error" with stop_reason store_full and gives its thread
// back. Those last writes are tried for as long as the worker lives (or
// until it stops, handing the request back): a run whose end cannot be
// written is never let go in a state nobody settles.

// StopStoreFull is the stop_reason of a run ended by a full store.
const StopStoreFull = protocol.StopStoreFull

// storeFullPauseMax bounds the pause between two tries of a refused write.
const storeFullPauseMax = 2 * time.Second

// storeFull records a refusal for lack of room: the metric, by stream or
// bucket, and a log line naming it (a warning at the first refusal of a
// wait, then debug).
func (w *Worker) storeFull(log *zap.Logger, err error, first bool) {
	store, _ := bus.IsStoreFull(err)
	if store == "" {
		store = "unknown"
	}
	w.cfg.Metrics.StoreFull(store)
	msg := "JetStream has no room for a write; waiting for space to be freed"
	if first {
		log.Warn(msg, zap.String("store", store), zap.Duration("store_full_wait", w.cfg.StoreFullWait), zap.Error(err))
	} else {
		log.Debug(msg, zap.String("store", store), zap.Error(err))
	}
}

// waitRoom is called with the error of a write on the run's path. When the
// store was full and the run's wait for room is not spent (nor the worker
// stopping), it pauses and reports true: the caller tries again.
func (j *job) waitRoom(ctx context.Context, err error) bool {
	if _, full := bus.IsStoreFull(err); !full {
		return false
	}
	w := j.w
	now := time.Now()
	since := j.fullSince.Load()
	first := since == 0
	if first {
		since = now.UnixNano()
		j.fullSince.Store(since)
	}
	w.storeFull(j.log, err, first)
	if w.cfg.StoreFullWait <= 0 || now.Sub(time.Unix(0, since)) >= w.cfg.StoreFullWait || w.isDraining() || j.isDrained() || ctx.Err() != nil {
		return false
	}
	pause := min(storeFullPauseMax, 250*time.Millisecond<<min(j.fullTries.Add(1), 5))
	sleep(ctx, pause)
	return ctx.Err() == nil
}

// roomFor runs write until it succeeds, fails for a reason other than a
// full store, or the run's wait for room is spent.
func (j *job) roomFor(ctx context.Context, write func() error) error {
	for {
		err := write()
		if err == nil {
			j.roomBack()
		}
		if !j.waitRoom(ctx, err) {
			return err
		}
	}
}

// roomBack notes that a write went through: the next full store starts a
// new wait.
func (j *job) roomBack() {
	if j.fullSince.Load() != 0 {
		j.log.Info("JetStream took the run's write again; the run goes on", zap.Duration("waited", time.Since(time.Unix(0, j.fullSince.Load()))))
		j.fullSince.Store(0)
		j.fullTries.Store(0)
	}
}

// settleWrite runs write, one of the writes that end a run, until it
// succeeds or fails for a reason other than a full store. It does not give
// up while the worker runs: a run whose end is not written would be left
// running with its thread busy. It returns the store-full error when the
// worker stops (the request is then handed back for the next delivery).
func (j *job) settleWrite(ctx context.Context, write func() error) error {
	return j.w.untilRoom(ctx, j.log, 0, j.isDrained, write)
}

// untilRoom runs write until it succeeds, fails for a reason other than a
// full store, the worker stops (or stopped reports true), ctx ends, or,
// when wait > 0, the store stayed full for wait; it returns write's last
// error.
func (w *Worker) untilRoom(ctx context.Context, log *zap.Logger, wait time.Duration, stopped func() bool, write func() error) error {
	began := time.Now()
	for tries := 0; ; tries++ {
		err := write()
		if _, full := bus.IsStoreFull(err); !full {
			return err
		}
		w.storeFull(log, err, tries == 0)
		if w.isDraining() || (stopped != nil && stopped()) || ctx.Err() != nil || (wait > 0 && time.Since(began) >= wait) {
			return err
		}
		sleep(ctx, min(storeFullPauseMax, 250*time.Millisecond<<min(tries+1, 5)))
	}
}

// roomWait is how long a background settling step (an advisory's dead
// letter) waits for room: StoreFullWait, and at least one try.
func (w *Worker) roomWait() time.Duration {
	return max(w.cfg.StoreFullWait, time.Nanosecond)
}

// storeFullText is the run's error when a full store ended it.
func storeFullText(err error) string {
	store, _ := bus.IsStoreFull(err)
	if store == "" {
		store = "the JetStream store"
	}
	return fmt.Sprintf("JetStream had no room to save the run (%s: %s) for longer than the worker waits (store_full_wait); an operator must free space (purge, or raise the limits of the stream, bucket, account or server). The thread is free again and keeps what the run saved before", store, bus.StoreFullText(err))
}

// endStoreFull ends a run that has not started executing (no events of its
// own beyond run.queued) after its wait for room was spent: its record
// ends "error" with stop_reason store_full, the thread lease it may hold
// is released, run.finished is published and the request acked. Each
// write is tried until it succeeds (settleWrite); if the worker stops
// first, the request is handed back and its next delivery settles it.
func (j *job) endStoreFull(ctx context.Context, lease *leaseHandle, cause error) {
	w := j.w
	req := j.req
	text := storeFullText(cause)
	j.log.Error("run ended: JetStream had no room for it", zap.Duration("store_full_wait", w.cfg.StoreFullWait), zap.Error(cause))
	if lease != nil {
		j.endStoreFullHeld(ctx, lease, text)
		return
	}
	var rec *protocol.Run
	end := func(r *protocol.Run, lastSeq uint64) {
		now := time.Now().UTC()
		r.Status, r.StopReason, r.Error, r.FinishedAt = protocol.StatusError, StopStoreFull, text, &now
		r.Seq = max(r.Seq, lastSeq) + 1
	}
	err := j.settleWrite(ctx, func() error {
		lastSeq, err := w.pub.LastSeq(ctx, req.Tenant, req.ThreadID, req.RunID)
		if err != nil {
			return err
		}
		rec, _, err = w.stores.Runs.Mutate(ctx, req.Tenant, req.RunID, func(r *protocol.Run) error {
			switch {
			case r.Status.Terminal():
				return errAlreadyFinished
			case r.Status == protocol.StatusRunning && (lease == nil || r.Epoch > lease.epoch):
				return agent.ErrLeaseLost // another attempt owns it
			}
			end(r, lastSeq)
			return nil
		})
		if !errors.Is(err, kv.ErrNotFound) {
			return err
		}
		// Nobody created the record yet: create it ended, after its
		// run.queued.
		if err := w.pub.PublishQueued(ctx, req); err != nil {
			return err
		}
		rec = kv.NewRun(req, j.seq, time.Now().UTC())
		end(rec, max(lastSeq, 1))
		_, err = w.stores.Runs.Create(ctx, rec)
		if err == nil {
			_ = w.stores.Threads.IndexRun(ctx, req.Tenant, req.ThreadID, req.RunID, rec.CreatedAt)
		}
		if errors.Is(err, kv.ErrExists) {
			// Created meanwhile: a store-full refusal of the next try
			// is impossible to tell from this, so let the next
			// delivery end that record.
			return errRetryAdmit
		}
		return err
	})
	switch {
	case errors.Is(err, agent.ErrLeaseLost):
		if lease != nil {
			j.abandon("run record taken over")
		} else {
			_ = j.msg.NakWithDelay(time.Second)
		}
		return
	case errors.Is(err, errAlreadyFinished):
		rec, _, err = w.stores.Runs.GetLatest(ctx, req.Tenant, req.RunID)
	case err == nil:
		w.ended(rec)
	}
	if err != nil {
		j.log.Warn("could not record the run's end; handing it back", zap.Error(err))
		_ = j.msg.NakWithDelay(time.Second)
		return
	}
	if lease != nil {
		if err := j.settleWrite(ctx, func() error { return lease.release(ctx, nil) }); err != nil && !errors.Is(err, agent.ErrLeaseLost) {
			j.log.Warn("could not release the thread; the lease sweep will", zap.Error(err))
		}
		j.releaseTenantSlot(ctx)
		j.hold.Lock()
		j.lease = nil
		j.hold.Unlock()
	}
	if err := j.settleWrite(ctx, func() error { return w.pub.EnsureFinished(ctx, rec) }); err != nil {
		j.log.Warn("could not publish run.finished; handing the request back so the next delivery does", zap.Error(err))
		_ = j.msg.NakWithDelay(time.Second)
		return
	}
	w.wakeThread(req.Tenant, req.ThreadID)
	_ = j.msg.Ack()
}

// endStoreFullHeld is endStoreFull for a run holding its thread's lease:
// the release, fenced by the lease's epoch, carries the run's end
// (protocol v2: the run's record is pending or missing while it runs);
// the record and run.finished follow.
func (j *job) endStoreFullHeld(ctx context.Context, lease *leaseHandle, text string) {
	w := j.w
	req := j.req
	held := lease.held()
	var done bool
	err := j.settleWrite(ctx, func() (err error) {
		th := &protocol.Thread{ThreadID: req.ThreadID, Tenant: req.Tenant}
		done, err = w.finishHeldWith(ctx, j.rec, th, held, protocol.StatusError, StopStoreFull, text, false)
		return err
	})
	if err == nil && !done {
		// Released already (an earlier try whose record write the full
		// store refused), or taken over.
		th, _, gerr := w.stores.Threads.GetLatest(ctx, req.Tenant, req.ThreadID)
		switch {
		case gerr != nil:
			err = gerr
		case releasedBy(th, req.RunID, held.Epoch):
			err = j.settleWrite(ctx, func() error {
				final, werr := w.stores.WithOutput(ctx, protocol.EndedRun(kv.NewRun(req, j.seq, th.LastRun.CreatedAt), th.LastRun))
				if werr != nil {
					return werr
				}
				rec, werr := writeEnded(ctx, w.stores.Runs, final)
				if errors.Is(werr, errAlreadyFinished) {
					rec, _, werr = w.stores.Runs.GetLatest(ctx, req.Tenant, req.RunID)
				}
				if werr != nil {
					return werr
				}
				return w.pub.EnsureFinished(ctx, rec)
			})
		default:
			j.abandon("lease lost while the store was full")
			return
		}
	}
	if err != nil {
		j.log.Warn("could not record the run's end; handing it back", zap.Error(err))
		_ = j.msg.NakWithDelay(time.Second)
		return
	}
	j.releaseTenantSlot(ctx)
	j.hold.Lock()
	j.lease = nil
	j.hold.Unlock()
	w.wakeThread(req.Tenant, req.ThreadID)
	_ = j.msg.Ack()
}

// refusedForRoom moves the lease's fence when the thread's bucket refused a
// write of the lease (sent then) for lack of room, as a successful write
// would. The fence stops a run that may be taken from it (its server out
// of reach); a full bucket is an answer from its leader, and while it
// refuses writes no other worker can take the lease either. The run that
// waits for room is not calling its model or tools; once the bucket takes
// writes again, the lease's compare-and-set says whether it is still its.
func (l *leaseHandle) refusedForRoom(sent time.Time, err error) {
	if _, full := bus.IsStoreFull(err); !full {
		return
	}
	l.confirmed(sent)
}
