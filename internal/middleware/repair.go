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
	"sync"
	"unicode/utf8"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/state"
)

// ToolCallRepair keeps every model request a valid transcript.
type ToolCallRepair struct{}

// Name implements Middleware.
func (ToolCallRepair) Name() string { return "tool_call_repair" }

// WrapModelCall implements WrapModelCall.
func (ToolCallRepair) WrapModelCall(ctx context.Context, rt *Runtime, req *ModelRequest, next ModelHandler) (*ModelResponse, error) {
	// Most transcripts need nothing: a per-run record of the prefix already
	// found valid makes the check cost only the new messages, so preparing
	// a call does not grow with the thread's history.
	check := Scratch(rt, "tool_call_repair:check", func() *transcriptCheck { return &transcriptCheck{} })
	if check.valid(req) {
		return next(ctx, req)
	}
	system, msgs, changed := RepairTranscript(req.System, req.Messages)
	if changed {
		c := *req
		c.System, c.Messages = system, msgs
		req = &c
	}
	return next(ctx, req)
}

// transcriptCheck remembers how much of a run's transcript is known to be
// valid, so the next call checks only what was added since.
type transcriptCheck struct {
	mu       sync.Mutex
	st       *state.State
	rewrites uint64
	n        int             // messages checked
	lastID   string          // id of message n-1
	open     map[string]bool // calls of the last assistant message not answered yet
}

// valid reports whether req's transcript needs no repair, checking only
// the messages after the prefix validated before (the whole transcript
// when state was rewritten since, or the prefix changed).
func (c *transcriptCheck) valid(req *ModelRequest) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	msgs := req.Messages
	fresh := req.State != nil && c.st == req.State && c.rewrites == req.State.Rewrites() &&
		c.n <= len(msgs) && (c.n == 0 || msgs[c.n-1].ID == c.lastID)
	if !fresh {
		c.st, c.n, c.lastID, c.open = req.State, 0, "", make(map[string]bool)
		if req.State != nil {
			c.rewrites = req.State.Rewrites()
		}
	}
	for i := c.n; i < len(msgs); i++ {
		if !c.accept(msgs[i]) {
			c.st = nil // start over next time
			return false
		}
		c.n, c.lastID = i+1, msgs[i].ID
	}
	return len(c.open) == 0 && c.lastID != ""
}

// accept checks one message against what came before it.
func (c *transcriptCheck) accept(m model.Message) bool {
	switch m.Role {
	case model.RoleSystem:
		return false // merged into the system prompt by a full repair
	case model.RoleTool:
		if m.ToolCallID == "" || !c.open[m.ToolCallID] || m.Name == "" {
			return false
		}
		delete(c.open, m.ToolCallID)
		return true
	case model.RoleAssistant:
		if len(c.open) > 0 || (len(m.ToolCalls) == 0 && strings.TrimSpace(m.Content) == "") {
			return false
		}
		// An id may repeat across turns (some providers number calls per
		// response): each result follows its own message, so only a
		// repeat within one message is a problem.
		for _, call := range m.ToolCalls {
			if call.ID == "" || c.open[call.ID] || strings.TrimSpace(call.Name) == "" || !isJSONObject(call.Arguments) {
				return false
			}
			c.open[call.ID] = true
		}
		return true
	default:
		return len(c.open) == 0
	}
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

// isJSONObject reports whether s is a JSON object (or empty, sent as {}).
// It runs on every new tool call, so it validates without decoding.
// Whitespace alone is not empty: providers refuse it as arguments. Only
// JSON's own whitespace may surround the object (strings.TrimSpace would
// also strip \v and U+0085, which no JSON parser accepts).
func isJSONObject(s string) bool {
	if s == "" {
		return true
	}
	t := strings.Trim(s, " \t\r\n")
	return t != "" && t[0] == '{' && json.Valid([]byte(t))
}

// clipText cuts s to at most n bytes, on a character boundary.
func clipText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}
