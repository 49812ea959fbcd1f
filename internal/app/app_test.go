package app

import (
	"strings"
	"testing"

	"github.com/natsagent/natsagent/internal/config"
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
