package middleware_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
	"github.com/natsagent/natsagent/internal/tools"
)

// A subagent never asks a person: in default mode it is not offered the
// gated tools, and a call to one by name is refused without running it
// (hiding is not the enforcement). It is not offered ask_clarification
// either.
func TestSubagentChainRefusesHiddenGatedTool(t *testing.T) {
	ran := 0
	set, err := tools.NewSet(
		tools.Func(model.ToolSpec{Name: "write_file"}, func(context.Context, json.RawMessage) (string, error) { ran++; return "written", nil }),
		tools.Func(model.ToolSpec{Name: "read_file"}, func(context.Context, json.RawMessage) (string, error) { return "content", nil }),
	)
	if err != nil {
		t.Fatal(err)
	}
	chain, err := middleware.Assemble(middleware.ChainConfig{}, middleware.Env{Kind: middleware.KindSubagent, KnownTool: func(string) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	var offered [][]string
	m := model.NewScripted(func(n int, req *model.Request) model.Reply {
		var names []string
		for _, spec := range req.Tools {
			names = append(names, spec.Name)
		}
		offered = append(offered, names)
		if n == 0 {
			return model.Reply{ToolCalls: []model.ToolCall{{ID: "c1", Name: "write_file", Arguments: `{"path":"/x","content":"y"}`}}}
		}
		return model.Reply{Text: "gave up"}
	})
	st := &state.State{}
	out := agent.Execute(context.Background(), &agent.Run{
		Runtime: &middleware.Runtime{RunID: "sub", ThreadID: "t", Tenant: "d", Tools: set, Logger: zap.NewNop(), Emit: func(string, any) {}},
		Chain:   chain, Model: m, System: "sys", State: st, Host: &memHost{base: &state.State{}},
		Input: []model.Message{{Role: model.RoleUser, Content: "change the file"}},
	})
	if out.Status != protocol.StatusSuccess {
		t.Fatalf("run ended %+v", out)
	}
	if ran != 0 {
		t.Fatal("the gated tool ran in a subagent")
	}
	for _, names := range offered {
		for _, n := range names {
			if n == "write_file" || n == middleware.ClarificationTool {
				t.Fatalf("a subagent was offered %s: %v", n, names)
			}
		}
	}
	var result string
	for _, msg := range st.Messages {
		if msg.Role == model.RoleTool && msg.ToolCallID == "c1" {
			result = msg.Content
		}
	}
	if !strings.Contains(result, "needs a person's approval and cannot run in a subagent") {
		t.Fatalf("refusal %q", result)
	}
}
