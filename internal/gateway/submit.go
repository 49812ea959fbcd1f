package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
	"github.com/natsagent/natsagent/internal/submit"
	"github.com/natsagent/natsagent/internal/webhook"
)

// submit takes a validated run request to the runs stream and returns its
// run record. The steps are ordered so that a crash after any of them
// leaves nothing a worker cannot finish:
//
//  1. a run id that already has a record is a retry: its record is the
//     answer (the runs stream dedupes within its window, the record beyond
//     it);
//  2. the thread record is created if missing (or 404 for if_not_exists
//     reject);
//  3. reject strategy on a busy thread: the run is recorded rejected and
//     never published;
//  4. the request is enqueued as every submitter enqueues (internal/submit:
//     request with Nats-Msg-Id = "<tenant>.<run id>", run.queued, pending
//     record, run index); a duplicate of another request is 409.
//
// A run due later (after_seconds: due is set) is recorded pending at
// once and its request scheduled in the jobs stream (submit.Delay); the
// reject strategy applies when it is due, in the worker.
func (s *Server) submit(ctx context.Context, req *protocol.RunRequest, ifNotExists string, due time.Time, tags map[string]any) (*protocol.Run, error) {
	log := s.log.With(zap.String("tenant", req.Tenant), zap.String("thread_id", req.ThreadID), zap.String("run_id", req.RunID))
	data, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	if limit := s.cfg.Settings.MaxRequestBytes; len(data) > limit {
		return nil, errTooLarge(fmt.Sprintf("run request is %d bytes, over the limit of %d bytes; put large content in files and reference it", len(data), limit))
	}

	rec, _, err := s.stores.Runs.Get(ctx, req.Tenant, req.RunID)
	switch {
	case err == nil:
		return s.retried(ctx, req, rec)
	case !errors.Is(err, kv.ErrNotFound):
		return nil, err
	}

	th, _, err := s.stores.Threads.Get(ctx, req.Tenant, req.ThreadID)
	if errors.Is(err, kv.ErrNotFound) {
		if ifNotExists == ifNotExistsReject {
			return nil, errNotFound(fmt.Sprintf("thread %s not found; create it first or send \"if_not_exists\": \"create\"", req.ThreadID))
		}
		th = newThread(req.Tenant, req.ThreadID, tags)
		_, err = s.stores.Threads.Put(ctx, th, 0)
		if errors.Is(err, kv.ErrExists) {
			// Created meanwhile (by a worker or another request): use it,
			// read from the leader (a replica may not have it yet).
			th, _, err = s.stores.Threads.GetLatest(ctx, req.Tenant, req.ThreadID)
		}
	}
	if err != nil {
		return nil, err
	}
	if th.Status == protocol.ThreadDeleting {
		return nil, errDeleting(req.ThreadID)
	}
	if missingTags(th.Metadata, tags) {
		// The thread's first run names its graph and assistant, as
		// LangGraph does: Agent Chat UI lists threads by them.
		_, _, err := s.stores.Threads.Mutate(ctx, req.Tenant, req.ThreadID, func(t *protocol.Thread) error {
			if t.Metadata == nil {
				t.Metadata = map[string]any{}
			}
			for k, v := range tags {
				if _, ok := t.Metadata[k]; !ok {
					t.Metadata[k] = v
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}

	if req.Command != nil {
		if err := s.checkCommand(ctx, req, th); err != nil {
			return nil, err
		}
	}

	if !due.IsZero() {
		rec, err := s.queue.Delay(ctx, req, data, due)
		if err != nil {
			return nil, err
		}
		log.Info("run scheduled", zap.String("agent", req.Agent), zap.Time("due", due))
		return rec, nil
	}

	if req.MultitaskStrategy == protocol.StrategyReject {
		busy, holder, err := s.busy(ctx, th)
		if err != nil {
			return nil, err
		}
		if busy {
			return s.reject(ctx, req, holder, log)
		}
	}

	// The publish span covers the enqueue; its context travels in the
	// request, so the worker's run span hangs under it.
	pubCtx, published := s.tracePublish(ctx, req)
	out, err := s.queue.Enqueue(pubCtx, req, data)
	if err != nil {
		published(nil, err)
		if errors.Is(err, submit.ErrMaxPayload) {
			return nil, errTooLarge(err.Error())
		}
		if errors.Is(err, submit.ErrRunIDTaken) {
			// Never 200 for a run that will not run.
			log.Warn("run id taken in the runs stream", zap.Error(err))
			return nil, errConflict(err.Error())
		}
		return nil, err
	}
	published(out.Ack, nil)
	rec, ack := out.Record, out.Ack
	log.Info("run submitted", zap.String("agent", req.Agent), zap.String("multitask_strategy", req.MultitaskStrategy),
		zap.Uint64("msg_seq", ack.Sequence), zap.Bool("duplicate", ack.Duplicate))
	return rec, nil
}

// retried answers a submission whose run id already has a record.
func (s *Server) retried(ctx context.Context, req *protocol.RunRequest, rec *protocol.Run) (*protocol.Run, error) {
	if rec.ThreadID != req.ThreadID {
		return nil, errConflict(fmt.Sprintf("run id %s is already used by a run on thread %s; choose another run_id", req.RunID, rec.ThreadID))
	}
	if rec.Status == protocol.StatusRejected && rec.MsgSeq == 0 {
		// Rejected here, never published: the retry gets the same answer,
		// and run.finished is published in case the first attempt died
		// before it.
		if err := s.pub.EnsureFinished(ctx, rec); err != nil {
			return nil, err
		}
		return rec, errConflict(rec.Error)
	}
	return rec, nil
}

// busy reports whether a run other than a finished one holds or waits for
// the thread, and names it when it can.
func (s *Server) busy(ctx context.Context, th *protocol.Thread) (bool, string, error) {
	active := func(run string) (bool, error) {
		r, _, err := s.stores.Runs.Get(ctx, th.Tenant, run)
		if errors.Is(err, kv.ErrNotFound) {
			r, err = nil, nil
		}
		if err != nil {
			return false, err
		}
		// Since protocol v2 a running run may have no record yet: the
		// lease says it runs, last_run that it ended.
		v := protocol.RunView(run, r, th)
		return v != nil && !v.Status.Terminal(), nil
	}
	if th.Lease != nil {
		// A lease whose run finished is stale: a worker breaks it.
		ok, err := active(th.Lease.RunID)
		if err != nil || ok {
			return ok, th.Lease.RunID, err
		}
	}
	for _, p := range th.Preempt {
		ok, err := active(p.RunID)
		if err != nil || ok {
			return ok, p.RunID, err
		}
	}
	// Requests stay in the work-queue stream until their run finishes; one
	// whose run has no record yet was published and not seen by a worker.
	subject := s.names.RunSubject(th.Tenant, th.ThreadID)
	var seq uint64
	for range 100 {
		m, err := s.runs.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return false, "", nil
		}
		if err != nil {
			return false, "", err
		}
		seq = m.Sequence + 1
		run := m.Header.Get(jetstream.MsgIDHeader)
		if run != "" {
			run = protocol.RunIDFromMsgID(th.Tenant, run) // "" (invalid) unless this tenant's
		} else {
			var probe struct {
				RunID string `json:"run_id"`
			}
			_ = json.Unmarshal(m.Data, &probe)
			run = probe.RunID
		}
		if !protocol.ValidToken(run) {
			return true, "", nil
		}
		r, _, err := s.stores.Runs.Get(ctx, th.Tenant, run)
		if errors.Is(err, kv.ErrNotFound) {
			return true, run, nil
		}
		if err != nil {
			return false, "", err
		}
		if !r.Status.Terminal() {
			return true, run, nil
		}
		// Finished, not yet acked: it holds nothing.
	}
	return true, "", nil
}

// reject records a run the gateway refuses because its thread is busy:
// it is never published, so no worker sees it. run.queued goes first and
// run.finished last, so a crash in between is repaired by a retry.
func (s *Server) reject(ctx context.Context, req *protocol.RunRequest, holder string, log *zap.Logger) (*protocol.Run, error) {
	reason := fmt.Sprintf("thread %s is busy", req.ThreadID)
	if holder != "" {
		reason = fmt.Sprintf("thread %s is busy with run %s", req.ThreadID, holder)
	}
	reason += "; run " + req.RunID + " was rejected (multitask_strategy reject)"
	if err := s.pub.PublishQueued(ctx, req); err != nil {
		return nil, fmt.Errorf("publish run.queued: %w", err)
	}
	now := time.Now().UTC()
	rec := kv.NewRun(req, 0, now)
	rec.Status, rec.FinishedAt, rec.Error, rec.Seq = protocol.StatusRejected, &now, reason, 2
	if _, err := s.stores.Runs.Create(ctx, rec); err != nil {
		if !errors.Is(err, kv.ErrExists) {
			return nil, fmt.Errorf("create run record: %w", err)
		}
		// The same run id was submitted concurrently.
		existing, _, err := s.stores.Runs.GetLatest(ctx, req.Tenant, req.RunID)
		if err != nil {
			return nil, err
		}
		return s.retried(ctx, req, existing)
	}
	if err := s.pub.PublishFinished(ctx, rec); err != nil {
		return nil, fmt.Errorf("publish run.finished: %w", err)
	}
	_ = s.stores.Threads.IndexRun(ctx, req.Tenant, req.ThreadID, req.RunID, rec.CreatedAt)
	if err := webhook.Enqueue(ctx, s.js, s.names, rec); err != nil {
		log.Warn("could not enqueue the rejected run's webhook", zap.Error(err))
	}
	log.Info("run rejected: thread busy", zap.String("busy_run", holder))
	return rec, errConflict(reason)
}

// checkResume refuses a resume the thread cannot take: it waits for
// nothing, or the value does not fit what it waits for.
func (s *Server) checkResume(st *state.State, req *protocol.RunRequest, th *protocol.Thread) error {
	var open protocol.Interrupt
	if ok, err := st.Value(protocol.InterruptValue, &open); err != nil || !ok {
		return errConflict(fmt.Sprintf("thread %s is not waiting for a person's answer; send new messages as input instead of command.resume", th.ThreadID))
	}
	switch open.Kind {
	case protocol.InterruptApproval:
		var resume protocol.Resume
		if err := json.Unmarshal(req.Command.Resume, &resume); err != nil {
			return errInvalid("command.resume", fmt.Sprintf("the thread waits for decisions on tool calls: send {\"decisions\": [...]}, one per action request: %v", err))
		}
		if err := protocol.CheckDecisions(&open, resume.Decisions); err != nil {
			return errInvalid("command.resume.decisions", err.Error())
		}
	case protocol.InterruptClarification:
		if _, ok := protocol.ResumeAnswer(req.Command.Resume); !ok {
			return errInvalid("command.resume", fmt.Sprintf("the thread waits for an answer to %q: send it as a string or as {\"answer\": \"...\"}", open.Question))
		}
	}
	// Another kind is a custom interrupt: its middleware reads the value
	// as sent (Runtime.Resume).
	return nil
}

// threadTags is the metadata a run gives a thread that has none of it
// (LangGraph's graph_id and assistant_id): the run's graph, and the
// assistant it named (a graph name or none: the graph's system
// assistant).
func threadTags(graph, assistantID string) map[string]any {
	if assistantID == "" || assistantID == graph {
		assistantID = systemAssistantID(graph)
	}
	return map[string]any{"graph_id": graph, "assistant_id": assistantID}
}

// missingTags reports whether metadata lacks a key of tags.
func missingTags(metadata, tags map[string]any) bool {
	for k := range tags {
		if _, ok := metadata[k]; !ok {
			return true
		}
	}
	return false
}
