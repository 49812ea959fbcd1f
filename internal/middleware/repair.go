package middleware

// Tool-call repair. Boundary: model call, request only. Reads the request's
// transcript; writes no state; emits nothing. On every model call it makes
// the transcript one a strict provider accepts (DESIGN invariant 1): system
// messages are merged into the one leading system prompt; every assistant
// tool call gets exactly one tool result right after its message (results
// found elsewhere are moved there, missing ones are answered with an error
// result); results that answer no call are dropped; empty tool names and
// ids are filled; arguments that are not a JSON object are sent as {};
// empty assistant messages are left out. State is never touched, so a
// transcript that needed no repair costs nothing and changes nothing.

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/natsagent/natsagent/internal/model"
)

// ToolCallRepair keeps every model request a valid transcript.
type ToolCallRepair struct{}

// Name implements Middleware.
func (ToolCallRepair) Name() string { return "tool_call_repair" }

// WrapModelCall implements WrapModelCall.
func (ToolCallRepair) WrapModelCall(ctx context.Context, rt *Runtime, req *ModelRequest, next ModelHandler) (*ModelResponse, error) {
	system, msgs, changed := RepairTranscript(req.System, req.Messages)
	if changed {
		c := *req
		c.System, c.Messages = system, msgs
		req = &c
	}
	return next(ctx, req)
}

// UnknownToolName replaces an empty tool name.
const UnknownToolName = "unknown_tool"

// Texts of the results that answer calls without one.
const (
	repairMissingName = "[This tool call could not run: its tool name was missing. Call one of the available tools by name.]"
	repairBadArgs     = "[This tool call could not run: its arguments were not a valid JSON object (%s). Send the arguments as a JSON object; if the content is very large, send it in smaller parts.]"
	repairInterrupted = "[This tool call was interrupted before it returned a result. Call it again if you still need its result.]"
)

// RepairTranscript returns the system prompt and messages with the
// repairs above applied, and whether anything changed. The input is not
// modified.
func RepairTranscript(system string, msgs []model.Message) (string, []model.Message, bool) {
	changed := false

	// System messages after the start move into the leading prompt.
	var systems []string
	if system != "" {
		systems = append(systems, system)
	}
	for _, m := range msgs {
		if m.Role == model.RoleSystem {
			changed = true
			if strings.TrimSpace(m.Content) != "" {
				systems = append(systems, m.Content)
			}
		}
	}
	if changed {
		system = strings.Join(systems, "\n\n")
	}

	// Fill empty call ids and names, make ids unique, and remember which
	// calls lacked an id so id-less results can be matched to them.
	type callInfo struct {
		call      model.ToolCall
		emptyName bool
		badArgs   string
	}
	calls := make(map[int][]callInfo) // by message index
	idless := make(map[int][]string)  // message index -> repaired ids of id-less calls
	// Calls by the id the model gave them, in order: a provider that
	// numbers calls per response reuses ids across turns, and the renamed
	// call must still get the result that follows it.
	type slot struct {
		msg int
		id  string // repaired id
	}
	byGiven := make(map[string][]slot)
	seen := make(map[string]bool)
	for i, m := range msgs {
		if m.Role != model.RoleAssistant || len(m.ToolCalls) == 0 {
			continue
		}
		infos := make([]callInfo, len(m.ToolCalls))
		for j, c := range m.ToolCalls {
			info := callInfo{call: c}
			if c.ID == "" || seen[c.ID] {
				base := m.ID
				if base == "" {
					base = fmt.Sprint(i)
				}
				info.call.ID = fmt.Sprintf("call_repaired_%s_%d", base, j)
				if c.ID == "" {
					idless[i] = append(idless[i], info.call.ID)
				}
				changed = true
			}
			if c.ID != "" {
				byGiven[c.ID] = append(byGiven[c.ID], slot{i, info.call.ID})
			}
			seen[info.call.ID] = true
			if strings.TrimSpace(c.Name) == "" {
				info.call.Name = UnknownToolName
				info.emptyName = true
				changed = true
			}
			if !isJSONObject(c.Arguments) {
				info.badArgs = clipText(c.Arguments, 120)
				info.call.Arguments = "{}"
				changed = true
			}
			infos[j] = info
		}
		calls[i] = infos
	}

	// Collect results by call id, in order; an id-less result is matched to
	// the id-less calls of the assistant message before it. A result whose
	// id several calls were given answers the first call not yet answered
	// in the nearest message before it that has that id.
	results := make(map[string][]int)
	lastAssistant := -1
	idlessUsed := make(map[int]int)
	claimed := make(map[string]bool)
	for i, m := range msgs {
		switch m.Role {
		case model.RoleAssistant:
			lastAssistant = i
		case model.RoleTool:
			id := m.ToolCallID
			if slots := byGiven[id]; len(slots) > 1 {
				near := -1
				for _, s := range slots {
					if s.msg < i {
						near = s.msg
					}
				}
				pick := ""
				for _, s := range slots {
					if s.msg != near {
						continue
					}
					if pick == "" {
						pick = s.id // all answered: a duplicate, dropped at the first call
					}
					if !claimed[s.id] {
						pick = s.id
						break
					}
				}
				if pick != "" {
					id = pick
					claimed[id] = true
				}
			}
			if id == "" && lastAssistant >= 0 {
				if n := idlessUsed[lastAssistant]; n < len(idless[lastAssistant]) {
					id = idless[lastAssistant][n]
					idlessUsed[lastAssistant] = n + 1
				}
			}
			if id != "" {
				results[id] = append(results[id], i)
			}
		}
	}

	out := make([]model.Message, 0, len(msgs))
	used := make(map[int]bool)
	for i, m := range msgs {
		switch {
		case m.Role == model.RoleSystem:
			continue
		case m.Role == model.RoleTool:
			if !used[i] {
				changed = true // an orphan, or a result already placed
			}
			continue
		case m.Role == model.RoleAssistant && len(m.ToolCalls) == 0 && strings.TrimSpace(m.Content) == "":
			changed = true // strict providers refuse empty assistant messages
			continue
		case m.Role != model.RoleAssistant || len(m.ToolCalls) == 0:
			out = append(out, m)
			continue
		}
		a := m
		a.ToolCalls = make([]model.ToolCall, len(calls[i]))
		for j, info := range calls[i] {
			a.ToolCalls[j] = info.call
		}
		out = append(out, a)
		for k, info := range calls[i] {
			placed := false
			for _, ri := range results[info.call.ID] {
				if used[ri] {
					continue
				}
				used[ri] = true
				r := msgs[ri]
				if r.ToolCallID != info.call.ID || r.Name != info.call.Name {
					r.ToolCallID, r.Name = info.call.ID, info.call.Name
					changed = true
				}
				if ri != i+1+k {
					changed = true // moved next to its call
				}
				out = append(out, r)
				placed = true
				break
			}
			if placed {
				continue
			}
			changed = true
			text := repairInterrupted
			switch {
			case info.emptyName:
				text = repairMissingName
			case info.badArgs != "":
				text = fmt.Sprintf(repairBadArgs, info.badArgs)
			}
			out = append(out, model.Message{
				Role:       model.RoleTool,
				ToolCallID: info.call.ID,
				Name:       info.call.Name,
				Content:    text,
				Status:     model.ToolStatusError,
			})
		}
	}
	if !changed {
		return system, msgs, false
	}
	return system, out, true
}

func isJSONObject(s string) bool {
	if strings.TrimSpace(s) == "" {
		return true // sent as {}
	}
	var v map[string]json.RawMessage
	return json.Unmarshal([]byte(s), &v) == nil && v != nil // "null" decodes to a nil map
}

func clipText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
