package config

import (
	"testing"
	"time"
)

func TestRetentionLoadAndMergeOverrides(t *testing.T) {
	clearModelEnv(t)
	cfg, err := Load(writeConfig(t, `
retention:
  interval: 10m
  default:
    events: 12h
    runs: 720h
    checkpoints: 50
  tenants:
    acme:
      runs: 24h
      threads_idle: 2160h
      dlq: 48h
`))
	if err != nil {
		t.Fatal(err)
	}
	if time.Duration(cfg.Retention.Interval) != 10*time.Minute {
		t.Fatalf("interval %s", time.Duration(cfg.Retention.Interval))
	}
	acme := cfg.Retention.For("acme")
	want := TenantRetention{Events: Duration(12 * time.Hour), Runs: Duration(24 * time.Hour), ThreadsIdle: Duration(2160 * time.Hour), Checkpoints: 50, DLQ: Duration(48 * time.Hour)}
	if acme != want {
		t.Fatalf("acme's retention %+v, want %+v", acme, want)
	}
	other := cfg.Retention.For("globex")
	if other != (TenantRetention{Events: Duration(12 * time.Hour), Runs: Duration(720 * time.Hour), Checkpoints: 50}) {
		t.Fatalf("default retention %+v", other)
	}
	if d := Default(); d.Retention.Default != (TenantRetention{}) || time.Duration(d.Retention.Interval) != time.Hour {
		t.Fatalf("the default retention removes something: %+v", d.Retention)
	}
}

func TestRetentionRejectBadValuesWithTheirPath(t *testing.T) {
	clearModelEnv(t)
	loadRefuses(t, map[string]string{
		"retention:\n  interval: 500ms\n":                                   "retention.interval: 500ms is too short",
		"retention:\n  default:\n    runs: -1h\n":                           "retention.default.runs: -1h0m0s must not be negative",
		"retention:\n  default:\n    files: 10ms\n":                         "retention.default.files: 10ms is too short",
		"retention:\n  default:\n    checkpoints: -3\n":                     "retention.default.checkpoints: -3 must not be negative",
		"retention:\n  tenants:\n    acme:\n      usage: 100ms\n":           "retention.tenants.acme.usage",
		"retention:\n  tenants:\n    acme:\n      threads_idle: -5s\n":      "retention.tenants.acme.threads_idle",
		"retention:\n  tenants:\n    a.b:\n      runs: 1h\n":                "retention.tenants.a.b",
		"retention:\n  tenants:\n    acme:\n      events: 48h\n":            "retention.tenants.acme.events: 48h0m0s is longer than nats.events_max_age 24h0m0s",
		"nats:\n  dlq_max_age: 24h\nretention:\n  default:\n    dlq: 25h\n": "retention.default.dlq: 25h0m0s is longer than nats.dlq_max_age 24h0m0s",
		"retention:\n  default:\n    runs: forever\n":                       "is not a duration",
	})
}
