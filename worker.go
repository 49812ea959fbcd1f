package natsagent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/app"
	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
)

// Config configures a [Worker]. The zero value serves the built-in chatbot
// with the model of the environment (OPENAI_BASE_URL, OPENAI_API_KEY,
// NATSAGENT_MODEL; the offline demo model without them).
type Config struct {
	// ConfigFile is a YAML configuration (docs/configuration.md): agents,
	// middleware, tools, limits, files. Its nats.url is ignored (the
	// worker uses the connection it is given); nats.prefix and
	// nats.replicas are used unless Prefix and Replicas replace them.
	ConfigFile string
	// ConfigYAML is the same configuration held in memory; at most one of
	// ConfigFile and ConfigYAML is set.
	ConfigYAML []byte
	// Agents are defined in Go, beside the configuration's. One named
	// "chatbot" replaces the built-in lead agent; one named like an agent
	// of the configuration is an error.
	Agents []Agent
	// Tools are added for every agent, of the configuration or Go, to
	// name, and the built-in chatbot (when neither the configuration nor
	// Agents define "chatbot") may call them.
	Tools []Tool
	// Model serves every model call no registered name routes elsewhere
	// (nil: the configured provider).
	Model Model
	// Models route model names to providers, as RegisterModel does for
	// the whole process.
	Models map[string]Model
	// ID names the worker in leases and logs ("": random).
	ID string
	// Prefix replaces the configuration's nats.prefix, the first token
	// of every subject and the prefix of every stream and bucket name
	// ("": the configuration's, "agent" by default). Clients and workers
	// of one deployment use the same.
	Prefix string
	// Replicas replaces the configuration's nats.replicas: the
	// JetStream replicas of the streams and buckets the worker
	// provisions, 1 or 3 (0: the configuration's, 1 by default).
	Replicas int
	// Concurrency is how many runs execute at once (0: the
	// configuration's, 8 by default).
	Concurrency int
	// ShutdownGrace is how long runs in flight get to reach a safe
	// boundary when Run's context ends (0: the configuration's, 10 s by
	// default); runs that do not are handed to another worker.
	ShutdownGrace time.Duration
	// Logger receives the worker's logs (nil: none).
	Logger *zap.Logger
	// MetricsRegistry receives the worker's Prometheus metrics when the
	// configuration has them on (telemetry.metrics, on by default); the
	// program serves the registry, and MetricsHandler is nil. Several
	// workers, and other natsagent parts of one process, may share one
	// registry: they count into the same series. nil: the worker has a
	// registry of its own, with the Go runtime and process collectors,
	// which MetricsHandler serves.
	MetricsRegistry *prometheus.Registry
}

// Worker executes runs: it consumes run requests, runs the agent loop in
// the middleware chain, and writes checkpoints, records and events. Run as
// many as you like, in as many processes: they share the work.
type Worker struct {
	nc    *nats.Conn
	cfg   config.Config
	parts app.WorkerParts
}

// MetricsHandler serves the worker's Prometheus metrics in the text
// format, for the program's own HTTP server (at /metrics, say); it works
// before Run. It is nil when the configuration turns metrics off, serves
// them on an address of their own (telemetry.metrics.listen, which Run
// serves), or Config.MetricsRegistry holds them.
func (w *Worker) MetricsHandler() http.Handler {
	return w.parts.Telemetry.InlineMetrics()
}

// NewWorker checks the configuration and every agent (tools exist, chains
// assemble) and returns a worker ready to Run on nc. nc stays yours: close
// or drain it after Run returned.
func NewWorker(nc *nats.Conn, cfg Config) (*Worker, error) {
	if nc == nil {
		return nil, errors.New("natsagent.NewWorker: nil NATS connection")
	}
	if cfg.ConfigFile != "" && len(cfg.ConfigYAML) > 0 {
		return nil, errors.New("natsagent.NewWorker: set ConfigFile or ConfigYAML, not both")
	}
	var (
		c   config.Config
		err error
	)
	if len(cfg.ConfigYAML) > 0 {
		c, err = config.Parse(cfg.ConfigYAML, "Config.ConfigYAML")
	} else {
		c, err = config.Load(cfg.ConfigFile)
	}
	if err != nil {
		return nil, err
	}
	if cfg.Prefix != "" {
		c.NATS.Prefix = cfg.Prefix
	}
	if cfg.Replicas != 0 {
		c.NATS.Replicas = cfg.Replicas
	}
	if cfg.Concurrency > 0 {
		c.Worker.Concurrency = cfg.Concurrency
	}
	if cfg.ShutdownGrace > 0 {
		c.Worker.ShutdownGrace = config.Duration(cfg.ShutdownGrace)
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("natsagent.NewWorker: %w", err)
	}
	if _, err := app.Settings(c); err != nil {
		return nil, fmt.Errorf("natsagent.NewWorker: %w", err)
	}
	parts := app.WorkerParts{ID: cfg.ID, Logger: cfg.Logger}
	models := maps.Clone(cfg.Models)
	if models == nil {
		models = map[string]Model{}
	}
	seen := map[string]bool{}
	for _, t := range append(registeredTools(), cfg.Tools...) {
		if t == nil {
			return nil, errors.New("natsagent.NewWorker: a nil tool")
		}
		parts.Tools = append(parts.Tools, t)
	}
	for _, t := range cfg.Tools {
		parts.ChatbotTools = append(parts.ChatbotTools, t.Spec().Name)
	}
	for _, a := range cfg.Agents {
		ps, ts, ms, err := a.profiles(middleware.KindLead)
		if err != nil {
			return nil, fmt.Errorf("natsagent.NewWorker: %w", err)
		}
		for _, p := range ps {
			if seen[p.Name] {
				return nil, fmt.Errorf("natsagent.NewWorker: agent %q is defined twice", p.Name)
			}
			seen[p.Name] = true
		}
		parts.Profiles = append(parts.Profiles, ps...)
		parts.Tools = append(parts.Tools, ts...)
		maps.Copy(models, ms)
	}
	fallback := cfg.Model
	if fallback != nil {
		parts.ModelLabel = "the program's model (Config.Model)"
	}
	parts.Model = func(configured model.Model) model.Model {
		if fallback != nil {
			configured = fallback
		}
		return newModelRouter(configured, models)
	}
	parts.Tools = dedupeTools(parts.Tools)
	if err := app.CheckParts(c, parts); err != nil {
		return nil, err
	}
	if parts.Telemetry, err = app.NewMetrics(c.Telemetry, cfg.MetricsRegistry); err != nil {
		return nil, fmt.Errorf("natsagent.NewWorker: %w", err)
	}
	return &Worker{nc: nc, cfg: c, parts: parts}, nil
}

// dedupeTools keeps one of each tool value; two different tools of one
// name are left for the registry (the later wins, as Config.Tools says).
func dedupeTools(ts []Tool) []Tool {
	seen := map[Tool]bool{}
	out := ts[:0:0]
	for _, t := range ts {
		if !seen[t] {
			seen[t] = true
			out = append(out, t)
		}
	}
	return out
}

// Run provisions the deployment's streams and buckets if they are missing,
// serves runs until ctx is done, then shuts down gracefully: runs in
// flight get the shutdown grace to finish, and the rest are handed to
// another worker at their last checkpoint. It returns nil after a clean
// shutdown.
func (w *Worker) Run(ctx context.Context) error {
	aw, err := app.NewWorker(ctx, w.nc, w.cfg, w.parts)
	if err != nil {
		return err
	}
	return aw.Run(ctx)
}
