// Package crons owns natsagent's cron jobs (LangGraph's /runs/crons): a
// schedule that starts a run at every tick. A cron is a record in the
// crons bucket (key "<tenant>.<cron id>") and one repeating message
// schedule in the jobs stream on
// <prefix>.schedules.jobs.cron_tick.<tenant>.<cron id>. The stream's
// leader fires it at each tick into <prefix>.jobs.cron_tick.<tenant>.<cron
// id>, a job any worker's job runner takes; the job starts the tick's run
// through internal/submit with a run id derived from the cron and the
// tick, so a tick fired or delivered twice starts one run. No process
// holds a timer: the schedule lives in the replicated stream and moves
// with its leader.
package crons

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/bus"
	kvs "github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/metrics"
	"github.com/natsagent/natsagent/internal/protocol"
)

// JobKind is the job a cron's schedule fires at each tick.
const JobKind = "cron_tick"

// Errors callers test with errors.Is.
var (
	ErrNotFound = errors.New("cron not found")
	ErrConflict = errors.New("cron changed concurrently")
)

// Cron is a cron as the LangGraph SDK reads it (schema.ts Cron).
type Cron struct {
	CronID         string         `json:"cron_id"`
	AssistantID    string         `json:"assistant_id"`
	ThreadID       *string        `json:"thread_id"`
	UserID         *string        `json:"user_id"`
	Schedule       string         `json:"schedule"`
	Timezone       *string        `json:"timezone"`
	EndTime        *time.Time     `json:"end_time"`
	Payload        map[string]any `json:"payload"`
	NextRunDate    *time.Time     `json:"next_run_date"`
	Metadata       map[string]any `json:"metadata"`
	Enabled        bool           `json:"enabled"`
	OnRunCompleted string         `json:"on_run_completed,omitempty"`
	CreatedAt      time.Time      `json:"created_at"`
	UpdatedAt      time.Time      `json:"updated_at"`
}

// Record is a cron as stored: the SDK's fields, the tenant, the owner of
// the threads its stateless runs create, and the run request each tick
// submits (validated and authorized when the cron was created or
// patched; each tick gives it its own run and thread ids).
type Record struct {
	Cron
	Tenant  string              `json:"tenant"`
	Owner   string              `json:"owner,omitempty"`
	Request protocol.RunRequest `json:"request"`
}

// Stateless reports whether each tick runs on a new thread.
func (r *Record) Stateless() bool { return r.ThreadID == nil }

// Spec parses the record's schedule.
func (r *Record) Spec() (*Spec, error) {
	tz := ""
	if r.Timezone != nil {
		tz = *r.Timezone
	}
	return Parse(r.Schedule, tz)
}

// View is the cron as answered: next_run_date is the next tick from now,
// none when disabled or past end_time.
func (r *Record) View(now time.Time) Cron {
	c := r.Cron
	c.NextRunDate = nil
	if !c.Enabled {
		return c
	}
	spec, err := r.Spec()
	if err != nil {
		return c
	}
	next, err := spec.Next(now)
	if err != nil || (c.EndTime != nil && next.After(*c.EndTime)) {
		return c
	}
	c.NextRunDate = &next
	return c
}

// TickRunID is the run id of a cron's tick: the same for every firing or
// delivery of one tick, so the runs stream and the run record dedupe it.
func TickRunID(cronID string, tick time.Time) string {
	return "cron-" + cronID + "-" + strconv.FormatInt(tick.Unix(), 10)
}

// Store keeps cron records in the crons bucket.
type Store struct {
	kv     jetstream.KeyValue
	js     jetstream.JetStream
	names  bus.Names
	bucket string
	// skips reports the records that do not decode (Observe).
	skips *kvs.Skips
}

// Open binds a store to the crons bucket, which must exist (bus.Provision).
func Open(ctx context.Context, js jetstream.JetStream, names bus.Names) (*Store, error) {
	kv, err := js.KeyValue(ctx, names.CronsBucket())
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w (provision the deployment with this version first)", names.CronsBucket(), err)
	}
	return &Store{kv: kv, js: js, names: names, bucket: names.CronsBucket()}, nil
}

// Observe makes the store report each record its listing skips because
// it does not decode (kv.NewSkips). Without it the listing skips such
// records silently.
func (s *Store) Observe(log *zap.Logger, rec metrics.Recorder) {
	s.skips = kvs.NewSkips(s.bucket, log, rec)
}

const opTimeout = 5 * time.Second

func key(tenant, cron string) string { return bus.Key(tenant, cron) }

// Get reads a cron of a tenant.
func (s *Store) Get(ctx context.Context, tenant, cron string) (*Record, uint64, error) {
	if !protocol.ValidToken(tenant) || !protocol.ValidToken(cron) {
		return nil, 0, ErrNotFound
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	e, err := s.kv.Get(ctx, key(tenant, cron))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, ErrNotFound
	}
	if err != nil {
		return nil, 0, err
	}
	return decode(e.Value(), e.Revision(), tenant, cron)
}

// GetLatest reads a cron through the bucket's leader (a job firing just
// after a create or delete must see it).
func (s *Store) GetLatest(ctx context.Context, tenant, cron string) (*Record, uint64, error) {
	if !protocol.ValidToken(tenant) || !protocol.ValidToken(cron) {
		return nil, 0, ErrNotFound
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	m, err := bus.GetMsgFromLeader(ctx, s.js, "KV_"+s.bucket, bus.MsgQuery{LastBySubject: "$KV." + s.bucket + "." + key(tenant, cron)})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, 0, ErrNotFound
	}
	if err != nil {
		return nil, 0, err
	}
	switch m.Header.Get("KV-Operation") {
	case "DEL", "PURGE":
		return nil, 0, ErrNotFound
	}
	return decode(m.Data, m.Sequence, tenant, cron)
}

func decode(data []byte, rev uint64, tenant, cron string) (*Record, uint64, error) {
	var r Record
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, 0, fmt.Errorf("decode cron %s: %w", cron, err)
	}
	if r.Tenant != tenant || r.CronID != cron {
		return nil, 0, fmt.Errorf("cron record %s.%s names %s.%s", tenant, cron, r.Tenant, r.CronID)
	}
	return &r, rev, nil
}

// Put creates (rev 0) or compare-and-sets (rev > 0) a record.
func (s *Store) Put(ctx context.Context, r *Record, rev uint64) (uint64, error) {
	data, err := json.Marshal(r)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	k := key(r.Tenant, r.CronID)
	var n uint64
	if rev == 0 {
		n, err = s.kv.Create(ctx, k, data)
	} else {
		n, err = s.kv.Update(ctx, k, data, rev)
	}
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return 0, ErrConflict
	}
	return n, bus.MarkStoreFull(s.bucket, err)
}

// List returns a tenant's crons.
func (s *Store) List(ctx context.Context, tenant string) ([]*Record, error) {
	if !protocol.ValidToken(tenant) {
		return nil, nil
	}
	return kvs.List(ctx, s.kv, tenant+".*", func(r *Record) bool { return r.Tenant == tenant }, s.skips)
}

// Schedule (re)writes a cron's message schedule from its record: the
// jobs stream's leader fires it at every tick. A disabled cron, or one
// past its end_time, has none. Older schedule messages of the cron are
// purged after the new one is stored, so there is never a moment with
// none while it is enabled.
func (s *Store) Schedule(ctx context.Context, r *Record) error {
	if !r.Enabled || (r.EndTime != nil && !r.EndTime.After(time.Now())) {
		return s.Unschedule(ctx, r.Tenant, r.CronID)
	}
	spec, err := r.Spec()
	if err != nil {
		return err
	}
	subject := s.names.JobScheduleSubject(JobKind, r.Tenant, r.CronID)
	m := nats.NewMsg(subject)
	m.Data, _ = json.Marshal(map[string]string{"tenant": r.Tenant, "cron_id": r.CronID})
	opts := []jetstream.PublishOpt{jetstream.WithScheduleCron(spec.Pattern), jetstream.WithScheduleTarget(s.names.JobSubject(JobKind, r.Tenant, r.CronID))}
	if spec.Loc != time.UTC {
		opts = append(opts, jetstream.WithScheduleTimeZone(spec.Loc.String()))
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	ack, err := s.js.PublishMsg(ctx, m, opts...)
	if err != nil {
		return fmt.Errorf("schedule cron %s: %w", r.CronID, bus.MarkStoreFull(s.names.JobsStream(), err))
	}
	st, err := s.js.Stream(ctx, s.names.JobsStream())
	if err != nil {
		return err
	}
	// Keep only the message just stored (a patch replaces the schedule).
	if err := st.Purge(ctx, jetstream.WithPurgeSubject(subject), jetstream.WithPurgeSequence(ack.Sequence)); err != nil {
		return fmt.Errorf("purge the cron's older schedule: %w", err)
	}
	return nil
}

// Unschedule purges a cron's message schedule: it fires no more.
func (s *Store) Unschedule(ctx context.Context, tenant, cron string) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	st, err := s.js.Stream(ctx, s.names.JobsStream())
	if err != nil {
		return err
	}
	if err := st.Purge(ctx, jetstream.WithPurgeSubject(s.names.JobScheduleSubject(JobKind, tenant, cron))); err != nil {
		return fmt.Errorf("unschedule cron %s: %w", cron, err)
	}
	return nil
}

// Delete purges a cron's schedule, then its record. A tick already fired
// finds no record and starts nothing. The record goes with a subject
// purge of the bucket's stream, not a KV purge, whose marker this bucket
// would keep for ever (it has no marker TTL).
func (s *Store) Delete(ctx context.Context, tenant, cron string) error {
	if !protocol.ValidToken(tenant) || !protocol.ValidToken(cron) {
		return ErrNotFound // never a wildcard in a purge's filter
	}
	if err := s.Unschedule(ctx, tenant, cron); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	st, err := s.js.Stream(ctx, "KV_"+s.bucket)
	if err != nil {
		return err
	}
	return st.Purge(ctx, jetstream.WithPurgeSubject("$KV."+s.bucket+"."+key(tenant, cron)))
}
