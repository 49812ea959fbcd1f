package protocol

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/natsagent/natsagent/internal/model"
)

// StateUpdate is a command's update: what a client may change in a
// thread's state before its run goes on. Messages are appended (never
// replace one the thread has); Title replaces the thread's title.
type StateUpdate struct {
	Messages []model.Message `json:"messages,omitempty"`
	Title    *string         `json:"title,omitempty"`
}

// UpdateKeys are the state keys a command's update may set. The others
// (interrupt, approved tool calls, todos...) are kept by middlewares, and
// a client writing them could step around a governance middleware (an
// approval).
var UpdateKeys = []string{"messages", "title"}

// ParseUpdate reads and checks a command's update (natsagent's message
// shape). Errors name the field.
func ParseUpdate(raw json.RawMessage) (*StateUpdate, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, nil
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(raw, &keys); err != nil {
		return nil, invalid("command.update", "must be an object of state keys (messages, title): %v", err)
	}
	names := make([]string, 0, len(keys))
	for k := range keys {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if k != "messages" && k != "title" {
			return nil, invalid("command.update."+clip(k, 40), "a command may update %s; %q is kept by the agent's middlewares", strings.Join(UpdateKeys, " and "), clip(k, 40))
		}
	}
	var u StateUpdate
	if err := json.Unmarshal(raw, &u); err != nil {
		return nil, invalid("command.update", "%v", err)
	}
	for i, m := range u.Messages {
		field := fmt.Sprintf("command.update.messages[%d]", i)
		switch m.Role {
		case model.RoleUser, model.RoleSystem:
		case model.RoleAssistant:
			if len(m.ToolCalls) > 0 {
				return nil, invalid(field+".tool_calls", "an update may add assistant text, not tool calls: tool calls come from the model")
			}
		case model.RoleTool:
			return nil, invalid(field+".role", "tool results come from tools; answer an interrupt with command.resume")
		default:
			return nil, invalid(field+".role", "%q is not a valid role (user, system or assistant)", clip(m.Role, 20))
		}
		if m.ID != "" && !ValidToken(m.ID) {
			return nil, invalid(field+".id", "%q is not a valid message id", clip(m.ID, 40))
		}
		if len(m.Parts) > 0 {
			return nil, invalid(field+".parts", "is not accepted: put images in the thread's workdir")
		}
		if m.ToolCallID != "" || m.Status != "" {
			return nil, invalid(field, "carries tool result fields (tool_call_id, status); an update adds user, system or assistant text")
		}
	}
	if u.Title != nil && len(*u.Title) > 500 {
		return nil, invalid("command.update.title", "is %d bytes; a title holds at most 500", len(*u.Title))
	}
	return &u, nil
}

// ResumeAnswer reads the answer to a clarification from a resume value:
// a JSON string (as LangGraph clients send it) or {"answer": "..."}.
func ResumeAnswer(raw json.RawMessage) (string, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "", false
	}
	var s string
	if raw[0] == '"' {
		if json.Unmarshal(raw, &s) != nil {
			return "", false
		}
	} else {
		var r Resume
		if json.Unmarshal(raw, &r) != nil {
			return "", false
		}
		s = r.Answer
	}
	s = strings.TrimSpace(s)
	return s, s != ""
}

// validateCommand checks a command's shape; the thread's state decides
// later whether it fits (a resume needs a waiting interrupt).
func (c *Command) validate() error {
	hasResume := len(c.Resume) > 0 && !bytes.Equal(c.Resume, []byte("null"))
	hasUpdate := len(c.Update) > 0 && !bytes.Equal(c.Update, []byte("null"))
	if !hasResume && !hasUpdate && c.Goto == "" {
		return invalid("command", "needs resume, update or goto")
	}
	switch c.Goto {
	case "", GotoModel, GotoTools:
	default:
		return invalid("command.goto", "%q is not a node natsagent can go to: use model or tools", clip(c.Goto, 40))
	}
	if hasResume && c.Goto != "" {
		return invalid("command.goto", "cannot be combined with command.resume: a resume goes on where the interrupt paused")
	}
	if hasUpdate {
		if _, err := ParseUpdate(c.Update); err != nil {
			return err
		}
	}
	return nil
}
