package agent_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/tools"
)

// source is an in-process ToolSource whose tools change between runs.
type source struct {
	mu    sync.Mutex
	tools map[string][]tools.Tool
}

func (s *source) Select(entry string) (string, bool) {
	rest, ok := strings.CutPrefix(entry, "dyn:")
	return "dyn__" + rest, ok
}
func (s *source) Claims(name string) bool { return strings.HasPrefix(name, "dyn__") }
func (s *source) Tools(tenant string) []tools.Tool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tools[tenant]
}
func (s *source) set(tenant string, names ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ts []tools.Tool
	for _, n := range names {
		ts = append(ts, tools.Func(model.ToolSpec{Name: n, Parameters: json.RawMessage(`{"type":"object"}`)},
			func(context.Context, json.RawMessage) (string, error) { return "ok", nil }))
	}
	s.tools[tenant] = ts
}

func prepare(t *testing.T, a *agent.Agents, tenant, name string) string {
	t.Helper()
	p, err := a.Prepare(&protocol.RunRequest{RunID: "r", ThreadID: "h", Tenant: tenant, Agent: name})
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(p.Tools.Names(), ",")
}

// Tools of a source are resolved per run, for the run's tenant, filtered
// by the profile's entries (exact names and prefixes ending in "*"), after
// the registry's tools.
func TestToolSourceResolvedPerRun(t *testing.T) {
	src := &source{tools: map[string][]tools.Tool{}}
	m := model.NewScripted(func(int, *model.Request) model.Reply { return model.Reply{Text: "x"} })
	a, err := agent.NewAgentsWith(agent.Resources{Model: m, Tools: tools.NewRegistry(), Source: src},
		agent.Profile{Name: "all", Tools: []string{"dyn:*", "current_time"}},
		agent.Profile{Name: "some", Tools: []string{"dyn:crm_*", "dyn:mail"}},
		agent.Profile{Name: "none", Tools: []string{"current_time"}},
	)
	if err != nil {
		t.Fatal(err)
	}
	if got := prepare(t, a, "acme", "all"); got != "current_time" {
		t.Fatalf("before any tool: %s", got)
	}
	src.set("acme", "dyn__crm_find", "dyn__crm_update", "dyn__mail", "dyn__mailer")
	src.set("beta", "dyn__beta")
	for _, c := range []struct{ tenant, profile, want string }{
		{"acme", "all", "current_time,dyn__crm_find,dyn__crm_update,dyn__mail,dyn__mailer"},
		{"acme", "some", "dyn__crm_find,dyn__crm_update,dyn__mail"},
		{"acme", "none", "current_time"},
		{"beta", "all", "current_time,dyn__beta"},
		{"gamma", "all", "current_time"},
	} {
		if got := prepare(t, a, c.tenant, c.profile); got != c.want {
			t.Errorf("%s/%s: %s, want %s", c.tenant, c.profile, got, c.want)
		}
	}
}

// A registry tool in a source's namespace fails the start: the two could
// not be told apart.
func TestToolSourceNamespaceClash(t *testing.T) {
	reg := tools.NewRegistry()
	reg.Register(tools.Func(model.ToolSpec{Name: "dyn__x"}, func(context.Context, json.RawMessage) (string, error) { return "", nil }))
	m := model.NewScripted(func(int, *model.Request) model.Reply { return model.Reply{Text: "x"} })
	_, err := agent.NewAgentsWith(agent.Resources{Model: m, Tools: reg, Source: &source{}}, agent.Profile{Name: "all"})
	if err == nil || !strings.Contains(err.Error(), `"dyn__x"`) {
		t.Fatalf("err %v", err)
	}
}
