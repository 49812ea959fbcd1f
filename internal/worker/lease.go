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

	mu   sync.Mutex
	th   *protocol.Thread
	rev  uint64
	lost bool
	// The fence (fenceFor, fenced) has a lock of its own: l.mu is held
	// through a write, which a server that does not answer holds for
	// seconds.
	fmu        sync.Mutex
	fence      *time.Timer
	fenceAfter time.Duration
	renewed    time.Time     // when the last successful write of the lease was sent
	progressed *atomic.Int64 // the request's last confirmed in-progress signal (job.progressed)
	fired      atomic.Bool
	// gone is set once the run may no longer act for the lease: the
	// lease was lost, or the fence ran out. Unlike fired it is not set
	// when the run simply ended (stopFence).
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
		l.fmu.Lock()
		if sent.After(l.renewed) {
			l.renewed = sent
		}
		l.fmu.Unlock()
		l.refence()
	} else {
		l.refusedForRoom(sent, err)
	}
	lost := errors.Is(err, agent.ErrLeaseLost) && !l.lost
	if lost {
		l.lost = true
		l.gone.Store(true)
	}
	l.mu.Unlock()
	if lost && l.onLost != nil {
		l.onLost()
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

// fenceFor starts the lease's fence: from now on, when for after no write
// of the lease has succeeded, or no in-progress signal of the run's
// request was confirmed (counted from when the last successful one was
// sent; the lease's taking at renewedAt counts as a write), the run is
// stopped as if the lease were lost (fenced).
func (l *leaseHandle) fenceFor(after time.Duration, renewedAt time.Time, progressed *atomic.Int64) {
	l.fmu.Lock()
	if l.fence != nil {
		l.fmu.Unlock()
		return
	}
	l.fenceAfter, l.renewed, l.progressed = after, renewedAt, progressed
	l.fence = time.AfterFunc(time.Until(l.deadline()), l.fenced)
	l.fmu.Unlock()
}

// deadline is when the fence fires unless a write or a confirmation comes
// first, with l.fmu held.
func (l *leaseHandle) deadline() time.Time {
	last := l.renewed
	if p := time.Unix(0, l.progressed.Load()); p.Before(last) {
		last = p
	}
	return last.Add(l.fenceAfter)
}

// refence moves the fence after a successful write or a confirmed
// in-progress signal.
func (l *leaseHandle) refence() {
	l.fmu.Lock()
	defer l.fmu.Unlock()
	if l.fence != nil && !l.fired.Load() {
		l.fence.Reset(time.Until(l.deadline()))
	}
}

// stopFence ends the fence once the run stopped executing: what is left
// (the run's end, the release) are writes the epoch fences anyway, and
// stopping a run that already ended would only delay it.
func (l *leaseHandle) stopFence() {
	l.fmu.Lock()
	defer l.fmu.Unlock()
	if l.fence != nil {
		l.fence.Stop()
	}
	l.fired.Store(true)
}

// fenced stops a run whose lease could not be renewed, or whose
// request's in-progress signals were not confirmed, for the fence's time.
// The server hands a request to another worker an ack wait after the last
// in-progress signal it received, and that worker takes the thread over;
// so a worker that has not had one confirmed (nor renewed its lease) for
// three quarters of the ack wait (a node loss, a partition) must assume
// the run may be taken from it soon and stop first: running on, it would
// call the model and tools and publish events beside the worker that took
// over (its writes alone are refused, by the epoch). The run stops as if
// the lease were lost: it is abandoned, so its request's in-progress
// signals stop too and the request does come back; whoever gets it
// continues from the last checkpoint (taking the lease over if it was
// still this run's).
func (l *leaseHandle) fenced() {
	l.fmu.Lock()
	if l.fired.Load() || time.Now().Before(l.deadline()) {
		// Stopped, or moved by a confirmation that raced the timer.
		l.fmu.Unlock()
		return
	}
	l.fired.Store(true)
	l.gone.Store(true)
	l.fmu.Unlock()
	l.w.log.Warn("lease not renewed in time: stopping the run before another worker takes it over", zap.String("tenant", l.tenant),
		zap.String("thread_id", l.thread), zap.String("run_id", l.run), zap.Duration("unrenewed_for", l.fenceAfter))
	if l.onLost != nil {
		l.onLost()
	}
}

// live reports whether the run may still act for its lease: publish an
// event, call the model, run a tool. It checks the fence's deadline
// itself rather than trusting the timer: a process that was paused (a
// SIGSTOP, a long GC, a suspended VM) resumes its goroutines in any
// order, and the one about to publish may run before the timer's. Past
// the deadline the run is fenced here and then, and live reports false.
func (l *leaseHandle) live() bool {
	if l.gone.Load() {
		return false
	}
	l.fmu.Lock()
	if l.fence == nil || l.fired.Load() || time.Now().Before(l.deadline()) {
		// Not fenced yet (the run is starting), ended, or in time.
		l.fmu.Unlock()
		return !l.gone.Load()
	}
	l.fmu.Unlock()
	l.fenced()
	return !l.gone.Load()
}

// Fenced is agent.Fence: the error a run that lost its lease stops with,
// checked before each model call and tool call.
func (l *leaseHandle) Fenced() error {
	if l.live() {
		return nil
	}
	return agent.ErrLeaseLost
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
	if err != nil && !errors.Is(err, agent.ErrLeaseLost) && !l.w.nc.IsClosed() {
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
		l.gone.Store(true)
	}
	l.mu.Unlock()
	if lost && l.onLost != nil {
		l.onLost()
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
	return l.mutate(ctx, func(t *protocol.Thread) error {
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
