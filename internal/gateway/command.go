package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
)

// command reads a LangGraph command: resume as any JSON value, update
// with messages in LangChain's shape or natsagent's (converted to
// natsagent's), goto as a node name.
func command(c *runCommand) (*protocol.Command, error) {
	out := &protocol.Command{}
	if !isNull(c.Resume) {
		out.Resume = c.Resume
	}
	if !isNull(c.Goto) {
		if err := json.Unmarshal(c.Goto, &out.Goto); err != nil || out.Goto == "" {
			return nil, errInvalid("command.goto", fmt.Sprintf("must be the name of a node: %s or %s (a Send or a list of nodes is not supported)", protocol.GotoModel, protocol.GotoTools))
		}
	}
	if !isNull(c.Update) {
		u, err := commandUpdate(c.Update)
		if err != nil {
			return nil, err
		}
		out.Update = u
	}
	return out, nil
}

// commandUpdate converts an update's messages to natsagent's shape. A
// LangGraph update may also be a list of [key, value] pairs; natsagent
// takes the object form only.
func commandUpdate(raw json.RawMessage) (json.RawMessage, error) {
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(raw, &keys); err != nil {
		return nil, errInvalid("command.update", "must be an object of state keys (messages, title)")
	}
	if msgs, ok := keys["messages"]; ok && !isNull(msgs) {
		var in []inputMessage
		if err := json.Unmarshal(msgs, &in); err != nil {
			return nil, errInvalid("command.update.messages", "must be a list of messages")
		}
		// The rules of a state update (lgstate.go): human or ai text,
		// never tool calls or tool results, which come from the model
		// and the tools (answer an interrupt with command.resume).
		conv := make([]model.Message, len(in))
		for i, m := range in {
			msg, err := updateMessage(fmt.Sprintf("command.update.messages[%d]", i), m)
			if err != nil {
				return nil, err
			}
			conv[i] = msg
		}
		data, err := json.Marshal(conv)
		if err != nil {
			return nil, err
		}
		keys["messages"] = data
	}
	out, err := json.Marshal(keys)
	if err != nil {
		return nil, err
	}
	if _, err := protocol.ParseUpdate(out); err != nil {
		return nil, err
	}
	return out, nil
}

func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || bytes.Equal(raw, []byte("null"))
}

// checkCommand refuses, before anything is published, a command the
// thread cannot take: a resume when it waits for nothing, decisions or an
// answer that do not fit what it waits for (never a silent guess), an
// update message whose id the thread already has, goto tools without tool
// calls waiting. The worker checks again when the run starts; this only
// answers early.
func (s *Server) checkCommand(ctx context.Context, req *protocol.RunRequest, th *protocol.Thread) error {
	st, _, err := s.stores.Checkpoints.Load(ctx, req.Tenant, th.ThreadID, th.Head)
	if err != nil {
		return err
	}
	c := req.Command
	if len(c.Resume) > 0 {
		if err := s.checkResume(st, req, th); err != nil {
			return err
		}
	}
	if u, _ := protocol.ParseUpdate(c.Update); u != nil {
		for i, m := range u.Messages {
			if m.ID != "" && st.Index(m.ID) >= 0 {
				return errInvalid(fmt.Sprintf("command.update.messages[%d].id", i), fmt.Sprintf("the thread already has a message %s; an update appends messages", m.ID))
			}
		}
		if len(u.Messages) > 0 && (len(c.Resume) > 0 || c.Goto == protocol.GotoTools) && st.ToolCallsWaiting() {
			return errInvalid("command.update.messages", "they would come between tool calls and their results (which this command runs first); send them in a run after this one")
		}
	}
	if c.Goto == protocol.GotoTools {
		if !st.ToolCallsWaiting() {
			return errConflict(fmt.Sprintf("thread %s has no tool calls waiting to run; command.goto tools runs the last response's unanswered calls", th.ThreadID))
		}
	}
	return nil
}
