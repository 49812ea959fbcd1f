package middleware

// Subagent limit. Boundary: model response (after-model) and tool call.
// Lead agents only. After DeerFlow's SubagentLimitMiddleware: a response
// may start at most max_per_response subagents (task and subagent_start
// calls; default 3, clamped to 1–4) and a run at most max_per_run (default
// 6, clamped to 1–50). The calls over the limit are answered, before
// anything runs, with an error result saying why (the first ones in the
// response's order start); the response's other calls run as usual. When
// the run's budget is spent and a response only delegates, its tool calls
// are stripped with a visible note and the run ends with stop_reason
// subagent_limit_capped. Reads this run's part of the transcript (the
// count is derived from it, so it is the same after a redelivery); writes
// the error results or the stripped message; emits subagent.limited.
// It sits at the head of the tail, so it sees a response after the loop,
// budget and safety guards had their say (a call they stripped is never
// counted), and its error results are never orphaned by them. On a resume
// after an approval, which stops a response before this hook runs, it
// answers the calls over a limit before they run.

import (
	"context"
	"fmt"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
)

// SubagentLimit caps the subagents a lead run starts.
type SubagentLimit struct {
	MaxPerResponse int `json:"max_per_response"`
	MaxPerRun      int `json:"max_per_run"`
}

// Defaults and clamps of the subagent limit, after DeerFlow.
const (
	DefaultSubagentsPerResponse = 3
	MaxSubagentsPerResponse     = 4
	DefaultSubagentsPerRun      = 6
	MaxSubagentsPerRun          = 50
)

// NewSubagentLimit fills defaults (for 0) and clamps the limits into
// their ranges (1–4 per response, 1–50 per run).
func NewSubagentLimit(l SubagentLimit) (*SubagentLimit, error) {
	if l.MaxPerResponse == 0 {
		l.MaxPerResponse = DefaultSubagentsPerResponse
	}
	if l.MaxPerRun == 0 {
		l.MaxPerRun = DefaultSubagentsPerRun
	}
	l.MaxPerResponse = min(max(l.MaxPerResponse, 1), MaxSubagentsPerResponse)
	l.MaxPerRun = min(max(l.MaxPerRun, 1), MaxSubagentsPerRun)
	return &l, nil
}

// Name implements Middleware.
func (*SubagentLimit) Name() string { return "subagent_limit" }

// Why a delegation call was not started.
const (
	limitPerResponse = "per_response"
	limitPerRun      = "per_run"
)

// SubagentLimitData is the data of subagent.limited.
type SubagentLimitData struct {
	// Dropped are the tool call ids answered without starting anything.
	Dropped        []string `json:"dropped"`
	Reason         string   `json:"reason"`
	MaxPerResponse int      `json:"max_per_response"`
	MaxPerRun      int      `json:"max_per_run"`
	// Stopped is true when the run ended on it (subagent_limit_capped).
	Stopped bool `json:"stopped,omitempty"`
}

// over returns the delegation calls of the assistant message at index i
// that go over a limit, with the reason, and whether the run's budget is
// spent. Calls already answered (by a guard that ran before) do not count;
// earlier delegations of the message's run count unless a guard answered
// them before they ran.
func (l *SubagentLimit) over(st *state.State, i int) (map[string]string, bool) {
	msg := st.Messages[i]
	runID, _ := msg.Meta["run_id"].(string)
	answered := make(map[string]bool)
	for _, m := range st.Messages[i+1:] {
		if m.Role == model.RoleTool {
			answered[m.ToolCallID] = true
		}
	}
	blocked := make(map[string]bool)
	prior := 0
	for j := i - 1; j >= 0; j-- {
		m := st.Messages[j]
		if id, _ := m.Meta["run_id"].(string); id != runID && id != "" {
			break // an earlier run's turn
		}
		if m.Role == model.RoleTool && m.Meta[MetaBlockedBy] != nil {
			blocked[m.ToolCallID] = true
		}
		if m.Role == model.RoleAssistant {
			for _, c := range m.ToolCalls {
				if isDelegation(c.Name) && !blocked[c.ID] {
					prior++
				}
			}
		}
	}
	remaining := max(0, l.MaxPerRun-prior)
	allowed := min(l.MaxPerResponse, remaining)
	out := make(map[string]string)
	k := 0
	for _, c := range msg.ToolCalls {
		if !isDelegation(c.Name) || answered[c.ID] {
			continue
		}
		k++
		switch {
		case k <= allowed:
		case prior+k > l.MaxPerRun:
			out[c.ID] = limitPerRun
		default:
			out[c.ID] = limitPerResponse
		}
	}
	return out, remaining == 0
}

func (l *SubagentLimit) note(reason string) string {
	if reason == limitPerRun {
		return fmt.Sprintf("[SUBAGENT LIMIT REACHED] Not started: this run may start at most %d subagents and has started them all. Continue with the subagent results already collected, do the remaining simple work yourself, or summarize what remains.", l.MaxPerRun)
	}
	return fmt.Sprintf("[SUBAGENT LIMIT] Not started: at most %d subagents start per response, and the first ones of this response did. Wait for their results; delegate the rest in a later response if it is still needed.", l.MaxPerResponse)
}

// AfterModel answers the delegation calls over a limit, or ends the run
// when its budget is spent and the response only delegates.
func (l *SubagentLimit) AfterModel(ctx context.Context, rt *Runtime, st *state.State) (Result, error) {
	i := LastAssistant(st)
	if i < 0 || len(st.Messages[i].ToolCalls) == 0 {
		return Result{}, nil
	}
	for _, m := range st.Messages[i+1:] {
		if m.Role != model.RoleTool {
			return Result{}, nil // not a fresh response
		}
	}
	over, spent := l.over(st, i)
	if len(over) == 0 {
		return Result{}, nil
	}
	answered := make(map[string]bool)
	for _, m := range st.Messages[i+1:] {
		answered[m.ToolCallID] = true
	}
	onlyDelegation := true
	var dropped []string
	reason := limitPerResponse
	for _, c := range st.Messages[i].ToolCalls {
		if answered[c.ID] {
			continue
		}
		if r, ok := over[c.ID]; ok {
			dropped = append(dropped, c.ID)
			if r == limitPerRun {
				reason = limitPerRun
			}
		} else {
			onlyDelegation = false
		}
	}
	data := SubagentLimitData{Dropped: dropped, Reason: reason, MaxPerResponse: l.MaxPerResponse, MaxPerRun: l.MaxPerRun}
	if spent && onlyDelegation && len(answered) == 0 {
		// Nothing of the response may run: it becomes the final answer
		// (DeerFlow #3857).
		data.Stopped = true
		emitIfSet(rt, protocol.EventSubagentLimited, data)
		note := fmt.Sprintf("[SUBAGENT LIMIT REACHED] This run may start at most %d subagents and has started them all, so the %d requested here were not started. The answer above uses the subagent results already collected.", l.MaxPerRun, len(dropped))
		return stopWith(st, i, protocol.StopSubagentLimitCapped, note), nil
	}
	var results []model.Message
	for _, c := range st.Messages[i].ToolCalls {
		if r, ok := over[c.ID]; ok && !answered[c.ID] {
			results = append(results, model.Message{
				ID: "subagent_limit_" + c.ID, Role: model.RoleTool, ToolCallID: c.ID, Name: c.Name, Status: model.ToolStatusError,
				Content: l.note(r), Meta: map[string]any{MetaBlockedBy: l.Name(), "run_id": rt.RunID},
			})
		}
	}
	emitIfSet(rt, protocol.EventSubagentLimited, data)
	return Result{Update: state.Update{Messages: results}}, nil
}

// BeforeAgent answers, on a resume, the delegation calls over a limit of
// the response the thread waited on: an approval interrupt stopped that
// response before the after-model hook ran. It runs before the approval
// middleware lets the response's calls run.
func (l *SubagentLimit) BeforeAgent(ctx context.Context, rt *Runtime, st *state.State) (Result, error) {
	if rt.Resume == nil {
		return Result{}, nil
	}
	i := LastAssistant(st)
	if i < 0 || len(st.Messages[i].ToolCalls) == 0 {
		return Result{}, nil
	}
	over, _ := l.over(st, i)
	var results []model.Message
	for _, c := range st.Messages[i].ToolCalls {
		if r, ok := over[c.ID]; ok {
			results = append(results, model.Message{
				ID: "subagent_limit_" + c.ID, Role: model.RoleTool, ToolCallID: c.ID, Name: c.Name, Status: model.ToolStatusError,
				Content: l.note(r), Meta: map[string]any{MetaBlockedBy: l.Name(), "run_id": rt.RunID},
			})
		}
	}
	if len(results) == 0 {
		return Result{}, nil
	}
	return Result{Update: state.Update{Messages: results}}, nil
}
