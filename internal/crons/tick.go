package crons

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/jobs"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/limits"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/submit"
)

// Missed-tick policies: what a tick fired late does (the stream had no
// leader at its time: every node of the jobs stream was down, or an
// election outlasted the grace).
const (
	// MissedSkip drops a tick fired more than the grace after its time:
	// the cron resumes at its next tick.
	MissedSkip = "skip"
	// MissedCatchUpOne runs it: after an outage, one run for all the
	// ticks missed (the stream fires one overdue tick and skips the rest).
	MissedCatchUpOne = "catch_up_one"
)

// DefaultLateGrace is how late a tick may fire and still run under
// MissedSkip: a leader election or a node restart fits in it.
const DefaultLateGrace = 30 * time.Second

// Ticker starts the runs of cron ticks: the jobs.Handler of JobKind.
type Ticker struct {
	Store *Store
	Queue *submit.Queue
	// Missed is MissedSkip (default) or MissedCatchUpOne.
	Missed string
	// LateGrace bounds a tick's lateness under MissedSkip (default
	// DefaultLateGrace).
	LateGrace       time.Duration
	MaxRequestBytes int
	// Admit, when set, counts a tick's run against its tenant's limits
	// as every submitter does (limits.Limiter.Admit); a tick it refuses
	// starts no run and is not retried (the next tick comes).
	Admit func(ctx context.Context, tenant string) error
	Log   *zap.Logger
}

// Handle starts the run of one tick. The tick is the latest time of the
// schedule at or before the job's firing; its run id is TickRunID, so a
// tick fired twice (a leader change between firing and recording it) or
// delivered twice (a worker lost mid-job) starts one run.
func (t *Ticker) Handle(ctx context.Context, j *jobs.Job) error {
	if len(j.Tokens) != 2 {
		return jobs.Permanent(fmt.Errorf("cron tick: subject tokens %v are not <tenant>.<cron>", j.Tokens))
	}
	tenant, cronID := j.Tokens[0], j.Tokens[1]
	log := t.log().With(zap.String("tenant", tenant), zap.String("cron_id", cronID))
	rec, _, err := t.Store.GetLatest(ctx, tenant, cronID)
	if errors.Is(err, ErrNotFound) {
		// Deleted: make sure its schedule is gone too.
		return t.Store.Unschedule(ctx, tenant, cronID)
	}
	if err != nil {
		return err
	}
	if !rec.Enabled {
		return nil
	}
	fired := j.Stored
	if fired.IsZero() {
		fired = time.Now()
	}
	spec, err := rec.Spec()
	if err != nil {
		return jobs.Permanent(err)
	}
	tick, err := spec.Prev(fired)
	if err != nil {
		return jobs.Permanent(err)
	}
	if rec.EndTime != nil && tick.After(*rec.EndTime) {
		log.Info("cron past its end_time: unscheduled")
		return t.Store.Unschedule(ctx, tenant, cronID)
	}
	if late := fired.Sub(tick); late > t.grace() && t.Missed != MissedCatchUpOne {
		log.Warn("cron tick fired late: skipped (missed-tick policy skip)", zap.Time("tick", tick), zap.Duration("late", late))
		return nil
	}
	return t.start(ctx, rec, tick, log)
}

func (t *Ticker) start(ctx context.Context, rec *Record, tick time.Time, log *zap.Logger) error {
	req := rec.Request
	req.Tenant = rec.Tenant
	req.RunID = TickRunID(rec.CronID, tick)
	meta := map[string]any{}
	for k, v := range req.Metadata {
		meta[k] = v
	}
	meta["cron_id"] = rec.CronID
	meta["cron_tick"] = tick.Format(time.RFC3339)
	req.Metadata = meta
	// From the leader, at once: a tick without a run is the usual case,
	// not a write in flight (GetLatest would wait 2 s for one).
	if _, _, err := t.Queue.Stores.Runs.GetFromLeader(ctx, req.Tenant, req.RunID); err == nil {
		return nil // this tick's run exists
	} else if !errors.Is(err, kv.ErrNotFound) {
		return err
	}
	if t.Admit != nil {
		if err := t.Admit(ctx, req.Tenant); err != nil {
			var ve *protocol.ValidationError
			if errors.Is(err, limits.ErrRateLimited) || errors.As(err, new(*limits.QuotaError)) || errors.As(err, &ve) {
				log.Warn("cron tick refused by the tenant's limits: skipped", zap.Time("tick", tick), zap.Error(err))
				return nil
			}
			return err
		}
	}
	threads := t.Queue.Stores.Threads
	if rec.Stateless() {
		req.ThreadID = req.RunID
		now := time.Now().UTC()
		th := &protocol.Thread{ThreadID: req.ThreadID, Tenant: req.Tenant, CreatedAt: now, UpdatedAt: now,
			Status: protocol.ThreadIdle, Owner: rec.Owner, Metadata: map[string]any{"cron_id": rec.CronID}}
		if _, err := threads.Put(ctx, th, 0); err != nil && !errors.Is(err, kv.ErrExists) {
			return err
		}
	} else {
		req.ThreadID = *rec.ThreadID
		th, _, err := threads.GetFromLeader(ctx, req.Tenant, req.ThreadID)
		if errors.Is(err, kv.ErrNotFound) {
			// The thread was deleted: its cron goes with it.
			log.Info("cron's thread is gone: cron deleted", zap.String("thread_id", req.ThreadID))
			return t.Store.Delete(ctx, rec.Tenant, rec.CronID)
		}
		if err != nil {
			return err
		}
		if th.Status == protocol.ThreadDeleting {
			return nil
		}
	}
	data, err := json.Marshal(&req)
	if err != nil {
		return jobs.Permanent(err)
	}
	if t.MaxRequestBytes > 0 && len(data) > t.MaxRequestBytes {
		return jobs.Permanent(fmt.Errorf("cron %s: run request is %d bytes, over %d", rec.CronID, len(data), t.MaxRequestBytes))
	}
	if _, err := t.Queue.Enqueue(ctx, &req, data); err != nil {
		if errors.Is(err, submit.ErrMaxPayload) || errors.Is(err, submit.ErrRunIDTaken) {
			return jobs.Permanent(err)
		}
		return err
	}
	log.Info("cron tick: run submitted", zap.Time("tick", tick), zap.String("thread_id", req.ThreadID), zap.String("run_id", req.RunID))
	return nil
}

func (t *Ticker) grace() time.Duration {
	if t.LateGrace > 0 {
		return t.LateGrace
	}
	return DefaultLateGrace
}

func (t *Ticker) log() *zap.Logger {
	if t.Log == nil {
		return zap.NewNop()
	}
	return t.Log
}
