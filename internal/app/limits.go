package app

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/limits"
)

// LimitsPolicy turns the configuration's limits section into the tenants'
// policy, each named tenant's overrides merged over the default.
func LimitsPolicy(cfg config.Limits) limits.Policy {
	conv := func(t config.TenantLimits) limits.Tenant {
		return limits.Tenant{MaxConcurrentRuns: t.MaxConcurrentRuns, RunsPerMinute: t.RunsPerMinute,
			MaxRunTime: time.Duration(t.MaxRunTime), MaxSteps: t.MaxSteps, MaxFileBytes: t.MaxFileBytes, MaxEventBytes: t.MaxEventBytes}
	}
	p := limits.Policy{Default: conv(cfg.Default), Tenants: make(map[string]limits.Tenant, len(cfg.Tenants))}
	for name := range cfg.Tenants {
		p.Tenants[name] = conv(cfg.For(name))
	}
	return p
}

// Limiter opens the tenants' limiter over the deployment's limits bucket;
// gateways, submitters and workers each open one.
func Limiter(ctx context.Context, js jetstream.JetStream, cfg config.Config, settings bus.Settings) (*limits.Limiter, error) {
	return limits.Open(ctx, js, settings, LimitsPolicy(cfg.Limits))
}

// QuotaFiles wraps a workdir factory (Files) with the tenants' file
// quotas; nil stays nil (no workdirs).
func QuotaFiles(open func(tenant, thread string) files.Workdir, l *limits.Limiter) func(tenant, thread string) files.Workdir {
	if open == nil || l == nil {
		return open
	}
	return func(tenant, thread string) files.Workdir { return l.Files(open(tenant, thread), tenant) }
}
