// Command worker executes natsagent runs from a NATS JetStream server or
// cluster. Run any number of them; they share the work.
//
// It is a user of the public API (natsagent.NewWorker), as any program's
// worker binary would be. What it keeps from internal/app is the
// command-line plumbing the API has no business exposing: the shared
// flags and --print-config (app.Flags), the NATS connection from the
// configuration's credentials and TLS (app.Connect), the logger
// (app.Logger) and the garbage collector's target (app.ApplyGC).
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent"
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
	listen := fs.String("listen", defaultListen, "HTTP address of the health endpoints /healthz and /readyz and of /metrics; empty: none")
	_ = fs.Parse(os.Args[1:])
	flags.Addresses = map[string]string{"listen": *listen}
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
	// The flags and the file were applied to cfg already (--prefix,
	// --replicas, --concurrency); the worker reads the same file and
	// takes those values.
	w, err := natsagent.NewWorker(nc, natsagent.Config{
		ConfigFile:  flags.ConfigPath,
		Prefix:      cfg.NATS.Prefix,
		Replicas:    cfg.NATS.Replicas,
		Concurrency: cfg.Worker.Concurrency,
		ID:          *id,
		Logger:      log,
	})
	if err != nil {
		return err
	}
	metrics := w.MetricsHandler()
	if *listen == "" && metrics != nil {
		log.Info("metrics are not served: set --listen (health and /metrics) or telemetry.metrics.listen")
	}
	stopHealth, err := startHealth(ctx, *listen, isSet(fs, "listen"), nc, log, metrics)
	if err != nil {
		return err
	}
	defer stopHealth()
	return w.Run(ctx)
}

// defaultListen is where a worker serves /healthz, /readyz and /metrics
// unless --listen says otherwise: loopback, like the gateway's API, on
// the port the deployment files give the workers (docs/operations.md).
const defaultListen = "127.0.0.1:8081"

// startHealth serves the health server (and /metrics) on addr, unless
// addr is empty. When the address was not asked for (the default) and is
// taken, as by a second worker on one host, the worker runs without it
// and says so; an address asked for must be served.
func startHealth(ctx context.Context, addr string, asked bool, nc *nats.Conn, log *zap.Logger, metrics http.Handler) (stop func(), err error) {
	if addr == "" {
		return func() {}, nil
	}
	stop, err = serveHealth(ctx, addr, nc, log, metrics)
	if err != nil && !asked {
		log.Warn("the default address of the health endpoints and /metrics is taken: serving neither; set --listen", zap.String("listen", addr), zap.Error(err))
		return func() {}, nil
	}
	return stop, err
}

func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) {
		if f.Name == name {
			set = true
		}
	})
	return set
}

// drainTimeout bounds the drain of the NATS connection at exit, after the
// runs were finished or handed back.
const drainTimeout = 10 * time.Second
