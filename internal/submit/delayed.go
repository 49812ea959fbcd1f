package submit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/events"
	"github.com/natsagent/natsagent/internal/jobs"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/protocol"
)

// DelayedJobKind is the job that starts a delayed run (LangGraph's
// after_seconds): the run's request waits in the jobs stream as a message
// schedule, so no process holds a timer, and when it is due any worker's
// job runner publishes it to the runs stream as Enqueue does.
const DelayedJobKind = "delayed_run"

// Delay records req as pending now and schedules its request for due:
// run.queued, the pending record (no request sequence yet) and the run
// index are written as by Enqueue; the request itself goes to the jobs
// stream. Cancelling the run before due records it cancelled, and the due
// job then drops it. The thread record must exist.
func (q *Queue) Delay(ctx context.Context, req *protocol.RunRequest, data []byte, due time.Time) (*protocol.Run, error) {
	if err := q.Events.PublishQueued(ctx, req); err != nil {
		return nil, fmt.Errorf("publish run.queued: %w", err)
	}
	rec := kv.NewRun(req, 0, time.Now().UTC())
	rec.Seq = 1 // run.queued
	if _, err := q.Stores.Runs.Create(ctx, rec); err != nil {
		if !errors.Is(err, kv.ErrExists) {
			return nil, fmt.Errorf("create run record: %w", err)
		}
		if rec, _, err = q.Stores.Runs.GetLatest(ctx, req.Tenant, req.RunID); err != nil {
			return nil, fmt.Errorf("read run record: %w", err)
		}
	}
	_ = q.Stores.Threads.IndexRun(ctx, req.Tenant, req.ThreadID, req.RunID, rec.CreatedAt)
	if _, err := jobs.Enqueue(ctx, q.JS, q.Names, jobs.Spec{
		Kind: DelayedJobKind, Tokens: []string{req.Tenant, req.ThreadID}, Key: req.RunID,
		ID: "run." + protocol.RunMsgID(req.Tenant, req.RunID), Due: due, Data: data,
	}); err != nil {
		return nil, fmt.Errorf("schedule the run: %w", bus.MarkStoreFull(q.Names.JobsStream(), err))
	}
	return rec, nil
}

// DelayedHandler is the jobs.Handler of DelayedJobKind: it publishes a due
// run's request unless the run ended meanwhile (cancelled) or is gone.
// Multitask rules apply then, as for any request a worker receives.
func (q *Queue) DelayedHandler(maxRequestBytes int, log *zap.Logger) jobs.Handler {
	return func(ctx context.Context, j *jobs.Job) error {
		if len(j.Tokens) != 2 {
			return jobs.Permanent(fmt.Errorf("delayed run job: subject tokens %v are not <tenant>.<thread>", j.Tokens))
		}
		tenant, thread := j.Tokens[0], j.Tokens[1]
		req, err := protocol.DecodeRunRequestFor(j.Data, maxRequestBytes, tenant, thread)
		if err != nil {
			return jobs.Permanent(fmt.Errorf("delayed run job: %w", err))
		}
		if req.Tenant != tenant || req.ThreadID != thread {
			return jobs.Permanent(fmt.Errorf("delayed run job: the request is for %s/%s, the job for %s/%s", req.Tenant, req.ThreadID, tenant, thread))
		}
		rec, _, err := q.Stores.Runs.GetFromLeader(ctx, tenant, req.RunID)
		switch {
		case errors.Is(err, kv.ErrNotFound):
			return nil // deleted before it was due
		case err != nil:
			return err
		case rec.Status.Terminal() || rec.ThreadID != thread:
			return nil // cancelled before it was due
		}
		if _, err := q.Enqueue(ctx, req, j.Data); err != nil {
			if errors.Is(err, ErrMaxPayload) || errors.Is(err, ErrRunIDTaken) {
				return jobs.Permanent(err)
			}
			return err
		}
		log.Info("delayed run due: published", zap.String("tenant", tenant), zap.String("thread_id", thread), zap.String("run_id", req.RunID))
		return nil
	}
}

// NewQueue builds a queue for a process that is not a gateway (the jobs
// runner of a worker).
func NewQueue(ctx context.Context, js jetstream.JetStream, names bus.Names, stores *kv.Stores, submitter string, log *zap.Logger) (*Queue, error) {
	pub, err := events.NewPublisher(ctx, js, names, log)
	if err != nil {
		return nil, err
	}
	return &Queue{JS: js, Names: names, Stores: stores, Events: pub, Submitter: submitter}, nil
}
