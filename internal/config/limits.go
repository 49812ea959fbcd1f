package config

import (
	"maps"
	"slices"
	"time"

	"github.com/natsagent/natsagent/internal/protocol"
)

// Limits bounds what each tenant may use, so that one tenant cannot
// starve or crowd out the others (docs/configuration.md, "limits").
// Default applies to every tenant; Tenants override it field by field
// (a zero field of an override keeps the default).
type Limits struct {
	Default TenantLimits            `yaml:"default"`
	Tenants map[string]TenantLimits `yaml:"tenants"`
}

// TenantLimits are one tenant's limits. Zero means unlimited, except
// MaxRunTime and MaxSteps, whose zero means the built-in default.
type TenantLimits struct {
	// MaxConcurrentRuns bounds the tenant's runs running at once across
	// all workers; more wait in the queue.
	MaxConcurrentRuns int `yaml:"max_concurrent_runs"`
	// RunsPerMinute bounds the runs the tenant submits per minute, across
	// all gateways and submitters.
	RunsPerMinute int `yaml:"runs_per_minute"`
	// MaxRunTime bounds a run's config.timeout_seconds (default 24h, at
	// most 7 days).
	MaxRunTime Duration `yaml:"max_run_time"`
	// MaxSteps bounds a run's config.max_steps (default 1000, at most
	// 10000).
	MaxSteps int `yaml:"max_steps"`
	// MaxFileBytes bounds the tenant's workdir files, all threads
	// together; a write that would pass it is refused.
	MaxFileBytes int64 `yaml:"max_file_bytes"`
	// MaxEventBytes bounds the events the tenant's runs stored within
	// nats.events_max_age; at it, new runs are refused.
	MaxEventBytes int64 `yaml:"max_event_bytes"`
}

// Defaults of a tenant's limits.
const (
	DefaultMaxRunTime = 24 * time.Hour
	DefaultMaxSteps   = 1000
)

func defaultLimits() Limits {
	return Limits{Default: TenantLimits{MaxRunTime: Duration(DefaultMaxRunTime), MaxSteps: DefaultMaxSteps}}
}

// For returns tenant's limits: its override over the default.
func (l Limits) For(tenant string) TenantLimits {
	out := l.Default
	o, ok := l.Tenants[tenant]
	if !ok {
		return out
	}
	if o.MaxConcurrentRuns != 0 {
		out.MaxConcurrentRuns = o.MaxConcurrentRuns
	}
	if o.RunsPerMinute != 0 {
		out.RunsPerMinute = o.RunsPerMinute
	}
	if o.MaxRunTime != 0 {
		out.MaxRunTime = o.MaxRunTime
	}
	if o.MaxSteps != 0 {
		out.MaxSteps = o.MaxSteps
	}
	if o.MaxFileBytes != 0 {
		out.MaxFileBytes = o.MaxFileBytes
	}
	if o.MaxEventBytes != 0 {
		out.MaxEventBytes = o.MaxEventBytes
	}
	return out
}

func (l Limits) validate(bad func(path, format string, args ...any)) {
	l.Default.validate("limits.default", bad)
	for _, name := range slices.Sorted(maps.Keys(l.Tenants)) {
		path := "limits.tenants." + name
		if !protocol.ValidToken(name) {
			bad(path, "%q is not a valid tenant id: use 1 to %d characters from A-Z, a-z, 0-9, '_' and '-'", name, protocol.MaxTokenLen)
			continue
		}
		l.Tenants[name].validate(path, bad)
	}
}

func (t TenantLimits) validate(path string, bad func(path, format string, args ...any)) {
	if t.MaxConcurrentRuns < 0 {
		bad(path+".max_concurrent_runs", "must not be negative (0: unlimited)")
	}
	if t.RunsPerMinute < 0 {
		bad(path+".runs_per_minute", "must not be negative (0: unlimited)")
	}
	if d := time.Duration(t.MaxRunTime); d < 0 || d > protocol.MaxTimeoutSeconds*time.Second {
		bad(path+".max_run_time", "%s is out of range: use 1s to 168h (7 days)", d)
	} else if d != 0 && d < time.Second {
		bad(path+".max_run_time", "%s is too short: use at least 1s", d)
	}
	if t.MaxFileBytes < 0 {
		bad(path+".max_file_bytes", "must not be negative (0: unlimited)")
	}
	if t.MaxEventBytes < 0 {
		bad(path+".max_event_bytes", "must not be negative (0: unlimited)")
	}
	if t.MaxSteps < 0 || t.MaxSteps > protocol.MaxRunSteps {
		bad(path+".max_steps", "%d is out of range: use 1 to %d", t.MaxSteps, protocol.MaxRunSteps)
	}
}
