// Package retention owns the removal of each tenant's old data, by the
// rules of the configuration's retention section: run events, finished
// runs, idle threads, old checkpoints off a thread's history, workdir
// files, usage totals and dead letters. What NATS can expire by itself it
// does (the streams' max ages, the key TTLs written by internal/kv); the
// per-tenant rest is a sweep, one background job per tenant per period on
// the jobs queue, planned by a recurring message schedule. A sweep only
// removes, each removal guarded by the revision it read, so two sweeps of
// one tenant at once remove everything once and fail on nothing. It never
// touches a thread that holds a lease or has a run queued, and never a
// checkpoint on a thread's current history.
package retention

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/erase"
	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/jobs"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/protocol"
)

// JobKind is the job kind of retention. The plan job,
// P.jobs.retention.plan, is published by a recurring schedule every
// interval and enqueues one sweep job per tenant,
// P.jobs.retention.sweep.<tenant>.
const JobKind = "retention"

// Job tokens after the kind.
const (
	planToken  = "plan"
	sweepToken = "sweep"
)

// Rules are one tenant's retention; zero keeps forever.
type Rules struct {
	Events      time.Duration
	Runs        time.Duration
	ThreadsIdle time.Duration
	Checkpoints int
	Files       time.Duration
	Usage       time.Duration
	DLQ         time.Duration
}

// Any reports whether r removes anything.
func (r Rules) Any() bool { return r != Rules{} }

// Policy is every tenant's rules: the default and the named tenants'
// (already merged over the default).
type Policy struct {
	// Interval is how often every tenant is swept.
	Interval time.Duration
	Default  Rules
	Tenants  map[string]Rules
}

// For returns tenant's rules.
func (p Policy) For(tenant string) Rules {
	if r, ok := p.Tenants[tenant]; ok {
		return r
	}
	return p.Default
}

// ThreadEraser deletes whole threads: their records, runs, checkpoints,
// files, usage and events. DeleteThreads deletes those of threads that
// exist and returns them; when one is busy (a run started on it since the
// sweep read it) it refuses with a *BusyError naming it, and the sweep
// tries again without it. Erase adapts internal/erase's Eraser.
type ThreadEraser interface {
	DeleteThreads(ctx context.Context, tenant string, threads []string) ([]string, error)
}

// EraserFunc is a ThreadEraser.
type EraserFunc func(ctx context.Context, tenant string, threads []string) ([]string, error)

// DeleteThreads calls f.
func (f EraserFunc) DeleteThreads(ctx context.Context, tenant string, threads []string) ([]string, error) {
	return f(ctx, tenant, threads)
}

// BusyError is a ThreadEraser's refusal: Thread is busy.
type BusyError struct {
	Thread string
	Err    error
}

func (e *BusyError) Error() string { return fmt.Sprintf("thread %s is busy: %v", e.Thread, e.Err) }
func (e *BusyError) Unwrap() error { return e.Err }

// Erase deletes idle threads with e, as DELETE /threads/{id} does. A
// thread a run took since the sweep read it is reported as a *BusyError.
func Erase(e *erase.Eraser) ThreadEraser {
	return EraserFunc(func(ctx context.Context, tenant string, threads []string) ([]string, error) {
		deleted, err := e.DeleteThreads(ctx, tenant, threads, erase.ThreadOptions{})
		if busy, ok := errors.AsType[*erase.BusyError](err); ok {
			return deleted, &BusyError{Thread: busy.ThreadID, Err: err}
		}
		return deleted, err
	})
}

// MaxThreadsPerSweep bounds the idle threads one sweep deletes: a tenant
// with more is finished by the next sweeps, within the job's timeout.
const MaxThreadsPerSweep = 100

// CheckpointGrace is how old a checkpoint off a thread's history must be
// before it is removed: a run or a compaction job writes its checkpoint
// before it moves the thread's head to it, and must not lose it in
// between.
const CheckpointGrace = time.Hour

// MarkerTTL is how long the marker a removal leaves in a bucket is kept
// (so watchers see the removal); then the key is gone entirely.
const MarkerTTL = bus.KVMarkerTTL

// Config configures a Sweeper.
type Config struct {
	JS     jetstream.JetStream
	Names  bus.Names
	Stores *kv.Stores
	Policy Policy
	// Workdirs opens a thread's files (nil: the deployment keeps none).
	// Give it the quota-counting workdirs, so removed files give their
	// bytes back.
	Workdirs func(tenant, thread string) files.Workdir
	// Eraser deletes idle threads (nil: threads_idle is not enforced, and
	// a sweep says so in its log).
	Eraser ThreadEraser
	// Now is the clock cutoffs are computed from (default time.Now).
	Now    func() time.Time
	Logger *zap.Logger
}

// Sweeper runs retention jobs.
type Sweeper struct {
	cfg Config
	log *zap.Logger
}

// New builds a sweeper.
func New(cfg Config) *Sweeper {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	return &Sweeper{cfg: cfg, log: cfg.Logger}
}

// Report counts what one sweep removed.
type Report struct {
	Events      uint64
	DLQ         uint64
	Runs        int
	Threads     int
	Checkpoints int
	Files       int
	// Content counts the workdir content objects collected: named by no
	// file and no checkpoint any more (files.Collect).
	Content int
	Usage   int
}

// Handle is the jobs.Handler of JobKind.
func (s *Sweeper) Handle(ctx context.Context, job *jobs.Job) error {
	switch {
	case len(job.Tokens) == 1 && job.Tokens[0] == planToken:
		return s.plan(ctx)
	case len(job.Tokens) == 2 && job.Tokens[0] == sweepToken && protocol.ValidToken(job.Tokens[1]):
		tenant := job.Tokens[1]
		rep, err := s.Sweep(ctx, tenant)
		log := s.log.With(zap.String("tenant", tenant), zap.Uint64("events", rep.Events), zap.Uint64("dead_letters", rep.DLQ),
			zap.Int("runs", rep.Runs), zap.Int("threads", rep.Threads), zap.Int("checkpoints", rep.Checkpoints),
			zap.Int("files", rep.Files), zap.Int("content", rep.Content), zap.Int("usage", rep.Usage))
		if err != nil {
			log.Warn("retention sweep incomplete; the job is retried", zap.Error(err))
			return err
		}
		log.Info("retention sweep done")
		return nil
	}
	return jobs.Permanent(fmt.Errorf("retention: subject tokens %v are not a plan or sweep job", job.Tokens))
}

// Schedule makes sure the recurring schedule of the plan job exists with
// interval. Every worker calls it at start: an existing schedule with the
// same interval is left alone (rewriting it would restart its clock, and
// workers restarting more often than the interval would postpone every
// sweep), a missing or different one is written with a compare-and-set
// on the schedule subject, so concurrent starts write it once.
func Schedule(ctx context.Context, js jetstream.JetStream, names bus.Names, interval time.Duration) error {
	subject := names.JobScheduleSubject(JobKind, planToken)
	pattern := "@every " + interval.String()
	var last uint64
	m, err := bus.GetMsgFromLeader(ctx, js, names.JobsStream(), bus.MsgQuery{LastBySubject: subject})
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
	case err != nil:
		return fmt.Errorf("read the retention schedule: %w", err)
	case m.Header.Get("Nats-Schedule") == pattern:
		return nil
	default:
		last = m.Sequence
	}
	msg := nats.NewMsg(subject)
	msg.Header.Set(jobs.HeaderJobID, "retention-plan")
	_, err = js.PublishMsg(ctx, msg, jetstream.WithScheduleEvery(interval),
		jetstream.WithScheduleTarget(names.JobSubject(JobKind, planToken)), jetstream.WithExpectLastSequencePerSubject(last))
	if err != nil && !wrongLastSeq(err) {
		return fmt.Errorf("write the retention schedule: %w", err)
	}
	return nil
}

// Unschedule removes the plan's schedule (retention with nothing to
// remove for any tenant).
func Unschedule(ctx context.Context, js jetstream.JetStream, names bus.Names) error {
	st, err := js.Stream(ctx, names.JobsStream())
	if err != nil {
		return err
	}
	return st.Purge(ctx, jetstream.WithPurgeSubject(names.JobScheduleSubject(JobKind, planToken)))
}

// plan enqueues one sweep per tenant with something to remove. The job
// id names the tenant and the period, so plan jobs delivered twice in a
// period enqueue one sweep.
func (s *Sweeper) plan(ctx context.Context) error {
	tenants, err := s.tenants(ctx)
	if err != nil {
		return err
	}
	period := s.cfg.Now().Truncate(max(s.cfg.Policy.Interval, time.Second)).Unix()
	var errs []error
	for _, t := range tenants {
		id := fmt.Sprintf("retention-%s-%d", t, period)
		if _, err := jobs.Enqueue(ctx, s.cfg.JS, s.cfg.Names, jobs.Spec{Kind: JobKind, Tokens: []string{sweepToken, t}, Key: "now", ID: id}); err != nil {
			errs = append(errs, err)
		}
	}
	s.log.Debug("retention planned", zap.Int("tenants", len(tenants)))
	return errors.Join(errs...)
}

// tenants lists the tenants whose rules remove something: the named
// ones, and when the default removes something, every tenant with a
// thread or a dead letter.
func (s *Sweeper) tenants(ctx context.Context) ([]string, error) {
	seen := map[string]bool{}
	for t, r := range s.cfg.Policy.Tenants {
		if r.Any() {
			seen[t] = true
		}
	}
	if s.cfg.Policy.Default.Any() {
		n := s.cfg.Names
		for _, q := range []struct{ stream, filter string }{
			{"KV_" + n.ThreadsBucket(), "$KV." + n.ThreadsBucket() + ".*.*"},
			{n.DLQStream(), n.Prefix + ".dlq.runs.*.*"},
		} {
			found, err := subjectTokens(ctx, s.cfg.JS, q.stream, q.filter)
			if err != nil {
				return nil, err
			}
			for t := range found {
				if _, named := s.cfg.Policy.Tenants[t]; !named {
					seen[t] = true
				}
			}
		}
	}
	return slices.Sorted(maps.Keys(seen)), nil
}

// subjectTokens returns the valid tokens at the first wildcard of filter
// (P.dlq.runs.*.* gives the tenants) among a stream's subjects.
func subjectTokens(ctx context.Context, js jetstream.JetStream, stream, filter string) (map[string]bool, error) {
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, fmt.Errorf("open stream %s: %w", stream, err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return nil, fmt.Errorf("list the subjects of %s: %w", stream, err)
	}
	at := len(splitSubject(filter[:len(filter)-len(".*.*")]))
	out := map[string]bool{}
	for subj := range info.State.Subjects {
		if tokens := splitSubject(subj); len(tokens) > at && protocol.ValidToken(tokens[at]) {
			out[tokens[at]] = true
		}
	}
	return out, nil
}

// Sweep removes what tenant's rules say is too old, rule by rule; a rule
// that fails does not stop the others, and the error names it.
func (s *Sweeper) Sweep(ctx context.Context, tenant string) (Report, error) {
	var rep Report
	if !protocol.ValidToken(tenant) {
		return rep, fmt.Errorf("retention: tenant %q is not a valid id", tenant)
	}
	r := s.cfg.Policy.For(tenant)
	now := s.cfg.Now()
	// A large backlog (retention just configured on a large tenant) is
	// removed over several sweeps: this one stops a margin before the
	// job's deadline and reports what it did, without failing the job.
	job := ctx
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) > 2*budgetMargin {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, dl.Add(-budgetMargin))
		defer cancel()
	}
	var errs []error
	step := func(name string, age time.Duration, fn func(cutoff time.Time) error) {
		if age <= 0 || ctx.Err() != nil {
			return
		}
		if err := fn(now.Add(-age)); err != nil {
			errs = append(errs, fmt.Errorf("retention %s of tenant %s: %w", name, tenant, err))
		}
	}
	n := s.cfg.Names
	step("events", r.Events, func(cutoff time.Time) (err error) {
		rep.Events, err = purgeBefore(ctx, s.cfg.JS, n.EventsStream(), n.Prefix+".events."+tenant+".>", cutoff)
		return err
	})
	step("dlq", r.DLQ, func(cutoff time.Time) (err error) {
		rep.DLQ, err = purgeBefore(ctx, s.cfg.JS, n.DLQStream(), n.Prefix+".dlq.runs."+tenant+".>", cutoff)
		return err
	})
	step("runs", r.Runs, func(cutoff time.Time) (err error) {
		rep.Runs, err = s.sweepRuns(ctx, tenant, cutoff)
		return err
	})
	step("usage", r.Usage, func(cutoff time.Time) (err error) {
		rep.Usage, err = s.sweepUsage(ctx, tenant, cutoff)
		return err
	})
	if s.cfg.Workdirs != nil {
		step("files", r.Files, func(cutoff time.Time) (err error) {
			rep.Files, err = s.sweepFiles(ctx, tenant, cutoff)
			return err
		})
	}
	if r.Checkpoints > 0 {
		step("checkpoints", CheckpointGrace, func(cutoff time.Time) (err error) {
			rep.Checkpoints, err = s.sweepCheckpoints(ctx, tenant, r.Checkpoints, cutoff)
			return err
		})
	}
	if r.Files > 0 || r.Checkpoints > 0 {
		// What those steps left unnamed, and what overwrites and removes
		// did since the last sweep.
		step("content", ContentGrace, func(cutoff time.Time) (err error) {
			rep.Content, err = s.sweepContent(ctx, tenant, cutoff)
			return err
		})
	}
	if r.ThreadsIdle > 0 && s.cfg.Eraser == nil {
		s.log.Warn("retention threads_idle is configured but this worker cannot delete threads; idle threads are kept", zap.String("tenant", tenant))
	} else {
		step("threads_idle", r.ThreadsIdle, func(cutoff time.Time) (err error) {
			rep.Threads, err = s.sweepThreads(ctx, tenant, cutoff)
			return err
		})
	}
	if ctx.Err() != nil && job.Err() == nil {
		s.log.Info("retention sweep stopped at its time budget; the next sweep goes on", zap.String("tenant", tenant))
		errs = slices.DeleteFunc(errs, func(err error) bool { return errors.Is(err, context.DeadlineExceeded) })
	} else if err := job.Err(); err != nil {
		errs = append(errs, err)
	}
	return rep, errors.Join(errs...)
}

// budgetMargin is how long before its job's deadline a sweep stops.
var budgetMargin = 30 * time.Second
