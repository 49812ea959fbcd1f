// Package app wires a configuration into running parts: the NATS
// connection, the JetStream settings, the model, the agents, workers and
// loggers. The commands in cmd/ stay thin; tests and the bench command use
// the same wiring.
package app

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/natsconn"
	"github.com/natsagent/natsagent/internal/policy"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/tools"
)

// Settings derives the JetStream settings from the configuration.
func Settings(cfg config.Config) (bus.Settings, error) {
	names, err := bus.NewNames(cfg.NATS.Prefix)
	if err != nil {
		return bus.Settings{}, fmt.Errorf("nats.prefix: %w", err)
	}
	s := bus.Settings{
		Names:           names,
		Replicas:        cfg.NATS.Replicas,
		EventsMaxAge:    time.Duration(cfg.NATS.EventsMaxAge),
		DuplicateWindow: time.Duration(cfg.NATS.DuplicateWindow),
		AckWait:         time.Duration(cfg.NATS.AckWait),
		MaxDeliver:      cfg.NATS.MaxDeliver,
		MaxAckPending:   cfg.NATS.MaxAckPending,
		MaxRequestBytes: cfg.NATS.MaxRequestBytes,
		DLQMaxBytes:     cfg.NATS.DLQMaxBytes,
		DLQMaxAge:       time.Duration(cfg.NATS.DLQMaxAge),
	}.WithDefaults()
	return s, s.Validate()
}

// Model builds the configured model: an OpenAI-compatible endpoint, or the
// offline demo model when none is configured. The label says which, for
// the start-up log.
func Model(cfg config.Config) (model.Model, string, error) {
	if cfg.UsesDemoModel() {
		return model.NewDemo(model.DemoOptions{}), "offline demo model (set OPENAI_BASE_URL, OPENAI_API_KEY and NATSAGENT_MODEL to use a real one)", nil
	}
	m, err := model.NewOpenAI(model.OpenAIConfig{BaseURL: cfg.Model.BaseURL, APIKey: string(cfg.Model.APIKey), Model: cfg.Model.Name})
	if err != nil {
		return nil, "", err
	}
	base := cfg.Model.BaseURL
	if base == "" {
		base = "https://api.openai.com/v1"
	}
	return m, fmt.Sprintf("%s at %s", cfg.Model.Name, base), nil
}

// Agents builds the configured agent profiles around m, plus the built-in
// chatbot unless the configuration defines its own. Options add tools
// (WithMCP).
func Agents(cfg config.Config, m model.Model, opts ...AgentsOption) (*agent.Agents, error) {
	profiles, err := Profiles(cfg)
	if err != nil {
		return nil, err
	}
	b := &agentsBuild{registry: tools.NewRegistry(), profiles: profiles}
	if err := registerExecute(cfg, b.registry); err != nil {
		return nil, err
	}
	for _, o := range opts {
		if err := o(b); err != nil {
			return nil, err
		}
	}
	pol, err := policy.New(cfg.Policy)
	if err != nil {
		return nil, err
	}
	windows := cfg.ContextWindows()
	if cfg.UsesDemoModel() {
		if _, set := windows[model.DemoModelName]; !set {
			windows = maps.Clone(windows)
			if windows == nil {
				windows = make(map[string]int, 1)
			}
			windows[model.DemoModelName] = model.DemoContextWindow
		}
	}
	return agent.NewAgentsWith(agent.Resources{Model: m, Tools: b.registry, Memory: b.memory, Source: b.source,
		ContextWindows: windows, Vision: cfg.Vision(), ToolPolicy: pol.ToolFilter}, b.profiles...)
}

// DemoSubagent is the subagent profile a deployment on the demo model
// adds when it configures none, so "subagent" in a message shows a
// subagent run offline.
const DemoSubagent = "helper"

func demoSubagent() agent.Profile {
	return agent.Profile{
		Name:         DemoSubagent,
		Description:  "Demo subagent (offline demo model only): looks up the current time.",
		SystemPrompt: "You are a subagent. Do the task you are given and answer with the result.",
		Model:        model.DemoModelName,
		Tools:        []string{"current_time"},
		Kind:         middleware.KindSubagent,
	}
}

// Profiles converts the configured agents into profiles.
func Profiles(cfg config.Config) ([]agent.Profile, error) {
	var out []agent.Profile
	hasChatbot, hasSubagent := false, false
	for i, a := range cfg.Agents {
		chain, err := chainConfig(a.Middleware)
		if err != nil {
			return nil, fmt.Errorf("agents[%d].middleware: %w", i, err)
		}
		p := agent.Profile{
			Name:         a.Name,
			Description:  a.Description,
			SystemPrompt: a.SystemPrompt,
			Model:        a.Model,
			Tools:        a.Tools,
			MaxSteps:     a.MaxSteps,
			Vision:       a.Vision,
			Kind:         a.Kind,
			Subagents:    a.Subagents,
			Middleware:   chain,
		}
		if p.Model == "" {
			p.Model = modelName(cfg)
		}
		hasChatbot = hasChatbot || a.Name == protocol.DefaultAgent
		hasSubagent = hasSubagent || a.Kind == middleware.KindSubagent
		out = append(out, p)
	}
	if cfg.UsesDemoModel() && !hasSubagent {
		out = append(out, demoSubagent())
	}
	if !hasChatbot {
		p := agent.Chatbot()
		p.Model = modelName(cfg)
		p.Tools = chatbotTools(cfg, p.Tools)
		out = append(out, p)
	}
	return out, nil
}

// modelName is the model a profile without one uses: the configured
// model, or the demo model's name (which gives it DemoContextWindow).
func modelName(cfg config.Config) string {
	if cfg.UsesDemoModel() {
		return model.DemoModelName
	}
	return cfg.Model.Name
}

// chainConfig converts YAML middleware settings into the chain's JSON form.
func chainConfig(m config.Middleware) (middleware.ChainConfig, error) {
	c := middleware.ChainConfig{Order: m.Order}
	if len(m.Settings) > 0 {
		c.Settings = make(map[string]json.RawMessage, len(m.Settings))
		for name, v := range m.Settings {
			raw, err := json.Marshal(v)
			if err != nil {
				return c, fmt.Errorf("settings.%s: %w", name, err)
			}
			c.Settings[name] = raw
		}
	}
	for i, u := range m.User {
		var raw json.RawMessage
		if u.Settings != nil {
			var err error
			if raw, err = json.Marshal(u.Settings); err != nil {
				return c, fmt.Errorf("user[%d].settings: %w", i, err)
			}
		}
		c.User = append(c.User, middleware.UserMiddleware{Use: u.Use, Name: u.Name, Settings: raw})
	}
	return c, nil
}

// Connect dials NATS as configured (natsconn.Connect).
func Connect(cfg config.Config, name string) (*nats.Conn, error) { return natsconn.Connect(cfg, name) }

// NATSOptions is natsconn.NATSOptions: the credentials and TLS options of
// the nats section.
func NATSOptions(n config.NATS) ([]nats.Option, error) { return natsconn.NATSOptions(n) }

// Logger builds a zap logger on stderr: JSON lines, or a console format
// for humans, coloured only when stderr is a terminal (a file or a pipe
// gets plain text a grep can read).
func Logger(console, debug bool) *zap.Logger {
	return newLogger(os.Stderr, console, console && StderrIsTerminal(), debug)
}

func newLogger(w io.Writer, console, colour, debug bool) *zap.Logger {
	level := zap.NewAtomicLevelAt(zap.InfoLevel)
	if debug {
		level.SetLevel(zap.DebugLevel)
	}
	encCfg := zap.NewProductionEncoderConfig()
	encCfg.EncodeTime = zapcore.ISO8601TimeEncoder
	var enc zapcore.Encoder
	if console {
		encCfg.EncodeLevel = zapcore.CapitalLevelEncoder
		if colour {
			encCfg.EncodeLevel = zapcore.CapitalColorLevelEncoder
		}
		enc = zapcore.NewConsoleEncoder(encCfg)
	} else {
		enc = zapcore.NewJSONEncoder(encCfg)
	}
	return zap.New(zapcore.NewCore(enc, zapcore.Lock(zapcore.AddSync(w)), level))
}

// StderrIsTerminal reports whether stderr is a terminal (a character
// device), not a file or a pipe.
func StderrIsTerminal() bool {
	st, err := os.Stderr.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
