package app

import (
	"strings"
	"testing"

	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/model"
)

// Subagent profiles are agents with kind: subagent; a lead's subagents
// list reaches its chain, and a name that is no subagent stops the start.
func TestSubagentProfilesFromConfig(t *testing.T) {
	cfg := config.Default()
	cfg.Agents = []config.Agent{
		{Name: "lead", Subagents: []string{"researcher"}, Tools: []string{"current_time"}},
		{Name: "researcher", Kind: "subagent", Description: "Finds facts.", Tools: []string{"current_time"}},
		{Name: "coder", Kind: "subagent", Tools: []string{"current_time"}},
	}
	agents, err := Agents(cfg, model.NewDemo(model.DemoOptions{}))
	if err != nil {
		t.Fatal(err)
	}
	if ok, _ := agents.MaySpawn("lead", "researcher"); !ok {
		t.Error("lead may not start researcher")
	}
	if ok, _ := agents.MaySpawn("lead", "coder"); ok {
		t.Error("lead may start coder, which its list leaves out")
	}
	if ok, allowed := agents.MaySpawn("chatbot", "coder"); !ok || len(allowed) != 2 {
		t.Errorf("the built-in chatbot may start %v", allowed)
	}
	if names := strings.Join(agents.Chain("researcher").Names(), ","); strings.Contains(names, "subagent_limit") || strings.Contains(names, "clarification") {
		t.Errorf("subagent chain %s", names)
	}

	cfg.Agents[0].Subagents = []string{"chatbot"}
	if _, err := Agents(cfg, model.NewDemo(model.DemoOptions{})); err == nil || !strings.Contains(err.Error(), `subagents[0]: "chatbot" is not a subagent profile`) {
		t.Errorf("a lead naming a lead: %v", err)
	}
}
