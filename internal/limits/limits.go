// Package limits owns the per-tenant limits of a deployment: the bounds
// of a run request's numbers (run time, steps), the cluster-wide rate of
// run submissions, and the cluster-wide count of a tenant's running runs.
// Its state lives in the KV bucket <prefix>_limits, so any number of
// gateways, submitters and workers share it. It never touches runs,
// threads or events; callers decide what a refusal means for them.
package limits

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/protocol"
)

// Tenant holds one tenant's limits. A zero count means unlimited; a zero
// MaxRunTime or MaxSteps means the protocol's bounds.
type Tenant struct {
	MaxConcurrentRuns int
	RunsPerMinute     int
	MaxRunTime        time.Duration
	MaxSteps          int
	// MaxFileBytes bounds the tenant's workdir files in total (files.go).
	MaxFileBytes int64
	// MaxEventBytes bounds the events the tenant's runs stored within the
	// events' max age; at it, new runs are refused (events.go).
	MaxEventBytes int64
}

// Policy maps a tenant to its limits.
type Policy struct {
	Default Tenant
	// Tenants are complete limits (overrides already merged over the
	// default) of tenants that differ from it.
	Tenants map[string]Tenant
}

// For returns tenant's limits.
func (p Policy) For(tenant string) Tenant {
	if t, ok := p.Tenants[tenant]; ok {
		return t
	}
	return p.Default
}

// CheckRequest refuses a run request whose timeout or step bound is over
// its tenant's limits; the error names the field and the maximum.
func (t Tenant) CheckRequest(req *protocol.RunRequest) error {
	if t.MaxRunTime > 0 && req.Config.TimeoutSeconds > 0 && time.Duration(req.Config.TimeoutSeconds) > t.MaxRunTime/time.Second {
		return &protocol.ValidationError{Field: "config.timeout_seconds", Message: fmt.Sprintf(
			"%d is over tenant %s's maximum run time of %d seconds (limits.max_run_time %s): ask for at most %d",
			req.Config.TimeoutSeconds, req.Tenant, int64(t.MaxRunTime/time.Second), t.MaxRunTime, int64(t.MaxRunTime/time.Second))}
	}
	if t.MaxSteps > 0 && req.Config.MaxSteps > t.MaxSteps {
		return &protocol.ValidationError{Field: "config.max_steps", Message: fmt.Sprintf(
			"%d is over tenant %s's maximum of %d steps (limits.max_steps): ask for at most %d", req.Config.MaxSteps, req.Tenant, t.MaxSteps, t.MaxSteps)}
	}
	return nil
}

// RateError refuses a submission over the tenant's runs_per_minute.
type RateError struct {
	Tenant     string
	Limit      int
	RetryAfter time.Duration
}

func (e *RateError) Error() string {
	return fmt.Sprintf("tenant %s already submitted %d runs this minute, its limit (limits runs_per_minute): submit again in %ds, or ask the operator to raise the limit",
		e.Tenant, e.Limit, int(e.RetryAfter.Round(time.Second)/time.Second))
}

// ErrRateLimited matches every *RateError with errors.Is.
var ErrRateLimited = errors.New("rate limited")

// Is lets errors.Is(err, ErrRateLimited) match a RateError.
func (e *RateError) Is(target error) bool { return target == ErrRateLimited }

// Limiter enforces a Policy over the deployment's limits bucket.
type Limiter struct {
	policy Policy
	kv     jetstream.KeyValue
	// eventsMaxAge is how long the events stream keeps events.
	eventsMaxAge time.Duration
	// now is the clock (tests move it).
	now func() time.Time
	// checked remembers, per tenant, the revision of its full slots whose
	// holders were all found live, and when: runs waiting for a slot poll,
	// and asking about every holder on every poll would cost a read per
	// holder per waiting run.
	mu      sync.Mutex
	checked map[string]checkedSlots
}

type checkedSlots struct {
	rev uint64
	at  time.Time
}

// recheckLive is how long full slots found all live are trusted at the
// same revision: a dead holder is found within it after its lease goes
// stale.
const recheckLive = 5 * time.Second

// Open binds a limiter to the deployment's limits bucket (bus.Provision
// creates it).
func Open(ctx context.Context, js jetstream.JetStream, settings bus.Settings, p Policy) (*Limiter, error) {
	settings = settings.WithDefaults()
	names := settings.Names
	kv, err := js.KeyValue(ctx, names.LimitsBucket())
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w (provision the deployment with this version first)", names.LimitsBucket(), err)
	}
	return &Limiter{policy: p, kv: kv, eventsMaxAge: settings.EventsMaxAge, now: time.Now, checked: make(map[string]checkedSlots)}, nil
}

// For returns tenant's limits.
func (l *Limiter) For(tenant string) Tenant { return l.policy.For(tenant) }

// rateWindow is one tenant's count of submissions in one minute.
type rateWindow struct {
	Minute int64 `json:"minute"`
	Count  int   `json:"count"`
}

// Admit refuses a new run of a tenant at its max_event_bytes (a
// *QuotaError), then counts the submission against its runs_per_minute,
// cluster-wide (a compare-and-set on one key per tenant), or refuses it
// with a *RateError saying when to retry. Every submitter calls it before
// it publishes a run request: the gateway, the submit service. A refused
// submission is not counted. Windows are calendar minutes, so a burst
// across a minute's end may reach twice the limit within 60 seconds.
func (l *Limiter) Admit(ctx context.Context, tenant string) error {
	if !protocol.ValidToken(tenant) {
		return &protocol.ValidationError{Field: "tenant", Message: fmt.Sprintf("%q is not a valid id", tenant)}
	}
	if err := l.checkEvents(ctx, tenant); err != nil {
		return err
	}
	t := l.policy.For(tenant)
	if t.RunsPerMinute <= 0 {
		return nil
	}
	return update(ctx, l, "rate."+tenant, "count a submission of tenant "+tenant, func(w *rateWindow) (bool, error) {
		now := l.now()
		minute := now.Unix() / 60
		if w.Minute != minute {
			*w = rateWindow{Minute: minute}
		}
		if w.Count >= t.RunsPerMinute {
			next := time.Unix((minute+1)*60, 0)
			return false, &RateError{Tenant: tenant, Limit: t.RunsPerMinute, RetryAfter: max(next.Sub(now), time.Second)}
		}
		w.Count++
		return true, nil
	})
}

// load reads the JSON value under key in the limits bucket and its
// revision (0 when the key is absent). A value that does not decode reads
// as the zero value: a damaged record would otherwise block its tenant
// for good.
func load[T any](ctx context.Context, l *Limiter, key string) (T, uint64, error) {
	var v T
	e, err := l.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return v, 0, nil
	}
	if err != nil {
		return v, 0, fmt.Errorf("read %s: %w", key, err)
	}
	if json.Unmarshal(e.Value(), &v) != nil {
		var zero T
		return zero, e.Revision(), nil
	}
	return v, e.Revision(), nil
}

// store writes v under key if the key is still at revision rev (0: if it
// does not exist), so a concurrent writer's change is never overwritten.
func store[T any](ctx context.Context, l *Limiter, key string, v T, rev uint64) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if rev == 0 {
		_, err = l.kv.Create(ctx, key, data)
	} else {
		_, err = l.kv.Update(ctx, key, data, rev)
	}
	return err
}

// update changes the value under key with a compare-and-set: it loads the
// value, lets apply change it, and stores it when apply says to write; a
// store that lost to a concurrent writer is tried again on the new value,
// after a backoff, up to 50 times. An error of apply is returned as is;
// what says what the update does, for the errors of NATS ("count a
// submission of tenant acme").
func update[T any](ctx context.Context, l *Limiter, key, what string, apply func(*T) (write bool, err error)) error {
	for attempt := 0; ; attempt++ {
		v, rev, err := load[T](ctx, l, key)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		write, err := apply(&v)
		if err != nil || !write {
			return err
		}
		err = store(ctx, l, key, v, rev)
		if err == nil {
			return nil
		}
		if !conflict(err) || attempt >= 50 {
			return fmt.Errorf("%s: %w", what, err)
		}
		if err := backoff(ctx, attempt); err != nil {
			return err
		}
	}
}

func conflict(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, jetstream.ErrKeyExists) ||
		(errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence)
}

func backoff(ctx context.Context, attempt int) error {
	d := time.Duration(1+rand.IntN(5*(1+min(attempt, 10)))) * time.Millisecond
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Slot is a running run holding one of its tenant's concurrency slots.
type Slot struct {
	Thread string    `json:"thread"`
	Run    string    `json:"-"`
	Worker string    `json:"worker"`
	At     time.Time `json:"at"`
}

// active is a tenant's slots, by run id, under key "active.<tenant>".
type active struct {
	Runs map[string]Slot `json:"runs"`
}

// Acquire takes one of tenant's max_concurrent_runs slots for s.Run, cluster-wide
// (a compare-and-set on one key per tenant). It reports false when every
// slot is held by a live run: the caller waits and tries again. A run that
// already holds a slot (a redelivery, a retry) keeps it. When the slots are
// full, live is asked about each holder, and the ones it reports dead
// (their run ended or their worker died: the thread's lease says so) are
// dropped, so a slot is never held forever.
func (l *Limiter) Acquire(ctx context.Context, tenant string, s Slot, live func(context.Context, Slot) (bool, error)) (bool, error) {
	limit := l.policy.For(tenant).MaxConcurrentRuns
	if limit <= 0 {
		return true, nil
	}
	key := "active." + tenant
	for attempt := 0; ; attempt++ {
		a, rev, err := load[active](ctx, l, key)
		if err != nil {
			return false, err
		}
		if _, ok := a.Runs[s.Run]; ok {
			return true, nil
		}
		if len(a.Runs) >= limit && l.trusted(tenant, rev) {
			return false, nil
		}
		if len(a.Runs) >= limit {
			dropped := false
			for run, held := range a.Runs {
				held.Run = run
				ok, err := live(ctx, held)
				if err != nil {
					return false, err
				}
				if !ok {
					delete(a.Runs, run)
					dropped = true
				}
			}
			if len(a.Runs) >= limit {
				if dropped {
					// Save the cleanup for the others; a conflict is fine.
					_ = store(ctx, l, key, a, rev)
				} else {
					l.trust(tenant, rev)
				}
				return false, nil
			}
		}
		if a.Runs == nil {
			a.Runs = make(map[string]Slot)
		}
		s.At = l.now().UTC()
		a.Runs[s.Run] = s
		err = store(ctx, l, key, a, rev)
		if err == nil {
			return true, nil
		}
		if !conflict(err) || attempt >= 50 {
			return false, fmt.Errorf("take a running-run slot of tenant %s: %w", tenant, err)
		}
		if err := backoff(ctx, attempt); err != nil {
			return false, err
		}
	}
}

// Release gives back run's slot (no-op when it holds none).
func (l *Limiter) Release(ctx context.Context, tenant, run string) error {
	if l.policy.For(tenant).MaxConcurrentRuns <= 0 {
		return nil
	}
	what := fmt.Sprintf("release the running-run slot of run %s of tenant %s", run, tenant)
	return update(ctx, l, "active."+tenant, what, func(a *active) (bool, error) {
		if _, ok := a.Runs[run]; !ok {
			return false, nil
		}
		delete(a.Runs, run)
		return true, nil
	})
}

// Running returns tenant's slots, as stored.
func (l *Limiter) Running(ctx context.Context, tenant string) ([]Slot, error) {
	a, _, err := load[active](ctx, l, "active."+tenant)
	if err != nil {
		return nil, err
	}
	out := make([]Slot, 0, len(a.Runs))
	for run, s := range a.Runs {
		s.Run = run
		out = append(out, s)
	}
	return out, nil
}

func (l *Limiter) trusted(tenant string, rev uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	c, ok := l.checked[tenant]
	return ok && c.rev == rev && l.now().Sub(c.at) < recheckLive
}

func (l *Limiter) trust(tenant string, rev uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.checked[tenant] = checkedSlots{rev: rev, at: l.now()}
}
