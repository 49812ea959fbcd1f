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

	"github.com/natsagent/natsagent/internal/app"
	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/gateway"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/policy"
	"github.com/natsagent/natsagent/internal/worker"
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

	var agentOpts []app.AgentsOption
	if o.dev {
		mcpServers, err := app.MCP(ctx, cfg, log)
		if err != nil {
			return err
		}
		// Deferred before the workers' stop, so it runs after it.
		defer func() { _ = mcpServers.Close() }()
		agentOpts = append(agentOpts, app.WithMCP(mcpServers))
		mem, err := app.Memory(ctx, js, settings)
		if err != nil {
			return err
		}
		agentOpts = append(agentOpts, app.WithMemory(mem))
		// One catalog for the in-process workers, on the gateway's
		// connection; stopped after the workers.
		remote, err := app.RemoteTools(ctx, cfg, nc, settings, log)
		if err != nil {
			return err
		}
		defer remote.Stop()
		agentOpts = append(agentOpts, app.WithRemoteTools(remote))
	}
	// Stopped after the workers (deferred before them): their last spans
	// are exported.
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
	if o.dev {
		if err := startWorkers(ctx, workerCtx, &workers, cfg, settings, o.workers, connect, log, tel, agentOpts...); err != nil {
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
		Embedder: embedder, StoreIndexFields: indexFields,
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

	select {
	case <-ctx.Done():
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			return err
		}
	}
	log.Info("shutting down")
	shutCtx, cancelShut := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelShut()
	_ = hs.Shutdown(shutCtx)
	stopWorkers()
	workers.Wait()
	return nil
}

// startWorkers runs n in-process workers, each on its own connection.
func startWorkers(ctx, workerCtx context.Context, wg *sync.WaitGroup, cfg config.Config, settings bus.Settings, n int, connect func(string) (*nats.Conn, error), log *zap.Logger, tel *app.Telemetry, agentOpts ...app.AgentsOption) error {
	m, label, err := app.Model(cfg)
	if err != nil {
		return err
	}
	agents, err := app.Agents(cfg, m, agentOpts...)
	if err != nil {
		return err
	}
	submitHooks, err := app.SubmitHooks(cfg)
	if err != nil {
		return err
	}
	log.Info("model", zap.String("model", label))
	if w := app.SandboxWarning(cfg); w != "" {
		log.Warn(w)
	}
	for i := range n {
		nc, err := connect(fmt.Sprintf("natsagent-worker-%d", i+1))
		if err != nil {
			return err
		}
		wjs, err := jetstream.New(nc)
		if err != nil {
			nc.Close()
			return err
		}
		mem, err := app.Memory(ctx, wjs, settings)
		if err != nil {
			nc.Close()
			return err
		}
		workdirs, err := app.Files(ctx, cfg, nc, settings)
		if err != nil {
			nc.Close()
			return err
		}
		lim, err := app.Limiter(ctx, wjs, cfg, settings)
		if err != nil {
			nc.Close()
			return err
		}
		jobRunner, err := app.Jobs(ctx, wjs, cfg, settings, mem, m, log, app.WithCompaction(agents, workdirs),
			app.WithRetention(cfg.Retention, app.QuotaFiles(workdirs, lim)))
		if err != nil {
			nc.Close()
			return err
		}
		w, err := worker.New(ctx, nc, worker.Config{
			Settings:      settings,
			Limits:        lim,
			ID:            fmt.Sprintf("dev-%d-%d", os.Getpid(), i+1),
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
			if err := w.Run(workerCtx); err != nil {
				log.Error("worker stopped", zap.Error(err))
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
