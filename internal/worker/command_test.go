package worker

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
)

// An update's messages never land between tool calls and their results:
// refused when the command runs waiting calls first (resume, goto tools),
// accepted otherwise (the waiting calls are then settled before them).
func TestCommandUpdateKeepsToolCallsWithResults(t *testing.T) {
	st := &state.State{}
	st.Apply(state.Update{Messages: []model.Message{
		{ID: "u1", Role: model.RoleUser, Content: "write it"},
		{ID: "a1", Role: model.RoleAssistant, ToolCalls: []model.ToolCall{{ID: "c1", Name: "write_file", Arguments: `{}`}}},
	}})
	upd := json.RawMessage(`{"messages":[{"role":"user","content":"also this"}]}`)
	for _, c := range []struct {
		cmd protocol.Command
		ok  bool
	}{
		{protocol.Command{Update: upd, Resume: json.RawMessage(`{"decisions":[{"type":"approve"}]}`)}, false},
		{protocol.Command{Update: upd, Goto: protocol.GotoTools}, false},
		{protocol.Command{Update: upd, Goto: protocol.GotoModel}, true},
		{protocol.Command{Update: upd}, true},
		{protocol.Command{Update: json.RawMessage(`{"title":"T"}`), Goto: protocol.GotoTools}, true},
		{protocol.Command{Update: json.RawMessage(`{"messages":[{"id":"u1","role":"user","content":"again"}]}`)}, false},
	} {
		_, err := commandUpdate(&c.cmd, st)
		if (err == nil) != c.ok {
			t.Errorf("%+v: err %v, want ok=%v", c.cmd, err, c.ok)
		}
		if err != nil && !strings.HasPrefix(err.Error(), "command.") {
			t.Errorf("error %q does not name the field", err)
		}
	}
	// Without waiting calls, goto tools is refused.
	done := st.Clone()
	done.Apply(state.Update{Messages: []model.Message{{ID: "t1", Role: model.RoleTool, ToolCallID: "c1", Content: "ok"}}})
	if _, err := commandUpdate(&protocol.Command{Goto: protocol.GotoTools}, done); err == nil {
		t.Error("goto tools without waiting calls accepted")
	}
}
