package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/events"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
	"github.com/natsagent/natsagent/internal/tools"
)

// job is one run request held by this worker, from delivery to ack.
type job struct {
	w   *Worker
	msg jetstream.Msg
	id  uint64 // this worker's number for the delivery (Worker.held)
	seq uint64 // stream sequence of the request
	key string // tenant.run once decoded
	req *protocol.RunRequest
	log *zap.Logger

	// hold guards the fields below, shared with the heartbeat goroutine
	// and control signals.
	hold      sync.Mutex
	lease     *leaseHandle // set while the run holds its thread
	cancelRun context.CancelCauseFunc
	// preempt's cause is middleware.ErrHandOff for a drain; preemptCtx is
	// done once it was called (the run stops at its next safe boundary).
	preempt    context.CancelCauseFunc
	preemptCtx context.Context
	wake       chan struct{} // signalled to re-check a waiting run
	rec        *protocol.Run // the run's record as read before it started (nil: none)
	recRev     uint64
	// What the run's lease says of this attempt: the thread's head when
	// the run first started, this attempt's start, the run's creation.
	base      string
	startedAt time.Time
	createdAt time.Time
	drained   bool
	abandoned bool // lease lost: never touch the message again
	finished  chan struct{}
	span      trace.Span // the run's span; nil when the process does not trace
	// fullSince is when (unix nanos) the run's current wait for room in a
	// full store began (0: not waiting); fullTries counts its tries.
	fullSince atomic.Int64
	fullTries atomic.Int64

	// seen is the lease an earlier delivery of this request held when
	// this one first saw it so, at seenAt (job.lapsed); waitedLapse is
	// set once the wait for it was logged.
	seen        *protocol.Lease
	seenAt      time.Time
	waitedLapse bool

	// guessWaits counts the looks again at a tentative lease (admit).
	guessWaits int

	// pre is the thread state being read while the lease was taken
	// (admit), for execute; nil once used.
	pre *statePrefetch
}

// runFields are the fields on every line a run logs: tenant, thread_id,
// run_id and, once the run started, attempt. They are read from the
// request when a line is written, so a run's logger keeps one field (zap
// keeps a field of 64 bytes for each, for the whole run) and most runs,
// which log nothing, never format them.
type runFields struct {
	req     *protocol.RunRequest
	attempt int
}

func (f runFields) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	enc.AddString("tenant", f.req.Tenant)
	enc.AddString("thread_id", f.req.ThreadID)
	enc.AddString("run_id", f.req.RunID)
	if f.attempt > 0 {
		enc.AddInt64("attempt", int64(f.attempt))
	}
	return nil
}

// handle takes one delivered request to its end. It owns one slot on entry
// and gives it back on return (or while it waits for its thread).
func (w *Worker) handle(base context.Context, msg jetstream.Msg) {
	if testHookHandling != nil {
		testHookHandling()
	}
	meta, err := msg.Metadata()
	if err != nil {
		// Like every request natsagent terminates, it is copied to the
		// dead-letter stream first (without a sequence to name it by).
		w.log.Error("request without metadata", zap.Error(err))
		tenant, thread, _ := w.names.ParseRunSubject(msg.Subject())
		if err := w.copyToDLQ(base, msg.Subject(), msg.Headers(), msg.Data(), 0, "delivered without JetStream metadata: "+err.Error(), tenant, thread); err != nil {
			w.log.Error("could not dead-letter the request; handing it back", zap.Error(err))
			_ = msg.NakWithDelay(time.Second)
		} else {
			_ = msg.Term()
		}
		<-w.slots
		return
	}
	j := &job{w: w, msg: msg, id: w.jobIDs.Add(1), seq: meta.Sequence.Stream, log: w.log, wake: make(chan struct{}, 1), finished: make(chan struct{})}
	w.track(j)
	hasSlot := true
	defer func() {
		w.untrack(j)
		close(j.finished)
		w.cfg.Metrics.JobProcessed(meta.NumDelivered > 1)
		if hasSlot {
			<-w.slots
		}
	}()
	defer func() {
		if p := recover(); p != nil {
			// Nothing a run does may take the worker down.
			j.log.Error("run panicked", zap.Any("panic", p), zap.Stack("stack"))
			j.fail(base, fmt.Sprintf("internal error: %v", p))
		}
	}()
	j.process(base, meta, &hasSlot)
}

func (j *job) process(base context.Context, meta *jetstream.MsgMetadata, hasSlot *bool) {
	w := j.w
	ctx := base
	req, reason := w.decode(j.msg)
	if reason != nil {
		w.deadLetter(ctx, j.msg, j.seq, req, reason)
		return
	}
	j.req = req
	j.key = bus.Key(req.Tenant, req.RunID)
	defer func() { j.pre.drop() }()
	// Lazy: most runs log nothing, and With copies the encoder with the
	// fields encoded, kept for the whole run.
	j.log = w.log.WithLazy(zap.Inline(runFields{req: req}))

	var d decision
	first := meta.NumDelivered == 1
	for {
		if w.isDraining() {
			j.handBack()
			return
		}
		snap, err := j.look(ctx, first)
		first = false
		if testHookLooked != nil && err == nil {
			testHookLooked(j)
		}
		if snap != nil && snap.spec != nil {
			// The lease was taken beside the reads (guessLease): it
			// stands if this request is its thread's oldest.
			if err == nil && snap.head == headSelf {
				if testHookLeased != nil {
					testHookLeased(j)
				}
				j.start(ctx, meta, nil, 0, snap.spec, snap.specRev)
				return
			}
			if derr := j.dropGuess(ctx, snap.spec, snap.specRev); err == nil {
				err = derr
			}
			if err == nil {
				continue // decided the usual way
			}
		}
		if err != nil {
			if j.waitRoom(ctx, err) {
				continue
			}
			j.retryLater(err)
			return
		}
		if snap.head == headCopy {
			j.log.Info("duplicate run request dropped: an older copy of it owns the run", zap.Uint64("stream_seq", j.seq))
			_ = j.msg.Ack()
			return
		}
		if rec := snap.rec; rec != nil {
			if done := j.settled(ctx, rec); done {
				return
			}
		}
		if th := snap.th; th != nil && th.LastRun != nil && th.LastRun.RunID == req.RunID && th.LastRun.MsgSeq == j.seq {
			j.finishFromLastRun(ctx, snap)
			return
		}
		d, err = j.admit(ctx, snap)
		if err != nil {
			if j.waitRoom(ctx, err) {
				continue
			}
			j.retryLater(err)
			return
		}
		if d.verdict == verdictStart {
			if testHookLeased != nil {
				testHookLeased(j)
			}
			j.start(ctx, meta, snap.rec, snap.rev, d.thread, d.rev)
			return
		}
		if d.verdict == verdictCancelled {
			j.cancelledBeforeStart(ctx)
			return
		}
		if d.verdict == verdictGone {
			j.requestGone(ctx)
			return
		}
		if d.verdict == verdictDeleting {
			// The deletion purges the request and whatever record it has;
			// running it would bring back part of the thread.
			j.log.Info("run request dropped: its thread is being deleted", zap.Uint64("stream_seq", j.seq))
			_ = j.msg.Ack()
			return
		}
		if d.verdict == verdictRetry {
			continue
		}
		if d.verdict == verdictWait && d.soon && j.guessWaits < guessWaitsMax {
			j.guessWaits++
			sleep(ctx, guessWait)
			continue
		}
		// Rejected or waiting: the run needs a record (and run.queued) now.
		if snap.rec == nil {
			if _, _, _, err := w.ensureRecord(ctx, req, j.seq); err != nil {
				if j.waitRoom(ctx, err) {
					continue
				}
				j.retryLater(err)
				return
			}
		}
		if d.verdict == verdictReject {
			j.finishPending(ctx, protocol.StatusRejected, "", d.reason)
			return
		}
		if d.verdict == verdictWait && !j.wait(ctx, hasSlot) {
			_ = j.msg.NakWithDelay(w.cfg.WaitPoll)
			return
		}
	}
}

// finishFromLastRun finishes a run whose worker gave its thread back (the
// release carried the run's terminal summary, last_run) but stopped before
// it wrote the terminal record or published run.finished: both are
// written from the summary now. The run is not run again.
func (j *job) finishFromLastRun(ctx context.Context, snap *snapshot) {
	w := j.w
	last := snap.th.LastRun
	j.log.Info("run ended before its record was written; finishing it from its thread's last_run", zap.String("status", string(last.Status)))
	final, err := w.stores.WithOutput(ctx, protocol.EndedRun(kv.NewRun(j.req, j.seq, last.CreatedAt), last))
	if err != nil {
		j.retryLater(err)
		return
	}
	rec, err := writeEnded(ctx, w.stores.Runs, final)
	own := err == nil
	if errors.Is(err, errAlreadyFinished) || errors.Is(err, kv.ErrExists) {
		rec, _, err = w.stores.Runs.GetLatest(ctx, j.req.Tenant, j.req.RunID)
	}
	if err != nil {
		j.retryLater(err)
		return
	}
	if own {
		w.ended(rec)
	}
	if err := w.pub.EnsureFinished(ctx, rec); err != nil {
		j.retryLater(err)
		return
	}
	w.wakeThread(j.req.Tenant, j.req.ThreadID)
	_ = j.msg.Ack()
}

// settled handles a request whose run record says it must not start:
// another thread's run id, a duplicate copy, a finished run, a run
// cancelled while pending. It reports whether the request is done with.
func (j *job) settled(ctx context.Context, rec *protocol.Run) bool {
	w := j.w
	switch {
	case rec.ThreadID != j.req.ThreadID:
		// The run id belongs to a run of another thread: this request can
		// have no record of its own. Its sender learns why on the events
		// of the thread it asked for, and the request is dead-lettered.
		w.conflictingRunID(ctx, j.msg, j.seq, j.req, rec)
	case rec.MsgSeq != j.seq && rec.MsgSeq != 0:
		// Same run id published again after the duplicate window: the run
		// already exists; this copy is dropped.
		j.log.Info("duplicate run request dropped", zap.Uint64("stream_seq", j.seq), zap.Uint64("owner_seq", rec.MsgSeq))
		if rec.Status.Terminal() {
			_ = w.pub.EnsureFinished(ctx, rec)
		}
		_ = j.msg.Ack()
	case rec.Status.Terminal():
		// Finished before (a crash between finishing and acking, or a
		// cancel while pending): make sure its terminal event exists,
		// and its webhook job (deduped by id).
		w.enqueueWebhook(rec)
		if err := w.pub.EnsureFinished(ctx, rec); err != nil {
			j.retryLater(err)
		} else {
			w.wakeThread(j.req.Tenant, j.req.ThreadID)
			_ = j.msg.Ack()
		}
	case rec.Status == protocol.StatusPending && rec.CancelRequested:
		j.finishPending(ctx, protocol.StatusCancelled, "", "")
	default:
		return false
	}
	return true
}

// cancelledBeforeStart settles a run its thread lists as cancelled
// before it took the lease (cancelIfStarted): the cancel ended its record
// before it listed the run, so the record, read from the leader, says
// cancelled; the run's request is acked without running it.
func (j *job) cancelledBeforeStart(ctx context.Context) {
	w := j.w
	j.log.Info("the run was cancelled while it took its thread; not starting it")
	// The cancel's write of the record was acknowledged before it listed
	// the run: the leader has it, no write is in flight.
	rec, _, err := w.stores.Runs.GetFromLeader(ctx, j.req.Tenant, j.req.RunID)
	if err == nil && j.settled(ctx, rec) {
		return
	}
	if err != nil && !errors.Is(err, kv.ErrNotFound) {
		j.retryLater(err)
		return
	}
	// The record is gone (expired) or still pending: the thread's list
	// says a cancel ended the run, so it ends cancelled.
	if _, _, _, err := w.ensureRecord(ctx, j.req, j.seq); err != nil {
		j.retryLater(err)
		return
	}
	j.finishPending(ctx, protocol.StatusCancelled, "", "")
}

// retryLater hands the request back after an infrastructure error (NATS
// unavailable, a leader election), to be redelivered.
//
// A full store (bus.IsStoreFull) is not handed back: redeliveries a
// second apart would spend the request's deliveries in seconds. The run's
// wait for room (waitRoom) is over when this is called with one, so the
// run ends store_full, unless the worker is stopping.
func (j *job) retryLater(err error) {
	if _, full := bus.IsStoreFull(err); full && j.req != nil && !j.w.isDraining() && !j.isDrained() {
		j.hold.Lock()
		lease := j.lease
		j.hold.Unlock()
		j.endStoreFull(context.Background(), lease, err)
		return
	}
	j.log.Warn("run request handed back after an error", zap.Error(err))
	_ = j.msg.NakWithDelay(time.Second)
}

// requestGone settles a delivered request that the runs stream no longer
// shows. It was removed on purpose only if its run is settled elsewhere:
// the record ended, or names another copy of the request. Anything else
// is a read that is behind the stream: a new stream leader still applying
// what it acknowledged, as during a node loss. Acking then would remove
// a request whose run nobody ran (the soak lost runs that way), so the
// request is looked at again a moment later; if it really was removed,
// it is not delivered again.
func (j *job) requestGone(ctx context.Context) {
	// From the leader, but without GetLatest's wait for a write in flight:
	// most runs have no record while they run, and that wait held a
	// goroutine per run for two seconds.
	rec, _, err := j.w.stores.Runs.GetFromLeader(ctx, j.req.Tenant, j.req.RunID)
	if err == nil && (rec.Status.Terminal() || (rec.MsgSeq != 0 && rec.MsgSeq != j.seq)) {
		_ = j.msg.Ack()
		return
	}
	j.log.Warn("the runs stream does not show this delivered request and its run has not ended; looking again", zap.Uint64("stream_seq", j.seq))
	_ = j.msg.NakWithDelay(time.Second)
}

// handBack returns a request to the stream for another worker at once
// (shutdown), and waits until the server confirms it. A Nak published and
// forgotten was lost when the process exited before the client wrote it
// out (cmd/worker's drain of the connection does not wait), when the
// connection carrying it dropped, or when the consumer had no leader; the
// run then came back only after the ack wait.
//
// The wait is bounded by handBackDeadline; a hand-back still unconfirmed
// then is logged, and its request comes back after the ack wait, as from
// a worker that died. A Nak is sent again only when it surely went
// nowhere: the server answered that nobody serves the consumer (no
// leader), or the connection that carried it is gone. A Nak the server
// took but whose answer is late is not sent again: a second one, after
// the request went to another worker, would have the server deliver it
// to a third one.
func (j *job) handBack() {
	w := j.w
	ctx, cancel := context.WithDeadline(context.Background(), w.handBackDeadline())
	defer cancel()
	err := nakConfirmed(ctx, w.nc, j.msg.Reply())
	if err != nil {
		j.log.Warn("the hand-back was not confirmed; the request comes back after the ack wait",
			zap.Error(err), zap.Duration("ack_wait", w.cfg.Settings.AckWait))
	}
}

var ackNak = []byte("-NAK")

// nakConfirmed sends a Nak to a delivery's ack subject with a reply
// subject, the way msg.InProgress is confirmed (heartbeat), and waits for
// the server's answer until ctx ends.
func nakConfirmed(ctx context.Context, nc *nats.Conn, ackSubject string) error {
	if ackSubject == "" {
		return errors.New("the request has no ack subject")
	}
	sub, err := nc.SubscribeSync(nc.NewInbox())
	if err != nil {
		// A connection already draining takes no new subscription: the
		// Nak goes out unconfirmed, which beats not at all.
		_ = nc.Publish(ackSubject, ackNak)
		return fmt.Errorf("subscribe for the confirmation: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	// connection counts the connections the Nak was written to: one
	// published while the client reconnects waits in its buffer for the
	// next connection.
	var connection uint64
	send := func() error {
		connection = nc.Stats().Reconnects
		if nc.Status() != nats.CONNECTED {
			connection++
		}
		return nc.PublishRequest(ackSubject, sub.Subject, ackNak)
	}
	if err := send(); err != nil {
		return err
	}
	for {
		tctx, tcancel := context.WithTimeout(ctx, 250*time.Millisecond)
		m, err := sub.NextMsgWithContext(tctx)
		tcancel()
		switch {
		case err == nil && m.Header.Get("Status") == "503":
			// No responders: the consumer has no leader now (an
			// election); the Nak reached nobody.
			sleep(ctx, 100*time.Millisecond)
		case err == nil:
			return nil
		case ctx.Err() != nil:
			return fmt.Errorf("no confirmation: %w", context.Cause(ctx))
		case nc.IsClosed():
			return nats.ErrConnectionClosed
		case !errors.Is(err, context.DeadlineExceeded):
			return fmt.Errorf("wait for the confirmation: %w", err)
		case nc.Stats().Reconnects <= connection:
			continue // still on the connection that carried the Nak
		}
		if ctx.Err() != nil {
			return fmt.Errorf("no confirmation: %w", context.Cause(ctx))
		}
		if err := send(); err != nil {
			return err
		}
	}
}

// fail ends the run with an internal error when its own code panicked.
func (j *job) fail(ctx context.Context, reason string) {
	if j.req == nil {
		j.w.deadLetter(ctx, j.msg, j.seq, nil, &protocol.ValidationError{Message: reason})
		return
	}
	j.hold.Lock()
	lease := j.lease
	abandoned := j.abandoned
	j.hold.Unlock()
	if abandoned {
		return
	}
	if lease == nil {
		j.finishPending(ctx, protocol.StatusError, "", reason)
		return
	}
	j.finalize(ctx, lease, nil, agent.Outcome{Status: protocol.StatusError, Error: reason})
}

// ensureRecord reads the run record, creating it (and the run.queued
// event) when this is the first time anyone sees the run.
func (w *Worker) ensureRecord(ctx context.Context, req *protocol.RunRequest, seq uint64) (*protocol.Run, uint64, bool, error) {
	rec, rev, err := w.stores.Runs.Get(ctx, req.Tenant, req.RunID)
	if err == nil {
		if rec.MsgSeq == 0 {
			// Created by the gateway before it knew the sequence.
			rec.MsgSeq = seq
		}
		return rec, rev, false, nil
	}
	if !errors.Is(err, kv.ErrNotFound) {
		return nil, 0, false, err
	}
	// run.queued goes first: if this worker dies right after, the next
	// delivery publishes it again and the stream keeps one copy.
	if err := w.pub.PublishQueued(ctx, req); err != nil {
		return nil, 0, false, err
	}
	rec = kv.NewRun(req, seq, time.Now().UTC())
	rec.Seq = 1
	rev, err = w.stores.Runs.Create(ctx, rec)
	if errors.Is(err, kv.ErrExists) {
		// From the leader: a replica may not have the record that
		// refused the create yet.
		rec, rev, err = w.stores.Runs.GetLatest(ctx, req.Tenant, req.RunID)
		return rec, rev, false, err
	}
	if err != nil {
		return nil, 0, false, err
	}
	_ = w.stores.Threads.IndexRun(ctx, req.Tenant, req.ThreadID, req.RunID, rec.CreatedAt)
	return rec, rev, true, nil
}

// finishPending ends a run that never started (rejected, cancelled while
// pending, or failed before start) and acks its request.
func (j *job) finishPending(ctx context.Context, status protocol.Status, stopReason, reason string) {
	w := j.w
	var rec *protocol.Run
	err := j.settleWrite(ctx, func() (err error) {
		rec, _, err = w.stores.Runs.Mutate(ctx, j.req.Tenant, j.req.RunID, func(r *protocol.Run) error {
			if r.Status.Terminal() {
				return errAlreadyFinished
			}
			if r.Status != protocol.StatusPending {
				return fmt.Errorf("run is %s, not pending", r.Status)
			}
			now := time.Now().UTC()
			r.Status = status
			r.StopReason = stopReason
			r.Error = reason
			r.FinishedAt = &now
			r.Seq++
			return nil
		})
		return err
	})
	if err != nil && !errors.Is(err, errAlreadyFinished) {
		j.retryLater(err)
		return
	}
	if err == nil {
		w.ended(rec)
	}
	if err := j.settleWrite(ctx, func() error { return w.pub.PublishFinished(ctx, rec) }); err != nil {
		j.retryLater(err)
		return
	}
	w.wakeThread(j.req.Tenant, j.req.ThreadID)
	_ = j.msg.Ack()
}

var errAlreadyFinished = errors.New("run already finished")

// testHookLooked, set by tests only, runs after a request's snapshot was
// read and before it is decided on.
var testHookLooked func(*job)

// testHookLeased, set by tests only, runs after a request's run took its
// thread's lease and before it starts.
var testHookLeased func(*job)

// testHookReleased, set by tests only, runs after a run's release gave
// its thread back (with last_run) and before its terminal record.
var testHookReleased func(*job)

// errStateUnavailable stops a run whose thread state could not be read
// for a reason that passes (a leader election, a node loss): it is handed
// back, not failed.
var errStateUnavailable = errors.New("thread state unavailable")

// start runs the run under the lease it holds, executes the agent loop and
// finishes the run. Since protocol v2 nothing is written to start it: the
// lease (taken by admit, carrying the attempt) says the run runs, and its
// record, when a submitter wrote one, stays pending until the end. A run
// seen for the first time gets run.started (seq 1, carrying run.queued's
// data) or, for a submitter's request, run.queued and run.started.
func (j *job) start(ctx context.Context, meta *jetstream.MsgMetadata, rec *protocol.Run, rev uint64, th *protocol.Thread, thRev uint64) {
	w := j.w
	req := j.req
	lease := &leaseHandle{w: w, tenant: req.Tenant, thread: req.ThreadID, run: req.RunID, epoch: th.Epoch, th: th, rev: thRev}
	held := *th.Lease
	now := time.Now().UTC()
	attempt := max(held.Attempt, 1)
	j.base, j.startedAt = held.BaseCheckpoint, held.AcquiredAt
	if held.CreatedAt != nil {
		j.createdAt = *held.CreatedAt
	} else {
		j.createdAt = now
	}
	var stream *events.Stream
	// queuedIn: run.started stands in for run.queued (protocol v2), for
	// a run no submitter announced. A submitter (the gateway, the submit
	// service) publishes run.queued itself, possibly while this worker
	// starts the run, so for its requests the worker publishes the same
	// run.queued (stored once, by its message id) and numbers
	// run.started after it, as in v1.
	queuedIn := false
	var lastSeq uint64
	if rec != nil {
		lastSeq = rec.Seq
	}
	if rec == nil && attempt == 1 {
		queuedIn = j.msg.Headers().Get(protocol.HeaderSubmitter) == ""
		stream = w.pub.NewStream(req.Tenant, req.ThreadID, req.RunID, 1, 0)
		if !queuedIn {
			stream.EmitQueued(req)
		}
	}
	if attempt > 1 {
		// The previous attempt died after publishing events this worker
		// cannot know: continue numbering after the highest stored seq,
		// so seq has no repeats, and mark the seqs below it that a node
		// loss swallowed with the dead worker (event.lost), so it has no
		// gaps. Only if the run's events all expired does the record's
		// figure stand.
		mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		top, marked, err := w.pub.FillGaps(mctx, req.Tenant, req.ThreadID, req.RunID, attempt, 0)
		cancel()
		switch {
		case err != nil:
			j.log.Warn("could not read the previous attempt's events; numbering after the last one stored", zap.Error(err))
			if n, err := w.pub.LastSeq(ctx, req.Tenant, req.ThreadID, req.RunID); err == nil && n > 0 {
				lastSeq = n
			}
		case top > 0:
			lastSeq = top
		}
		if marked > 0 {
			j.log.Warn("the previous attempt's events were lost with it; marked them", zap.Int("events", marked))
		}
	}
	if stream == nil {
		stream = w.pub.NewStream(req.Tenant, req.ThreadID, req.RunID, attempt, lastSeq)
	}
	// A worker told to stop starts nothing more: the drain is checked and
	// run.started emitted under the job's lock, so a drain either comes
	// first (the run is handed back unstarted; the lease stays, for the
	// next delivery to take over) or after the event.
	stream.SetFence(lease.live)
	stream.SetHold(lease.pausedNow)
	lease.onResume = stream.Resume
	stream.SetResumable(req.StreamResumable)
	j.hold.Lock()
	if j.drained || w.isDraining() {
		j.hold.Unlock()
		j.log.Info("worker stopping: run handed back before it started")
		lease.handOver(ctx)
		j.handOff(ctx, stream)
		return
	}
	started := protocol.StartedData{Attempt: attempt, Worker: w.cfg.ID, Agent: req.Agent}
	if queuedIn {
		queuedAt := j.createdAt
		started.MultitaskStrategy, started.QueuedAt = req.MultitaskStrategy, &queuedAt
	}
	stream.Emit(protocol.EventRunStarted, started, events.StartedID(req.RunID, attempt))
	j.hold.Unlock()
	j.rec, j.recRev = rec, rev
	// Built again from the worker's logger rather than on top of the
	// one above: a waiting run holds one logger, not a chain of two.
	j.log = w.log.WithLazy(zap.Inline(runFields{req: req, attempt: attempt}))
	ctx = j.started(ctx, meta, protocol.RunView(req.RunID, rec, th))
	defer j.endSpan()
	j.log.Info("run started", zap.String("agent", req.Agent), zap.Uint64("epoch", th.Epoch), zap.Uint64("deliveries", meta.NumDelivered))

	timeout := w.runTimeout(req)
	runCtx, cancelRun := context.WithCancelCause(ctx)
	defer cancelRun(nil)
	runCtx, cancelTimeout := context.WithTimeoutCause(runCtx, timeout, ErrRunTimeout)
	defer cancelTimeout()
	preemptCtx, preempt := context.WithCancelCause(context.Background())
	defer preempt(nil)

	j.hold.Lock()
	j.lease = lease
	j.cancelRun = cancelRun
	j.preempt, j.preemptCtx = preempt, preemptCtx
	drained := j.drained
	j.hold.Unlock()
	if cause := w.setRunning(j); cause != nil {
		// A cancel saw this run's lease before it ran here.
		j.log.Info("the run was cancelled while it took its thread; stopping it")
		cancelRun(cause)
	}
	if drained {
		preempt(middleware.ErrHandOff)
	}
	lease.onPreempt = func(p protocol.Preemption) { j.preempted(p) }
	lease.onLost = func() { cancelRun(agent.ErrLeaseLost) }
	lease.fenceFor(w.cfg.Settings.AckWait, leaseTakenAt(th, now))
	defer lease.stopFence()
	lease.checkPreempt()
	if rec != nil && rec.CancelRequested {
		cancelRun(ErrCancelled)
	}

	host := &runHost{j: j, lease: lease, stream: stream}
	out := j.execute(runCtx, preemptCtx, host)
	lease.stopFence()
	j.finalize(ctx, lease, host, out)
}

// execute prepares the run and drives the agent loop.
func (j *job) execute(ctx, preempt context.Context, host *runHost) agent.Outcome {
	w := j.w
	req := j.req
	lease, stream := host.lease, host.stream
	prep, err := w.cfg.Agents.Prepare(req)
	if err != nil {
		return agent.Outcome{Status: protocol.StatusError, Error: err.Error()}
	}
	st, chain, err := j.loadState(ctx, lease.head())
	if err != nil {
		if ctx.Err() != nil {
			return agent.Outcome{Stopped: context.Cause(ctx)}
		}
		if bus.Transient(err) {
			// A leader election or a node loss: the state is there, the
			// next delivery reads it.
			return agent.Outcome{Stopped: fmt.Errorf("%w: %w", errStateUnavailable, err)}
		}
		return agent.Outcome{Status: protocol.StatusError, Error: fmt.Sprintf("load thread state: %v", err)}
	}
	host.st = st
	wd, rf, err := j.followFiles(ctx, w.workdir(req.Tenant, workdirThread(req)), lease.head(), lease.filesAt(), chain)
	if err != nil {
		if ctx.Err() != nil {
			return agent.Outcome{Stopped: context.Cause(ctx)}
		}
		return agent.Outcome{Stopped: fmt.Errorf("%w: check out the head's files: %w", errStateUnavailable, err)}
	}
	host.files, host.chain = rf, chain
	resumed := false
	for _, d := range chain {
		if d.RunID == req.RunID {
			resumed = true
		}
	}
	if req.Command != nil && len(req.Command.Resume) > 0 && !resumed {
		// The thread's state, not its status, says what it waits for: a
		// resume that failed (say, the wrong number of decisions) leaves
		// the thread waiting for a corrected one.
		if _, waiting := st.Values[middleware.InterruptValue]; !waiting {
			return agent.Outcome{Status: protocol.StatusError, Error: "command.resume was sent but the thread is not waiting for input; send new messages as input instead"}
		}
	}
	rt := &middleware.Runtime{
		RunID:    req.RunID,
		ThreadID: req.ThreadID,
		Tenant:   req.Tenant,
		Agent:    req.Agent,
		Config:   req.Config,
		Tools:    prep.Tools,
		User:     userOf(req),
		Files:    wd,
		Logger:   j.log,
		Metrics:  w.cfg.Metrics,
		Emit:     func(t string, data any) { stream.Emit(t, data, "") },
		// A lead's delegation tools start and await children through
		// this worker's subagent service.
		Subagents: w.subagents,
		Preempt:   preempt,
	}
	if req.Command != nil {
		rt.Resume = req.Command.Resume
	}
	rt.Principal = req.Principal
	run := &agent.Run{
		ToolEnv:   tools.Env{User: rt.User, Files: rt.Files},
		Runtime:   rt,
		Chain:     prep.Chain,
		Model:     prep.Model,
		ModelName: prep.ModelName,
		System:    prep.Profile.SystemPrompt,
		MaxSteps:  prep.MaxSteps,
		State:     st,
		Host:      host,
		Preempt:   preempt,
		NoImages:  !prep.Vision,
	}
	if !resumed && req.Input != nil {
		run.Input = req.Input.Messages
	}
	if !resumed && req.Command != nil {
		if run.Update, err = commandUpdate(req.Command, st); err != nil {
			return agent.Outcome{Status: protocol.StatusError, Error: err.Error()}
		}
		run.Goto = req.Command.Goto
	}
	return agent.Execute(ctx, run)
}

// userOf is the user a run acts for.
func userOf(req *protocol.RunRequest) string {
	if req.Config.UserID != "" {
		return req.Config.UserID
	}
	return "default"
}

// runHost is the agent loop's view of the worker.
type runHost struct {
	j      *job
	lease  *leaseHandle
	stream *events.Stream
	step   int
	// st is the run's state; after the loop returned it holds what the
	// end persists.
	st *state.State
	// files follows the workdir for the checkpoints (nil: not versioned);
	// chain is the chain the run's state was loaded from.
	files *runFiles
	chain []*kv.Delta
}

// Checkpoint writes the delta and moves the thread's head under the lease.
// A full store is waited out (roomFor) up to the worker's StoreFullWait.
func (h *runHost) Checkpoint(ctx context.Context, u state.Update) error {
	id, title, err := h.delta(ctx, u)
	if err != nil {
		return err
	}
	return h.j.roomFor(ctx, func() error { return h.lease.moveHead(ctx, id, title) })
}

// delta writes the delta of the next step without moving the head.
func (h *runHost) delta(ctx context.Context, u state.Update) (id, title string, err error) {
	h.step++
	step := h.step
	changes := h.files.changes(ctx, u)
	err = h.j.roomFor(ctx, func() (err error) {
		id, title, err = h.lease.writeDelta(ctx, h.j.req.RunID, step, u, changes)
		return err
	})
	if err != nil {
		h.files.failed(changes)
	} else {
		h.files.recorded(changes)
	}
	return id, title, err
}

// Emit publishes an event of the run.
func (h *runHost) Emit(eventType string, data any) { h.stream.Emit(eventType, data, "") }

// Fenced is agent.Fence: it waits while the run is paused (its lease's
// renewal is late), and is agent.ErrLeaseLost once the run lost its lease.
func (h *runHost) Fenced(ctx context.Context) error { return h.lease.Fenced(ctx) }

// finalize records the outcome, gives the thread back, publishes the one
// terminal event and acks the request, in that order: a crash between any
// two steps is finished by the next delivery without a second event.
func (j *job) finalize(ctx context.Context, lease *leaseHandle, host *runHost, out agent.Outcome) {
	w := j.w
	req := j.req
	var stream *events.Stream
	if host != nil {
		stream = host.stream
	}
	status, supersededBy, stopReason := out.Status, "", out.StopReason
	errText := out.Error
	rollbackTo := ""
	switch {
	case out.Stopped == nil:
	case errors.Is(out.Stopped, agent.ErrLeaseLost):
		j.abandon("lease lost")
		return
	case errors.Is(out.Stopped, ErrShutdown):
		j.log.Info("run handed back at a safe boundary for shutdown")
		j.handOff(ctx, stream)
		return
	case errors.Is(out.Stopped, agent.ErrCheckpointFailed) && errors.Is(out.Stopped, bus.ErrStoreFull) && !j.isDrained():
		// The store stayed full for the whole StoreFullWait: the run
		// ends with what its last checkpoint saved.
		status, stopReason, errText = protocol.StatusError, StopStoreFull, storeFullText(out.Stopped)
	case errors.Is(out.Stopped, errStateUnavailable):
		j.log.Warn("could not read the thread's state; handing the run back", zap.Error(out.Stopped))
		j.handOffAfter(ctx, stream, time.Second)
		return
	case errors.Is(out.Stopped, agent.ErrCheckpointFailed):
		// The next delivery takes the run over from its last saved
		// checkpoint (the lease names this request); max_deliver bounds
		// the attempts.
		j.log.Warn("could not save the run's progress; handing it back", zap.Error(out.Stopped))
		j.handOffAfter(ctx, stream, time.Second)
		return
	case errors.Is(out.Stopped, ErrCancelled):
		status = protocol.StatusCancelled
		if errors.Is(out.Stopped, ErrCancelRollback) {
			rollbackTo = j.base
		}
	case errors.Is(out.Stopped, ErrRunTimeout):
		// Whatever the run was waiting for (a provider that stopped
		// answering, a stuck tool), the person learns the limit it hit
		// and where it is set.
		status = protocol.StatusTimeout
		errText = fmt.Sprintf("%v: it ran for %s (config.timeout_seconds of the run, or the worker's run_timeout); the work done so far is kept in the thread", ErrRunTimeout, w.runTimeout(req))
	case errors.Is(out.Stopped, ErrRolledBack):
		status = protocol.StatusCancelled
		supersededBy = lease.preemptor().RunID
		rollbackTo = j.base
	case errors.Is(out.Stopped, agent.ErrPreempted):
		status = protocol.StatusSteered
		supersededBy = lease.preemptor().RunID
		if j.isDrained() {
			j.handOff(ctx, stream)
			return
		}
	default:
		status, errText = protocol.StatusError, out.Stopped.Error()
	}
	if status == "" {
		status, errText = protocol.StatusError, "run ended without a status"
	}

	// The last step's changes go with the end: its delta is written now and
	// the head moves in the same write that releases the thread.
	var head, title string
	if !out.Pending.Empty() && host != nil {
		var err error
		head, title, err = host.delta(ctx, out.Pending)
		switch {
		case err == nil:
		case errors.Is(err, bus.ErrStoreFull) && !j.isDrained():
			// Waited out: the run ends without its last step.
			head, title = "", ""
			status, stopReason, errText = protocol.StatusError, StopStoreFull, storeFullText(err)
			out.Output, out.Interrupt = nil, nil
		default:
			j.log.Warn("could not save the run's last step; handing it back", zap.Error(err))
			j.retryLater(err)
			return
		}
	}

	var finishedSeq uint64
	if stream != nil {
		finishedSeq = stream.Reserve()
	}
	kids := j.children(ctx, host)
	usage := withChildUsage(runUsage(host, req), kids)
	if finishedSeq == 0 {
		// Ended before it ran (no event stream): after what is stored.
		n, err := w.pub.LastSeq(ctx, req.Tenant, req.ThreadID, req.RunID)
		if err != nil {
			j.retryLater(err)
			return
		}
		finishedSeq = n + 1
	}
	ended := time.Now().UTC()
	end := func(r *protocol.Run) {
		r.Status, r.StopReason, r.Error, r.Output, r.SupersededBy, r.FinishedAt = status, stopReason, errText, out.Output, supersededBy, &ended
		r.IncompleteDetails = protocol.IncompleteFor(status, stopReason)
		r.Interrupt, r.Usage, r.CancelRequested = out.Interrupt, usage, false
		r.Seq = finishedSeq
	}
	final := j.endedRecord(lease, end)
	threadStatus := protocol.ThreadIdle
	switch {
	case stopReason == StopStoreFull:
		// The thread is not at fault: it takes the next run as it is.
	case status == protocol.StatusError, status == protocol.StatusTimeout:
		threadStatus = protocol.ThreadError
	case status == protocol.StatusInterrupted:
		threadStatus = protocol.ThreadInterrupted
	}
	if host != nil && host.st != nil && status != protocol.StatusInterrupted {
		if _, waiting := host.st.Values[middleware.InterruptValue]; waiting {
			// A failed resume: the thread still waits for a person.
			threadStatus = protocol.ThreadInterrupted
		}
	}

	// The thread's release goes first, fenced by the lease epoch, and
	// carries the run's terminal summary (last_run); the terminal record
	// follows, then run.finished. Should this worker stop between the
	// release and the record, the next delivery of the request finds
	// the summary on the thread and finishes the run from it
	// (finishFromLastRun), without running it again.
	if preempting(req) {
		j.recordOverwritten(ctx, lease)
	}
	rollback := errors.Is(out.Stopped, ErrRolledBack) || errors.Is(out.Stopped, ErrCancelRollback)
	// A rollback takes the run's files back too, before the thread is
	// released to the next run.
	filesBack := rollback && host != nil && host.files.rollback(ctx, host.chain, rollbackTo)
	endHead := head
	if endHead == "" {
		endHead = lease.head()
	}
	opts := &releaseOpts{status: threadStatus, rollbackTo: rollbackTo, rollback: rollback, filesBack: filesBack, head: head, title: title, usage: usage, last: lastRunOf(final, endHead)}
	relErr := j.settleWrite(ctx, func() error { return lease.release(ctx, opts) })
	for try := 0; relErr != nil && ctx.Err() == nil; try++ {
		// The write may have been stored without its answer reaching
		// this worker (a retry then finds the lease gone): the thread
		// says. A write that failed for a passing reason (a leader
		// election) is tried again a few times: handing the run back
		// would have the next delivery run it again.
		if th, _, err := w.stores.Threads.GetLatest(ctx, req.Tenant, req.ThreadID); err == nil && releasedBy(th, req.RunID, lease.epoch) {
			relErr = nil
			break
		}
		if errors.Is(relErr, agent.ErrLeaseLost) || try == 4 || j.isDrained() {
			break
		}
		sleep(ctx, 250*time.Millisecond<<try)
		relErr = j.settleWrite(ctx, func() error { return lease.release(ctx, opts) })
	}
	if errors.Is(relErr, agent.ErrLeaseLost) {
		j.abandon("lease lost before the run's end was written")
		return
	}
	if relErr != nil {
		j.log.Warn("could not release the thread; handing the run back", zap.Error(relErr))
		j.retryLater(relErr)
		return
	}
	if testHookReleased != nil {
		testHookReleased(j)
	}
	var rec *protocol.Run
	err := j.settleWrite(ctx, func() (err error) {
		rec, err = j.writeEnd(ctx, final)
		return err
	})
	own := err == nil
	// The slot goes back only once the record says the run ended, so
	// no reader ever sees more of a tenant's runs running than its limit.
	j.releaseTenantSlot(ctx)
	switch {
	case errors.Is(err, errForeignRecord):
		j.hold.Lock()
		j.lease = nil
		j.hold.Unlock()
		j.settled(ctx, rec)
		return
	case errors.Is(err, errAlreadyFinished):
		// Ended by someone else meanwhile (a cancel that found no worker):
		// its record and its run.finished stand.
		if rec == nil {
			if rec, _, err = w.stores.Runs.GetLatest(ctx, req.Tenant, req.RunID); err != nil {
				j.retryLater(err)
				return
			}
		}
	case err != nil:
		j.log.Warn("could not record the run's end; handing it back", zap.Error(err))
		j.retryLater(err)
		return
	default:
		w.ended(rec)
		j.traced(rec)
	}
	if stream != nil {
		if err := stream.Flush(ctx); err != nil {
			j.log.Warn("some run events were not stored", zap.Error(err))
		}
		j.countEventBytes(ctx, stream.Bytes())
	}
	publish := w.pub.PublishFinished
	if !own {
		publish = w.pub.EnsureFinished // someone else's end
	}
	if err := j.settleWrite(ctx, func() error { return publish(ctx, rec) }); err != nil {
		j.log.Warn("could not publish run.finished; handing the request back so the next delivery does", zap.Error(err))
		j.retryLater(err)
		return
	}
	j.hold.Lock()
	j.lease = nil
	j.hold.Unlock()
	w.wakeThread(req.Tenant, req.ThreadID)
	_ = j.msg.Ack()
	j.cancelChildren(kids)
	fields := []zap.Field{zap.String("status", string(status))}
	if stopReason != "" {
		fields = append(fields, zap.String("stop_reason", stopReason))
	}
	if !j.startedAt.IsZero() {
		fields = append(fields, zap.Duration("duration", time.Since(j.startedAt)))
	}
	j.log.Info("run finished", fields...)
}

// recordOverwritten makes sure the run whose summary this run's release
// replaces (the thread's last_run) has its terminal record and its
// run.finished, before the summary is gone. Only a steer or rollback can
// take a thread whose last run released it but whose worker stopped
// before the record (enqueued runs wait behind that run's request): its
// redelivery, finding neither a terminal record nor its summary, would
// run it again.
func (j *job) recordOverwritten(ctx context.Context, lease *leaseHandle) {
	w := j.w
	lease.mu.Lock()
	prev := lease.th.LastRun
	lease.mu.Unlock()
	if prev == nil || prev.RunID == j.req.RunID {
		return
	}
	rec, _, err := w.stores.Runs.GetLatest(ctx, j.req.Tenant, prev.RunID)
	if err == nil && rec.Status.Terminal() {
		return
	}
	if err != nil && !errors.Is(err, kv.ErrNotFound) {
		j.log.Warn("could not read the record of the thread's last run before replacing its summary", zap.String("last_run", prev.RunID), zap.Error(err))
		return
	}
	last, err := w.stores.WithOutput(ctx, prev)
	if err != nil {
		j.log.Warn("could not read the output of the thread's last run before replacing its summary", zap.String("last_run", prev.RunID), zap.Error(err))
		return
	}
	if last == prev {
		copied := *prev
		last = &copied
	}
	rec, err = writeEnded(ctx, w.stores.Runs, last)
	own := err == nil
	if errors.Is(err, errAlreadyFinished) || errors.Is(err, kv.ErrExists) {
		rec, _, err = w.stores.Runs.GetLatest(ctx, j.req.Tenant, prev.RunID)
	}
	if err != nil {
		j.log.Warn("could not record the end of the thread's last run from its summary", zap.String("last_run", prev.RunID), zap.Error(err))
		return
	}
	j.log.Info("the thread's last run ended without its record; recorded it from its summary before replacing it", zap.String("last_run", prev.RunID))
	if own {
		w.ended(rec)
	}
	if err := w.pub.EnsureFinished(ctx, rec); err != nil {
		j.log.Warn("could not publish run.finished of the thread's last run", zap.String("last_run", prev.RunID), zap.Error(err))
	}
}

// endedRecord is the run's terminal record: its record as read before it
// started (or a new one from its request), with this attempt's lease
// fields and end over it.
func (j *job) endedRecord(lease *leaseHandle, end func(*protocol.Run)) *protocol.Run {
	var r protocol.Run
	if j.rec != nil {
		r = *j.rec
	} else {
		r = *kv.NewRun(j.req, j.seq, j.createdAt)
	}
	l := lease.held()
	started := j.startedAt
	if started.IsZero() {
		started = time.Now().UTC()
	}
	r.Attempt, r.StartedAt, r.Worker, r.Epoch, r.MsgSeq, r.BaseCheckpoint = max(l.Attempt, 1), &started, j.w.cfg.ID, lease.epoch, j.seq, j.base
	end(&r)
	return &r
}

// lastRunSmall bounds the output and the interrupt the thread's last_run
// carries: a thread record is rewritten by every write of the lease.
const lastRunSmall = 4 << 10

// lastRunOf is the terminal summary of rec the release carries: what a
// record written from it needs, without what only the request knows
// (metadata, parent, webhook) and without an output or interrupt larger
// than lastRunSmall. Either left out is named by the checkpoint the run
// ended at (head, output_checkpoint): its last assistant message is the
// output and its interrupt value the interrupt, which the record written
// from the summary reads there (kv.Stores.WithOutput).
func lastRunOf(rec *protocol.Run, head string) *protocol.Run {
	last := *rec
	last.Metadata, last.Parent, last.Webhook = nil, nil, nil
	if last.Output != nil && messageSize(last.Output) > lastRunSmall {
		last.Output, last.OutputCheckpoint = nil, head
	}
	if last.Interrupt != nil {
		if b, err := json.Marshal(last.Interrupt); err != nil || len(b) > lastRunSmall {
			last.Interrupt, last.OutputCheckpoint = nil, head
		}
	}
	return &last
}

// messageSize is about the encoded size of m: its text, its tool calls
// and its annotations, counted without encoding it (this runs at the end
// of every run).
func messageSize(m *model.Message) int {
	n := len(m.Content) + 16*len(m.Meta)
	for _, c := range m.ToolCalls {
		n += len(c.Name) + len(c.Arguments) + len(c.ID)
	}
	return n
}

// releasedBy reports whether th was given back by run's lease of epoch.
func releasedBy(th *protocol.Thread, run string, epoch uint64) bool {
	return th.LastRun != nil && th.LastRun.RunID == run && th.LastRun.Epoch == epoch &&
		(th.Lease == nil || th.Lease.RunID != run || th.Lease.Epoch != epoch)
}

// errForeignRecord: the run id's record belongs to another request (a run
// of another thread, or another copy published after the duplicate
// window); the record returned with it says which.
var errForeignRecord = errors.New("the run id's record is another request's")

// writeEnd writes the run's terminal record final, after the release that
// fenced it: an update of the record read before the run started (at its
// revision), else a create, falling back to an edit of what is there.
func (j *job) writeEnd(ctx context.Context, final *protocol.Run) (*protocol.Run, error) {
	w := j.w
	var err error
	if j.rec != nil {
		_, err = w.stores.Runs.Update(ctx, final, j.recRev)
	} else {
		_, err = w.stores.Runs.Create(ctx, final)
	}
	if err == nil {
		return final, nil
	}
	if !errors.Is(err, kv.ErrConflict) && !errors.Is(err, kv.ErrExists) {
		return nil, err
	}
	cur, _, err := w.stores.Runs.GetLatest(ctx, j.req.Tenant, j.req.RunID)
	if err != nil {
		return nil, err
	}
	if cur.ThreadID != j.req.ThreadID || (cur.MsgSeq != 0 && cur.MsgSeq != j.seq) {
		return cur, errForeignRecord
	}
	return writeEnded(ctx, w.stores.Runs, final)
}

// writeEnded makes the run's record say final ended it, unless it already
// ended: what only the record knows (metadata, parent, webhook, a noted
// finished event) is kept.
func writeEnded(ctx context.Context, runs *kv.Runs, final *protocol.Run) (*protocol.Run, error) {
	rec, _, err := runs.Mutate(ctx, final.Tenant, final.RunID, func(r *protocol.Run) error {
		if r.Status.Terminal() {
			return errAlreadyFinished
		}
		if r.Status == protocol.StatusRunning && r.Epoch > final.Epoch {
			return agent.ErrLeaseLost // a v1 worker's later attempt
		}
		*r = *protocol.EndedRun(r, final)
		return nil
	})
	if errors.Is(err, kv.ErrNotFound) {
		if _, err := runs.Create(ctx, final); err != nil {
			return nil, err
		}
		return final, nil
	}
	return rec, err
}

// handOff gives a stopped run back for another worker (shutdown): its
// events are flushed and its request is returned to the stream; the lease
// stays, so the next delivery takes the run over where it stopped.
func (j *job) handOff(ctx context.Context, stream *events.Stream) {
	j.handOffAfter(ctx, stream, 0)
}

// handOffAfter is handOff with the redelivery delayed, for a failure the
// store may need a moment to get over.
func (j *job) handOffAfter(ctx context.Context, stream *events.Stream, delay time.Duration) {
	j.hold.Lock()
	lease := j.lease
	j.lease = nil
	j.hold.Unlock()
	if stream != nil {
		_ = stream.Flush(ctx)
	}
	if lease != nil {
		// Its events are out: the next delivery need not wait for the
		// lease to lapse.
		lease.handOver(ctx)
	}
	if delay > 0 {
		_ = j.msg.NakWithDelay(delay)
		return
	}
	j.handBack()
}

// abandon stops touching a request whose run another worker took over.
func (j *job) abandon(why string) {
	j.hold.Lock()
	j.abandoned = true
	j.lease = nil
	j.hold.Unlock()
	j.log.Warn("run abandoned: another worker owns it now", zap.String("why", why))
}

func (j *job) isDrained() bool {
	j.hold.Lock()
	defer j.hold.Unlock()
	return j.drained
}

// drain asks the job to stop at its next safe boundary (worker shutdown).
func (j *job) drain() {
	j.hold.Lock()
	j.drained = true
	preempt := j.preempt
	j.hold.Unlock()
	if preempt != nil {
		preempt(middleware.ErrHandOff)
	}
	select {
	case j.wake <- struct{}{}:
	default:
	}
}

// preempted reacts to a steer or rollback that names this run's thread.
func (j *job) preempted(p protocol.Preemption) {
	j.hold.Lock()
	cancelRun, preempt := j.cancelRun, j.preempt
	j.hold.Unlock()
	if p.Strategy == protocol.StrategyRollback {
		if cancelRun != nil {
			cancelRun(ErrRolledBack)
		}
		return
	}
	if preempt != nil {
		preempt(agent.ErrPreempted)
	}
}

// heartbeat tells the server the request is still being worked on, and
// returns the thread lease of a running run to renew: renewals wait for
// the server, so the caller makes them after every request's heartbeat
// went out.
func (j *job) heartbeat() *leaseHandle {
	j.hold.Lock()
	lease, abandoned := j.lease, j.abandoned
	j.hold.Unlock()
	if abandoned {
		return nil
	}
	_ = j.msg.InProgress()
	return lease
}

// runTimeout is the wall time req's run may take.
func (w *Worker) runTimeout(req *protocol.RunRequest) time.Duration {
	if s := req.Config.TimeoutSeconds; s > 0 {
		// Validation bounds s; the cap keeps the conversion from
		// overflowing whatever reaches here.
		return time.Duration(min(s, protocol.MaxTimeoutSeconds)) * time.Second
	}
	return w.cfg.RunTimeout
}
