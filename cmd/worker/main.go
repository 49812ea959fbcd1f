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

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/app"
	"github.com/natsagent/natsagent/internal/bus"
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

	nc, err := app.Connect(cfg, "natsagent-worker")
	if err != nil {
		return err
	}
	defer func() {
		if err := bus.Drain(nc, drainTimeout); err != nil {
			log.Warn("NATS connection", zap.Error(err))
		}
	}()
	w, err := app.NewWorker(ctx, nc, cfg, app.WorkerParts{ID: *id, Logger: log})
	if err != nil {
		return err
	}
	tel := w.Telemetry
	if *listen == "" && tel.InlineMetrics() != nil {
		log.Info("metrics are not served: set --listen (health and /metrics) or telemetry.metrics.listen")
	}
	if *listen != "" {
		stopHealth, err := serveHealth(ctx, *listen, nc, log, tel.InlineMetrics())
		if err != nil {
			return err
		}
		defer stopHealth()
	}
	log.Info("natsagent worker", zap.String("nats", nc.ConnectedUrlRedacted()), zap.String("model", w.ModelLabel), zap.String("prefix", cfg.NATS.Prefix))
	return w.Run(ctx)
}

// drainTimeout bounds the drain of the NATS connection at exit, after the
// runs were finished or handed back.
const drainTimeout = 10 * time.Second
