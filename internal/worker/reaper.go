package worker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/metrics"
	"github.com/natsagent/natsagent/internal/protocol"
)

// The reaper settles runs that no worker will ever continue: a thread
// lease nobody renewed for StaleLease whose run's request left the runs
// stream (acknowledged, terminated, deleted) or was given up by the
// consumer after MaxDeliver deliveries while the advisory that would have
// dead-lettered it was lost (advisories are core NATS: nobody may have been
// listening). A lease whose request is still pending redelivery is never
// touched: redelivery continues that run, and the reaper must not race it.
// Every write is a compare-and-set fenced by the lease epoch or the record
// revision, so every worker may sweep at once.

// requestState is what the runs stream and its consumer say about a run's
// request.
type requestState int

const (
	// requestQueued: in the stream and still tracked by the consumer
	// (delivered and unacked, or waiting for redelivery).
	requestQueued requestState = iota
	// requestGone: no longer in the stream.
	requestGone
	// requestExhausted: still in the stream, but the consumer is done
	// with it (it reached MaxDeliver; a work-queue stream keeps such a
	// message) and will never deliver it again.
	requestExhausted
)

// requestStateOf looks up the request stored at seq, which must carry run,
// whose run was started attempts times. The consumer does not say which
// messages it still tracks (one that reached MaxDeliver leaves its pending
// set but stays in the work-queue stream, and holds the ack floor below
// it for ever), so exhaustion is inferred from what proves it:
//   - the request is at or below the consumer's ack floor;
//   - the run was started (each start is a delivery) MaxDeliver times and
//     the last holder is gone;
//   - or, for deliveries that never started (writes a full store refused,
//     workers that stopped first): the consumer delivered the request once
//     (it is at or below its last delivered sequence) and, at two looks at
//     least two ack waits apart, no live worker held it (heldByAWorker)
//     while the consumer had pull requests waiting for work. A request the
//     consumer still tracks is delivered again an ack wait after its last
//     in-progress signal to such a waiting pull, and its holder answers.
//
// The last is inference, not the consumer's word: a worker that cannot
// answer for two ack waits holds a run it cannot continue anyway, and
// every write that settles the run is fenced (by the lease epoch and the
// record's revision), so a worker that takes the run over first wins.
func (w *Worker) requestStateOf(ctx context.Context, seq uint64, run string, attempts int) (requestState, *jetstream.RawStreamMsg, error) {
	st, m, err := w.requestStateOfSeq(ctx, seq, run, attempts)
	if st != requestQueued && err == nil {
		w.forgetUnheld(seq)
	}
	return st, m, err
}

func (w *Worker) requestStateOfSeq(ctx context.Context, seq uint64, run string, attempts int) (requestState, *jetstream.RawStreamMsg, error) {
	if seq == 0 {
		return requestGone, nil, nil
	}
	m, err := w.runsStream.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		// A replica's answer; only the leader may say it is gone.
		m, err = bus.GetMsgFromLeader(ctx, w.js, w.names.RunsStream(), bus.MsgQuery{Seq: seq})
	}
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return requestGone, nil, nil
	}
	if err != nil {
		return 0, nil, err
	}
	if tenant, _, ok := w.names.ParseRunSubject(m.Subject); !ok || protocol.CheckRunMsgID(tenant, run, m.Header.Get(nats.MsgIdHdr)) != nil {
		return requestGone, nil, nil // not this run's request (cannot happen: sequences are not reused)
	}
	info, err := w.consumer.Info(ctx)
	if err != nil {
		return 0, nil, err
	}
	if seq <= info.AckFloor.Stream || (info.Config.MaxDeliver > 0 && attempts >= info.Config.MaxDeliver) {
		return requestExhausted, m, nil
	}
	if seq > info.Delivered.Stream {
		w.forgetUnheld(seq)
		return requestQueued, m, nil // never delivered: simply queued
	}
	held, err := w.heldByAWorker(ctx, seq)
	if err != nil {
		return 0, nil, err
	}
	if held {
		w.forgetUnheld(seq)
		return requestQueued, m, nil
	}
	if info.NumWaiting > 0 && w.unheldSince(seq) >= 2*w.cfg.Settings.AckWait {
		return requestExhausted, m, nil
	}
	return requestQueued, m, nil
}

// heldByAWorker asks every live worker whether it holds the request at seq
// (Names.WorkerHolds); silence for holdProbeWait means none does.
func (w *Worker) heldByAWorker(ctx context.Context, seq uint64) (bool, error) {
	pctx, cancel := context.WithTimeout(ctx, holdProbeWait)
	defer cancel()
	_, err := w.nc.RequestWithContext(pctx, w.names.WorkerHolds(), []byte(strconv.FormatUint(seq, 10)))
	switch {
	case err == nil:
		return true, nil
	case ctx.Err() != nil:
		return false, ctx.Err()
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrNoResponders), errors.Is(err, nats.ErrTimeout):
		return false, nil
	}
	return false, err
}

// holdProbeWait is how long heldByAWorker waits for a holder's answer.
const holdProbeWait = 2 * time.Second

// answerHolds answers a heldByAWorker question when this worker holds the
// request (and has not abandoned it: its in-progress signals stopped).
func (w *Worker) answerHolds(m *nats.Msg) {
	seq, err := strconv.ParseUint(string(m.Data), 10, 64)
	if err != nil {
		return
	}
	w.mu.Lock()
	var held []*job // held is by job id: a request may be held twice
	for _, j := range w.held {
		if j.seq == seq {
			held = append(held, j)
		}
	}
	w.mu.Unlock()
	for _, j := range held {
		j.hold.Lock()
		abandoned := j.abandoned
		j.hold.Unlock()
		if !abandoned {
			_ = m.Respond([]byte("held"))
			return
		}
	}
}

// unheldSince notes that no worker held the request at seq now, and
// returns for how long that has been seen (0 at the first look).
func (w *Worker) unheldSince(seq uint64) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.unheld == nil {
		w.unheld = make(map[uint64]time.Time)
	}
	for s, at := range w.unheld {
		// Not looked at again (its lease was renewed or released):
		// forgotten; looked at again later, it starts over.
		if time.Since(at) > 10*w.cfg.StaleLease {
			delete(w.unheld, s)
		}
	}
	first, ok := w.unheld[seq]
	if !ok {
		w.unheld[seq] = time.Now()
		return 0
	}
	return time.Since(first)
}

// forgetUnheld drops seq from the requests seen unheld.
func (w *Worker) forgetUnheld(seq uint64) {
	w.mu.Lock()
	delete(w.unheld, seq)
	w.mu.Unlock()
}

// reapLoop sweeps the threads every ReapEvery (jittered) until done.
func (w *Worker) reapLoop(ctx context.Context) {
	for {
		t := time.NewTimer(jitter(w.cfg.ReapEvery))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		passCtx, cancel := context.WithTimeout(ctx, max(w.cfg.ReapEvery, 30*time.Second))
		n, err := w.reap(passCtx)
		cancel()
		if err != nil && ctx.Err() == nil {
			w.log.Warn("lease sweep failed", zap.Error(err))
		}
		if n > 0 {
			w.log.Info("lease sweep settled runs no worker would continue", zap.Int("runs", n))
		}
	}
}

// reap settles every stale lease that redelivery will not resolve and
// returns how many it settled.
func (w *Worker) reap(ctx context.Context) (int, error) {
	stale, err := w.stores.Threads.StaleLeases(ctx, time.Now().Add(-w.cfg.StaleLease))
	if err != nil {
		return 0, err
	}
	n := 0
	for _, th := range stale {
		settled, err := w.reapLease(ctx, th)
		if err != nil {
			w.log.Warn("could not settle a stale lease", zap.String("tenant", th.Tenant), zap.String("thread_id", th.ThreadID), zap.String("run_id", th.Lease.RunID), zap.Error(err))
			continue
		}
		if settled {
			n++
		}
	}
	return n, nil
}

// reapLease settles th's lease, which nobody renewed for StaleLease (or
// whose run finished), unless the run's request is still queued for
// redelivery. It reports whether it released the lease.
func (w *Worker) reapLease(ctx context.Context, th *protocol.Thread) (bool, error) {
	lease := *th.Lease
	log := w.log.With(zap.String("tenant", th.Tenant), zap.String("thread_id", th.ThreadID), zap.String("run_id", lease.RunID), zap.Uint64("epoch", lease.Epoch))
	rec, _, err := w.stores.Runs.Get(ctx, th.Tenant, lease.RunID)
	if errors.Is(err, kv.ErrNotFound) {
		rec, err = nil, nil
	}
	if err != nil {
		return false, err
	}
	if rec != nil && rec.Status.Terminal() {
		// Finished, but its worker stopped before it gave the thread back:
		// the release adds the run's usage to the thread's totals, as its
		// own release would have.
		if err := w.pub.EnsureFinished(ctx, rec); err != nil {
			return false, err
		}
		if _, err := w.releaseStale(ctx, th.Tenant, th.ThreadID, lease, rec.Usage); err != nil {
			return false, err
		}
		return true, nil
	}
	seq := lease.MsgSeq
	if seq == 0 && rec != nil {
		seq = rec.MsgSeq
	}
	attempts := lease.Attempt // protocol v2: the lease counts the starts
	if rec != nil {
		attempts = max(attempts, rec.Attempt)
	}
	st, raw, err := w.requestStateOf(ctx, seq, lease.RunID, attempts)
	if err != nil {
		return false, err
	}
	var reason string
	ago := time.Since(lease.RenewedAt).Round(time.Second)
	switch st {
	case requestQueued:
		return false, nil
	case requestGone:
		reason = fmt.Sprintf("the worker running this run (%s) stopped: its lease on the thread was last renewed %s ago, and the run request is no longer in the runs stream (acknowledged, terminated or deleted), so no worker will continue it; submit the run again", lease.Worker, ago)
	case requestExhausted:
		reason = fmt.Sprintf("the run request was delivered %d times without finishing: the workers running it stopped each time (crash, kill, or shutdown without hand-back)", max(attempts, w.cfg.Settings.MaxDeliver))
		if attempts < w.cfg.Settings.MaxDeliver {
			reason = fmt.Sprintf("the runs consumer gave up on the run request after %d deliveries (its max_deliver), %d of which started the run: the others could not start (a full JetStream store refused their writes, or their worker stopped first); submit the run again", w.cfg.Settings.MaxDeliver, attempts)
		}
	}
	if rec != nil && rec.Status == protocol.StatusRunning {
		// A running record a v1 worker wrote. Fenced: a record a newer
		// lease took over is not this lease's.
		if _, err := w.finishUnowned(ctx, rec, protocol.StatusError, reason, func(r *protocol.Run) bool {
			return !r.Status.Terminal() && r.Epoch <= lease.Epoch
		}); err != nil {
			return false, err
		}
	} else if lease.Attempt > 0 || rec != nil {
		// Protocol v2: the lease says the run ran (its record is pending
		// or missing); the release, fenced by the lease's epoch, records
		// its end.
		if _, err := w.finishHeld(ctx, rec, th, lease, protocol.StatusError, reason, false); err != nil {
			return false, err
		}
	}
	if _, err := w.releaseStale(ctx, th.Tenant, th.ThreadID, lease, nil); err != nil {
		return false, err
	}
	if st == requestExhausted {
		// The run's end is recorded: without the copy (a full store),
		// the request stays in the stream until the thread's next run
		// finds it finished and deletes it (admit.go, head).
		tenant, thread, _ := w.names.ParseRunSubject(raw.Subject)
		if err := w.copyToDLQ(ctx, raw.Subject, raw.Header, raw.Data, seq, reason, tenant, thread); err != nil {
			return true, err
		}
		w.cfg.Metrics.DeadLettered(metrics.DLQMaxDeliveries)
		w.deleteRequest(ctx, seq)
	}
	log.Warn("run settled by the lease sweep: no worker will continue it", zap.String("reason", reason))
	return true, nil
}

// releaseStale removes lease from its thread if the thread still holds it
// (same run and epoch). It reports whether this call released it.
func (w *Worker) releaseStale(ctx context.Context, tenant, thread string, lease protocol.Lease, usage *protocol.RunUsage) (bool, error) {
	_, _, err := w.stores.Threads.Mutate(ctx, tenant, thread, func(t *protocol.Thread) error {
		if t.Lease == nil || t.Lease.RunID != lease.RunID || t.Lease.Epoch != lease.Epoch {
			return errUnchanged
		}
		t.Lease = nil
		t.Status = protocol.ThreadIdle
		t.Preempt = withoutRun(t.Preempt, lease.RunID)
		if usage != nil {
			applyThreadUsage(t, usage)
		}
		return nil
	})
	switch {
	case errors.Is(err, errUnchanged), errors.Is(err, kv.ErrNotFound):
		return false, nil
	case err != nil:
		return false, err
	}
	w.wakeThread(tenant, thread)
	return true, nil
}
