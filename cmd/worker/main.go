// Command worker executes natsagent runs from a NATS JetStream server or
// cluster. Run any number of them; they share the work.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/app"
	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/worker"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}

func run() error {
	fs := flag.NewFlagSet("worker", flag.ExitOnError)
	flags := app.RegisterFlags(fs)
	flags.AssemblesAgents = true
	id := fs.String("id", "", "worker id in leases and logs (default: random)")
	listen := fs.String("listen", "", "HTTP address of the health endpoints /healthz and /readyz and of /metrics, e.g. :8081 (default: none)")
	_ = fs.Parse(os.Args[1:])
	cfg, err := flags.Load()
	if err != nil {
		return err
	}
	log := app.Logger(flags.Console, flags.Debug)
	defer func() { _ = log.Sync() }()
	app.ApplyGC(cfg.Worker, log)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	settings, err := app.Settings(cfg)
	if err != nil {
		return err
	}
	nc, err := app.Connect(cfg, "natsagent-worker")
	if err != nil {
		return err
	}
	defer func() {
		if err := bus.Drain(nc, drainTimeout); err != nil {
			log.Warn("NATS connection", zap.Error(err))
		}
	}()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	provCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := bus.Provision(provCtx, js, settings); err != nil {
		return err
	}
	m, label, err := app.Model(cfg)
	if err != nil {
		return err
	}
	mcpServers, err := app.MCP(ctx, cfg, log)
	if err != nil {
		return err
	}
	// Closed once w.Run returned: runs finishing in the shutdown grace
	// keep their tools.
	defer func() { _ = mcpServers.Close() }()
	mem, err := app.Memory(ctx, js, settings)
	if err != nil {
		return err
	}
	remote, err := app.RemoteTools(ctx, cfg, nc, settings, log)
	if err != nil {
		return err
	}
	defer remote.Stop()
	submitHooks, err := app.SubmitHooks(cfg)
	if err != nil {
		return err
	}
	agents, err := app.Agents(cfg, m, app.WithMCP(mcpServers), app.WithMemory(mem), app.WithRemoteTools(remote))
	if err != nil {
		return err
	}
	if w := app.SandboxWarning(cfg); w != "" {
		log.Warn(w)
	}
	workdirs, err := app.Files(ctx, cfg, nc, settings)
	if err != nil {
		return err
	}
	lim, err := app.Limiter(ctx, js, cfg, settings)
	if err != nil {
		return err
	}
	jobRunner, err := app.Jobs(ctx, js, cfg, settings, mem, m, log, app.WithCompaction(agents, workdirs),
		app.WithRetention(cfg.Retention, app.QuotaFiles(workdirs, lim)))
	if err != nil {
		return err
	}
	tel, stopTelemetry, err := app.StartTelemetry(ctx, cfg.Telemetry, app.ServiceWorker, log)
	if err != nil {
		return err
	}
	defer stopTelemetry()
	if *listen == "" && tel.InlineMetrics() != nil {
		log.Info("metrics are not served: set --listen (health and /metrics) or telemetry.metrics.listen")
	}
	w, err := worker.New(ctx, nc, worker.Config{
		Settings:      settings,
		Limits:        lim,
		ID:            *id,
		Concurrency:   cfg.Worker.Concurrency,
		RunTimeout:    time.Duration(cfg.Worker.RunTimeout),
		ShutdownGrace: time.Duration(cfg.Worker.ShutdownGrace),
		StoreFullWait: cfg.Worker.RunStoreFullWait(),
		Agents:        agents,
		Logger:        log,
		Jobs:          jobRunner,
		Files:         app.QuotaFiles(workdirs, lim),
		Metrics:       tel.Metrics,
		Traces:        tel.TracerProvider,
		Submit:        submitHooks,
		KeyTTLs:       app.KeyTTLs(cfg.Retention),
	})
	if err != nil {
		return err
	}
	if *listen != "" {
		stopHealth, err := serveHealth(ctx, *listen, nc, log, tel.InlineMetrics())
		if err != nil {
			return err
		}
		defer stopHealth()
	}
	log.Info("natsagent worker", zap.String("nats", nc.ConnectedUrlRedacted()), zap.String("model", label), zap.String("prefix", settings.Names.Prefix))
	return w.Run(ctx)
}

// drainTimeout bounds the drain of the NATS connection at exit, after the
// runs were finished or handed back.
const drainTimeout = 10 * time.Second
