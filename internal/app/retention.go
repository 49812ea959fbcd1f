package app

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/erase"
	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/jobs"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/retention"
)

// RetentionPolicy turns the configuration's retention section into the
// tenants' rules, each named tenant's overrides merged over the default.
func RetentionPolicy(cfg config.Retention) retention.Policy {
	conv := func(t config.TenantRetention) retention.Rules {
		return retention.Rules{Events: time.Duration(t.Events), Runs: time.Duration(t.Runs), ThreadsIdle: time.Duration(t.ThreadsIdle),
			Checkpoints: t.Checkpoints, Files: time.Duration(t.Files), Usage: time.Duration(t.Usage), DLQ: time.Duration(t.DLQ)}
	}
	p := retention.Policy{Interval: time.Duration(cfg.Interval), Default: conv(cfg.Default), Tenants: make(map[string]retention.Rules, len(cfg.Tenants))}
	for name := range cfg.Tenants {
		p.Tenants[name] = conv(cfg.For(name))
	}
	return p
}

// KeyTTLs are the key TTLs the stores of a worker write (kv.SetTTLs), so
// the server expires finished runs and usage totals by itself.
func KeyTTLs(cfg config.Retention) kv.TTLs {
	p := RetentionPolicy(cfg)
	return kv.TTLs{
		Runs:  func(tenant string) time.Duration { return p.For(tenant).Runs },
		Usage: func(tenant string) time.Duration { return p.For(tenant).Usage },
	}
}

// WithRetention lets the runner take retention jobs, and makes sure the
// schedule that plans them every retention.interval exists (or is gone,
// when no tenant's rules remove anything). workdirs opens a thread's
// files, with the tenants' quotas so removed files give their bytes back
// (nil: none). Idle threads are deleted as DELETE /threads/{id} does
// (internal/erase).
func WithRetention(cfg config.Retention, workdirs func(tenant, thread string) files.Workdir) JobsOption {
	return func(ctx context.Context, js jetstream.JetStream, settings bus.Settings, stores *kv.Stores, log *zap.Logger, handlers map[string]jobs.Handler) error {
		p := RetentionPolicy(cfg)
		var eraser retention.ThreadEraser // only a threads_idle rule deletes threads
		if anyRule(p, func(r retention.Rules) bool { return r.ThreadsIdle > 0 }) {
			e, err := erase.New(ctx, erase.Config{JS: js, Names: settings.Names, Stores: stores, Files: workdirs, Logger: log})
			if err != nil {
				return err
			}
			eraser = retention.Erase(e)
		}
		s := retention.New(retention.Config{JS: js, Names: settings.Names, Stores: stores, Policy: p, Workdirs: workdirs, Eraser: eraser, Logger: log})
		handlers[retention.JobKind] = s.Handle
		if !anyRule(p, retention.Rules.Any) {
			return retention.Unschedule(ctx, js, settings.Names)
		}
		return retention.Schedule(ctx, js, settings.Names, p.Interval)
	}
}

// anyRule reports whether the default or a tenant's rules satisfy has.
func anyRule(p retention.Policy, has func(retention.Rules) bool) bool {
	if has(p.Default) {
		return true
	}
	for _, r := range p.Tenants {
		if has(r) {
			return true
		}
	}
	return false
}
