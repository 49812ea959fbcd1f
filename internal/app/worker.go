package app

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/tools"
	"github.com/natsagent/natsagent/internal/worker"
)

// WorkerParts are what a program adds to a worker built from a
// configuration: the parts defined in code.
type WorkerParts struct {
	// ID names the worker in leases and logs ("": random).
	ID string
	// Logger receives the worker's logs (nil: none).
	Logger *zap.Logger
	// Model, when set, wraps the configured model provider (the public
	// package routes registered model names to their providers with it).
	Model func(configured model.Model) model.Model
	// ModelLabel, when set, says in the start log which model serves the
	// runs, in place of the configured one's label (the program's own
	// model serves them).
	ModelLabel string
	// Tools are added to the deployment's registry: agent profiles, from
	// the YAML or from code, select them by name.
	Tools []tools.Tool
	// ChatbotTools are tool names the built-in chatbot gets besides its
	// own, when neither the configuration nor Profiles define a chatbot.
	ChatbotTools []string
	// Profiles are agents defined in code, beside the configured ones. A
	// code profile named like the built-in chatbot replaces it; one named
	// like a configured profile is an error.
	Profiles []agent.Profile
	// Telemetry is the worker's, built beforehand (NewMetrics) so that its
	// program serves the metrics before the worker starts; NewWorker
	// starts it (traces, telemetry.metrics.listen) and Run stops it. nil:
	// NewWorker builds it from the configuration.
	Telemetry *Telemetry
}

// Worker is a worker wired from a configuration and its parts, with
// everything it started (MCP servers, remote tools, telemetry), which Run
// stops when the worker returned.
type Worker struct {
	*worker.Worker
	closers []func()
}

// NewWorker provisions the deployment's streams and buckets on nc (which
// stays the caller's), and builds a worker serving cfg's agents and the
// parts: what the public package's Worker runs.
func NewWorker(ctx context.Context, nc *nats.Conn, cfg config.Config, parts WorkerParts) (_ *Worker, err error) {
	log := parts.Logger
	if log == nil {
		log = zap.NewNop()
	}
	w := &Worker{}
	defer func() {
		if err != nil {
			w.close()
		}
	}()
	settings, err := Settings(cfg)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	provCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := bus.Provision(provCtx, js, settings); err != nil {
		return nil, err
	}
	m, label, err := Model(cfg)
	if err != nil {
		return nil, err
	}
	if parts.Model != nil {
		m = parts.Model(m)
	}
	if parts.ModelLabel != "" {
		label = parts.ModelLabel
	}
	mcpServers, err := MCP(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	// Closed once Run returned: runs finishing in the shutdown grace keep
	// their tools.
	w.closers = append(w.closers, func() { _ = mcpServers.Close() })
	mem, err := Memory(ctx, js, settings)
	if err != nil {
		return nil, err
	}
	remote, err := RemoteTools(ctx, cfg, nc, settings, log)
	if err != nil {
		return nil, err
	}
	w.closers = append(w.closers, remote.Stop)
	submitHooks, err := SubmitHooks(cfg)
	if err != nil {
		return nil, err
	}
	agents, err := Agents(cfg, m, WithMCP(mcpServers), WithMemory(mem), WithRemoteTools(remote),
		WithTools(parts.Tools...), WithProfiles(cfg, parts.Profiles...), withChatbotTools(cfg, parts))
	if err != nil {
		return nil, err
	}
	if warn := SandboxWarning(cfg); warn != "" {
		log.Warn(warn)
	}
	workdirs, err := Files(ctx, cfg, nc, settings)
	if err != nil {
		return nil, err
	}
	lim, err := Limiter(ctx, js, cfg, settings)
	if err != nil {
		return nil, err
	}
	jobRunner, err := Jobs(ctx, js, cfg, settings, mem, m, log, WithCompaction(agents, workdirs),
		WithRetention(cfg.Retention, QuotaFiles(workdirs, lim)))
	if err != nil {
		return nil, err
	}
	tel := parts.Telemetry
	if tel == nil {
		if tel, err = NewMetrics(cfg.Telemetry, nil); err != nil {
			return nil, err
		}
	}
	stopTelemetry, err := tel.Start(ctx, ServiceWorker, log)
	if err != nil {
		return nil, err
	}
	w.closers = append(w.closers, stopTelemetry)
	w.Worker, err = worker.New(ctx, nc, worker.Config{
		Settings:      settings,
		Limits:        lim,
		ID:            parts.ID,
		Concurrency:   cfg.Worker.Concurrency,
		RunTimeout:    time.Duration(cfg.Worker.RunTimeout),
		ShutdownGrace: time.Duration(cfg.Worker.ShutdownGrace),
		StoreFullWait: cfg.Worker.RunStoreFullWait(),
		Agents:        agents,
		Logger:        log,
		Jobs:          jobRunner,
		Files:         QuotaFiles(workdirs, lim),
		Metrics:       tel.Metrics,
		Traces:        tel.TracerProvider,
		Submit:        submitHooks,
		KeyTTLs:       KeyTTLs(cfg.Retention),
	})
	if err != nil {
		return nil, err
	}
	log.Info("natsagent worker", zap.String("nats", nc.ConnectedUrlRedacted()), zap.String("model", label), zap.String("prefix", settings.Names.Prefix))
	return w, nil
}

// Run serves runs until ctx is done, finishes or hands back the runs in
// flight (the shutdown grace), then stops what NewWorker started.
func (w *Worker) Run(ctx context.Context) error {
	defer w.close()
	return w.Worker.Run(ctx)
}

func (w *Worker) close() {
	for i := len(w.closers) - 1; i >= 0; i-- {
		w.closers[i]()
	}
	w.closers = nil
}

// WithTools adds tools defined in code to the registry profiles select
// from. A tool named like a built-in replaces it.
func WithTools(ts ...tools.Tool) AgentsOption {
	return func(b *agentsBuild) error {
		for _, t := range ts {
			if t == nil || t.Spec().Name == "" {
				return errors.New("a tool defined in code has no name")
			}
			b.registry.Register(t)
		}
		return nil
	}
}

// WithProfiles adds agent profiles defined in code. One named like the
// built-in chatbot replaces it (cfg defines none); one named like a
// configured profile is an error, as two configured ones would be.
func WithProfiles(cfg config.Config, ps ...agent.Profile) AgentsOption {
	return func(b *agentsBuild) error {
		configured := make(map[string]bool, len(cfg.Agents))
		for _, a := range cfg.Agents {
			configured[a.Name] = true
		}
		for _, p := range ps {
			if configured[p.Name] {
				return fmt.Errorf("agent %q is defined in the configuration and in code; rename one", p.Name)
			}
			replaced := false
			for i := range b.profiles {
				if b.profiles[i].Name == p.Name {
					b.profiles[i], replaced = p, true
				}
			}
			if !replaced {
				b.profiles = append(b.profiles, p)
			}
		}
		return nil
	}
}

// CheckParts assembles every agent profile, the configured ones and the
// parts', without connecting anywhere: a profile naming a tool that does
// not exist, or an impossible middleware chain, fails here.
func CheckParts(cfg config.Config, parts WorkerParts) error {
	m, _, err := Model(cfg)
	if err != nil {
		return err
	}
	if parts.Model != nil {
		m = parts.Model(m)
	}
	_, err = Agents(cfg, m, offline(cfg), WithTools(parts.Tools...), WithProfiles(cfg, parts.Profiles...), withChatbotTools(cfg, parts))
	return err
}

// withChatbotTools gives the built-in chatbot the parts' ChatbotTools.
func withChatbotTools(cfg config.Config, parts WorkerParts) AgentsOption {
	return func(b *agentsBuild) error {
		if len(parts.ChatbotTools) == 0 {
			return nil
		}
		for _, a := range cfg.Agents {
			if a.Name == protocol.DefaultAgent {
				return nil
			}
		}
		for _, p := range parts.Profiles {
			if p.Name == protocol.DefaultAgent {
				return nil
			}
		}
		for i := range b.profiles {
			if b.profiles[i].Name == protocol.DefaultAgent {
				b.profiles[i].Tools = append(slices.Clone(b.profiles[i].Tools), parts.ChatbotTools...)
			}
		}
		return nil
	}
}
