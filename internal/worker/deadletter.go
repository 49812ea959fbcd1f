package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/metrics"
	"github.com/natsagent/natsagent/internal/protocol"
)

// Headers set on dead-lettered requests.
const (
	HeaderDLQReason    = "Natsagent-Dlq-Reason"
	HeaderDLQSubject   = "Natsagent-Dlq-Subject"
	HeaderDLQStreamSeq = "Natsagent-Dlq-Stream-Seq"
	// HeaderDLQTruncated is "true" on a dead letter that holds only the
	// first bytes of the request; HeaderDLQOriginalBytes is its size.
	HeaderDLQTruncated     = "Natsagent-Dlq-Truncated"
	HeaderDLQOriginalBytes = "Natsagent-Dlq-Original-Bytes"
	// HeaderDLQHeadersDropped counts the client's headers not copied
	// because together they were over DLQKeepBytes.
	HeaderDLQHeadersDropped = "Natsagent-Dlq-Headers-Dropped"
)

// DLQKeepBytes is how much of an invalid request (oversized, undecodable,
// or failing validation) the dead-letter stream keeps, and how many bytes
// of the client's headers any dead letter keeps. An invalid request cannot
// be replayed as it is, and storing it whole would let one tenant fill the
// dead-letter stream shared by all with a few large publishes.
const DLQKeepBytes = 4 << 10

// decode checks a delivered request against the subject it came on and
// the deployment's agents. The error says what a person must fix.
func (w *Worker) decode(msg jetstream.Msg) (*protocol.RunRequest, error) {
	tenant, thread, ok := w.names.ParseRunSubject(msg.Subject())
	if !ok {
		return nil, &protocol.ValidationError{Message: fmt.Sprintf("subject %q is not a run subject", msg.Subject())}
	}
	if err := protocol.CheckToken("tenant (subject)", tenant); err != nil {
		return nil, err
	}
	if err := protocol.CheckToken("thread_id (subject)", thread); err != nil {
		return nil, err
	}
	req, err := protocol.DecodeRunRequestFor(msg.Data(), w.cfg.Settings.MaxRequestBytes, tenant, thread)
	if err != nil {
		return nil, err
	}
	if req.Tenant != tenant {
		return req, &protocol.ValidationError{Field: "tenant", Message: fmt.Sprintf("%q does not match the subject's tenant %q", req.Tenant, tenant)}
	}
	if req.ThreadID != thread {
		return req, &protocol.ValidationError{Field: "thread_id", Message: fmt.Sprintf("%q does not match the subject's thread %q", req.ThreadID, thread)}
	}
	if err := protocol.CheckRunMsgID(tenant, req.RunID, msg.Headers().Get(nats.MsgIdHdr)); err != nil {
		// Only "<tenant>.<run>" may be deduplicated: any other id could
		// be another run's (another tenant's) and swallow its request.
		return req, err
	}
	if !w.cfg.Agents.Has(req.Agent) {
		return req, &protocol.ValidationError{Field: "agent", Message: fmt.Sprintf("unknown agent %q (known agents: %v)", req.Agent, w.cfg.Agents.Names())}
	}
	if w.cfg.Limits != nil {
		// A submitter that checked the limits already agrees; a plain
		// NATS publish is checked here.
		if err := w.cfg.Limits.For(req.Tenant).CheckRequest(req); err != nil {
			return req, err
		}
	}
	return req, nil
}

// deadLetter ends an invalid request: an error run (when the request names
// a run it may own) with the reason, a copy in the dead-letter stream, and
// the request removed from the runs stream. The worker keeps serving.
func (w *Worker) deadLetter(ctx context.Context, msg jetstream.Msg, seq uint64, req *protocol.RunRequest, reason error) {
	tenant, thread, ok := w.names.ParseRunSubject(msg.Subject())
	log := w.log.With(zap.String("subject", msg.Subject()), zap.Uint64("stream_seq", seq))
	log.Warn("invalid run request dead-lettered", zap.Error(reason))
	if ok && protocol.ValidToken(tenant) && protocol.ValidToken(thread) {
		runID := w.invalidRunID(msg, seq)
		if err := w.recordInvalid(ctx, req, tenant, thread, runID, seq, reason); err != nil {
			log.Warn("could not record the invalid run", zap.Error(err))
		}
	}
	// A full store is waited for (the request is held, no delivery is
	// spent) before the request is handed back.
	if err := w.untilRoom(ctx, log, w.roomWait(), nil, func() error {
		return w.copyToDLQKeep(ctx, msg.Subject(), msg.Headers(), msg.Data(), seq, reason.Error(), tenant, thread, DLQKeepBytes)
	}); err != nil {
		log.Error("could not dead-letter the request; handing it back", zap.Error(err))
		_ = msg.NakWithDelay(time.Second)
		return
	}
	w.cfg.Metrics.DeadLettered(metrics.DLQInvalid)
	_ = msg.TermWithReason(clipReason(reason.Error()))
}

// conflictingRunID ends a request whose run id is taken by a run of
// another thread.
func (w *Worker) conflictingRunID(ctx context.Context, msg jetstream.Msg, seq uint64, req *protocol.RunRequest, owner *protocol.Run) {
	reason := fmt.Sprintf("run_id: %q is already used by a run on thread %q; choose another run id", req.RunID, owner.ThreadID)
	w.log.Warn("run request with a taken run id dead-lettered", zap.String("tenant", req.Tenant), zap.String("run_id", req.RunID), zap.String("thread_id", req.ThreadID), zap.String("owner_thread", owner.ThreadID))
	lastSeq, err := w.pub.LastSeq(ctx, req.Tenant, req.ThreadID, req.RunID)
	if err == nil {
		var m *nats.Msg
		m, err = w.pub.Msg(req.Tenant, req.ThreadID, req.RunID, 0, lastSeq+1, protocol.EventRunFinished,
			protocol.FinishedData{Status: protocol.StatusError, Error: reason}, req.RunID+".conflict."+req.ThreadID)
		if err == nil {
			err = w.pub.Publish(ctx, m)
		}
	}
	if err != nil {
		w.log.Warn("could not publish the conflict event", zap.Error(err))
	}
	if err := w.untilRoom(ctx, w.log, w.roomWait(), nil, func() error {
		return w.copyToDLQ(ctx, msg.Subject(), msg.Headers(), msg.Data(), seq, reason, req.Tenant, req.ThreadID)
	}); err != nil {
		_ = msg.NakWithDelay(time.Second)
		return
	}
	w.cfg.Metrics.DeadLettered(metrics.DLQConflict)
	_ = msg.TermWithReason(clipReason(reason))
}

// invalidRunID picks the id under which an invalid request is recorded:
// its run_id or Nats-Msg-Id when valid, else one derived from its stream
// sequence so the person who sent it can still find the error.
func (w *Worker) invalidRunID(msg jetstream.Msg, seq uint64) string {
	var probe struct {
		RunID string `json:"run_id"`
	}
	if json.Unmarshal(msg.Data(), &probe) == nil && protocol.ValidToken(probe.RunID) {
		return probe.RunID
	}
	if tenant, _, ok := w.names.ParseRunSubject(msg.Subject()); ok {
		if id := protocol.RunIDFromMsgID(tenant, msg.Headers().Get(nats.MsgIdHdr)); id != "" {
			return id
		}
	}
	return "invalid-" + strconv.FormatUint(seq, 10)
}

func (w *Worker) recordInvalid(ctx context.Context, req *protocol.RunRequest, tenant, thread, runID string, seq uint64, reason error) error {
	return w.recordFailed(ctx, req, tenant, thread, runID, seq, "invalid run request: "+reason.Error())
}

// recordFailed ends the run runID of the request stored at seq as an error
// with text, creating its record if nobody did.
func (w *Worker) recordFailed(ctx context.Context, req *protocol.RunRequest, tenant, thread, runID string, seq uint64, text string) error {
	for range 3 {
		rec, _, err := w.stores.Runs.Get(ctx, tenant, runID)
		if err == nil {
			if rec.Status.Terminal() || rec.ThreadID != thread || (rec.MsgSeq != 0 && rec.MsgSeq != seq) {
				// The id belongs to another request's run; leave it alone.
				return nil
			}
			_, err = w.finishUnowned(ctx, rec, protocol.StatusError, text, func(r *protocol.Run) bool { return !r.Status.Terminal() })
			return err
		}
		if !errors.Is(err, kv.ErrNotFound) {
			return err
		}
		// run.queued may exist already (the gateway publishes it before
		// it creates the record): number after what is stored.
		lastSeq, err := w.pub.LastSeq(ctx, tenant, thread, runID)
		if err != nil {
			return err
		}
		now := time.Now().UTC()
		rec = &protocol.Run{RunID: runID, ThreadID: thread, Tenant: tenant, CreatedAt: now}
		if req != nil && req.RunID == runID {
			rec = kv.NewRun(req, seq, now)
			rec.ThreadID, rec.Tenant = thread, tenant
		}
		rec.Status, rec.FinishedAt, rec.MsgSeq, rec.Seq, rec.Error = protocol.StatusError, &now, seq, lastSeq+1, text
		if _, err := w.stores.Runs.Create(ctx, rec); err != nil {
			if errors.Is(err, kv.ErrExists) {
				continue // created meanwhile (by the gateway): finish that one
			}
			return err
		}
		w.ended(rec)
		_ = w.stores.Threads.IndexRun(ctx, tenant, thread, runID, now)
		return w.pub.PublishFinished(ctx, rec)
	}
	return fmt.Errorf("run %s kept changing while being recorded as failed", runID)
}

// copyToDLQ dead-letters a request whole when it is within the request
// size limit (a valid request an operator may replay), else its first
// DLQKeepBytes.
func (w *Worker) copyToDLQ(ctx context.Context, subject string, hdr nats.Header, data []byte, seq uint64, reason, tenant, thread string) error {
	keep := w.cfg.Settings.MaxRequestBytes
	if keep <= 0 {
		keep = bus.DefaultMaxRequestBytes
	}
	return w.copyToDLQKeep(ctx, subject, hdr, data, seq, reason, tenant, thread, keep)
}

// copyToDLQKeep dead-letters a request, keeping at most keep bytes of its
// body (more is cut to DLQKeepBytes) and DLQKeepBytes of its headers.
func (w *Worker) copyToDLQKeep(ctx context.Context, subject string, hdr nats.Header, data []byte, seq uint64, reason, tenant, thread string, keep int) error {
	dlSubject := w.names.Prefix + ".dlq.runs.invalid"
	if protocol.ValidToken(tenant) && protocol.ValidToken(thread) {
		dlSubject = w.names.DLQSubject(tenant, thread)
	}
	m := nats.NewMsg(dlSubject)
	keys := make([]string, 0, len(hdr))
	for k := range hdr {
		keys = append(keys, k)
	}
	sort.Strings(keys) // which headers are kept does not depend on map order
	hdrBytes, dropped := 0, 0
	for _, k := range keys {
		// Nats-* headers are the server's (dedupe id, expectations, TTL,
		// schedules): on the copy they mean nothing or get it refused.
		if strings.HasPrefix(k, "Nats-") {
			continue
		}
		size := len(k)
		for _, v := range hdr[k] {
			size += len(v) + 4
		}
		if hdrBytes+size > DLQKeepBytes {
			dropped++
			continue
		}
		hdrBytes += size
		m.Header[k] = hdr[k]
	}
	if dropped > 0 {
		m.Header.Set(HeaderDLQHeadersDropped, strconv.Itoa(dropped))
	}
	m.Header.Set(HeaderDLQReason, clipReason(reason))
	m.Header.Set(HeaderDLQSubject, clipReason(subject))
	m.Header.Set(HeaderDLQStreamSeq, strconv.FormatUint(seq, 10))
	m.Data = data
	if len(data) > keep {
		m.Data = data[:min(DLQKeepBytes, len(data))]
		m.Header.Set(HeaderDLQTruncated, "true")
		m.Header.Set(HeaderDLQOriginalBytes, strconv.Itoa(len(data)))
	}
	var opts []jetstream.PublishOpt
	if seq != 0 {
		opts = append(opts, jetstream.WithMsgID(dlqMsgID(w.names, seq)))
	}
	_, err := w.js.PublishMsg(ctx, m, opts...)
	return bus.MarkStoreFull(w.names.DLQStream(), err)
}

func clipReason(s string) string {
	if len(s) > 1024 {
		return s[:1024]
	}
	return s
}

func maxDeliveriesSubject(n bus.Names) string {
	return "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + n.RunsStream() + "." + bus.RunsConsumer
}

// handleMaxDeliveries dead-letters a request the server gave up
// redelivering (every worker running it died or stopped, or its deliveries
// could not start). JetStream keeps such a message in a work-queue stream,
// so it is copied and deleted here, in this order: the run's end is
// recorded first, then the copy is stored, then the request is deleted.
// A step a full store refuses is tried again for up to StoreFullWait; if
// it still fails, the steps after it are not taken:
//   - run not recorded: the request stays, and the lease sweep settles the
//     run (reaper.go) once there is room;
//   - copy not stored: the run has ended; the request stays until its
//     thread's next run finds it finished and deletes it (admit.go, head),
//     without a dead-letter copy.
func (w *Worker) handleMaxDeliveries(m *nats.Msg) {
	var adv struct {
		StreamSeq  uint64 `json:"stream_seq"`
		Deliveries uint64 `json:"deliveries"`
	}
	if err := json.Unmarshal(m.Data, &adv); err != nil || adv.StreamSeq == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*w.roomWait()+30*time.Second)
	defer cancel()
	raw, err := w.runsStream.GetMsg(ctx, adv.StreamSeq)
	if err != nil {
		return // already handled by another worker
	}
	log := w.log.With(zap.Uint64("stream_seq", adv.StreamSeq))
	reason := fmt.Sprintf("the run request was delivered %d times without finishing: the workers running it stopped each time (crash, kill, or shutdown without hand-back)", adv.Deliveries)
	tenant, thread, _ := w.names.ParseRunSubject(raw.Subject)
	if req, err := protocol.DecodeRunRequest(raw.Data, w.cfg.Settings.MaxRequestBytes); err == nil && req.Tenant == tenant && req.ThreadID == thread {
		log = log.With(zap.String("tenant", tenant), zap.String("thread_id", thread), zap.String("run_id", req.RunID))
		if rec, _, err := w.stores.RunView(ctx, tenant, thread, req.RunID); err == nil && rec.Status == protocol.StatusRunning && rec.Attempt < int(adv.Deliveries) {
			reason = fmt.Sprintf("the runs consumer gave up on the run request after %d deliveries (its max_deliver), %d of which started the run: the others could not start (a full JetStream store refused their writes, or their worker stopped first); submit the run again", adv.Deliveries, rec.Attempt)
		}
		err := w.untilRoom(ctx, log, w.roomWait(), nil, func() error {
			rec, _, err := w.stores.Runs.Get(ctx, tenant, req.RunID)
			if err == nil && rec.Status.Terminal() {
				return nil
			}
			if err == nil || errors.Is(err, kv.ErrNotFound) {
				// Protocol v2: a run that holds its thread's lease runs with
				// a pending or missing record; the fenced release ends it.
				if rec != nil && (rec.Status == protocol.StatusRunning || rec.ThreadID != thread || (rec.MsgSeq != adv.StreamSeq && rec.MsgSeq != 0)) {
					// A v1 running record, or another request's: below.
				} else if th, _, terr := w.stores.Threads.Get(ctx, tenant, thread); terr == nil && th.Lease != nil && th.Lease.RunID == req.RunID && th.Lease.MsgSeq == adv.StreamSeq {
					if done, err := w.finishHeld(ctx, rec, th, *th.Lease, protocol.StatusError, reason, false); err != nil || done {
						return err
					}
				} else if terr == nil && th.LastRun != nil && th.LastRun.RunID == req.RunID && th.LastRun.MsgSeq == adv.StreamSeq {
					// It ended (its release carried last_run) and its
					// record was not written: it ended as last_run says.
					final, err := w.stores.WithOutput(ctx, protocol.EndedRun(kv.NewRun(req, adv.StreamSeq, th.LastRun.CreatedAt), th.LastRun))
					if err != nil {
						return err
					}
					ended, err := writeEnded(ctx, w.stores.Runs, final)
					if errors.Is(err, errAlreadyFinished) {
						ended, _, err = w.stores.Runs.GetLatest(ctx, tenant, req.RunID)
					}
					if err != nil {
						return err
					}
					w.ended(ended)
					return w.pub.EnsureFinished(ctx, ended)
				}
			}
			switch {
			case errors.Is(err, kv.ErrNotFound):
				// Never recorded (its deliveries could not write it):
				// record it ended, so the request never holds its thread.
				return w.recordFailed(ctx, req, tenant, thread, req.RunID, adv.StreamSeq, reason)
			case err != nil:
				return err
			case rec.Status.Terminal() || (rec.MsgSeq != adv.StreamSeq && rec.MsgSeq != 0):
				return nil
			}
			_, err = w.finishUnowned(ctx, rec, protocol.StatusError, reason, func(r *protocol.Run) bool { return !r.Status.Terminal() })
			return err
		})
		if err != nil {
			log.Warn("could not record the dead-lettered run; the request stays in the runs stream and the lease sweep settles the run", zap.Error(err))
			return
		}
	}
	if err := w.untilRoom(ctx, log, w.roomWait(), nil, func() error {
		return w.copyToDLQ(ctx, raw.Subject, raw.Header, raw.Data, adv.StreamSeq, reason, tenant, thread)
	}); err != nil {
		log.Error("could not dead-letter the request; it stays in the runs stream until its thread's next run removes it", zap.Error(err))
		return
	}
	w.cfg.Metrics.DeadLettered(metrics.DLQMaxDeliveries)
	w.deleteRequest(ctx, adv.StreamSeq)
	log.Warn("run request dead-lettered after max deliveries", zap.Uint64("deliveries", adv.Deliveries))
}

func terminatedSubject(n bus.Names) string {
	return "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED." + n.RunsStream() + "." + bus.RunsConsumer
}

// Reasons the server itself gives when it terminates a delivery because
// the message left the stream (natsagent deletes requests of settled runs;
// stream limits). Those removals are not dead letters.
const (
	serverTermDeleted = "Unacknowledged message was deleted"
	serverTermLimits  = "Message deleted by stream limits"
)

// handleTerminated makes sure every request a client terminated is in the
// dead-letter stream. natsagent's own paths copy a request before they
// terminate it, under the message id the copy here would use, so for them
// this publish is a duplicate the stream drops. A request terminated by
// anything else (another client, an operator's tool) is copied if the
// stream still holds it, and otherwise recorded by a marker holding the
// reason and the stream sequence: a work-queue stream removes a message as
// soon as it is terminated, so its body may be gone.
func (w *Worker) handleTerminated(m *nats.Msg) {
	var adv struct {
		StreamSeq  uint64 `json:"stream_seq"`
		Deliveries uint64 `json:"deliveries"`
		Reason     string `json:"reason"`
	}
	if err := json.Unmarshal(m.Data, &adv); err != nil || adv.StreamSeq == 0 {
		return
	}
	if adv.Reason == serverTermDeleted || adv.Reason == serverTermLimits {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reason := "terminated by a client: " + adv.Reason
	if adv.Reason == "" {
		reason = "terminated by a client that gave no reason"
	}
	if raw, err := w.runsStream.GetMsg(ctx, adv.StreamSeq); err == nil {
		tenant, thread, _ := w.names.ParseRunSubject(raw.Subject)
		if err := w.copyToDLQ(ctx, raw.Subject, raw.Header, raw.Data, adv.StreamSeq, reason, tenant, thread); err != nil {
			w.log.Error("could not dead-letter a terminated request", zap.Uint64("stream_seq", adv.StreamSeq), zap.Error(err))
		}
		return
	}
	marker := nats.NewMsg(w.names.Prefix + ".dlq.runs.terminated")
	marker.Header.Set(HeaderDLQReason, clipReason(reason+" (the request was no longer in the runs stream to be copied)"))
	marker.Header.Set(HeaderDLQStreamSeq, strconv.FormatUint(adv.StreamSeq, 10))
	ack, err := w.js.PublishMsg(ctx, marker, jetstream.WithMsgID(dlqMsgID(w.names, adv.StreamSeq)))
	if err != nil {
		w.log.Error("could not record a terminated request in the dead-letter stream", zap.Uint64("stream_seq", adv.StreamSeq), zap.Error(err))
		return
	}
	if !ack.Duplicate {
		w.log.Warn("a run request was terminated by another client before it was dead-lettered", zap.Uint64("stream_seq", adv.StreamSeq), zap.String("reason", adv.Reason))
	}
}

// dlqMsgID is the message id of the dead letter of the request stored at
// seq: every path that dead-letters it uses it, so it is stored once.
func dlqMsgID(n bus.Names, seq uint64) string {
	return n.RunsStream() + "-" + strconv.FormatUint(seq, 10)
}
