package config

import (
	"maps"
	"slices"
	"time"

	"github.com/natsagent/natsagent/internal/protocol"
)

// Retention bounds how long each tenant's data is kept, so a deployment
// does not grow without bound (docs/configuration.md, "retention").
// Default applies to every tenant; Tenants override it field by field (a
// zero field of an override keeps the default). Zero everywhere keeps
// everything, as before retention existed; the streams' own max ages
// (nats.events_max_age, nats.dlq_max_age) apply whatever this says.
type Retention struct {
	// Interval is how often each tenant's data is swept (default 1h).
	Interval Duration                   `yaml:"interval"`
	Default  TenantRetention            `yaml:"default"`
	Tenants  map[string]TenantRetention `yaml:"tenants"`
}

// TenantRetention is one tenant's retention. Zero keeps forever.
type TenantRetention struct {
	// Events: run events older than this are removed (at most
	// nats.events_max_age, which removes every tenant's older events).
	Events Duration `yaml:"events"`
	// Runs: a finished run's record is removed this long after it ended.
	Runs Duration `yaml:"runs"`
	// ThreadsIdle: a thread with no run for this long, and none active or
	// queued, is deleted with its checkpoints, files and usage.
	ThreadsIdle Duration `yaml:"threads_idle"`
	// Checkpoints keeps a thread's newest N checkpoints and removes older
	// ones that are not on the thread's current history (branches left by
	// rollbacks and lost leases); the current history is never cut.
	Checkpoints int `yaml:"checkpoints"`
	// Files: workdir files not written for this long are removed.
	Files Duration `yaml:"files"`
	// Usage: usage totals not updated for this long are removed.
	Usage Duration `yaml:"usage"`
	// DLQ: the tenant's dead-lettered run requests older than this are
	// removed (at most nats.dlq_max_age).
	DLQ Duration `yaml:"dlq"`
}

// DefaultRetentionInterval is how often tenants are swept by default.
const DefaultRetentionInterval = time.Hour

func defaultRetention() Retention {
	return Retention{Interval: Duration(DefaultRetentionInterval)}
}

// For returns tenant's retention: its override over the default.
func (r Retention) For(tenant string) TenantRetention {
	out := r.Default
	o, ok := r.Tenants[tenant]
	if !ok {
		return out
	}
	pick := func(dst *Duration, v Duration) {
		if v != 0 {
			*dst = v
		}
	}
	pick(&out.Events, o.Events)
	pick(&out.Runs, o.Runs)
	pick(&out.ThreadsIdle, o.ThreadsIdle)
	pick(&out.Files, o.Files)
	pick(&out.Usage, o.Usage)
	pick(&out.DLQ, o.DLQ)
	if o.Checkpoints != 0 {
		out.Checkpoints = o.Checkpoints
	}
	return out
}

func (r Retention) validate(n NATS, bad func(path, format string, args ...any)) {
	if d := time.Duration(r.Interval); d < time.Second {
		bad("retention.interval", "%s is too short: use at least 1s (default 1h)", d)
	}
	r.Default.validate("retention.default", n, bad)
	for _, name := range slices.Sorted(maps.Keys(r.Tenants)) {
		path := "retention.tenants." + name
		if !protocol.ValidToken(name) {
			bad(path, "%q is not a valid tenant id: use 1 to %d characters from A-Z, a-z, 0-9, '_' and '-'", name, protocol.MaxTokenLen)
			continue
		}
		r.Tenants[name].validate(path, n, bad)
	}
}

func (t TenantRetention) validate(path string, n NATS, bad func(path, format string, args ...any)) {
	age := func(field string, d Duration) bool {
		switch v := time.Duration(d); {
		case v < 0:
			bad(path+"."+field, "%s must not be negative (0: keep forever)", v)
		case v != 0 && v < time.Second:
			bad(path+"."+field, "%s is too short: use at least 1s (0: keep forever)", v)
		default:
			return true
		}
		return false
	}
	if age("events", t.Events) && t.Events > n.EventsMaxAge {
		bad(path+".events", "%s is longer than nats.events_max_age %s, after which the events stream removes every tenant's events: lower it or raise nats.events_max_age",
			time.Duration(t.Events), time.Duration(n.EventsMaxAge))
	}
	age("runs", t.Runs)
	age("threads_idle", t.ThreadsIdle)
	age("files", t.Files)
	age("usage", t.Usage)
	if age("dlq", t.DLQ) && t.DLQ > n.DLQMaxAge {
		bad(path+".dlq", "%s is longer than nats.dlq_max_age %s, after which the dead-letter stream removes every tenant's dead letters: lower it or raise nats.dlq_max_age",
			time.Duration(t.DLQ), time.Duration(n.DLQMaxAge))
	}
	if t.Checkpoints < 0 {
		bad(path+".checkpoints", "%d must not be negative (0: keep every checkpoint)", t.Checkpoints)
	}
}
