package middleware

// Tool policy: the tools a run's principal may use (internal/policy,
// resolved once when the run is prepared). Boundary: model call (the tools
// offered) and tool call. It reads and writes nothing. It is two
// middlewares that a prepared run's chain holds around every other one:
// the gate, outermost, refuses a call to a tool the principal may not use
// before any other wrapper (a middleware's own tool, such as task or
// write_todos, answers its calls itself); the trim, innermost, removes
// such tools from the very request the model receives, after every
// middleware added its own.

import (
	"context"
	"fmt"
	"slices"

	"github.com/natsagent/natsagent/internal/model"
)

// Names of the tool policy middlewares.
const (
	ToolPolicyGate = "tool_policy"
	ToolPolicyTrim = "tool_policy_trim"
)

// ToolPolicy is what the run's principal may use; Allow reports one tool.
type ToolPolicy struct {
	Allow func(name string) bool
}

// WithToolPolicy returns chain held by the policy's gate (first) and trim
// (last); chain itself is shared by every run of its profile and not
// changed.
func WithToolPolicy(chain *Chain, allow func(name string) bool) (*Chain, error) {
	p := &ToolPolicy{Allow: allow}
	return NewChain([]Middleware{toolPolicyGate{p}}, chain.Middlewares(), []Middleware{toolPolicyTrim{p}})
}

type toolPolicyGate struct{ p *ToolPolicy }

func (toolPolicyGate) Name() string { return ToolPolicyGate }

// WrapToolCall refuses a tool the principal may not use, called by name.
func (g toolPolicyGate) WrapToolCall(ctx context.Context, rt *Runtime, call *ToolCall, next ToolHandler) (*ToolResult, error) {
	if !g.p.Allow(call.Call.Name) {
		return &ToolResult{Message: model.Message{
			Content: fmt.Sprintf("Error: the tool %s is not available to this run.", call.Call.Name),
			Status:  model.ToolStatusError,
		}}, nil
	}
	return next(ctx, call)
}

type toolPolicyTrim struct{ p *ToolPolicy }

func (toolPolicyTrim) Name() string { return ToolPolicyTrim }

// WrapModelCall drops the tools the principal may not use.
func (t toolPolicyTrim) WrapModelCall(ctx context.Context, rt *Runtime, req *ModelRequest, next ModelHandler) (*ModelResponse, error) {
	if !slices.ContainsFunc(req.Tools, func(s model.ToolSpec) bool { return !t.p.Allow(s.Name) }) {
		return next(ctx, req)
	}
	c := *req
	c.Tools = slices.DeleteFunc(slices.Clone(req.Tools), func(s model.ToolSpec) bool { return !t.p.Allow(s.Name) })
	return next(ctx, &c)
}
