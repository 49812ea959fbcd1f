package soak

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/tools"
)

// ToolName is the one tool a soak run calls.
const ToolName = "echo"

// Agents is the lead agent ("chatbot") a soak runs: the built-in profile
// limited to the echo tool, on model m.
func Agents(m model.Model) (*agent.Agents, error) {
	reg := tools.NewRegistry()
	reg.Register(tools.Func(model.ToolSpec{Name: ToolName, Description: "Answers with its arguments.", Parameters: json.RawMessage(`{"type":"object"}`)},
		func(ctx context.Context, args json.RawMessage) (string, error) { return "echo " + string(args), nil }))
	p := agent.Chatbot()
	p.Tools = []string{ToolName}
	return agent.NewAgents(m, reg, p)
}

// StepReply is the policy of an offline soak model: steps tool calls, one
// per model call, then an answer. It decides from the transcript alone, so
// a run taken over by another worker (or process) after its last
// checkpoint goes on where it was.
func StepReply(steps int, req *model.Request) model.Reply {
	done := 0
	for i := len(req.Messages) - 1; i >= 0; i-- {
		m := req.Messages[i]
		if m.Role == model.RoleUser {
			break
		}
		if m.Role == model.RoleTool {
			done++
		}
	}
	if done < steps {
		return model.Reply{Text: fmt.Sprintf("step %d", done+1), ToolCalls: []model.ToolCall{{ID: fmt.Sprintf("call-%d", done+1), Name: ToolName, Arguments: fmt.Sprintf(`{"step":%d}`, done+1)}}}
	}
	return model.Reply{Text: fmt.Sprintf("done after %d steps", done), Pieces: 3}
}

// StepModel is an in-process model answering with StepReply, each call
// taking delay().
func StepModel(steps int, delay func() time.Duration) model.Model {
	return model.Func(func(ctx context.Context, req *model.Request, onDelta func(model.Delta)) (*model.Response, error) {
		r := StepReply(steps, req)
		r.Delay = delay()
		return model.NewFixed(r).Generate(ctx, req, onDelta)
	})
}
