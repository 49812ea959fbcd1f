package worker

import (
	"encoding/json"
	"fmt"

	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
)

// commandUpdate turns a command's update into a state update, refusing
// message ids the thread already has (an update appends) and goto tools
// without tool calls waiting.
func commandUpdate(c *protocol.Command, st *state.State) (state.Update, error) {
	var out state.Update
	if c.Goto == protocol.GotoTools {
		if !middleware.ToolCallsWaiting(st) {
			return out, fmt.Errorf("command.goto tools: the thread has no tool calls waiting to run")
		}
	}
	u, err := protocol.ParseUpdate(c.Update)
	if err != nil || u == nil {
		return out, err
	}
	for _, m := range u.Messages {
		if m.ID != "" && st.Index(m.ID) >= 0 {
			return out, fmt.Errorf("command.update: the thread already has a message %s; an update appends messages", m.ID)
		}
	}
	if len(u.Messages) > 0 && (len(c.Resume) > 0 || c.Goto == protocol.GotoTools) && middleware.ToolCallsWaiting(st) {
		return out, fmt.Errorf("command.update.messages: they would come between tool calls and their results; send them in a run after this one")
	}
	out.Messages = u.Messages
	if u.Title != nil {
		t, _ := json.Marshal(*u.Title)
		out.Values = map[string]json.RawMessage{middleware.TitleValue: t}
	}
	return out, nil
}
