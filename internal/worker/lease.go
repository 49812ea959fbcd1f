package worker

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/metrics"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
)

// leaseHandle is a running run's hold on its thread: a cached copy of the
// thread record and its revision. Every write goes through a CAS that
// first checks the lease epoch is still this run's, so a worker that lost
// the thread stops instead of writing.
type leaseHandle struct {
	w      *Worker
	tenant string
	thread string
	run    string
	epoch  uint64
	base   string

	onPreempt func(protocol.Preemption)
	onLost    func()
	// onResume is called when a pause of the run ends with the lease
	// still its own (the stream publishes the events it kept).
	onResume func()

	// renewing is set while a heartbeat's renewal of the lease is out
	// (renewLeases).
	renewing atomic.Bool

	mu   sync.Mutex
	th   *protocol.Thread
	rev  uint64
	lost bool
	// The fence (fenceFor, expire) has a lock of its own: l.mu is held
	// through a write, which a server that does not answer holds for
	// seconds.
	fmu        sync.Mutex
	fence      *time.Timer
	pauseAfter time.Duration
	stopAfter  time.Duration
	renewed    time.Time // when the last write of the lease the server confirmed was sent
	// paused is set while the lease's renewal is late (pauseAfter): the
	// run starts no model or tool call and its events are kept, until a
	// confirmed write ends the pause (resumed is closed then).
	paused  atomic.Bool
	resumed chan struct{}
	fired   atomic.Bool
	// gone is set once the run may no longer act for the lease: the
	// lease was lost, or went unconfirmed for stopAfter. Unlike fired it
	// is not set when the run simply ended (stopFence).
	gone atomic.Bool
}

func (l *leaseHandle) head() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.th.Head
}

func (l *leaseHandle) threadStatus() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.th.Status
}

// mutate applies fn to the thread record under the lease.
func (l *leaseHandle) mutate(ctx context.Context, fn func(*protocol.Thread) error) error {
	l.mu.Lock()
	if l.lost {
		l.mu.Unlock()
		return agent.ErrLeaseLost
	}
	sent := time.Now()
	th, rev, err := l.w.stores.Threads.MutateFrom(ctx, l.tenant, l.thread, l.th, l.rev, func(t *protocol.Thread) error {
		if t.Lease == nil || t.Lease.RunID != l.run || t.Lease.Epoch != l.epoch {
			return agent.ErrLeaseLost
		}
		return fn(t)
	})
	if err == nil {
		l.th, l.rev = th, rev
		l.confirmed(sent)
	} else {
		l.refusedForRoom(sent, err)
	}
	lost := errors.Is(err, agent.ErrLeaseLost) && !l.lost
	if lost {
		l.lost = true
		l.markGone()
	}
	l.mu.Unlock()
	if lost {
		l.fenceStop(metrics.FenceLeaseTaken, err)
	}
	if err == nil {
		l.checkPreempt()
	}
	return err
}

// writeDelta writes a checkpoint delta; the head does not move yet. It
// returns the delta's id and the thread title the delta sets, if any.
func (l *leaseHandle) writeDelta(ctx context.Context, run string, step int, u state.Update, changes []files.Change) (id, title string, err error) {
	d := &kv.Delta{ID: kv.CheckpointID(l.epoch, step), Parent: l.head(), RunID: run, Step: step, Time: time.Now().UTC(), Update: u, Files: changes}
	if _, err := l.w.stores.Checkpoints.Put(ctx, l.tenant, l.thread, d); err != nil {
		return "", "", err
	}
	if raw, ok := u.Values[middleware.TitleValue]; ok {
		_ = json.Unmarshal(raw, &title)
	}
	return d.ID, title, nil
}

// moveHead makes a written delta the thread's head, under the lease.
func (l *leaseHandle) moveHead(ctx context.Context, id, title string) error {
	return l.mutate(ctx, func(t *protocol.Thread) error {
		t.Head, t.FilesAt = id, id
		t.Lease.RenewedAt = time.Now().UTC()
		if title != "" {
			t.Title = title
		}
		return nil
	})
}

// fenceFor starts the lease's fence, for a lease another worker may take
// over once it went unrenewed for lapse (job.lapsed: a redelivery of the
// request waits that long). renewedAt is when the lease was taken (a
// write of it). Counted from when the last write the server confirmed
// was sent:
//   - after 3/4 of lapse the run pauses: it starts no model or tool call
//     and its events are kept, not published, until a write of the lease
//     is confirmed in time again (a renewal that was merely slow, as on
//     an overloaded machine), and then goes on where it was;
//   - after twice lapse with no write confirmed (the threads bucket out
//     of reach: a node loss, a partition) the run stops as if the lease
//     were lost.
//
// A write refused because the lease changed (another run's lease, a
// newer epoch) stops the run at once (mutate, refresh). The in-progress
// signals of the request play no part: a redelivery of it waits for the
// lease to lapse before it takes the thread over, so only the lease says
// whether another worker may be running the run.
func (l *leaseHandle) fenceFor(lapse time.Duration, renewedAt time.Time) {
	l.fmu.Lock()
	defer l.fmu.Unlock()
	if l.fence != nil {
		return
	}
	l.pauseAfter, l.stopAfter, l.renewed = lapse*3/4, 2*lapse, renewedAt
	l.fence = time.AfterFunc(time.Until(l.renewed.Add(l.pauseAfter)), l.expire)
}

// confirmed notes a write of the lease, sent at sent, that the server
// confirmed: the fence moves, and a pause ends if the write came in time.
func (l *leaseHandle) confirmed(sent time.Time) {
	l.fmu.Lock()
	if sent.After(l.renewed) {
		l.renewed = sent
	}
	l.fmu.Unlock()
	l.refence()
}

// refence moves the fence after a confirmed write of the lease, and ends
// a pause the write came in time for.
func (l *leaseHandle) refence() {
	l.fmu.Lock()
	if l.fence != nil && !l.fired.Load() {
		l.fence.Reset(time.Until(l.renewed.Add(l.pauseAfter)))
	}
	resume := l.paused.Load() && !l.gone.Load() && time.Now().Before(l.renewed.Add(l.pauseAfter))
	if resume {
		l.unpause()
	}
	l.fmu.Unlock()
	if resume {
		l.w.log.Info("lease renewal confirmed: the run goes on", zap.String("tenant", l.tenant), zap.String("thread_id", l.thread), zap.String("run_id", l.run))
		if l.onResume != nil {
			l.onResume()
		}
	}
}

// unpause ends a pause, with l.fmu held.
func (l *leaseHandle) unpause() {
	if l.paused.CompareAndSwap(true, false) {
		close(l.resumed)
	}
}

// markGone records that the run may no longer act for the lease; a
// pause ends with it.
func (l *leaseHandle) markGone() {
	l.fmu.Lock()
	defer l.fmu.Unlock()
	l.gone.Store(true)
	l.unpause()
}

// released ends the fence of a run whose thread release was confirmed:
// the events it kept while paused were emitted under a lease the release
// proved its own, however long the release took, so they go out.
func (l *leaseHandle) released() {
	l.fmu.Lock()
	resume := l.paused.Load()
	l.unpause()
	l.fmu.Unlock()
	if resume && l.onResume != nil {
		l.onResume()
	}
}

// stopFence ends the fence once the run stopped executing: what is left
// (the run's end, the release) are writes the epoch fences anyway, and
// stopping a run that already ended would only delay it. A pause stays
// until the release says whether the run's kept events go out.
func (l *leaseHandle) stopFence() {
	l.fmu.Lock()
	defer l.fmu.Unlock()
	if l.fence != nil {
		l.fence.Stop()
	}
	l.fired.Store(true)
}

// expire is the fence's timer, and is called by live when the timer is
// late (a process paused by SIGSTOP, a long GC, a suspended VM resumes
// its goroutines in any order). It pauses the run once its lease's
// renewal is late, and stops it once the lease went unconfirmed for long
// enough that another worker may hold it (see fenceFor).
func (l *leaseHandle) expire() {
	l.fmu.Lock()
	if l.fired.Load() || l.gone.Load() {
		l.fmu.Unlock()
		return
	}
	now := time.Now()
	pauseAt, stopAt := l.renewed.Add(l.pauseAfter), l.renewed.Add(l.stopAfter)
	switch {
	case now.Before(pauseAt):
		// Moved by a confirmation that raced the timer.
		l.fmu.Unlock()
		return
	case now.Before(stopAt):
		paused := l.paused.CompareAndSwap(false, true)
		if paused {
			l.resumed = make(chan struct{})
		}
		l.fence.Reset(time.Until(stopAt))
		unconfirmed := now.Sub(l.renewed) // read under l.fmu: confirmed moves it
		l.fmu.Unlock()
		if paused {
			l.w.cfg.Metrics.FencePause()
			l.w.log.Warn("lease renewal not confirmed in time: the run pauses until it is", zap.String("tenant", l.tenant),
				zap.String("thread_id", l.thread), zap.String("run_id", l.run), zap.Duration("unconfirmed_for", unconfirmed))
		}
		return
	}
	l.fired.Store(true)
	l.fmu.Unlock()
	l.markGone()
	l.fenceStop(metrics.FenceLeaseExpired, nil)
}

// fenceStop stops the run: its lease is another's (a write refused by
// the lease's compare-and-set, a newer epoch) or may be (expired). It is
// abandoned, so its request's in-progress signals stop too and the
// request does come back; whoever gets it continues from the last
// checkpoint (taking the lease over if it was still this run's).
func (l *leaseHandle) fenceStop(reason string, err error) {
	l.w.cfg.Metrics.FenceStop(reason)
	fields := []zap.Field{zap.String("tenant", l.tenant), zap.String("thread_id", l.thread), zap.String("run_id", l.run),
		zap.Uint64("epoch", l.epoch), zap.String("reason", reason)}
	if err != nil {
		fields = append(fields, zap.Error(err))
	}
	if reason == metrics.FenceLeaseExpired {
		l.fmu.Lock()
		fields = append(fields, zap.Duration("unconfirmed_for", time.Since(l.renewed)))
		l.fmu.Unlock()
	}
	l.w.log.Warn("lease fence: stopping the run, another worker may own its thread", fields...)
	if l.onLost != nil {
		l.onLost()
	}
}

// live reports whether the run may still act for its lease at all (its
// events are dropped once it may not). It checks the fence's deadlines
// itself rather than trusting the timer (see expire).
func (l *leaseHandle) live() bool {
	if l.gone.Load() {
		return false
	}
	l.fmu.Lock()
	late := l.fence != nil && !l.fired.Load() && !time.Now().Before(l.renewed.Add(l.pauseAfter))
	l.fmu.Unlock()
	if late {
		l.expire()
	}
	return !l.gone.Load()
}

// pausedNow reports whether the run is paused (its events are kept).
func (l *leaseHandle) pausedNow() bool {
	return l.paused.Load() && !l.gone.Load()
}

// Fenced is agent.Fence: checked before each model call and tool call, it
// waits while the run is paused, and returns agent.ErrLeaseLost once the
// run lost its lease (or ctx's cause when ctx ends first).
func (l *leaseHandle) Fenced(ctx context.Context) error {
	for {
		if !l.live() {
			return agent.ErrLeaseLost
		}
		l.fmu.Lock()
		paused, resumed := l.paused.Load(), l.resumed
		l.fmu.Unlock()
		if !paused {
			return nil
		}
		select {
		case <-resumed:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// handOver marks the lease handed back (shutdown, a checkpoint that
// failed): the run stopped at a safe boundary and its events are
// flushed, so the next delivery of the request takes the run over at
// once instead of waiting for the lease to lapse. The write is fenced by
// the epoch like every other; if it fails, the next delivery waits.
func (l *leaseHandle) handOver(ctx context.Context) {
	if l.gone.Load() {
		return
	}
	// A shutdown's runs are handed back after their context ended (the
	// grace ran out): the mark is bounded on its own.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), handOverTimeout)
	defer cancel()
	err := l.mutate(ctx, func(t *protocol.Thread) error {
		t.Lease.HandedOver = true
		return nil
	})
	if err != nil && !errors.Is(err, agent.ErrLeaseLost) {
		l.w.log.Warn("could not mark the lease handed back; the next delivery waits for it to lapse", zap.String("tenant", l.tenant),
			zap.String("thread_id", l.thread), zap.String("run_id", l.run), zap.Error(err))
	}
}

// handOverTimeout bounds handOver's write.
const handOverTimeout = 3 * time.Second

// renew refreshes the lease when it is getting old, which also picks up a
// steer or rollback whose signal was lost. Heartbeats come every third of
// the ack wait, and a lease older than a quarter of it is renewed, so
// every heartbeat renews it unless a checkpoint just did: one renewal
// lost (a leader election) leaves time for the next before the fence.
func (l *leaseHandle) renew(ctx context.Context) {
	l.mu.Lock()
	due := l.th.Lease != nil && time.Since(l.th.Lease.RenewedAt) > l.w.cfg.Settings.AckWait/4
	l.mu.Unlock()
	if !due {
		return
	}
	err := l.mutate(ctx, func(t *protocol.Thread) error {
		t.Lease.RenewedAt = time.Now().UTC()
		return nil
	})
	if bus.IsStoreFullErr(err) {
		// Counted; the run logs its own wait for room.
		l.w.storeFull(l.w.log.With(zap.String("thread_id", l.thread), zap.String("run_id", l.run)), err, false)
		return
	}
	if err != nil && !errors.Is(err, agent.ErrLeaseLost) && !l.w.nc.IsClosed() && !errors.Is(err, context.Canceled) {
		// (Canceled: the worker is stopping.)
		l.w.log.Warn("lease renewal failed", zap.String("tenant", l.tenant), zap.String("thread_id", l.thread), zap.String("run_id", l.run), zap.Error(err))
	}
}

// refresh re-reads the thread record (a steer signal arrived).
func (l *leaseHandle) refresh(ctx context.Context) {
	th, rev, err := l.w.stores.Threads.Get(ctx, l.tenant, l.thread)
	if err != nil {
		return
	}
	l.mu.Lock()
	if rev > l.rev {
		l.th, l.rev = th, rev
	}
	mine := th.Lease != nil && th.Lease.RunID == l.run && th.Lease.Epoch == l.epoch
	lost := !mine && !l.lost
	if lost {
		l.lost = true
		l.markGone()
	}
	l.mu.Unlock()
	if lost {
		l.fenceStop(metrics.FenceLeaseTaken, nil)
		return
	}
	l.checkPreempt()
}

// checkPreempt calls onPreempt when another run reserved the thread.
func (l *leaseHandle) checkPreempt() {
	if p := l.preemptor(); p.RunID != "" && l.onPreempt != nil {
		l.onPreempt(p)
	}
}

// preemptor returns the first reservation by another run.
func (l *leaseHandle) preemptor() protocol.Preemption {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range l.th.Preempt {
		if p.RunID != l.run {
			return p
		}
	}
	return protocol.Preemption{}
}

type releaseOpts struct {
	status     string
	rollback   bool
	rollbackTo string
	// filesBack: the rollback checked rollbackTo's files out.
	filesBack bool
	// head and title, when set, move the head to the run's last delta in
	// the same write.
	head, title string
	// usage, when set, is the run's usage, applied to the thread's
	// totals in the same write (the thread's usage bucket entry before
	// protocol v2).
	usage *protocol.RunUsage
	// last, when set, is the run's terminal summary (Thread.LastRun).
	last *protocol.Run
}

// release gives the thread back. A rollback also returns the thread's head
// to where it was before the run started.
func (l *leaseHandle) release(ctx context.Context, o *releaseOpts) error {
	if o == nil {
		o = &releaseOpts{status: protocol.ThreadIdle}
	}
	err := l.mutate(ctx, func(t *protocol.Thread) error {
		t.Lease = nil
		t.Status = o.status
		switch {
		case o.rollback:
			t.Head = o.rollbackTo
			if o.filesBack {
				t.FilesAt = o.rollbackTo
			}
		case o.head != "":
			t.Head, t.FilesAt = o.head, o.head
		}
		if o.title != "" {
			t.Title = o.title
		}
		t.Preempt = withoutRun(t.Preempt, l.run)
		if u := o.usage; u != nil {
			applyThreadUsage(t, u)
		}
		if o.last != nil {
			t.LastRun = o.last
		}
		return nil
	})
	if err == nil {
		l.released()
	}
	return err
}

// held is the lease as this run last wrote it.
func (l *leaseHandle) held() protocol.Lease {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.th.Lease == nil {
		return protocol.Lease{RunID: l.run, Epoch: l.epoch}
	}
	return *l.th.Lease
}

// applyThreadUsage sets a run's total in the thread record's usage. The
// release that carries it is fenced by the lease epoch, so a run counts
// once; a run whose end is written again (its terminal record failed
// after the release) replaces its entry instead of adding to it.
func applyThreadUsage(t *protocol.Thread, u *protocol.RunUsage) {
	if t.Usage == nil {
		t.Usage = &protocol.ThreadUsage{ThreadID: t.ThreadID, Tenant: t.Tenant}
	} else {
		t.Usage = t.Usage.Clone()
	}
	if t.Usage.Apply(u.RunID, u.Total, protocol.ThreadRecordUsageRuns) {
		t.Usage.UpdatedAt = time.Now().UTC()
	}
}

// leaseTakenAt is when this worker wrote the lease of th (its own clock),
// or else when the run is starting.
func leaseTakenAt(th *protocol.Thread, starting time.Time) time.Time {
	if th.Lease != nil && !th.Lease.RenewedAt.IsZero() && th.Lease.RenewedAt.Before(starting) {
		return th.Lease.RenewedAt
	}
	return starting
}
