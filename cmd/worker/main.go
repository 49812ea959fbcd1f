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
	id := fs.String("id", "", "worker id in leases and logs (default: random)")
	_ = fs.Parse(os.Args[1:])
	cfg, err := flags.Load()
	if err != nil {
		return err
	}
	log := app.Logger(flags.Console, flags.Debug)
	defer func() { _ = log.Sync() }()

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
	defer func() { _ = nc.Drain() }()
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
	agents, err := app.Agents(cfg, m)
	if err != nil {
		return err
	}
	w, err := worker.New(ctx, nc, worker.Config{
		Settings:      settings,
		ID:            *id,
		Concurrency:   cfg.Worker.Concurrency,
		RunTimeout:    time.Duration(cfg.Worker.RunTimeout),
		ShutdownGrace: time.Duration(cfg.Worker.ShutdownGrace),
		Agents:        agents,
		Logger:        log,
	})
	if err != nil {
		return err
	}
	log.Info("natsagent worker", zap.String("nats", nc.ConnectedUrl()), zap.String("model", label), zap.String("prefix", settings.Names.Prefix))
	return w.Run(ctx)
}
