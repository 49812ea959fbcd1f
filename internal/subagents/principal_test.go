package subagents_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/policy"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/worker"
)

// TestSubagentInheritsThePrincipal: a child run acts for its lead's
// principal, so the lead's tool policy holds in the child (without the
// principal, the child would have the default roles, which allow more).
func TestSubagentInheritsThePrincipal(t *testing.T) {
	e := newEnv(t)
	pol, err := policy.New(config.Policy{
		DefaultRoles: []string{"open"},
		Roles: map[string]config.Role{
			"open":   {Agents: []string{"*"}, Tools: config.ToolRule{Allow: []string{"*"}}},
			"member": {Agents: []string{"*"}, Tools: config.ToolRule{Allow: []string{"*"}, Deny: []string{"current_time"}}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var offered []string
	s := newScript(map[string]func(context.Context, *model.Request) model.Reply{
		"lead": leadDelegates(taskCall("t", "researcher", "look it up")),
		"researcher": func(_ context.Context, req *model.Request) model.Reply {
			mu.Lock()
			for _, spec := range req.Tools {
				offered = append(offered, spec.Name)
			}
			mu.Unlock()
			return model.Reply{Text: "found it"}
		},
	})
	e.startWorker("wa", s.model(), 4, func(c *worker.Config) {
		agents, err := agent.NewAgentsWith(agent.Resources{Model: s.model(), Tools: e.reg, ToolPolicy: pol.ToolFilter}, e.profiles...)
		if err != nil {
			t.Fatal(err)
		}
		c.Agents = agents
	})
	lead := e.watch("t1", "lead1")
	e.submitReq(&protocol.RunRequest{RunID: "lead1", ThreadID: "t1", Agent: protocol.DefaultAgent,
		Input:     &protocol.Input{Messages: []model.Message{{Role: model.RoleUser, Content: "delegate"}}},
		Principal: &protocol.Principal{User: "alice", Roles: []string{"member"}}})
	if fin := lead.finished(t, 20*time.Second); fin.Status != protocol.StatusSuccess {
		t.Fatalf("lead ended %s: %s", fin.Status, fin.Error)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(offered) == 0 {
		t.Fatal("the researcher never called its model")
	}
	if slices.Contains(offered, "current_time") {
		t.Fatalf("the child of a member was offered current_time: %v", offered)
	}
}
