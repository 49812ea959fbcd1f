package config

import (
	"testing"
	"time"
)

func TestLimitsLoadAndMergeOverrides(t *testing.T) {
	clearModelEnv(t)
	cfg, err := Load(writeConfig(t, `
nats:
  dlq_max_bytes: 104857600
  dlq_max_age: 48h
limits:
  default:
    max_concurrent_runs: 4
    runs_per_minute: 60
  tenants:
    acme:
      max_concurrent_runs: 2
      max_run_time: 1h
`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NATS.DLQMaxBytes != 100<<20 || time.Duration(cfg.NATS.DLQMaxAge) != 48*time.Hour {
		t.Fatalf("dlq bounds %+v", cfg.NATS)
	}
	acme := cfg.Limits.For("acme")
	if acme.MaxConcurrentRuns != 2 || acme.RunsPerMinute != 60 || time.Duration(acme.MaxRunTime) != time.Hour || acme.MaxSteps != DefaultMaxSteps {
		t.Fatalf("acme's limits %+v", acme)
	}
	other := cfg.Limits.For("globex")
	if other.MaxConcurrentRuns != 4 || time.Duration(other.MaxRunTime) != DefaultMaxRunTime {
		t.Fatalf("default limits %+v", other)
	}
	if d := Default(); time.Duration(d.NATS.DLQMaxAge) != 7*24*time.Hour || d.NATS.DLQMaxBytes != 1<<30 {
		t.Fatalf("dlq defaults %+v", d.NATS)
	}
}

func TestLimitsRejectBadValuesWithTheirPath(t *testing.T) {
	clearModelEnv(t)
	cases := map[string]string{
		"limits:\n  default:\n    max_concurrent_runs: -1\n":         "limits.default.max_concurrent_runs",
		"limits:\n  tenants:\n    acme:\n      max_steps: 10001\n":   "limits.tenants.acme.max_steps: 10001 is out of range: use 1 to 10000",
		"limits:\n  tenants:\n    acme:\n      max_run_time: 200h\n": "limits.tenants.acme.max_run_time",
		"limits:\n  tenants:\n    a.b:\n      runs_per_minute: 1\n":  "limits.tenants.a.b",
		"nats:\n  dlq_max_bytes: 1000\n":                             "nats.dlq_max_bytes",
		"nats:\n  dlq_max_age: 1s\n":                                 "nats.dlq_max_age",
	}
	loadRefuses(t, cases)
}
