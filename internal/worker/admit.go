package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/limits"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
)

type verdict int

const (
	verdictStart     verdict = iota // the run holds the thread's lease
	verdictWait                     // another run goes first
	verdictReject                   // reject strategy and the thread is busy
	verdictGone                     // the request left the stream: nothing to do
	verdictRetry                    // the thread changed under us: decide again now
	verdictDeleting                 // the thread is being deleted: drop the request
	verdictCancelled                // a cancel listed the run on its thread: settle it
)

type decision struct {
	verdict verdict
	thread  *protocol.Thread
	rev     uint64
	reason  string
	// soon: wait a moment only (a tentative lease about to be given
	// back), not for the thread's next run to finish.
	soon bool
}

// snapshot is what decides a request's fate, read in one round trip: its
// run record, whether it is the oldest request of its thread, and the
// thread record.
type snapshot struct {
	rec   *protocol.Run
	rev   uint64
	head  headState
	th    *protocol.Thread
	thRev uint64
	// spec is the new thread record, with this run's tentative lease,
	// that look created beside its reads (j.speculate), at specRev; nil
	// when it did not (the thread exists, or the run may not try).
	spec    *protocol.Thread
	specRev uint64
}

// look reads the snapshot; the reads go out together. The run record is
// not read for a request delivered for the first time that no submitter
// announced (a plain NATS publish): nobody has written its record yet
// unless the run id is reused, which creating the record finds out.
func (j *job) look(ctx context.Context, first bool) (*snapshot, error) {
	w := j.w
	req := j.req
	s := &snapshot{head: headSelf}
	var wg sync.WaitGroup
	var recErr, headErr error
	if !first || j.msg.Headers().Get(protocol.HeaderSubmitter) != "" {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.rec, s.rev, recErr = w.stores.Runs.Get(ctx, req.Tenant, req.RunID)
			if errors.Is(recErr, kv.ErrNotFound) {
				s.rec, recErr = nil, nil
			}
		}()
	}
	if !preempting(req) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.head, headErr = j.head(ctx)
		}()
	}
	if first && j.mayGuessLease() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.spec, s.specRev = j.guessLease(ctx)
		}()
	}
	th, rev, err := w.stores.Threads.Get(ctx, req.Tenant, req.ThreadID)
	if err == nil {
		s.th, s.thRev = th, rev
	} else if !errors.Is(err, kv.ErrNotFound) {
		wg.Wait()
		return s, err
	}
	wg.Wait()
	if recErr != nil {
		return s, recErr
	}
	return s, headErr
}

// mayGuessLease reports whether the run may take its thread's lease in
// the same round trip as it reads whether it is the thread's oldest
// request (guessLease): a request a plain publish sent, delivered for the
// first time (nobody wrote its record), that keeps its thread's order
// (not steer or rollback), of a tenant whose running runs are not
// counted (a slot would be one more round trip first).
func (j *job) mayGuessLease() bool {
	w := j.w
	if preempting(j.req) || j.msg.Headers().Get(protocol.HeaderSubmitter) != "" {
		return false
	}
	return w.cfg.Limits == nil || j.req.Parent != nil || w.cfg.Limits.For(j.req.Tenant).MaxConcurrentRuns <= 0
}

// guessLease creates the thread record with this run's lease, tentative,
// for a thread that does not exist yet: most requests of a new thread are
// its first and only one, so the lease is taken beside the reads that
// say whether it may be (look) instead of after them, a stage less. The
// create is refused, writing nothing, when the thread exists. It returns
// the record and its revision, or nil.
func (j *job) guessLease(ctx context.Context) (*protocol.Thread, uint64) {
	req := j.req
	now := time.Now().UTC()
	t := &protocol.Thread{ThreadID: req.ThreadID, Tenant: req.Tenant, CreatedAt: now, UpdatedAt: now}
	j.takeLease(t, nil, now)
	t.Lease.Tentative = true
	rev, err := j.w.stores.Threads.CreateNew(ctx, t)
	if err != nil {
		return nil, 0
	}
	return t, rev
}

// takeLease makes t's lease req's run's (Epoch, Lease, Status and the
// run's place in RecentRuns) and returns the runs that left RecentRuns.
func (j *job) takeLease(t *protocol.Thread, rec *protocol.Run, now time.Time) (evicted []string) {
	req := j.req
	if t.Epoch == 0 && t.Owner == "" && req.Principal != nil && req.Parent == nil {
		// The first run of a thread no submitter created owns it.
		t.Owner = req.Principal.User
	}
	t.Epoch++
	t.Lease = nextLease(t, rec, req, j.w.cfg.ID, j.seq, now)
	t.Status = protocol.ThreadBusy
	t.LastRunID = req.RunID
	t.Preempt = withoutRun(t.Preempt, req.RunID)
	// The run is listed with its thread by this write (protocol v2: no
	// run index key of its own while it is recent).
	return t.AddRecentRun(req.RunID)
}

// dropGuess gives back a lease guessLease took when the run may not start
// now (an older request of the thread waits, the request left the
// stream): the thread is put back as it was before (no lease, epoch 0,
// no owner, the run not listed), keeping what others wrote since (a steer
// reservation). Runs of this worker waiting for the thread are woken;
// those of other workers see the lease gone at their next look.
func (j *job) dropGuess(ctx context.Context, th *protocol.Thread, rev uint64) error {
	req := j.req
	_, _, err := j.w.stores.Threads.MutateFrom(ctx, req.Tenant, req.ThreadID, th, rev, func(t *protocol.Thread) error {
		if t.Lease == nil || t.Lease.RunID != req.RunID || t.Lease.Epoch != th.Epoch || !t.Lease.Tentative {
			return errUnchanged
		}
		t.Lease = nil
		t.Status = protocol.ThreadIdle
		if t.Epoch == th.Epoch {
			t.Epoch--
		}
		if t.Owner == th.Owner && t.Epoch == 0 {
			t.Owner = ""
		}
		if t.LastRunID == req.RunID {
			t.LastRunID = ""
		}
		var runs []string
		for _, r := range t.RecentRuns {
			if r != req.RunID {
				runs = append(runs, r)
			}
		}
		t.RecentRuns = runs
		return nil
	})
	if errors.Is(err, errUnchanged) {
		err = nil
	}
	j.w.wakeThread(req.Tenant, req.ThreadID)
	return err
}

// guessWaitsMax bounds how many times a run looks again, a moment apart,
// at a tentative lease of a younger request before it waits as for any
// busy thread.
const guessWaitsMax = 50

// guessWait is how long a run waits before it looks again at a
// tentative lease of a younger request: about the round trip its holder
// needs to give it back.
const guessWait = 5 * time.Millisecond

func preempting(req *protocol.RunRequest) bool {
	return req.MultitaskStrategy == protocol.StrategySteer || req.MultitaskStrategy == protocol.StrategyRollback
}

// admit decides whether the run may start now. Ordering comes from the
// runs stream itself: a thread's requests stay in the stream until they
// finish, so the oldest one on the thread's subject is the one whose turn
// it is. Steer and rollback runs skip that order and reserve the thread in
// its record (Preempt); every start goes through a CAS on the thread
// record, which is also the lease.
func (j *job) admit(ctx context.Context, snap *snapshot) (decision, error) {
	w := j.w
	req := j.req
	strategy := req.MultitaskStrategy

	if snap.th != nil && snap.th.Status == protocol.ThreadDeleting {
		return decision{verdict: verdictDeleting}, nil
	}
	switch snap.head {
	case headGone:
		return decision{verdict: verdictGone}, nil
	case headOther:
		if strategy == protocol.StrategyReject {
			return decision{verdict: verdictReject, reason: "the thread has an earlier run waiting or running"}, nil
		}
		return decision{verdict: verdictWait}, nil
	}

	th, rev := snap.th, snap.thRev
	var breakEpoch uint64 // a stale lease this run may break
	var breakRenewed time.Time
	if th != nil && th.Lease != nil && th.Lease.RunID != req.RunID {
		stale, err := w.staleLease(ctx, th)
		if err != nil {
			return decision{}, err
		}
		if l := th.Lease; !stale && l.Tentative && l.MsgSeq > j.seq {
			// A younger request's run took the lease before it read that
			// this older one waits (guessLease): it gives it back in a
			// moment. Neither busy (a reject run would be refused) nor
			// stale, unless its holder died before it could.
			if time.Since(l.RenewedAt) <= w.cfg.Settings.AckWait {
				return decision{verdict: verdictWait, soon: true}, nil
			}
			stale = true
		}
		if !stale {
			switch strategy {
			case protocol.StrategyReject:
				return decision{verdict: verdictReject, reason: fmt.Sprintf("the thread is busy with run %s", th.Lease.RunID)}, nil
			case protocol.StrategyEnqueue:
				return decision{verdict: verdictWait}, nil
			}
			return j.reserve(ctx, th, rev)
		}
		// A holder no redelivery will continue is settled (its record
		// ended, the thread released) rather than left running forever
		// behind a broken lease.
		if settled, err := w.reapLease(ctx, th); err != nil {
			return decision{}, err
		} else if settled {
			return decision{verdict: verdictRetry}, nil
		}
		j.log.Warn("breaking a stale lease", zap.String("holder", th.Lease.RunID), zap.Time("renewed_at", th.Lease.RenewedAt))
		breakEpoch, breakRenewed = th.Lease.Epoch, th.Lease.RenewedAt
	}
	if th != nil && th.Lease != nil && th.Lease.RunID == req.RunID && th.Lease.MsgSeq != j.seq {
		// The lease belongs to another copy of this run's request.
		return decision{verdict: verdictWait}, nil
	}
	takeover := th != nil && th.Lease != nil && th.Lease.RunID == req.RunID
	if takeover && !j.lapsed(th.Lease) {
		// An earlier delivery of this request holds the lease and may
		// still be running it (the server redelivers on its own clock:
		// after a restart, a consumer leader's move, unconfirmed
		// heartbeats). The lease decides: wait, the request kept in
		// progress, until its holder stopped renewing it.
		return decision{verdict: verdictWait}, nil
	}
	if !takeover && th != nil && len(th.Preempt) > 0 && th.Preempt[0].RunID != req.RunID {
		cleaned, err := j.dropFinishedPreemptions(ctx, th, rev)
		if err != nil || cleaned {
			return decision{verdict: verdictRetry}, err
		}
		switch {
		case strategy == protocol.StrategyReject:
			return decision{verdict: verdictReject, reason: fmt.Sprintf("run %s is about to take the thread", th.Preempt[0].RunID)}, nil
		case preempting(req):
			return j.reserve(ctx, th, rev)
		}
		return decision{verdict: verdictWait}, nil
	}

	if ok, err := j.tenantSlot(ctx); err != nil || !ok {
		// Over the tenant's running runs: wait like a run whose thread
		// is busy (no delivery is spent, nothing is dead-lettered).
		return decision{verdict: verdictWait}, err
	}
	// The lease keeps the head it was taken at: the run's state at that
	// head is read while the lease is written, not after it.
	pre := j.prefetchState(ctx, th)
	now := time.Now().UTC()
	var evicted []string
	next, nextRev, err := w.stores.Threads.MutateFrom(ctx, req.Tenant, req.ThreadID, th, rev, func(t *protocol.Thread) error {
		evicted = nil
		if t.Status == protocol.ThreadDeleting {
			return errRetryAdmit // decided again: dropped
		}
		if t.RunCancelled(req.RunID) {
			// A cancel ended the run before this write (cancelIfStarted):
			// whatever this run read before, it does not start.
			return errRunCancelled
		}
		switch {
		case t.Lease == nil:
		case th != nil && t.Lease.RunID == req.RunID && t.Lease.MsgSeq == j.seq && sameHolding(t.Lease, th.Lease):
			// Taken over as seen lapsed: renewed since, it is not.
		case breakEpoch != 0 && t.Lease.Epoch == breakEpoch && t.Lease.RenewedAt.Equal(breakRenewed):
		default:
			return errRetryAdmit
		}
		if len(t.Preempt) > 0 && t.Preempt[0].RunID != req.RunID && !takeover {
			return errRetryAdmit
		}
		evicted = j.takeLease(t, snap.rec, now)
		return nil
	})
	if err != nil {
		pre.drop()
	} else {
		j.pre = pre
	}
	if errors.Is(err, errRetryAdmit) {
		return decision{verdict: verdictRetry}, nil
	}
	if errors.Is(err, errRunCancelled) {
		return decision{verdict: verdictCancelled}, nil
	}
	if err != nil {
		return decision{}, err
	}
	for _, run := range evicted {
		// Off the thread's recent list: listed by its index key from now.
		_ = w.stores.Threads.IndexRun(ctx, req.Tenant, req.ThreadID, run, now)
	}
	return decision{verdict: verdictStart, thread: next, rev: nextRev}, nil
}

var (
	errRetryAdmit   = errors.New("thread changed; decide again")
	errRunCancelled = errors.New("the run was cancelled before it took the lease")
)

// nextLease is the lease req's run takes on t (whose Epoch is already
// the new one). Since protocol v2 no record is written when a run starts,
// so the lease carries what that record did: the attempt, the base
// checkpoint a rollback returns to, the agent and the creation time. A
// lease taken over from an earlier attempt of the run (its lease, or a
// running record a v1 worker wrote) continues its count and keeps its
// base.
func nextLease(t *protocol.Thread, rec *protocol.Run, req *protocol.RunRequest, worker string, seq uint64, now time.Time) *protocol.Lease {
	l := &protocol.Lease{RunID: req.RunID, Worker: worker, Epoch: t.Epoch, MsgSeq: seq, AcquiredAt: now, RenewedAt: now,
		Attempt: 1, Agent: req.Agent, BaseCheckpoint: t.Head}
	created := now
	if rec != nil {
		created = rec.CreatedAt
		l.Attempt = rec.Attempt + 1
		if rec.Status == protocol.StatusRunning {
			l.BaseCheckpoint = rec.BaseCheckpoint
		}
	}
	if prev := t.Lease; prev != nil && prev.RunID == req.RunID && prev.Attempt > 0 {
		l.Attempt = max(l.Attempt, prev.Attempt+1)
		l.BaseCheckpoint = prev.BaseCheckpoint
		if prev.CreatedAt != nil {
			created = *prev.CreatedAt
		}
	}
	l.CreatedAt = &created
	return l
}

// lapsed reports whether lease, held for this request by an earlier
// delivery of it, may be taken over: its holder handed it back, or
// stopped renewing it long enough ago that it stopped running the run.
//
// A holder stops itself (its fence) when no write of the lease and no
// in-progress signal of the request succeeded for 3/4 of the ack wait,
// counted from when it sent them. This delivery saw the lease's last
// renewal only after it was stored, so once the lease has stayed the
// same for an ack wait by this worker's clock, its holder has been
// stopped for at least a quarter of one, whatever the two clocks say.
// A renewal older than an ack wait by the holder's own timestamp counts
// as well (worker clocks agree to well within a quarter of the ack wait
// under NTP): that spares the wait when the holder died long ago, the
// usual case of a redelivery.
func (j *job) lapsed(lease *protocol.Lease) bool {
	if lease.HandedOver {
		return true
	}
	now := time.Now()
	if j.seen == nil || !sameHolding(j.seen, lease) {
		seen := *lease
		j.seen, j.seenAt = &seen, now
	}
	lapse := j.w.cfg.Settings.AckWait
	if now.Sub(j.seenAt) >= lapse || now.Sub(lease.RenewedAt) >= lapse {
		return true
	}
	if !j.waitedLapse {
		j.waitedLapse = true
		j.log.Info("an earlier delivery of this run still holds the thread's lease; waiting for it to lapse",
			zap.String("holder", lease.Worker), zap.Uint64("epoch", lease.Epoch), zap.Time("renewed_at", lease.RenewedAt))
	}
	return false
}

// sameHolding reports whether two reads of a lease show the same holding,
// not renewed in between.
func sameHolding(a, b *protocol.Lease) bool {
	return a != nil && b != nil && a.RunID == b.RunID && a.Epoch == b.Epoch && a.RenewedAt.Equal(b.RenewedAt) && a.HandedOver == b.HandedOver
}

type headState int

const (
	headSelf headState = iota
	headOther
	headGone
	// headCopy: an older copy of this very request (the same run id,
	// published again without a message id or after the duplicate
	// window) owns the run; this copy is dropped.
	headCopy
)

// head reports whether this request is the oldest one of its thread still
// in the runs stream. Older requests whose runs already finished (a crash
// between finishing and acking, a cancel while pending) are cleaned up on
// the way, so they never hold the thread back.
func (j *job) head(ctx context.Context) (headState, error) {
	w := j.w
	subject := w.names.RunSubject(j.req.Tenant, j.req.ThreadID)
	var from uint64 // where to look: past the requests of runs finishing now
	for range 100 {
		m, err := bus.DirectGetNext(ctx, w.js, w.names.RunsStream(), subject, from)
		if errors.Is(err, bus.ErrNoDirectGet) {
			m, err = w.runsStream.GetMsg(ctx, from, jetstream.WithGetMsgSubject(subject))
		}
		if errors.Is(err, jetstream.ErrMsgNotFound) || (err == nil && m.Sequence > j.seq) {
			// Our own request looks gone from the stream. A direct get
			// may be answered by a replica that has not stored it yet
			// (it was delivered by the leader): only the leader may say
			// so, or a run would be acked without running.
			m, err = bus.GetMsgFromLeader(ctx, w.js, w.names.RunsStream(), bus.MsgQuery{NextBySubject: subject, Seq: from})
		}
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return headGone, nil
		}
		if err != nil {
			return 0, err
		}
		if m.Sequence == j.seq {
			return headSelf, nil
		}
		if m.Sequence > j.seq {
			// Our own request is gone from the stream.
			return headGone, nil
		}
		runID := m.Header.Get(nats.MsgIdHdr)
		if runID != "" {
			// Another tenant's id or the old bare form: invalid, and
			// its worker dead-letters it.
			runID = protocol.RunIDFromMsgID(j.req.Tenant, runID)
		} else {
			var probe struct {
				RunID string `json:"run_id"`
			}
			_ = json.Unmarshal(m.Data, &probe)
			runID = probe.RunID
		}
		if !protocol.ValidToken(runID) {
			// An invalid request its worker has not dead-lettered yet.
			return headOther, nil
		}
		if runID == j.req.RunID {
			// An older copy of this very run. The copy the run's record
			// names owns the run, and the other one is dead weight. With
			// no record, or one that names no copy yet, the older copy
			// owns it: a run starts before its record is written (its
			// lease says it runs), so the older copy may be running now.
			rec, _, err := w.stores.Runs.GetFromLeader(ctx, j.req.Tenant, runID)
			if err != nil && !errors.Is(err, kv.ErrNotFound) {
				return 0, err
			}
			if err == nil && rec.MsgSeq == j.seq {
				w.deleteRequest(ctx, m.Sequence)
				continue
			}
			return headCopy, nil
		}
		hrec, _, err := w.stores.Runs.Get(ctx, j.req.Tenant, runID)
		if errors.Is(err, kv.ErrNotFound) {
			return headOther, nil // not seen by any worker yet
		}
		if err != nil {
			return 0, err
		}
		if hrec.MsgSeq != 0 && hrec.MsgSeq != m.Sequence {
			w.deleteRequest(ctx, m.Sequence) // a duplicate copy of another run
			continue
		}
		if !hrec.Status.Terminal() {
			return headOther, nil
		}
		if hrec.FinishedAt != nil && time.Since(*hrec.FinishedAt) < w.cfg.Settings.AckWait {
			// Finished just now: its worker is flushing its last events
			// and publishing run.finished (the record ends first). It
			// no longer holds the thread, so this run looks past it;
			// finishing it here would mark events still on their way
			// as lost, and they would then be stored twice. Should its
			// worker die now, its request is delivered again and
			// finished then.
			from = m.Sequence + 1
			continue
		}
		if err := w.pub.EnsureFinished(ctx, hrec); err != nil {
			return 0, err
		}
		w.deleteRequest(ctx, m.Sequence)
	}
	return headOther, nil
}

func (w *Worker) deleteRequest(ctx context.Context, seq uint64) {
	if err := w.runsStream.DeleteMsg(ctx, seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		w.log.Debug("delete finished request", zap.Uint64("stream_seq", seq), zap.Error(err))
	}
}

// staleLease reports whether the thread's lease may be broken: its run
// finished without releasing it, or nobody renewed it for StaleLease.
func (w *Worker) staleLease(ctx context.Context, th *protocol.Thread) (bool, error) {
	if time.Since(th.Lease.RenewedAt) > w.cfg.StaleLease {
		return true, nil
	}
	hrec, _, err := w.stores.Runs.Get(ctx, th.Tenant, th.Lease.RunID)
	if errors.Is(err, kv.ErrNotFound) {
		// Not a sign of a dead lease: a worker takes the lease before it
		// creates the record of a run no submitter announced, and a
		// replica may not have the record yet. A lease that nobody
		// renews goes stale by time, above.
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return hrec.Status.Terminal(), nil
}

// reserve puts a steer or rollback run in the thread's Preempt list and
// tells the worker running the thread's active run to look.
func (j *job) reserve(ctx context.Context, th *protocol.Thread, rev uint64) (decision, error) {
	w := j.w
	req := j.req
	next, _, err := w.stores.Threads.MutateFrom(ctx, req.Tenant, req.ThreadID, th, rev, func(t *protocol.Thread) error {
		if t.Status == protocol.ThreadDeleting {
			return errUnchanged
		}
		for _, p := range t.Preempt {
			if p.RunID == req.RunID {
				return errUnchanged
			}
		}
		t.Preempt = append(t.Preempt, protocol.Preemption{RunID: req.RunID, Strategy: req.MultitaskStrategy})
		return nil
	})
	if err != nil && !errors.Is(err, errUnchanged) {
		return decision{}, err
	}
	if next != nil && next.Lease != nil {
		w.signal(next.Lease.Worker, control{Action: actionLook, Tenant: req.Tenant, Thread: req.ThreadID, Run: next.Lease.RunID})
	}
	return decision{verdict: verdictWait}, nil
}

var errUnchanged = errors.New("unchanged")

// dropFinishedPreemptions removes reservations of runs that ended while
// they waited (cancelled, failed), so they never block the thread.
func (j *job) dropFinishedPreemptions(ctx context.Context, th *protocol.Thread, rev uint64) (bool, error) {
	w := j.w
	var dead []string
	for _, p := range th.Preempt {
		if p.RunID == j.req.RunID {
			break
		}
		r, _, err := w.stores.Runs.Get(ctx, th.Tenant, p.RunID)
		if errors.Is(err, kv.ErrNotFound) || (err == nil && r.Status.Terminal()) {
			dead = append(dead, p.RunID)
			continue
		}
		if err != nil {
			return false, err
		}
	}
	if len(dead) == 0 {
		return false, nil
	}
	_, _, err := w.stores.Threads.MutateFrom(ctx, th.Tenant, th.ThreadID, th, rev, func(t *protocol.Thread) error {
		for _, id := range dead {
			t.Preempt = withoutRun(t.Preempt, id)
		}
		return nil
	})
	return err == nil, err
}

func withoutRun(ps []protocol.Preemption, run string) []protocol.Preemption {
	out := ps[:0:0]
	for _, p := range ps {
		if p.RunID != run {
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// tenantSlot takes one of the tenant's max_concurrent_runs slots for the
// run (limits.Limiter.Acquire), or reports false when they are all held.
// Subagent runs take none: their parent holds one, and a child waiting
// for its parent's slot would wait for ever.
func (j *job) tenantSlot(ctx context.Context) (bool, error) {
	w := j.w
	if w.cfg.Limits == nil || j.req.Parent != nil {
		return true, nil
	}
	slot := limits.Slot{Thread: j.req.ThreadID, Run: j.req.RunID, Worker: w.cfg.ID}
	return w.cfg.Limits.Acquire(ctx, j.req.Tenant, slot, func(ctx context.Context, s limits.Slot) (bool, error) {
		return w.slotLive(ctx, j.req.Tenant, s)
	})
}

// slotLive reports whether a run holding a tenant slot still runs: it
// holds its thread's lease and the lease is renewed. A slot younger than
// AckWait counts as live: its run may be between the slot and the lease.
func (w *Worker) slotLive(ctx context.Context, tenant string, s limits.Slot) (bool, error) {
	if time.Since(s.At) < w.cfg.Settings.AckWait || !protocol.ValidToken(s.Thread) {
		return protocol.ValidToken(s.Thread), nil
	}
	th, _, err := w.stores.Threads.Get(ctx, tenant, s.Thread)
	if errors.Is(err, kv.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if th.Lease == nil || th.Lease.RunID != s.Run {
		return false, nil
	}
	return time.Since(th.Lease.RenewedAt) <= w.cfg.StaleLease, nil
}

// releaseTenantSlot gives the run's tenant slot back when it ends. If
// this fails the slot is freed when the next run finds it dead.
func (j *job) releaseTenantSlot(ctx context.Context) {
	w := j.w
	if w.cfg.Limits == nil || j.req.Parent != nil {
		return
	}
	if err := w.cfg.Limits.Release(ctx, j.req.Tenant, j.req.RunID); err != nil {
		j.log.Warn("could not release the tenant's running-run slot; the next run of the tenant frees it", zap.Error(err))
	}
}

// countEventBytes adds the events this attempt of the run stored to the
// tenant's event quota (limits max_event_bytes).
func (j *job) countEventBytes(ctx context.Context, n int64) {
	w := j.w
	if w.cfg.Limits == nil || n <= 0 {
		return
	}
	if err := w.cfg.Limits.AddEventBytes(ctx, j.req.Tenant, n); err != nil {
		j.log.Warn("could not count the run's event bytes for the tenant's quota", zap.Error(err))
	}
}

// statePrefetch is a run's thread state read from a head while the run's
// lease is being written (job.prefetchState).
type statePrefetch struct {
	head   string
	done   chan struct{}
	st     *state.State
	chain  []*kv.Delta
	err    error
	cancel context.CancelFunc
}

// prefetchState starts reading the state at th's head, for the run about
// to take th's lease: the lease's write leaves the head as it is, so the
// run needs that state once the lease is its own, and the read goes out
// beside the write instead of after it. Nil when there is nothing to read
// (a new thread, or one without a checkpoint).
func (j *job) prefetchState(ctx context.Context, th *protocol.Thread) *statePrefetch {
	if th == nil || th.Head == "" {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	p := &statePrefetch{head: th.Head, done: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(p.done)
		p.st, p.chain, p.err = j.w.stores.Checkpoints.Load(ctx, j.req.Tenant, j.req.ThreadID, p.head)
	}()
	return p
}

// drop abandons a prefetch whose lease was not taken.
func (p *statePrefetch) drop() {
	if p != nil {
		p.cancel()
	}
}

// loadState is the run's state at head: the prefetched one when it was
// read at that head and without error, else read now.
func (j *job) loadState(ctx context.Context, head string) (*state.State, []*kv.Delta, error) {
	p := j.pre
	j.pre = nil
	if p != nil {
		defer p.cancel()
		if p.head == head {
			select {
			case <-p.done:
				if p.err == nil {
					return p.st, p.chain, nil
				}
			case <-ctx.Done():
				return nil, nil, context.Cause(ctx)
			}
		}
	}
	return j.w.stores.Checkpoints.Load(ctx, j.req.Tenant, j.req.ThreadID, head)
}
