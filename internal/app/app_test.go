package app

import (
	"strings"
	"testing"

	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
)

func TestAgentsFromConfig(t *testing.T) {
	cfg := config.Default()
	cfg.Agents = []config.Agent{{
		Name:  "researcher",
		Tools: []string{"current_time"},
		Middleware: config.Middleware{
			Settings: map[string]map[string]any{"token_budget": {"enabled": true, "max_tokens": 5000}, "title": {"enabled": false}},
			User:     []config.UserMiddleware{{Use: "tool_call_limit", Settings: map[string]any{"run_limit": 3}}},
		},
	}}
	agents, err := Agents(cfg, model.NewDemo(model.DemoOptions{}))
	if err != nil {
		t.Fatal(err)
	}
	if !agents.Has("researcher") || !agents.Has("chatbot") {
		t.Fatalf("profiles %v", agents.Names())
	}
	names := strings.Join(agents.Chain("researcher").Names(), ",")
	if !strings.Contains(names, "token_budget") || strings.Contains(names, "title") || !strings.Contains(names, "tool_call_limit") {
		t.Fatalf("researcher chain %s", names)
	}
}

func TestImpossibleMiddlewareConfigurationFailsAtStart(t *testing.T) {
	cases := []struct {
		mw   config.Middleware
		want string
	}{
		{config.Middleware{Settings: map[string]map[string]any{"tool_call_repair": {"enabled": false}}}, "settings.tool_call_repair.enabled"},
		{config.Middleware{Settings: map[string]map[string]any{"loop_detection": {"warn_threshold": 5, "hard_limit": 3}}}, "hard_limit"},
		{config.Middleware{Settings: map[string]map[string]any{"loop_detection": {"warn_treshold": 5}}}, "warn_treshold"},
		{config.Middleware{Settings: map[string]map[string]any{"tool_exclusion": {"exclude": []any{"ghost"}}}}, `"ghost"`},
		{config.Middleware{User: []config.UserMiddleware{{Use: "nope"}}}, "user[0].use"},
	}
	for _, c := range cases {
		cfg := config.Default()
		cfg.Agents = []config.Agent{{Name: "a", Tools: []string{"current_time"}, Middleware: c.mw}}
		_, err := Agents(cfg, model.NewDemo(model.DemoOptions{}))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want it to mention %s", c.mw, err, c.want)
		}
	}
}

// A model listed in the configuration's models section gets its window in
// every profile's context limits (the usage snapshot and the compression
// trigger read them), unless a profile sets token_usage.context_window.
func TestConfiguredModelWindowsReachTheChains(t *testing.T) {
	cfg := config.Default()
	cfg.Models = []config.ModelInfo{{Name: "qwen2.5:7b", ContextWindow: 32768}}
	cfg.Agents = []config.Agent{
		{Name: "local", Model: "qwen2.5:7b"},
		{Name: "pinned", Model: "qwen2.5:7b", Middleware: config.Middleware{
			Settings: map[string]map[string]any{"token_usage": {"context_window": 8192}}}},
	}
	agents, err := Agents(cfg, model.NewDemo(model.DemoOptions{}))
	if err != nil {
		t.Fatal(err)
	}
	window := func(profile, modelName string) int {
		for _, m := range agents.Chain(profile).Middlewares() {
			if u, ok := m.(*middleware.TokenUsage); ok {
				return u.WindowFor(modelName)
			}
		}
		t.Fatalf("%s has no token_usage", profile)
		return 0
	}
	if w := window("local", "qwen2.5:7b"); w != 32768 {
		t.Errorf("configured model: window %d, want 32768", w)
	}
	if w := window("local", "ollama/qwen2.5:7b"); w != 32768 {
		t.Errorf("provider-prefixed name: window %d, want 32768", w)
	}
	if w := window("local", "gpt-4"); w != 8192 {
		t.Errorf("unlisted model: window %d, want the table's 8192", w)
	}
	if w := window("pinned", "qwen2.5:7b"); w != 8192 {
		t.Errorf("profile context_window: window %d, want 8192", w)
	}
}
