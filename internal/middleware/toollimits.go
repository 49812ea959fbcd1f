package middleware

// Tool exclusion and tool call limits. Boundary: model call (the tools
// offered) and tool call. Tool exclusion reads and writes nothing; it is
// two middlewares that Assemble holds around every other one, so it is the
// very last step on the tools whatever a middleware added (write_todos,
// task, ask_clarification): the gate, outermost, refuses an excluded tool
// called by name anyway, before a middleware answers its own tool; the
// trim, innermost, removes excluded tools from the request the model
// receives. Tool call limits read the transcript (calls
// this run and this thread made) and write error results for the calls
// over a limit, after LangChain's ToolCallLimitMiddleware; counts come from
// the transcript, so they survive redelivery.

import (
	"context"
	"fmt"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
)

// ToolExclusion hides tools from a run.
type ToolExclusion struct {
	Exclude []string `json:"exclude"`
	set     map[string]bool
}

// NewToolExclusion checks that every excluded name is a known tool. The
// result is the gate; toolExclusionTrim is its other half.
func NewToolExclusion(t ToolExclusion, known func(string) bool) (*ToolExclusion, error) {
	t.set = make(map[string]bool)
	for _, n := range t.Exclude {
		if !known(n) {
			return nil, fmt.Errorf("exclude: unknown tool %q", n)
		}
		t.set[n] = true
	}
	return &t, nil
}

// Name implements Middleware.
func (*ToolExclusion) Name() string { return "tool_exclusion" }

// toolExclusionTrim is tool exclusion's innermost half.
type toolExclusionTrim struct{ t *ToolExclusion }

// Name implements Middleware.
func (toolExclusionTrim) Name() string { return ToolExclusionTrim }

// WrapModelCall drops excluded tools from the request.
func (x toolExclusionTrim) WrapModelCall(ctx context.Context, rt *Runtime, req *ModelRequest, next ModelHandler) (*ModelResponse, error) {
	t := x.t
	if len(t.set) == 0 {
		return next(ctx, req)
	}
	c := *req
	c.Tools = make([]model.ToolSpec, 0, len(req.Tools))
	for _, spec := range req.Tools {
		if !t.set[spec.Name] {
			c.Tools = append(c.Tools, spec)
		}
	}
	return next(ctx, &c)
}

// WrapToolCall refuses an excluded tool called by name.
func (t *ToolExclusion) WrapToolCall(ctx context.Context, rt *Runtime, call *ToolCall, next ToolHandler) (*ToolResult, error) {
	if t.set[call.Call.Name] {
		return &ToolResult{Message: model.Message{
			Content: fmt.Sprintf("Error: the tool %s is not available to this run.", call.Call.Name),
			Status:  model.ToolStatusError,
		}}, nil
	}
	return next(ctx, call)
}

// Exit behaviours of a tool call limit.
const (
	LimitContinue = "continue" // answer blocked calls with an error, go on
	LimitEnd      = "end"      // answer blocked calls and end the run
	LimitError    = "error"    // fail the run
)

// StopToolLimitCapped is the stop reason of a run ended by a tool call
// limit.
const StopToolLimitCapped = protocol.StopToolLimitCapped

// ToolCallLimit caps tool calls per run and per thread.
type ToolCallLimit struct {
	// MiddlewareName distinguishes several limits in one chain.
	MiddlewareName string `json:"name"`
	// Tool limits calls of one tool; empty limits all calls.
	Tool         string `json:"tool"`
	RunLimit     int    `json:"run_limit"`
	ThreadLimit  int    `json:"thread_limit"`
	ExitBehavior string `json:"exit_behavior"`
}

// NewToolCallLimit checks the limits.
func NewToolCallLimit(l ToolCallLimit) (*ToolCallLimit, error) {
	if l.RunLimit <= 0 && l.ThreadLimit <= 0 {
		return nil, fmt.Errorf("set run_limit or thread_limit")
	}
	if l.RunLimit < 0 || l.ThreadLimit < 0 {
		return nil, fmt.Errorf("limits must not be negative")
	}
	if l.RunLimit > 0 && l.ThreadLimit > 0 && l.RunLimit > l.ThreadLimit {
		return nil, fmt.Errorf("run_limit (%d) must not exceed thread_limit (%d)", l.RunLimit, l.ThreadLimit)
	}
	switch l.ExitBehavior {
	case "":
		l.ExitBehavior = LimitContinue
	case LimitContinue, LimitEnd, LimitError:
	default:
		return nil, fmt.Errorf("exit_behavior %q is not one of continue, end, error", l.ExitBehavior)
	}
	if l.MiddlewareName == "" {
		l.MiddlewareName = "tool_call_limit"
		if l.Tool != "" {
			l.MiddlewareName += "_" + l.Tool
		}
	}
	return &l, nil
}

// Name implements Middleware.
func (l *ToolCallLimit) Name() string { return l.MiddlewareName }

// MetaBlockedBy marks a tool result that a limit produced instead of
// running the call.
const MetaBlockedBy = "blocked_by"

func (l *ToolCallLimit) matches(name string) bool { return l.Tool == "" || l.Tool == name }

// AfterModel answers the calls of the new response that go over a limit.
func (l *ToolCallLimit) AfterModel(ctx context.Context, rt *Runtime, st *state.State) (Result, error) {
	i := LastAssistant(st)
	if i < 0 || len(st.Messages[i].ToolCalls) == 0 {
		return Result{}, nil
	}
	for _, m := range st.Messages[i+1:] {
		if m.Role != model.RoleTool {
			return Result{}, nil // not a fresh response
		}
	}
	// Results already present for the new calls come from another limit
	// earlier in the after-model order: those calls are blocked already.
	answered := make(map[string]bool)
	blocked := make(map[string]bool)
	for _, m := range st.Messages {
		if m.Role == model.RoleTool && m.Meta[MetaBlockedBy] != nil {
			blocked[m.ToolCallID] = true
		}
	}
	for _, m := range st.Messages[i+1:] {
		if m.Role == model.RoleTool {
			answered[m.ToolCallID] = true
		}
	}
	runCount, threadCount := 0, 0
	for j := 0; j < i; j++ {
		m := st.Messages[j]
		if m.Role != model.RoleAssistant {
			continue
		}
		ownRun := m.Meta["run_id"] == rt.RunID
		for _, c := range m.ToolCalls {
			if !l.matches(c.Name) {
				continue
			}
			if ownRun {
				runCount++ // a run counts blocked calls too
			}
			if !blocked[c.ID] {
				threadCount++
			}
		}
	}
	var results []model.Message
	var over []string
	for _, c := range st.Messages[i].ToolCalls {
		if !l.matches(c.Name) || answered[c.ID] {
			continue
		}
		runCount++
		if (l.RunLimit == 0 || runCount <= l.RunLimit) && (l.ThreadLimit == 0 || threadCount+1 <= l.ThreadLimit) {
			threadCount++
			continue
		}
		over = append(over, c.Name)
		text := fmt.Sprintf("Tool call limit reached: do not call %s again in this run.", c.Name)
		if l.Tool == "" {
			text = "Tool call limit reached: do not make more tool calls; answer with what you have."
		}
		results = append(results, model.Message{
			ID: "limit_" + c.ID, Role: model.RoleTool, ToolCallID: c.ID, Name: c.Name, Content: text,
			Status: model.ToolStatusError, Meta: map[string]any{MetaBlockedBy: l.Name(), "run_id": rt.RunID},
		})
	}
	if len(over) == 0 {
		return Result{}, nil
	}
	switch l.ExitBehavior {
	case LimitError:
		return Result{}, fmt.Errorf("tool call limit exceeded for %s (run limit %d, thread limit %d)", over[0], l.RunLimit, l.ThreadLimit)
	case LimitEnd:
		// Every other call of the response is answered too, so the
		// transcript stays valid, and the run ends.
		for _, r := range results {
			answered[r.ToolCallID] = true
		}
		for _, c := range st.Messages[i].ToolCalls {
			if !answered[c.ID] {
				results = append(results, model.Message{
					ID: "limit_" + c.ID, Role: model.RoleTool, ToolCallID: c.ID, Name: c.Name,
					Content: "Not run: the run ended at a tool call limit.", Status: model.ToolStatusError,
					Meta: map[string]any{MetaBlockedBy: l.Name(), "run_id": rt.RunID},
				})
			}
		}
		results = append(results, model.Message{
			ID: "limit_end_" + st.Messages[i].ID, Role: model.RoleAssistant,
			Content: fmt.Sprintf("[The run stopped: the %s tool call limit was reached.]", over[0]),
			Meta:    map[string]any{MetaBlockedBy: l.Name(), "run_id": rt.RunID, MetaStopNote: StopToolLimitCapped},
		})
		return Result{Update: state.Update{Messages: results}, Jump: JumpEnd, StopReason: StopToolLimitCapped}, nil
	}
	return Result{Update: state.Update{Messages: results}}, nil
}
