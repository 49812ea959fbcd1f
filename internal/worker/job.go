package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/events"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
)

// job is one run request held by this worker, from delivery to ack.
type job struct {
	w   *Worker
	msg jetstream.Msg
	seq uint64 // stream sequence of the request
	key string // tenant.run once decoded
	req *protocol.RunRequest
	log *zap.Logger

	// hold guards the fields below, shared with the heartbeat goroutine
	// and control signals.
	hold      sync.Mutex
	lease     *leaseHandle // set while the run holds its thread
	cancelRun context.CancelCauseFunc
	preempt   context.CancelFunc
	wake      chan struct{} // signalled to re-check a waiting run
	drained   bool
	abandoned bool // lease lost: never touch the message again
	finished  chan struct{}
}

// handle takes one delivered request to its end. It owns one slot on entry
// and gives it back on return (or while it waits for its thread).
func (w *Worker) handle(base context.Context, msg jetstream.Msg) {
	meta, err := msg.Metadata()
	if err != nil {
		w.log.Error("request without metadata", zap.Error(err))
		_ = msg.Term()
		<-w.slots
		return
	}
	j := &job{w: w, msg: msg, seq: meta.Sequence.Stream, log: w.log, wake: make(chan struct{}, 1), finished: make(chan struct{})}
	w.track(j)
	hasSlot := true
	defer func() {
		w.untrack(j)
		close(j.finished)
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
	j.log = w.log.With(zap.String("tenant", req.Tenant), zap.String("thread_id", req.ThreadID), zap.String("run_id", req.RunID))

	rec, rev, created, err := w.ensureRecord(ctx, req, j.seq)
	if err != nil {
		j.retryLater(err)
		return
	}
	if rec.ThreadID != req.ThreadID {
		// The run id belongs to a run of another thread: this request can
		// have no record of its own. Its sender learns why on the events
		// of the thread it asked for, and the request is dead-lettered.
		w.conflictingRunID(ctx, j.msg, j.seq, req, rec)
		return
	}
	if rec.MsgSeq != j.seq && rec.MsgSeq != 0 {
		// Same run id published again after the duplicate window: the run
		// already exists; this copy is dropped.
		j.log.Info("duplicate run request dropped", zap.Uint64("stream_seq", j.seq), zap.Uint64("owner_seq", rec.MsgSeq))
		if rec.Status.Terminal() {
			_ = w.pub.EnsureFinished(ctx, rec)
		}
		_ = j.msg.Ack()
		return
	}
	if rec.Status.Terminal() {
		// Finished before (a crash between finishing and acking, or a
		// cancel while pending): make sure its terminal event exists.
		if err := w.pub.EnsureFinished(ctx, rec); err != nil {
			j.retryLater(err)
			return
		}
		_ = j.msg.Ack()
		return
	}
	if rec.Status == protocol.StatusPending && rec.CancelRequested {
		j.finishPending(ctx, protocol.StatusCancelled, "", "")
		return
	}
	_ = created

	// Admission: wait for the thread, in submission order.
	var th *protocol.Thread
	var thRev uint64
	for {
		if w.isDraining() {
			j.handBack()
			return
		}
		d, err := j.admit(ctx, rec)
		if err != nil {
			if errors.Is(err, kv.ErrNotFound) {
				_ = j.msg.Ack()
				return
			}
			j.retryLater(err)
			return
		}
		switch d.verdict {
		case verdictStart:
			th, thRev = d.thread, d.rev
		case verdictReject:
			j.finishPending(ctx, protocol.StatusRejected, "", d.reason)
			return
		case verdictGone:
			_ = j.msg.Ack()
			return
		case verdictWait:
			if !j.wait(ctx, hasSlot) {
				_ = j.msg.NakWithDelay(w.cfg.WaitPoll)
				return
			}
			// Re-read the record: the run may have been cancelled while it
			// waited.
			rec, rev, err = w.stores.Runs.Get(ctx, req.Tenant, req.RunID)
			if err != nil {
				j.retryLater(err)
				return
			}
			if rec.Status.Terminal() {
				_ = w.pub.EnsureFinished(ctx, rec)
				_ = j.msg.Ack()
				return
			}
			continue
		}
		break
	}
	_ = rev
	j.start(ctx, meta, th, thRev)
}

// retryLater hands the request back after an infrastructure error (NATS
// unavailable, a leader election), to be redelivered.
func (j *job) retryLater(err error) {
	j.log.Warn("run request handed back after an error", zap.Error(err))
	_ = j.msg.NakWithDelay(time.Second)
}

// handBack returns a request to the stream at once (shutdown).
func (j *job) handBack() {
	_ = j.msg.Nak()
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
		rec, rev, err = w.stores.Runs.Get(ctx, req.Tenant, req.RunID)
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
	rec, _, err := w.stores.Runs.Mutate(ctx, j.req.Tenant, j.req.RunID, func(r *protocol.Run) error {
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
	if err != nil && !errors.Is(err, errAlreadyFinished) {
		j.retryLater(err)
		return
	}
	if err := w.pub.PublishFinished(ctx, rec); err != nil {
		j.retryLater(err)
		return
	}
	w.wakeThread(j.req.Tenant, j.req.ThreadID)
	_ = j.msg.Ack()
}

var errAlreadyFinished = errors.New("run already finished")

// start takes the run from pending to running under the lease it holds,
// executes the agent loop and finishes the run.
func (j *job) start(ctx context.Context, meta *jetstream.MsgMetadata, th *protocol.Thread, thRev uint64) {
	w := j.w
	req := j.req
	lease := &leaseHandle{w: w, tenant: req.Tenant, thread: req.ThreadID, run: req.RunID, epoch: th.Epoch, th: th, rev: thRev}

	var attempt int
	var lastSeq uint64
	var takeover bool
	rec, _, err := w.stores.Runs.Mutate(ctx, req.Tenant, req.RunID, func(r *protocol.Run) error {
		if r.Status.Terminal() {
			return errAlreadyFinished
		}
		now := time.Now().UTC()
		takeover = r.Status == protocol.StatusRunning
		if !takeover {
			r.BaseCheckpoint = th.Head
		}
		r.Status = protocol.StatusRunning
		r.Attempt++
		r.StartedAt = &now
		r.Worker = w.cfg.ID
		r.Epoch = th.Epoch
		r.MsgSeq = j.seq
		attempt, lastSeq = r.Attempt, r.Seq
		return nil
	})
	if err != nil {
		// Cancelled between admission and start, or NATS trouble: give
		// the thread back first.
		_ = lease.release(ctx, nil)
		if errors.Is(err, errAlreadyFinished) {
			_ = w.pub.EnsureFinished(ctx, rec)
			w.wakeThread(req.Tenant, req.ThreadID)
			_ = j.msg.Ack()
			return
		}
		j.retryLater(err)
		return
	}
	if takeover {
		// The previous attempt died after publishing events this worker
		// cannot know: continue numbering after the last stored one.
		if n, err := w.pub.LastSeq(ctx, req.Tenant, req.ThreadID, req.RunID); err == nil && n > lastSeq {
			lastSeq = n
		}
	}
	stream := w.pub.NewStream(req.Tenant, req.ThreadID, req.RunID, attempt, lastSeq)
	stream.Emit(protocol.EventRunStarted, protocol.StartedData{Attempt: attempt, Worker: w.cfg.ID, Agent: req.Agent}, events.StartedID(req.RunID, attempt))
	j.log = j.log.With(zap.Int("attempt", attempt))
	j.log.Debug("run started", zap.Uint64("epoch", th.Epoch), zap.Uint64("deliveries", meta.NumDelivered))

	timeout := w.cfg.RunTimeout
	if s := req.Config.TimeoutSeconds; s > 0 {
		timeout = time.Duration(s) * time.Second
	}
	runCtx, cancelRun := context.WithCancelCause(ctx)
	defer cancelRun(nil)
	runCtx, cancelTimeout := context.WithTimeoutCause(runCtx, timeout, ErrRunTimeout)
	defer cancelTimeout()
	preemptCtx, preempt := context.WithCancel(context.Background())
	defer preempt()

	j.hold.Lock()
	j.lease = lease
	j.cancelRun = cancelRun
	j.preempt = preempt
	drained := j.drained
	j.hold.Unlock()
	w.setRunning(j)
	if drained {
		preempt()
	}
	lease.onPreempt = func(p protocol.Preemption) { j.preempted(p) }
	lease.onLost = func() { cancelRun(agent.ErrLeaseLost) }
	lease.checkPreempt()
	if rec.CancelRequested {
		cancelRun(ErrCancelled)
	}

	out := j.execute(runCtx, preemptCtx, rec, lease, stream)
	j.finalize(ctx, lease, stream, out)
}

// execute prepares the run and drives the agent loop.
func (j *job) execute(ctx, preempt context.Context, rec *protocol.Run, lease *leaseHandle, stream *events.Stream) agent.Outcome {
	w := j.w
	req := j.req
	prep, err := w.cfg.Agents.Prepare(req)
	if err != nil {
		return agent.Outcome{Status: protocol.StatusError, Error: err.Error()}
	}
	st, chain, err := w.stores.Checkpoints.Load(ctx, req.Tenant, req.ThreadID, lease.head())
	if err != nil {
		if ctx.Err() != nil {
			return agent.Outcome{Stopped: context.Cause(ctx)}
		}
		return agent.Outcome{Status: protocol.StatusError, Error: fmt.Sprintf("load thread state: %v", err)}
	}
	resumed := false
	for _, d := range chain {
		if d.RunID == req.RunID {
			resumed = true
		}
	}
	if req.Command != nil && !resumed && lease.threadStatus() != protocol.ThreadInterrupted {
		return agent.Outcome{Status: protocol.StatusError, Error: "command.resume was sent but the thread is not waiting for input; send new messages as input instead"}
	}
	host := &runHost{j: j, lease: lease, stream: stream}
	rt := &middleware.Runtime{
		RunID:    req.RunID,
		ThreadID: req.ThreadID,
		Tenant:   req.Tenant,
		Agent:    req.Agent,
		Config:   req.Config,
		Tools:    prep.Tools,
		Logger:   j.log,
		Emit:     func(t string, data any) { stream.Emit(t, data, "") },
	}
	if req.Command != nil {
		rt.Resume = req.Command.Resume
	}
	run := &agent.Run{
		Runtime:   rt,
		Chain:     prep.Chain,
		Model:     prep.Model,
		ModelName: prep.ModelName,
		System:    prep.Profile.SystemPrompt,
		MaxSteps:  prep.MaxSteps,
		State:     st,
		Host:      host,
		Preempt:   preempt,
	}
	if !resumed && req.Input != nil {
		run.Input = req.Input.Messages
	}
	_ = rec
	return agent.Execute(ctx, run)
}

// runHost is the agent loop's view of the worker.
type runHost struct {
	j      *job
	lease  *leaseHandle
	stream *events.Stream
	step   int
}

// Checkpoint writes the delta and moves the thread's head under the lease.
func (h *runHost) Checkpoint(ctx context.Context, u state.Update) error {
	h.step++
	return h.lease.checkpoint(ctx, h.j.req.RunID, h.step, u)
}

// Emit publishes an event of the run.
func (h *runHost) Emit(eventType string, data any) { h.stream.Emit(eventType, data, "") }

// finalize records the outcome, gives the thread back, publishes the one
// terminal event and acks the request, in that order: a crash between any
// two steps is finished by the next delivery without a second event.
func (j *job) finalize(ctx context.Context, lease *leaseHandle, stream *events.Stream, out agent.Outcome) {
	w := j.w
	req := j.req
	status, supersededBy := out.Status, ""
	errText := out.Error
	rollbackTo := ""
	switch {
	case out.Stopped == nil:
	case errors.Is(out.Stopped, agent.ErrLeaseLost):
		j.abandon("lease lost")
		return
	case errors.Is(out.Stopped, ErrShutdown):
		j.log.Info("run handed back at a safe boundary for shutdown")
		j.hold.Lock()
		j.lease = nil
		j.hold.Unlock()
		if stream != nil {
			_ = stream.Flush(ctx)
		}
		j.handBack()
		return
	case errors.Is(out.Stopped, ErrCancelled):
		status = protocol.StatusCancelled
	case errors.Is(out.Stopped, ErrRunTimeout):
		status, errText = protocol.StatusTimeout, ErrRunTimeout.Error()
	case errors.Is(out.Stopped, ErrRolledBack):
		status = protocol.StatusCancelled
		p := lease.preemptor()
		supersededBy = p.RunID
		rollbackTo = lease.base
		if rec, _, err := w.stores.Runs.Get(ctx, req.Tenant, req.RunID); err == nil {
			rollbackTo = rec.BaseCheckpoint
		}
	case errors.Is(out.Stopped, agent.ErrPreempted):
		status = protocol.StatusSteered
		supersededBy = lease.preemptor().RunID
		if j.isDrained() {
			j.hold.Lock()
			j.lease = nil
			j.hold.Unlock()
			if stream != nil {
				_ = stream.Flush(ctx)
			}
			j.handBack()
			return
		}
	default:
		status, errText = protocol.StatusError, out.Stopped.Error()
	}
	if status == "" {
		status, errText = protocol.StatusError, "run ended without a status"
	}

	var finishedSeq uint64
	if stream != nil {
		finishedSeq = stream.Reserve()
	}
	rec, _, err := w.stores.Runs.Mutate(ctx, req.Tenant, req.RunID, func(r *protocol.Run) error {
		if r.Epoch != lease.epoch {
			return agent.ErrLeaseLost
		}
		if r.Status.Terminal() {
			return errAlreadyFinished
		}
		now := time.Now().UTC()
		r.Status = status
		r.StopReason = out.StopReason
		r.Error = errText
		r.Output = out.Output
		r.SupersededBy = supersededBy
		r.FinishedAt = &now
		if finishedSeq == 0 {
			finishedSeq = r.Seq + 1
		}
		r.Seq = finishedSeq
		return nil
	})
	switch {
	case errors.Is(err, agent.ErrLeaseLost):
		j.abandon("run record taken over")
		return
	case errors.Is(err, errAlreadyFinished):
	case err != nil:
		j.log.Warn("could not record the run's end; handing it back", zap.Error(err))
		j.retryLater(err)
		return
	}
	threadStatus := protocol.ThreadIdle
	switch status {
	case protocol.StatusError, protocol.StatusTimeout:
		threadStatus = protocol.ThreadError
	case protocol.StatusInterrupted:
		threadStatus = protocol.ThreadInterrupted
	}
	if err := lease.release(ctx, &releaseOpts{status: threadStatus, rollbackTo: rollbackTo, rollback: errors.Is(out.Stopped, ErrRolledBack)}); err != nil && !errors.Is(err, agent.ErrLeaseLost) {
		j.log.Warn("could not release the thread", zap.Error(err))
	}
	if stream != nil {
		if err := stream.Flush(ctx); err != nil {
			j.log.Warn("some run events were not stored", zap.Error(err))
		}
	}
	if err := w.pub.PublishFinished(ctx, rec); err != nil {
		j.log.Warn("could not publish run.finished; handing the request back so the next delivery does", zap.Error(err))
		j.retryLater(err)
		return
	}
	j.hold.Lock()
	j.lease = nil
	j.hold.Unlock()
	w.wakeThread(req.Tenant, req.ThreadID)
	_ = j.msg.Ack()
	j.log.Debug("run finished", zap.String("status", string(status)))
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
		preempt()
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
		preempt()
	}
}

// heartbeat tells the server the request is still being worked on and
// renews the thread lease of a running run.
func (j *job) heartbeat(ctx context.Context) {
	j.hold.Lock()
	lease, abandoned := j.lease, j.abandoned
	j.hold.Unlock()
	if abandoned {
		return
	}
	_ = j.msg.InProgress()
	if lease != nil {
		lease.renew(ctx)
	}
}
