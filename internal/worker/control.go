package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/intake"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/protocol"
)

// Queue groups shared by all workers.
const (
	cancelQueue   = "natsagent-cancel"
	advisoryQueue = "natsagent-dlq"
)

// control is a message on a worker's private control subject.
type control struct {
	Action string `json:"action"`
	Tenant string `json:"tenant"`
	Thread string `json:"thread"`
	Run    string `json:"run"`
	// Rollback (actionCancel) returns the thread to where it was before
	// the run.
	Rollback bool `json:"rollback,omitempty"`
}

const (
	// actionLook: the thread record changed (a steer or rollback
	// reserved it); re-read it.
	actionLook = "look"
	// actionCancel: cancel the run and reply when it ended.
	actionCancel = "cancel"
)

type controlReply struct {
	Found  bool            `json:"found"`
	Status protocol.Status `json:"status,omitempty"`
}

func (w *Worker) subscribe() error {
	sub, err := w.nc.QueueSubscribe(w.names.CancelSubjects(), cancelQueue, func(m *nats.Msg) {
		w.spawn(func() { w.handleCancel(m) })
	})
	if err != nil {
		return fmt.Errorf("subscribe to cancel requests: %w", err)
	}
	w.subs = append(w.subs, sub)
	sub, err = w.nc.Subscribe(w.names.WorkerControl(w.cfg.ID), func(m *nats.Msg) {
		go w.handleControl(m)
	})
	if err != nil {
		return fmt.Errorf("subscribe to worker control: %w", err)
	}
	w.subs = append(w.subs, sub)
	sub, err = w.nc.Subscribe(w.names.WorkerHolds(), w.answerHolds)
	if err != nil {
		return fmt.Errorf("subscribe to hold questions: %w", err)
	}
	w.subs = append(w.subs, sub)
	sub, err = w.nc.QueueSubscribe(maxDeliveriesSubject(w.names), advisoryQueue, func(m *nats.Msg) {
		w.spawn(func() { w.handleMaxDeliveries(m) })
	})
	if err != nil {
		return fmt.Errorf("subscribe to delivery advisories: %w", err)
	}
	w.subs = append(w.subs, sub)
	sub, err = w.nc.QueueSubscribe(terminatedSubject(w.names), advisoryQueue, func(m *nats.Msg) {
		w.spawn(func() { w.handleTerminated(m) })
	})
	if err != nil {
		return fmt.Errorf("subscribe to termination advisories: %w", err)
	}
	w.subs = append(w.subs, sub)
	return w.nc.Flush()
}

// spawn runs a subscription callback's work on its own goroutine, which
// the worker's end waits for. A callback still running when that wait has
// begun does its work inline instead: WaitGroup.Add must not race Wait.
func (w *Worker) spawn(fn func()) {
	w.hmu.Lock()
	if w.hclosed {
		w.hmu.Unlock()
		fn()
		return
	}
	w.handlers.Add(1)
	w.hmu.Unlock()
	go func() {
		defer w.handlers.Done()
		fn()
	}()
}

// stopHandlers ends the subscriptions, then waits for the work their
// callbacks started (a cancel answering once its run ended, a dead letter
// being copied).
func (w *Worker) stopHandlers() {
	for _, s := range w.subs {
		_ = s.Unsubscribe()
	}
	w.subs = nil
	w.hmu.Lock()
	w.hclosed = true
	w.hmu.Unlock()
	w.handlers.Wait()
}

// signal sends a control message to a worker, without waiting.
func (w *Worker) signal(worker string, c control) {
	if !protocol.ValidToken(worker) {
		return
	}
	data, _ := json.Marshal(c)
	if err := w.nc.Publish(w.names.WorkerControl(worker), data); err != nil {
		w.log.Debug("control signal not sent", zap.String("to", worker), zap.Error(err))
	}
}

func (w *Worker) handleControl(m *nats.Msg) {
	var c control
	if err := json.Unmarshal(m.Data, &c); err != nil {
		return
	}
	switch c.Action {
	case actionLook:
		if j := w.runningJob(c.Tenant, c.Run); j != nil {
			j.hold.Lock()
			lease := j.lease
			j.hold.Unlock()
			if lease != nil {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				lease.refresh(ctx)
				cancel()
			}
		}
	case actionCancel:
		cause := ErrCancelled
		if c.Rollback {
			cause = ErrCancelRollback
		}
		// A run that took its lease but is not running here yet is
		// cancelled as it starts.
		j := w.runningOrAsked(c.Tenant, c.Run, cause)
		if j == nil {
			respondJSON(m, controlReply{Found: false})
			return
		}
		j.hold.Lock()
		cancelRun := j.cancelRun
		j.hold.Unlock()
		if cancelRun != nil {
			cancelRun(cause)
		}
		select {
		case <-j.finished:
		case <-time.After(15 * time.Second):
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		rec, _, err := w.stores.Runs.Get(ctx, c.Tenant, c.Run)
		if err != nil {
			respondJSON(m, controlReply{Found: true, Status: protocol.StatusRunning})
			return
		}
		respondJSON(m, controlReply{Found: true, Status: rec.Status})
	}
}

// handleCancel serves P.ctl.<tenant>.<thread>.<run>.cancel for every run:
// a pending run is cancelled here, a running one by the worker running it
// (which cancels its model and tool calls), and a running one whose worker
// is gone by fencing it out and recording the cancel.
//
// A tenant in its own account reaches it through its service import, with
// Nats-Request-Info naming its account: that account must be the
// subject's tenant. The answer goes only to m.Reply through m.Respond,
// which the server maps back to the requester of an import.
func (w *Worker) handleCancel(m *nats.Msg) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tenant, thread, run, ok := w.names.ParseCancelSubject(m.Subject)
	if !ok {
		respondError(m, protocol.CodeInvalid, "malformed cancel subject")
		return
	}
	for _, f := range [][2]string{{"tenant", tenant}, {"thread_id", thread}, {"run_id", run}} {
		if err := protocol.CheckToken(f[0], f[1]); err != nil {
			respondError(m, protocol.CodeInvalid, err.Error())
			return
		}
	}
	p, err := intake.Requester(tenant, "cancel runs of", m.Header, w.cfg.Submit.Roles)
	if re, ok := errors.AsType[*intake.RequesterError](err); ok {
		w.log.Warn("cancel refused", zap.String("tenant", tenant), zap.String("reason", re.Msg))
		code := codeForbidden
		if re.Status == 400 {
			code = protocol.CodeInvalid
		}
		respondError(m, code, re.Msg)
		return
	}
	if p != nil {
		// Another user's thread is not found, as over HTTP.
		th, _, err := w.stores.Threads.Get(ctx, tenant, thread)
		if err != nil && !errors.Is(err, kv.ErrNotFound) {
			respondError(m, protocol.CodeUnavailable, err.Error())
			return
		}
		if th != nil && !intake.MayUse(w.cfg.Submit.MayUseThread, th, p) {
			respondError(m, protocol.CodeNotFound, fmt.Sprintf("no run %s on thread %s", run, thread))
			return
		}
	}
	status, err := w.cancelRun(ctx, tenant, thread, run, cancelRollback(m.Data))
	w.cfg.Metrics.CancelRequest(cancelOutcome(err))
	if err != nil {
		var ce *codedError
		if errors.As(err, &ce) {
			respondError(m, ce.code, ce.msg)
			return
		}
		respondError(m, protocol.CodeUnavailable, err.Error())
		return
	}
	respondJSON(m, protocol.CancelReply{RunID: run, Status: status})
}

// codeForbidden refuses a requester who may not act on the run.
const codeForbidden = "forbidden"

// testHookCancelUnanswered, set by tests only, runs when a cancel's
// signal found no running run at the lease's worker.
var testHookCancelUnanswered func(run string)

type codedError struct{ code, msg string }

func (e *codedError) Error() string { return e.msg }

func (w *Worker) cancelRun(ctx context.Context, tenant, thread, run string, rollback bool) (protocol.Status, error) {
	// asked: this cancel has signalled the run's worker or tried to end
	// the run itself. A run found cancelled after that was cancelled by
	// this request, or with it: the answer is cancelled, not a conflict.
	asked := false
	for range 5 {
		rec, _, err := w.stores.Runs.Get(ctx, tenant, run)
		if errors.Is(err, kv.ErrNotFound) {
			rec, err = nil, nil
		}
		if err != nil {
			return "", err
		}
		if rec != nil && rec.ThreadID != thread {
			return "", &codedError{protocol.CodeNotFound, fmt.Sprintf("run %s is not on thread %s", run, thread)}
		}
		if rec != nil && rec.Status.Terminal() {
			if asked && rec.Status == protocol.StatusCancelled {
				return protocol.StatusCancelled, nil
			}
			return "", &codedError{protocol.CodeConflict, fmt.Sprintf("run %s already finished with status %s", run, rec.Status)}
		}
		// Since protocol v2 a running run's record stays pending (or
		// missing): its thread's lease says it runs.
		th, _, err := w.stores.Threads.Get(ctx, tenant, thread)
		if errors.Is(err, kv.ErrNotFound) {
			th, err = nil, nil
		}
		if err != nil {
			return "", err
		}
		view := protocol.RunView(run, rec, th)
		switch {
		case view == nil:
			req, err := w.findRequest(ctx, tenant, thread, run)
			if err != nil {
				return "", err
			}
			if req == nil {
				return "", &codedError{protocol.CodeNotFound, fmt.Sprintf("no run %s on thread %s", run, thread)}
			}
			// Published but not seen by a worker yet: record it as
			// cancelled; the worker that receives it will only ack it.
			rec = kv.NewRun(req, 0, time.Now().UTC())
			now := time.Now().UTC()
			rec.Status, rec.FinishedAt, rec.Seq = protocol.StatusCancelled, &now, 1
			if _, err := w.stores.Runs.Create(ctx, rec); err != nil {
				if errors.Is(err, kv.ErrExists) {
					continue
				}
				return "", err
			}
			w.ended(rec)
			_ = w.stores.Threads.IndexRun(ctx, tenant, thread, run, rec.CreatedAt)
			owner := ""
			if req.Principal != nil && req.Parent == nil {
				owner = req.Principal.User
			}
			w.cancelIfStarted(ctx, tenant, thread, run, owner, rollback)
			if err := w.pub.PublishFinished(ctx, rec); err != nil {
				return "", err
			}
			w.wakeThread(tenant, thread)
			return protocol.StatusCancelled, nil
		case view.Status.Terminal():
			if asked && view.Status == protocol.StatusCancelled {
				return protocol.StatusCancelled, nil
			}
			return "", &codedError{protocol.CodeConflict, fmt.Sprintf("run %s already finished with status %s", run, view.Status)}
		case view.Status == protocol.StatusPending:
			done, err := w.finishUnowned(ctx, rec, protocol.StatusCancelled, "", func(r *protocol.Run) bool { return r.Status == protocol.StatusPending })
			if err != nil {
				return "", err
			}
			if done {
				// A pending record is a submitter's, which created the
				// thread with its owner.
				w.cancelIfStarted(ctx, tenant, thread, run, "", rollback)
				return protocol.StatusCancelled, nil
			}
			continue // it started meanwhile
		}
		// Running: ask the worker that runs it.
		data, _ := json.Marshal(control{Action: actionCancel, Tenant: tenant, Thread: thread, Run: run, Rollback: rollback})
		asked = true
		reply, err := w.nc.RequestWithContext(ctx, w.names.WorkerControl(view.Worker), data)
		if err == nil {
			var cr controlReply
			if json.Unmarshal(reply.Data, &cr) == nil && cr.Found {
				return cr.Status, nil
			}
		} else if !errors.Is(err, nats.ErrNoResponders) && !errors.Is(err, context.DeadlineExceeded) {
			return "", err
		}
		if testHookCancelUnanswered != nil {
			testHookCancelUnanswered(run)
		}
		// Its worker is gone, or has not registered the run as running
		// yet (it kept the signal: the run stops as it starts): fence it
		// out and record the cancel.
		var done bool
		if rec != nil && rec.Status == protocol.StatusRunning && rec.Epoch == view.Epoch {
			// A running record a v1 worker wrote.
			epoch := rec.Epoch
			done, err = w.finishUnownedTo(ctx, rec, protocol.StatusCancelled, "", func(r *protocol.Run) bool {
				return r.Status == protocol.StatusRunning && r.Epoch == epoch
			}, rollback)
		} else {
			done, err = w.finishHeld(ctx, rec, th, *th.Lease, protocol.StatusCancelled, "", rollback)
		}
		if err != nil {
			return "", err
		}
		if done {
			w.cancelOrphans(ctx, tenant, thread, run)
			return protocol.StatusCancelled, nil
		}
	}
	return "", &codedError{protocol.CodeConflict, fmt.Sprintf("run %s kept changing while being cancelled; try again", run)}
}

// cancelIfStarted makes sure a run whose pending (or missing) record a
// cancel just ended does not run: since protocol v2 starting a run writes
// no record, so the cancel's write cannot stop a start by itself. Called
// after the record was written, it writes the thread record by
// compare-and-set: if the thread's lease names the run, the run took it
// meanwhile and its worker is told to cancel it (the run's end then finds
// the cancelled record and keeps it); otherwise the run is listed in the
// thread's cancelled_runs, and no run listed there takes the lease (admit
// refuses it and settles the run from its record).
//
// Why one side always sees the other: the lease is taken by a
// compare-and-set write of the same record, whose mutation reads the
// revision it replaces. The two writes are ordered by the record's
// revisions. If the lease's write came first, this write's mutation sees
// the lease and signals its worker (a worker that has not registered the
// run as running yet keeps the signal for it, runningOrAsked). If this
// write came first, the lease's mutation sees the run listed and takes
// nothing, whatever the run read before. So the run side needs no read
// of its own after taking the lease. The thread record is created when it
// does not exist, so a run guessing a new thread's lease (guessLease)
// finds it; owner is then its owner, as the cancelled run's lease would
// have made it (takeLease): the record's creation also writes its
// creation index key, which names the owner, and a thread created without
// one would be missing from its owner's searches once a later run owns it.
func (w *Worker) cancelIfStarted(ctx context.Context, tenant, thread, run, owner string, rollback bool) {
	var holder string
	_, _, err := w.stores.Threads.Mutate(ctx, tenant, thread, func(t *protocol.Thread) error {
		holder = ""
		switch {
		case t.Lease != nil && t.Lease.RunID == run:
			holder = t.Lease.Worker
			return errUnchanged
		case t.Status == protocol.ThreadDeleting, t.RunCancelled(run):
			return errUnchanged
		}
		if t.Epoch == 0 && t.Owner == "" && t.Head == "" && len(t.RecentRuns) == 0 && len(t.CancelledRuns) == 0 {
			t.Owner = owner // a thread that never ran: it is created here
		}
		t.AddCancelledRun(run)
		return nil
	})
	if err != nil && !errors.Is(err, errUnchanged) {
		w.log.Warn("could not mark the cancelled run on its thread; a worker taking its lease now may run it",
			zap.String("tenant", tenant), zap.String("thread_id", thread), zap.String("run_id", run), zap.Error(err))
		return
	}
	if holder != "" {
		w.signal(holder, control{Action: actionCancel, Tenant: tenant, Thread: thread, Run: run, Rollback: rollback})
	}
}

// finishHeld ends a run that holds its thread's lease but that no worker
// is executing any more (its worker is gone), when its record is pending
// or missing (protocol v2): the release, fenced by the lease's epoch,
// carries the run's terminal summary; the record is written from it, then
// run.finished. It reports false when the thread no longer holds lease.
func (w *Worker) finishHeld(ctx context.Context, rec *protocol.Run, th *protocol.Thread, lease protocol.Lease, status protocol.Status, reason string, rollback bool) (bool, error) {
	return w.finishHeldWith(ctx, rec, th, lease, status, "", reason, rollback)
}

// finishHeldWith is finishHeld with a stop reason.
func (w *Worker) finishHeldWith(ctx context.Context, rec *protocol.Run, th *protocol.Thread, lease protocol.Lease, status protocol.Status, stopReason, reason string, rollback bool) (bool, error) {
	lastSeq, err := w.pub.LastSeq(ctx, th.Tenant, th.ThreadID, lease.RunID)
	if err != nil {
		return false, err
	}
	var base protocol.Run
	if rec != nil {
		base = *rec
		lastSeq = max(lastSeq, rec.Seq)
	} else {
		base = protocol.Run{RunID: lease.RunID, ThreadID: th.ThreadID, Tenant: th.Tenant, Agent: lease.Agent, CreatedAt: lease.AcquiredAt}
		if lease.CreatedAt != nil {
			base.CreatedAt = *lease.CreatedAt
		}
	}
	now := time.Now().UTC()
	started := lease.AcquiredAt
	base.Status, base.StopReason, base.Error, base.FinishedAt, base.StartedAt = status, stopReason, reason, &now, &started
	base.Attempt, base.Worker, base.Epoch, base.MsgSeq, base.Seq = max(lease.Attempt, 1), lease.Worker, lease.Epoch, lease.MsgSeq, lastSeq+1
	if lease.BaseCheckpoint != "" {
		base.BaseCheckpoint = lease.BaseCheckpoint
	}
	base.CancelRequested = false
	final := &base
	last := *final
	last.Metadata, last.Parent, last.Webhook = nil, nil, nil
	_, _, err = w.stores.Threads.Mutate(ctx, th.Tenant, th.ThreadID, func(t *protocol.Thread) error {
		if t.Lease == nil || t.Lease.RunID != lease.RunID || t.Lease.Epoch != lease.Epoch {
			return errUnchanged
		}
		t.Lease = nil
		t.Status = protocol.ThreadIdle
		if rollback {
			t.Head = lease.BaseCheckpoint
		}
		t.Preempt = withoutRun(t.Preempt, lease.RunID)
		t.LastRun = &last
		return nil
	})
	if errors.Is(err, errUnchanged) || errors.Is(err, kv.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	w.wakeThread(th.Tenant, th.ThreadID)
	out, err := writeEnded(ctx, w.stores.Runs, final)
	own := err == nil
	if errors.Is(err, errAlreadyFinished) {
		out, _, err = w.stores.Runs.GetLatest(ctx, th.Tenant, lease.RunID)
	}
	if err != nil {
		return true, err
	}
	if own {
		w.ended(out)
		return true, w.pub.PublishFinished(ctx, out)
	}
	return true, w.pub.EnsureFinished(ctx, out)
}

// finishUnowned ends a run that no worker is executing (pending, or whose
// worker is gone): it records the terminal status if cond still holds,
// releases the thread if the run held it, and publishes run.finished. It
// reports false when cond no longer held.
func (w *Worker) finishUnowned(ctx context.Context, rec *protocol.Run, status protocol.Status, reason string, cond func(*protocol.Run) bool) (bool, error) {
	return w.finishUnownedTo(ctx, rec, status, reason, cond, false)
}

// finishUnownedTo is finishUnowned; with rollback, the release also
// returns the thread's head to the run's base checkpoint.
func (w *Worker) finishUnownedTo(ctx context.Context, rec *protocol.Run, status protocol.Status, reason string, cond func(*protocol.Run) bool, rollback bool) (bool, error) {
	lastSeq, err := w.pub.LastSeq(ctx, rec.Tenant, rec.ThreadID, rec.RunID)
	if err != nil {
		return false, err
	}
	errChanged := errors.New("changed")
	var holderEpoch uint64
	rec, _, err = w.stores.Runs.Mutate(ctx, rec.Tenant, rec.RunID, func(r *protocol.Run) error {
		if !cond(r) {
			return errChanged
		}
		holderEpoch = r.Epoch
		now := time.Now().UTC()
		r.Status, r.Error, r.FinishedAt = status, reason, &now
		r.Seq = max(r.Seq, lastSeq) + 1
		return nil
	})
	if errors.Is(err, errChanged) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	w.ended(rec)
	_, _, err = w.stores.Threads.Mutate(ctx, rec.Tenant, rec.ThreadID, func(t *protocol.Thread) error {
		held := t.Lease != nil && t.Lease.RunID == rec.RunID && t.Lease.Epoch == holderEpoch
		reserved := len(withoutRun(t.Preempt, rec.RunID)) != len(t.Preempt)
		if !held && !reserved {
			return errUnchanged
		}
		if held {
			t.Lease = nil
			t.Status = protocol.ThreadIdle
			if rollback {
				t.Head = rec.BaseCheckpoint
			}
		}
		t.Preempt = withoutRun(t.Preempt, rec.RunID)
		return nil
	})
	if err != nil && !errors.Is(err, errUnchanged) && !errors.Is(err, kv.ErrNotFound) {
		return true, err
	}
	if err := w.pub.PublishFinished(ctx, rec); err != nil {
		return true, err
	}
	w.wakeThread(rec.Tenant, rec.ThreadID)
	return true, nil
}

// findRequest looks for a run's request among its thread's requests still
// in the stream.
func (w *Worker) findRequest(ctx context.Context, tenant, thread, run string) (*protocol.RunRequest, error) {
	subject := w.names.RunSubject(tenant, thread)
	var seq uint64
	for range 10000 {
		m, err := w.runsStream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		seq = m.Sequence + 1
		if id := m.Header.Get(nats.MsgIdHdr); id != "" && id != protocol.RunMsgID(tenant, run) {
			continue
		}
		req, err := protocol.DecodeRunRequest(m.Data, w.cfg.Settings.MaxRequestBytes)
		if err != nil || req.RunID != run {
			continue
		}
		if req.Tenant != tenant || req.ThreadID != thread {
			return nil, nil // an invalid request; its worker dead-letters it
		}
		return req, nil
	}
	return nil, nil
}

// respondJSON and respondError answer through m.Respond only: never a
// publish to a subject the request names.
func respondJSON(m *nats.Msg, v any) {
	data, _ := json.Marshal(v)
	_ = m.Respond(data)
}

func respondError(m *nats.Msg, code, message string) {
	reply := nats.NewMsg(m.Reply)
	reply.Header.Set("Nats-Service-Error-Code", errorStatus(code))
	reply.Header.Set("Nats-Service-Error", message)
	reply.Data, _ = json.Marshal(protocol.ErrorReply{Error: protocol.ErrorBody{Code: code, Message: message}})
	_ = m.RespondMsg(reply)
}

func errorStatus(code string) string {
	switch code {
	case protocol.CodeInvalid:
		return "400"
	case protocol.CodeNotFound:
		return "404"
	case protocol.CodeConflict:
		return "409"
	case codeForbidden:
		return "403"
	case protocol.CodeUnavailable:
		return "503"
	}
	return "500"
}

// cancelRollback reads a cancel request's body: {"action":"rollback"}
// asks for a rollback; anything else (empty, "interrupt") a cancel.
func cancelRollback(data []byte) bool {
	var body struct {
		Action string `json:"action"`
	}
	return json.Unmarshal(data, &body) == nil && body.Action == protocol.CancelRollback
}
