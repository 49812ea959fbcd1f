package app

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/crons"
	"github.com/natsagent/natsagent/internal/jobs"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/memory"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/submit"
	"github.com/natsagent/natsagent/internal/webhook"
)

// WebhookConfig is the webhook deliveries' configuration.
func WebhookConfig(cfg config.Config) webhook.Config {
	return webhook.Config{
		Secret:       string(cfg.Webhooks.Secret),
		AllowPrivate: cfg.Webhooks.AllowPrivate,
		MaxAttempts:  cfg.Webhooks.MaxAttempts,
		Timeout:      time.Duration(cfg.Webhooks.Timeout),
	}
}

// WithMemory lets profiles enable the memory middleware, over store.
func WithMemory(store *memory.Store) AgentsOption {
	return func(b *agentsBuild) error {
		if store == nil {
			return errors.New("memory: no store")
		}
		b.memory = store
		return nil
	}
}

// Memory opens the deployment's memory store (the bucket must exist:
// bus.Provision).
func Memory(ctx context.Context, js jetstream.JetStream, settings bus.Settings) (*memory.Store, error) {
	return memory.Open(ctx, js, memory.Config{Names: settings.Names})
}

// Jobs builds a worker's background job runner: the memory job, which
// reads threads and asks m for facts, and the kinds opts add
// (WithCompaction). Give it to worker.Config.Jobs.
func Jobs(ctx context.Context, js jetstream.JetStream, cfg config.Config, settings bus.Settings, store *memory.Store, m model.Model, log *zap.Logger, opts ...JobsOption) (*jobs.Runner, error) {
	stores, err := kv.Open(ctx, js, settings.Names)
	if err != nil {
		return nil, err
	}
	extractor := memory.NewExtractor(store, stores, m, log)
	handlers := map[string]jobs.Handler{
		memory.JobKind:  extractor.Handle,
		webhook.JobKind: webhook.NewHandler(WebhookConfig(cfg), stores, log).Handle,
	}
	queue, err := submit.NewQueue(ctx, js, settings.Names, stores, "scheduler", log)
	if err != nil {
		return nil, err
	}
	handlers[submit.DelayedJobKind] = queue.DelayedHandler(settings.MaxRequestBytes, log)
	cronStore, err := crons.Open(ctx, js, settings.Names)
	if err != nil {
		return nil, err
	}
	lim, err := Limiter(ctx, js, cfg, settings)
	if err != nil {
		return nil, err
	}
	handlers[crons.JobKind] = (&crons.Ticker{Store: cronStore, Queue: queue, Missed: cfg.Crons.MissedTicks,
		LateGrace: time.Duration(cfg.Crons.LateGrace), MaxRequestBytes: settings.MaxRequestBytes,
		Admit: lim.Admit, Log: log}).Handle
	for _, o := range opts {
		if err := o(ctx, js, settings, stores, log, handlers); err != nil {
			return nil, err
		}
	}
	return jobs.NewRunner(ctx, js, jobs.Config{
		Settings:    settings,
		Handlers:    handlers,
		Concurrency: cfg.Worker.JobConcurrency,
		Logger:      log,
	})
}
