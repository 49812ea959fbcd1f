package middleware

// Request layout for prompt caching. Providers cache the longest prefix
// of a request they have seen (tools, system prompt, messages, in that
// order), so a request keeps its prefix stable within a run: the system
// prompt and the tools are fixed for the run, the history only grows, and
// what changes from call to call (the todo list, a note saved to memory
// during the run, a new day) goes into ModelRequest.Context, which the
// innermost model handler sends as one trailing user message after
// everything else, tool results and transient guidance included. Only
// that message and the newest step are new to the provider's cache on
// each call. The message is request-only: it never enters state, events
// or checkpoints.

import (
	"strings"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/tokens"
)

// ContextMessageName is the name of the trailing context message.
const ContextMessageName = model.ContextMessageName

// contextPreamble opens the trailing context message: it tells the model
// the message is the system's, not the person's.
const contextPreamble = "<system-reminder>\nThe state of your task as the system tracks it now. It is not a message from the user; do not answer it, use it."

// withContextSection returns a copy of req whose trailing context carries
// section too (appended after the sections outer wrappers added).
func withContextSection(req *ModelRequest, section string) *ModelRequest {
	if section == "" {
		return req
	}
	c := *req
	c.Context = append(req.Context[:len(req.Context):len(req.Context)], section)
	return &c
}

// ContextMessage is the trailing context message of req, rendered from
// its Context sections; ok is false when there are none.
func ContextMessage(req *ModelRequest) (m model.Message, ok bool) {
	if len(req.Context) == 0 {
		return model.Message{}, false
	}
	var b strings.Builder
	b.WriteString(contextPreamble)
	for _, s := range req.Context {
		b.WriteString("\n")
		b.WriteString(strings.TrimRight(s, "\n"))
	}
	b.WriteString("\n</system-reminder>")
	return model.Message{Role: model.RoleUser, Name: ContextMessageName, Content: b.String(), Meta: map[string]any{MetaHidden: true}}, true
}

// Sent is req as the provider gets it: its Context rendered as the
// trailing message and cleared. The innermost model handler sends Sent
// and records it (RecordSent), so token counts include the context.
func Sent(req *ModelRequest) *ModelRequest {
	m, ok := ContextMessage(req)
	if !ok {
		return req
	}
	c := *req
	c.Messages = append(req.Messages[:len(req.Messages):len(req.Messages)], m)
	c.Context = nil
	return &c
}

// contextTokens counts req's trailing context message (0 without one).
// It is small and changes every call, so it is counted, never cached.
func contextTokens(counter tokens.Counter, req *ModelRequest) int {
	m, ok := ContextMessage(req)
	if !ok {
		return 0
	}
	return tokens.Message(counter, &m)
}
