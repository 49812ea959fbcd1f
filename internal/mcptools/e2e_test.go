package mcptools_test

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/app"
	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
)

type host struct {
	mu     sync.Mutex
	events []protocol.ToolEventData
}

func (h *host) Checkpoint(context.Context, state.Update) error { return nil }
func (h *host) Emit(typ string, data any) {
	if typ == protocol.EventToolFinished {
		h.mu.Lock()
		h.events = append(h.events, data.(protocol.ToolEventData))
		h.mu.Unlock()
	}
}

// TestRunCallsMCPTools runs an agent configured as a deployment would be:
// an MCP server in the configuration, a profile selecting its tools with
// "<server>__*", the default chain. The model calls one tool that answers
// and one that times out; the run goes on and ends with the answer.
func TestRunCallsMCPTools(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.MCP.Servers = []config.MCPServer{{
		Name: "lab", Transport: config.MCPStdio, Command: exe, TimeoutSeconds: 1,
		Env:   map[string]config.Template{"MCPTOOLS_TEST_SERVER": "stdio", "GORACE": "atexit_sleep_ms=0"},
		Tools: []string{"echo", "slow"},
	}}
	cfg.Agents = []config.Agent{{Name: "chatbot", SystemPrompt: "You test tools.", Tools: []string{"current_time", "lab__*"}}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	servers, err := app.MCP(context.Background(), cfg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = servers.Close() }()

	var offered []string
	m := model.NewScripted(func(call int, req *model.Request) model.Reply {
		last := req.Messages[len(req.Messages)-1]
		if last.Role != model.RoleTool {
			// Other middlewares may add their own tools.
			for _, s := range req.Tools {
				if s.Name == "current_time" || strings.HasPrefix(s.Name, "lab__") {
					offered = append(offered, s.Name)
				}
			}
			return model.Reply{ToolCalls: []model.ToolCall{
				{ID: "c1", Name: "lab__echo", Arguments: `{"text":"hi"}`},
				{ID: "c2", Name: "lab__slow", Arguments: `{"millis":20000}`},
			}}
		}
		return model.Reply{Text: "done"}
	})
	agents, err := app.Agents(cfg, m, app.WithMCP(servers))
	if err != nil {
		t.Fatal(err)
	}
	prep, err := agents.Prepare(&protocol.RunRequest{RunID: "r1", ThreadID: "h1", Tenant: "default", Agent: "chatbot"})
	if err != nil {
		t.Fatal(err)
	}
	h := &host{}
	st := &state.State{}
	out := agent.Execute(context.Background(), &agent.Run{
		Runtime: &middleware.Runtime{RunID: "r1", ThreadID: "h1", Tenant: "default", Agent: "chatbot", User: "default",
			Tools: prep.Tools, Logger: zap.NewNop(), Emit: h.Emit},
		Chain: prep.Chain, Model: prep.Model, ModelName: prep.ModelName, System: prep.Profile.SystemPrompt,
		MaxSteps: prep.MaxSteps, State: st, Host: h,
		Input: []model.Message{{Role: model.RoleUser, Content: "try the lab tools"}},
	})
	if out.Status != protocol.StatusSuccess || out.Output == nil || out.Output.Content != "done" {
		t.Fatalf("outcome %+v", out)
	}
	if got := strings.Join(offered, ","); got != "current_time,lab__echo,lab__slow" {
		t.Errorf("the model was offered %s", got)
	}
	results := map[string]model.Message{}
	for _, msg := range st.Messages {
		if msg.Role == model.RoleTool {
			results[msg.ToolCallID] = msg
		}
	}
	if r := results["c1"]; r.Content != "echo: hi" || r.Status != model.ToolStatusSuccess {
		t.Errorf("echo result %+v", r)
	}
	if r := results["c2"]; r.Status != model.ToolStatusError || !strings.Contains(r.Content, "did not finish within 1s") {
		t.Errorf("slow result %+v", r)
	}
	if len(h.events) != 2 {
		t.Errorf("tool.finished events %+v", h.events)
	}
}

// TestProfileNamesUnknownServer: a profile selecting the tools of a server
// that is not configured fails the start with the profile's name.
func TestProfileNamesUnknownServer(t *testing.T) {
	cfg := config.Default()
	cfg.Agents = []config.Agent{{Name: "chatbot", Tools: []string{"github__*"}}}
	servers, err := app.MCP(context.Background(), cfg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	_, err = app.Agents(cfg, model.NewScripted(func(int, *model.Request) model.Reply { return model.Reply{Text: "x"} }), app.WithMCP(servers))
	if err == nil || !strings.Contains(err.Error(), `agent profile "chatbot"`) || !strings.Contains(err.Error(), `MCP server "github"`) {
		t.Fatalf("err %v", err)
	}
}
