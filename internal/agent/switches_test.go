package agent_test

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/tools"
)

// A switch only keeps or removes what the profile has: asking for plan
// mode on an agent without todos fails the run's preparation, and
// switching a capability off takes its tools out of the run's chain.
func TestSwitchesWithinTheProfile(t *testing.T) {
	plain := agent.Chatbot()
	plain.Name = "plain"
	plain.Middleware.Settings = map[string]json.RawMessage{"todos": json.RawMessage(`{"enabled": false}`)}
	agents, err := agent.NewAgents(model.NewScripted(func(int, *model.Request) model.Reply { return model.Reply{Text: "ok"} }), tools.NewRegistry(), agent.Chatbot(), plain)
	if err != nil {
		t.Fatal(err)
	}
	yes, no := true, false
	req := func(name string, c protocol.RunConfig) *protocol.RunRequest {
		return &protocol.RunRequest{RunID: "r1", ThreadID: "h1", Tenant: "default", Agent: name, Config: c}
	}
	if _, err := agents.Prepare(req("plain", protocol.RunConfig{PlanMode: &yes})); !errors.Is(err, agent.ErrSwitchUnavailable) {
		t.Fatalf("plan_mode true on an agent without todos: %v", err)
	}
	if _, err := agents.Prepare(req("plain", protocol.RunConfig{PlanMode: &no})); err != nil {
		t.Fatalf("plan_mode false on an agent without todos: %v", err)
	}
	p, err := agents.Prepare(req("chatbot", protocol.RunConfig{PlanMode: &yes, Clarification: &no}))
	if err != nil {
		t.Fatal(err)
	}
	names := p.Chain.Names()
	if !slices.Contains(names, middleware.ToolPolicyGate) || !slices.Contains(names, middleware.ToolPolicyTrim) {
		t.Fatalf("a run with a switch off is not held by the tool gate: %v", names)
	}
	if p, err = agents.Prepare(req("chatbot", protocol.RunConfig{PlanMode: &yes})); err != nil || slices.Contains(p.Chain.Names(), middleware.ToolPolicyGate) {
		t.Fatalf("a run with no switch off got a tool gate: %v %v", p.Chain.Names(), err)
	}
}
