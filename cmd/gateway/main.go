// Command gateway serves natsagent's HTTP + SSE API and publishes runs to
// NATS JetStream. With --dev it is a whole deployment in one process: an
// embedded NATS server with JetStream (reachable by the nats CLI and any
// client), in-process workers and the API.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent"
	"github.com/natsagent/natsagent/internal/app"
	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/gateway"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/policy"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "gateway:", err)
		os.Exit(1)
	}
}

type options struct {
	dev        bool
	listen     string
	natsListen string
	dataDir    string
	workers    int
}

func run() error {
	fs := flag.NewFlagSet("gateway", flag.ExitOnError)
	flags := app.RegisterFlags(fs)
	var o options
	fs.BoolVar(&o.dev, "dev", false, "run everything in one process: embedded NATS, in-process workers and the API")
	fs.StringVar(&o.listen, "listen", "", "HTTP listen address (default 127.0.0.1:8080)")
	fs.StringVar(&o.natsListen, "nats-listen", "127.0.0.1:4222", "--dev: address of the embedded NATS server for outside clients")
	fs.StringVar(&o.dataDir, "data", "./data", "--dev: folder for the embedded server's JetStream files")
	fs.IntVar(&o.workers, "workers", 2, "--dev: in-process workers")
	_ = fs.Parse(os.Args[1:])
	if o.dev && !isSet(fs, "log-console") {
		flags.Console = true
	}
	// Without --dev the gateway runs no agent; the workers check the
	// profiles (a skills dir, say, may exist on their hosts only).
	flags.AssemblesAgents = o.dev
	cfg, err := flags.Load()
	if err != nil {
		return err
	}
	if o.listen != "" {
		cfg.Gateway.Listen = o.listen
	}
	log := app.Logger(flags.Console, flags.Debug)
	defer func() { _ = log.Sync() }()
	if o.dev {
		// The in-process workers' garbage: the setting of a worker process.
		app.ApplyGC(cfg.Worker, log)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	settings, err := app.Settings(cfg)
	if err != nil {
		return err
	}
	keys, err := apiKeys(cfg)
	if err != nil {
		return err
	}
	bearer, err := bearerJWT(ctx, cfg, log)
	if err != nil {
		return err
	}
	pol, err := policy.New(cfg.Policy)
	if err != nil {
		return err
	}

	connect := func(name string) (*nats.Conn, error) { return app.Connect(cfg, name) }
	if o.dev {
		dir, err := filepath.Abs(filepath.Join(o.dataDir, "nats"))
		if err != nil {
			return err
		}
		srv, err := bus.StartEmbedded(bus.EmbeddedConfig{StoreDir: dir, Listen: o.natsListen})
		if err != nil {
			return err
		}
		defer srv.Shutdown()
		connect = func(name string) (*nats.Conn, error) { return srv.Connect(name) }
		log.Info("embedded NATS server with JetStream", zap.String("url", srv.ClientURL()), zap.String("store", dir))
	}

	nc, err := connect("natsagent-gateway")
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

	// Stopped after the workers (deferred before them): the --dev workers
	// count into its registry, served until they stopped.
	tel, stopTelemetry, err := app.StartTelemetry(ctx, cfg.Telemetry, app.ServiceGateway, log)
	if err != nil {
		return err
	}
	defer stopTelemetry()
	var workers sync.WaitGroup
	workerCtx, stopWorkers := context.WithCancel(context.Background())
	defer func() {
		stopWorkers()
		workers.Wait()
	}()
	workerFailed := make(chan error, max(o.workers, 1))
	if o.dev {
		// The flags and the file were applied to cfg already; each worker
		// reads the same file and takes those values. Its metrics go to the
		// gateway's registry, so the gateway's /metrics shows them.
		wc := natsagent.Config{ConfigFile: flags.ConfigPath, Prefix: cfg.NATS.Prefix, Replicas: cfg.NATS.Replicas,
			Concurrency: cfg.Worker.Concurrency, Logger: log, MetricsRegistry: tel.Registry()}
		if err := startWorkers(workerCtx, &workers, workerFailed, wc, o.workers, connect, log); err != nil {
			return err
		}
	}

	workdirs, err := app.Files(ctx, cfg, nc, settings)
	if err != nil {
		return err
	}
	lim, err := app.Limiter(ctx, js, cfg, settings)
	if err != nil {
		return err
	}
	graphs, err := gatewayGraphs(cfg)
	if err != nil {
		return err
	}
	embedder, indexFields, err := storeEmbedder(cfg)
	if err != nil {
		return err
	}
	gw, err := gateway.New(ctx, nc, gateway.Config{Settings: settings, Graphs: graphs, MaxBodyBytes: cfg.Gateway.MaxBodyBytes,
		Images: gateway.ImageLimits{MaxBytes: cfg.Gateway.Images.MaxBytes, MaxPerRequest: cfg.Gateway.Images.MaxPerRequest, RefuseURLs: cfg.Gateway.Images.RefuseURLs}, Logger: log, Limits: lim,
		Embedder: embedder, StoreIndexFields: indexFields, StoreIndexMemory: cfg.Store.IndexMemoryBytes,
		Files: app.QuotaFiles(workdirs, lim), MaxFileBytes: cfg.Files.MaxFileBytes, APIKeys: keys, JWT: bearer, Policy: pol,
		Metrics: tel.Metrics, MetricsHandler: tel.InlineMetrics(), Traces: tel.TracerProvider, WebhookAllowPrivate: cfg.Webhooks.AllowPrivate,
		MaxCronsPerTenant: cfg.Crons.MaxPerTenant})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Gateway.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w (change it with --listen)", cfg.Gateway.Listen, err)
	}
	// Open SSE streams end when shutdown begins (clients resume with
	// Last-Event-ID) instead of holding the shutdown for its whole timeout.
	baseCtx, endStreams := context.WithCancel(context.Background())
	defer endStreams()
	hs := &http.Server{
		Handler:           gw.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return baseCtx },
	}
	hs.RegisterOnShutdown(endStreams)
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	log.Info("natsagent gateway", zap.String("http", "http://"+ln.Addr().String()), zap.String("console", "http://"+ln.Addr().String()+"/console/"),
		zap.Bool("dev", o.dev), zap.Int("api_keys", len(keys)), zap.Bool("jwt", bearer != nil))
	warnIfOpen(log, ln.Addr(), cfg.Gateway.Authenticated())
	if o.dev {
		devHint(os.Stderr, log, flags.Console && app.StderrIsTerminal(), ln.Addr())
	}

	var failed error
	select {
	case <-ctx.Done():
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			return err
		}
	case failed = <-workerFailed:
		// As a worker process would exit: --dev is one deployment, and
		// one without its workers would take runs nobody executes.
		log.Error("an in-process worker stopped", zap.Error(failed))
	}
	log.Info("shutting down")
	shutCtx, cancelShut := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelShut()
	_ = hs.Shutdown(shutCtx)
	stopWorkers()
	workers.Wait()
	return failed
}

// startWorkers runs n in-process workers, each a natsagent.Worker on its
// own connection, as n worker processes would be: cmd/gateway uses the
// public API for them, as any program's main would. Each starts its own
// MCP servers, remote tools catalog and memory store, as a worker process
// does (one worker of n×concurrency slots would share them, but the
// deployment would lose what --workers shows: several consumers, leases
// and ids sharing the work). They share the gateway's metrics registry
// (wc.MetricsRegistry). A worker that stops with an error before ctx
// ends reports it on failed.
func startWorkers(ctx context.Context, wg *sync.WaitGroup, failed chan<- error, wc natsagent.Config, n int, connect func(string) (*nats.Conn, error), log *zap.Logger) error {
	for i := range n {
		nc, err := connect(fmt.Sprintf("natsagent-worker-%d", i+1))
		if err != nil {
			return err
		}
		c := wc
		c.ID = fmt.Sprintf("dev-%d-%d", os.Getpid(), i+1)
		w, err := natsagent.NewWorker(nc, c)
		if err != nil {
			nc.Close()
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() {
				if err := bus.Drain(nc, drainTimeout); err != nil {
					log.Warn("worker's NATS connection", zap.Error(err))
				}
			}()
			if err := w.Run(ctx); err != nil && ctx.Err() == nil {
				select {
				case failed <- fmt.Errorf("in-process worker %s: %w", c.ID, err):
				default:
				}
			}
		}()
	}
	return nil
}

// devHint tells a person where to start: as a few lines of text when the
// logs are for a person at a terminal, else as one log line, so a JSON
// log stays one JSON object a line and a piped log stays greppable.
func devHint(w io.Writer, log *zap.Logger, text bool, addr net.Addr) {
	console := "http://" + addr.String() + "/console/"
	curl := "curl -N http://" + addr.String() + "/threads/demo/runs/stream -H 'Content-Type: application/json' -d '{\"input\":{\"messages\":[{\"role\":\"user\",\"content\":\"What time is it?\"}]}}'"
	if !text {
		log.Info("try it", zap.String("console", console), zap.String("curl", curl))
		return
	}
	fmt.Fprintf(w, "\nOpen the console at %s or try it from a shell:\n  %s\n\n", console, curl)
}

func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// drainTimeout bounds the drain of a NATS connection at exit.
const drainTimeout = 10 * time.Second

// gatewayGraphs lists the lead agent profiles the gateway serves as
// LangGraph graphs (a subagent is started by a lead, not by a client).
// storeEmbedder is the embeddings client of the store's semantic search
// (store.index), nil when none is configured.
func storeEmbedder(cfg config.Config) (model.Embedder, []string, error) {
	ix := cfg.Store.Index
	if ix == nil {
		return nil, nil, nil
	}
	base, key := ix.BaseURL, ix.APIKey
	if base == "" {
		base = cfg.Model.BaseURL
	}
	if key == "" {
		key = cfg.Model.APIKey
	}
	e, err := model.NewOpenAIEmbeddings(model.EmbeddingsConfig{BaseURL: base, APIKey: string(key), Model: ix.Model, Dimensions: ix.Dims})
	if err != nil {
		return nil, nil, fmt.Errorf("store.index: %w", err)
	}
	return e, ix.Fields, nil
}

func gatewayGraphs(cfg config.Config) ([]gateway.Graph, error) {
	profiles, err := app.Profiles(cfg)
	if err != nil {
		return nil, err
	}
	var out []gateway.Graph
	for _, p := range profiles {
		if p.Kind == middleware.KindSubagent {
			continue
		}
		out = append(out, gateway.Graph{Name: p.Name, Description: p.Description})
	}
	return out, nil
}
