// Package config owns natsagent's configuration: the YAML file, the
// environment overrides, defaults, and validation that names the path of
// every bad field. It builds nothing; internal/app turns a Config into
// running parts.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/natsagent/natsagent/internal/protocol"
)

// Config is the whole configuration of a gateway or worker process.
type Config struct {
	NATS  NATS  `yaml:"nats"`
	Model Model `yaml:"model"`
	// Models describe the models profiles use (their context windows).
	Models  []ModelInfo `yaml:"models"`
	Worker  Worker      `yaml:"worker"`
	Gateway Gateway     `yaml:"gateway"`
	// Agents are the agent profiles; the built-in "chatbot" is added
	// unless a profile of that name is configured.
	Agents []Agent `yaml:"agents"`
	// MCP lists the MCP servers whose tools profiles may select.
	MCP MCP `yaml:"mcp"`
	// Files configures the threads' workdirs.
	Files Files `yaml:"files"`
	// RemoteTools configures the discovery and calls of remote tools.
	RemoteTools RemoteTools `yaml:"remote_tools"`
	// Telemetry configures metrics and traces.
	Telemetry Telemetry `yaml:"telemetry"`
	// Policy gives roles their permissions (policy.go).
	Policy Policy `yaml:"policy"`
	// Limits bounds each tenant's runs (limits.go).
	Limits Limits `yaml:"limits"`
	// Retention bounds how long each tenant's data is kept (retention.go).
	Retention Retention `yaml:"retention"`
	// Webhooks configures runs' webhook deliveries (webhooks.go).
	Webhooks Webhooks `yaml:"webhooks"`
	// Crons configures what a cron tick fired late does.
	Crons Crons `yaml:"crons"`
	// Store configures the LangGraph store the gateway serves.
	Store Store `yaml:"store"`
}

// Store configures the LangGraph store (internal/store).
type Store struct {
	// Index, when set, gives the store semantic search through an
	// OpenAI-compatible /embeddings endpoint (LangGraph's store.index).
	Index *StoreIndex `yaml:"index"`
	// IndexMemoryBytes bounds the memory each gateway's search index
	// holds (default 256 MiB): tenants are held while they are searched,
	// the least recently searched leave first, and a tenant larger than
	// the budget is searched from the bucket.
	IndexMemoryBytes int64 `yaml:"index_memory_bytes"`
}

// StoreIndex configures the store's embeddings.
type StoreIndex struct {
	// BaseURL and APIKey default to model.base_url and model.api_key.
	BaseURL string `yaml:"base_url"`
	APIKey  Secret `yaml:"api_key"`
	// Model is the embeddings model, e.g. text-embedding-3-small.
	Model string `yaml:"model"`
	// Dims asks the model for vectors of this size (0: the model's own).
	Dims int `yaml:"dims"`
	// Fields are the value fields embedded when a put names none
	// (default ["$"], the whole value).
	Fields []string `yaml:"fields"`
}

// Crons configures cron ticks (internal/crons).
type Crons struct {
	// MissedTicks is skip (default: a tick fired more than LateGrace
	// after its time, which happens only when the jobs stream had no
	// leader then, starts no run) or catch_up_one (it runs: one run for
	// all the ticks an outage missed).
	MissedTicks string `yaml:"missed_ticks"`
	// LateGrace is how late a tick may fire and still run under skip
	// (default 30s).
	LateGrace Duration `yaml:"late_grace"`
	// MaxPerTenant caps each tenant's crons (default 100); the gateway
	// answers 409 to a create past it.
	MaxPerTenant int `yaml:"max_per_tenant"`
}

// Agent is an agent profile.
type Agent struct {
	Name         string `yaml:"name"`
	Description  string `yaml:"description"`
	SystemPrompt string `yaml:"system_prompt"`
	// Model is the model name sent to the provider (default: model.name).
	Model    string   `yaml:"model"`
	Tools    []string `yaml:"tools"`
	MaxSteps int      `yaml:"max_steps"`
	// Vision false: the profile's model takes no image input (image
	// parts reach it as text notes naming their files); true: images
	// are sent. Unset: the models entry of its model decides, else true.
	Vision *bool `yaml:"vision"`
	// Kind is lead (default) or subagent.
	Kind       string     `yaml:"kind"`
	Middleware Middleware `yaml:"middleware"`
	// Subagents names the subagent profiles a lead may start (absent:
	// every one; []: none).
	Subagents []string `yaml:"subagents"`
}

// Middleware configures a profile's middleware chain (docs/middleware.md).
type Middleware struct {
	// Settings per built-in middleware; "enabled: false" removes an
	// optional one, "enabled: true" adds one that is off by default.
	Settings map[string]map[string]any `yaml:"settings"`
	// Order rearranges optional middlewares within their segment.
	Order []string `yaml:"order"`
	// User lists the user segment's middlewares, in order.
	User []UserMiddleware `yaml:"user"`
}

// UserMiddleware is one entry of the user segment.
type UserMiddleware struct {
	Use      string         `yaml:"use"`
	Name     string         `yaml:"name"`
	Settings map[string]any `yaml:"settings"`
}

// NATS configures the connection and the JetStream assets.
type NATS struct {
	// URL of the server or cluster (comma-separated); ignored in --dev.
	URL string `yaml:"url"`
	// Prefix of every subject, stream and bucket name.
	Prefix   string `yaml:"prefix"`
	Replicas int    `yaml:"replicas"`
	// AckWait is how long a silent worker keeps a run before another
	// worker takes it.
	AckWait         Duration `yaml:"ack_wait"`
	MaxDeliver      int      `yaml:"max_deliver"`
	MaxAckPending   int      `yaml:"max_ack_pending"`
	EventsMaxAge    Duration `yaml:"events_max_age"`
	DuplicateWindow Duration `yaml:"duplicate_window"`
	MaxRequestBytes int      `yaml:"max_request_bytes"`
	// DLQMaxBytes and DLQMaxAge bound the dead-letter stream; when it is
	// full the oldest dead letters are dropped.
	DLQMaxBytes int64    `yaml:"dlq_max_bytes"`
	DLQMaxAge   Duration `yaml:"dlq_max_age"`
	// CredsFile is a NATS credentials file (user JWT and nkey seed).
	CredsFile string `yaml:"creds_file"`
	// User and Password, Token and NkeySeedFile are the other ways to
	// authenticate; configure at most one (security.go).
	User         string `yaml:"user"`
	Password     Secret `yaml:"password"`
	Token        Secret `yaml:"token"`
	NkeySeedFile string `yaml:"nkey_seed_file"`
	TLS          TLS    `yaml:"tls"`
}

// Model configures the default model provider. Without BaseURL, APIKey
// and Name, the offline demo model is used.
type Model struct {
	BaseURL string `yaml:"base_url"`
	APIKey  Secret `yaml:"api_key"`
	Name    string `yaml:"name"`
}

// Worker configures run execution.
type Worker struct {
	Concurrency   int      `yaml:"concurrency"`
	RunTimeout    Duration `yaml:"run_timeout"`
	ShutdownGrace Duration `yaml:"shutdown_grace"`
	// StoreFullWait is how long a run waits for JetStream to take a write
	// it refused for lack of room before it ends store_full (worker.Config).
	StoreFullWait Duration `yaml:"store_full_wait"`
	// JobConcurrency is how many background jobs (memory extraction) a
	// worker runs at once, beside its runs.
	JobConcurrency int `yaml:"job_concurrency"`
	// GOGC is the garbage collector's target percentage in a process that
	// runs workers (cmd/worker, cmd/gateway --dev), as the GOGC variable
	// sets it: 0 leaves Go's default (100), -1 turns the collector off
	// but for GOMEMLIMIT. The GOGC environment variable, when set, wins.
	GOGC int `yaml:"gogc"`
}

// RunStoreFullWait is StoreFullWait as worker.Config takes it, where 0
// means its default and a negative wait none.
func (w Worker) RunStoreFullWait() time.Duration {
	if w.StoreFullWait == 0 {
		return -1
	}
	return time.Duration(w.StoreFullWait)
}

// Gateway configures the HTTP API.
type Gateway struct {
	Listen       string `yaml:"listen"`
	MaxBodyBytes int64  `yaml:"max_body_bytes"`
	// APIKeys, when any is configured, are required on every endpoint
	// but the health checks; each maps to one tenant, user and roles.
	APIKeys []APIKey `yaml:"api_keys"`
	// JWT, when set, accepts bearer JWTs of an identity provider
	// (security.go); with API keys, both are accepted.
	JWT *JWT `yaml:"jwt"`
	// Images bounds the images of user input the gateway stores as
	// thread files (0: the gateway's defaults).
	Images GatewayImages `yaml:"images"`
}

// GatewayImages bounds the images of user input.
type GatewayImages struct {
	// MaxBytes bounds one image (default 5 MiB, at most 20 MiB).
	MaxBytes int64 `yaml:"max_bytes"`
	// MaxPerRequest bounds the images of one run request (default 8).
	MaxPerRequest int `yaml:"max_per_request"`
	// RefuseURLs refuses http(s) image URLs instead of passing them to
	// the model.
	RefuseURLs bool `yaml:"refuse_urls"`
}

// Authenticated reports whether the HTTP API requires a credential.
func (g *Gateway) Authenticated() bool { return len(g.APIKeys) > 0 || g.JWT != nil }

// Duration is a time.Duration written as "30s", "5m" in YAML.
type Duration time.Duration

// UnmarshalYAML parses a duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("%q is not a duration (use forms like 30s, 5m, 1h)", s)
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML writes the duration as a string.
func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }

// Secret is a string never printed in full.
type Secret string

// MarshalYAML masks the secret.
func (s Secret) MarshalYAML() (any, error) {
	if s == "" {
		return "", nil
	}
	return "****", nil
}

// Default returns the configuration with every default filled.
func Default() Config {
	return Config{
		NATS: NATS{
			URL:             "nats://127.0.0.1:4222",
			Prefix:          "agent",
			Replicas:        1,
			AckWait:         Duration(30 * time.Second),
			MaxDeliver:      10,
			MaxAckPending:   20000,
			EventsMaxAge:    Duration(24 * time.Hour),
			DuplicateWindow: Duration(10 * time.Minute),
			MaxRequestBytes: 256 << 10,
			DLQMaxBytes:     1 << 30,
			DLQMaxAge:       Duration(7 * 24 * time.Hour),
		},
		Worker: Worker{
			Concurrency:   8,
			RunTimeout:    Duration(time.Hour),
			ShutdownGrace: Duration(10 * time.Second),
			StoreFullWait: Duration(5 * time.Minute),
			// Background jobs (memory extraction), beside the runs.
			JobConcurrency: 2,
		},
		Gateway: Gateway{
			Listen:       "127.0.0.1:8080",
			MaxBodyBytes: 1 << 20,
		},
		Files:       defaultFiles(),
		RemoteTools: defaultRemoteTools(),
		Telemetry:   defaultTelemetry(),
		Limits:      defaultLimits(),
		Retention:   defaultRetention(),
		Store:       Store{IndexMemoryBytes: DefaultStoreIndexMemory},
	}
}

// DefaultStoreIndexMemory is store.index_memory_bytes's default (256 MiB,
// about 37,000 items with 1536-dimension vectors); minStoreIndexMemory its
// least (1 MiB).
const (
	DefaultStoreIndexMemory = 256 << 20
	minStoreIndexMemory     = 1 << 20
)

// Load reads the YAML file at path (none when path is ""), over the
// defaults, then applies the environment. Unknown keys and values of the
// wrong kind are errors; every mistake of the file and of the result is
// reported at once, each with its path.
func Load(path string) (Config, error) {
	if path == "" {
		return Parse(nil, "")
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return Default(), fmt.Errorf("read config: %w", err)
	}
	return Parse(data, path)
}

// Parse is Load of YAML held in memory; name says where it came from in
// errors.
func Parse(data []byte, name string) (Config, error) {
	cfg := Default()
	var problems []string
	if len(data) > 0 {
		var err error
		if problems, err = decode(data, &cfg); err != nil {
			return cfg, fmt.Errorf("config %s: %w", name, err)
		}
	}
	cfg.applyEnv(os.Getenv)
	problems = append(problems, cfg.problems()...)
	if len(problems) > 0 {
		return cfg, invalid(problems)
	}
	return cfg, nil
}

// decode decodes a YAML file into cfg, leaving out (and returning) what
// does not fit it; err is a file that is not YAML at all.
func decode(data []byte, cfg *Config) (problems []string, err error) {
	var doc yaml.Node
	if err := yaml.NewDecoder(bytes.NewReader(data)).Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		return nil, err
	}
	problems = checkTree(&doc, reflect.TypeFor[Config]())
	if err := doc.Decode(cfg); err != nil {
		// checkTree removed every value that does not fit; one left is
		// a bug of the check, reported rather than lost.
		problems = append(problems, err.Error())
	}
	return problems, nil
}

func invalid(problems []string) error {
	return errors.New("invalid configuration:\n  " + strings.Join(problems, "\n  "))
}

// Environment variables that override the file.
const (
	EnvBaseURL = "OPENAI_BASE_URL"
	EnvAPIKey  = "OPENAI_API_KEY"
	EnvModel   = "NATSAGENT_MODEL"
	EnvNATSURL = "NATS_URL"
)

func (c *Config) applyEnv(get func(string) string) {
	if v := get(EnvBaseURL); v != "" {
		c.Model.BaseURL = v
	}
	if v := get(EnvAPIKey); v != "" {
		c.Model.APIKey = Secret(v)
	}
	if v := get(EnvModel); v != "" {
		c.Model.Name = v
	}
	if v := get(EnvNATSURL); v != "" {
		c.NATS.URL = v
	}
	c.NATS.applyAuthEnv(get)
	c.Telemetry.applyEnv(get)
	c.Webhooks.applyEnv(get)
}

// UsesDemoModel reports whether no model provider is configured.
func (c *Config) UsesDemoModel() bool {
	return c.Model.BaseURL == "" && c.Model.APIKey == "" && c.Model.Name == ""
}

// Validate checks the configuration; errors name the field's path.
func (c *Config) Validate() error {
	if p := c.problems(); len(p) > 0 {
		return invalid(p)
	}
	return nil
}

// problems lists what is wrong with the configuration, each with its path.
func (c *Config) problems() []string {
	var errs []string
	bad := func(path, format string, args ...any) {
		errs = append(errs, path+": "+fmt.Sprintf(format, args...))
	}
	if c.NATS.Replicas != 1 && c.NATS.Replicas != 3 {
		bad("nats.replicas", "must be 1 or 3, not %d", c.NATS.Replicas)
	}
	if time.Duration(c.NATS.AckWait) < time.Second {
		bad("nats.ack_wait", "must be at least 1s")
	}
	if c.NATS.MaxDeliver < 2 {
		bad("nats.max_deliver", "must be at least 2")
	}
	// NATS's rules for the events stream: checked here so --print-config
	// and the start refuse them before any stream exists.
	maxAge, window := time.Duration(c.NATS.EventsMaxAge), time.Duration(c.NATS.DuplicateWindow)
	if maxAge < 100*time.Millisecond {
		bad("nats.events_max_age", "must be at least 100ms")
	}
	if window < 100*time.Millisecond {
		bad("nats.duplicate_window", "must be at least 100ms")
	}
	if maxAge >= 100*time.Millisecond && window > maxAge {
		bad("nats.duplicate_window", "%s is longer than nats.events_max_age %s: NATS refuses a stream that remembers message ids longer than it keeps messages; lower duplicate_window or raise events_max_age", window, maxAge)
	}
	if c.NATS.MaxAckPending < 1 {
		bad("nats.max_ack_pending", "must be positive")
	}
	if c.NATS.MaxRequestBytes < 1024 {
		bad("nats.max_request_bytes", "must be at least 1024")
	}
	if c.NATS.DLQMaxBytes < 1<<20 {
		bad("nats.dlq_max_bytes", "must be at least 1048576 (1 MiB), not %d", c.NATS.DLQMaxBytes)
	}
	if time.Duration(c.NATS.DLQMaxAge) < time.Minute {
		bad("nats.dlq_max_age", "must be at least 1m, not %s", time.Duration(c.NATS.DLQMaxAge))
	}
	if c.Worker.Concurrency < 1 {
		bad("worker.concurrency", "must be at least 1")
	}
	if c.Worker.StoreFullWait < 0 {
		bad("worker.store_full_wait", "must not be negative (0 ends a run at the first refusal)")
	}
	if c.Worker.GOGC < -1 {
		bad("worker.gogc", "must be a percentage, 0 (Go's default, 100) or -1 (off but for GOMEMLIMIT)")
	}
	if c.Worker.JobConcurrency < 1 {
		bad("worker.job_concurrency", "must be at least 1")
	}
	switch c.Crons.MissedTicks {
	case "", "skip", "catch_up_one":
	default:
		bad("crons.missed_ticks", "must be skip or catch_up_one")
	}
	if c.Crons.LateGrace < 0 {
		bad("crons.late_grace", "must not be negative")
	}
	if c.Crons.MaxPerTenant < 0 {
		bad("crons.max_per_tenant", "must not be negative (0 takes the default, 100)")
	}
	validateModels(c.Models, bad)
	c.MCP.validate(bad)
	c.Files.validate(bad)
	c.RemoteTools.validate(bad)
	c.NATS.validateAuth(bad)
	c.Gateway.validateAPIKeys(bad)
	c.Gateway.JWT.validate(bad)
	c.Policy.validate(c.Gateway.APIKeys, bad)
	c.Telemetry.validate(c.Gateway.Authenticated(), bad)
	c.Limits.validate(bad)
	c.Retention.validate(c.NATS, bad)
	c.Webhooks.validate(bad)
	seen := make(map[string]bool)
	for i, a := range c.Agents {
		path := fmt.Sprintf("agents[%d]", i)
		if a.Name == "" {
			bad(path+".name", "is required")
		} else if !protocol.ValidToken(a.Name) {
			bad(path+".name", "%q is not a valid name: letters, digits, _ and - only, at most %d", a.Name, protocol.MaxTokenLen)
		} else if seen[a.Name] {
			bad(path+".name", "%q is defined twice", a.Name)
		}
		seen[a.Name] = true
		if a.Kind != "" && a.Kind != "lead" && a.Kind != "subagent" {
			bad(path+".kind", "must be lead or subagent, not %q", a.Kind)
		}
		if a.MaxSteps < 0 {
			bad(path+".max_steps", "must not be negative")
		}
	}
	if c.Store.IndexMemoryBytes < minStoreIndexMemory {
		bad("store.index_memory_bytes", "must be at least %d (1 MiB), not %d", minStoreIndexMemory, c.Store.IndexMemoryBytes)
	}
	if ix := c.Store.Index; ix != nil {
		if strings.TrimSpace(ix.Model) == "" {
			bad("store.index.model", "the embeddings model is required, for example text-embedding-3-small or nomic-embed-text")
		}
		if ix.Dims < 0 {
			bad("store.index.dims", "must not be negative")
		}
		for _, f := range ix.Fields {
			if f == "" {
				bad("store.index.fields", "a field path is empty")
			}
		}
	}
	if !c.UsesDemoModel() && c.Model.Name == "" {
		bad("model.name", "a model endpoint is configured (%s or %s) but no model name: set %s (or model.name) to the model your endpoint serves, for example gpt-4o-mini or qwen2.5:7b", EnvBaseURL, EnvAPIKey, EnvModel)
	}
	return errs
}

// String renders the effective configuration as YAML with secrets masked.
func (c Config) String() string {
	data, err := yaml.Marshal(c)
	if err != nil {
		return err.Error()
	}
	return string(data)
}
