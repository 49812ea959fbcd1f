package state

import "github.com/natsagent/natsagent/internal/model"

// ToolCallsWaiting reports whether the last assistant message has tool
// calls without a result: messages appended now would split the calls
// from their results. Clients check it before they append to a thread.
func (st *State) ToolCallsWaiting() bool {
	i := len(st.Messages) - 1
	for i >= 0 && st.Messages[i].Role != model.RoleAssistant {
		i--
	}
	if i < 0 {
		return false
	}
	answered := map[string]bool{}
	for _, m := range st.Messages[i+1:] {
		if m.ToolCallID != "" {
			answered[m.ToolCallID] = true
		}
	}
	for _, c := range st.Messages[i].ToolCalls {
		if !answered[c.ID] {
			return true
		}
	}
	return false
}
