package middleware

import (
	"strings"
	"sync"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
)

// MetaStopNote marks an assistant message whose tool calls a guard
// stripped; its value is the guard's stop reason.
const MetaStopNote = "stopped_by"

// MetaSentBack marks a final answer an after-model hook sent back to the
// model (JumpModel, as the todo completion reminder does). The loop sets
// it with the step's checkpoint, so a run redelivered before the next
// model call makes that call instead of ending on the answer.
const MetaSentBack = "sent_back"

// InterruptValue is the state value holding the interrupt a thread waits
// for (a protocol.Interrupt); the middleware that raises it sets it, the
// one that handles the resume clears it.
const InterruptValue = protocol.InterruptValue

// MetaHidden marks a message that is part of the transcript but not meant
// for a person's view (injected context, reminders).
const MetaHidden = "hidden"

// SwitchedOff reports whether a run's switch (config.clarification,
// subagents, plan_mode) turned its capability off for the run.
func SwitchedOff(sw *bool) bool { return sw != nil && !*sw }

// LastAssistant returns the index of the last assistant message, or -1.
func LastAssistant(st *state.State) int {
	for i := len(st.Messages) - 1; i >= 0; i-- {
		if st.Messages[i].Role == model.RoleAssistant {
			return i
		}
	}
	return -1
}

// StripToolCalls returns a copy of an assistant message with its tool
// calls removed and a visible note appended, ready to replace the original
// by id: a guard that stops the loop turns the message into a final answer
// (invariant 2), so no raw tool call is left unanswered.
func StripToolCalls(m model.Message, stopReason, note string) model.Message {
	c := m.Clone()
	c.ToolCalls = nil
	if note != "" {
		if strings.TrimSpace(c.Content) == "" {
			c.Content = note
		} else {
			c.Content += "\n\n" + note
		}
	}
	if c.Meta == nil {
		c.Meta = map[string]any{}
	}
	c.Meta[MetaStopNote] = stopReason
	if fr, _ := c.Meta["finish_reason"].(string); fr == model.FinishToolCalls || fr == "" {
		c.Meta["finish_reason"] = model.FinishStop
	}
	return c
}

// stopWith is the Result of a guard that ends the run by stripping the
// tool calls of the assistant message at index i.
func stopWith(st *state.State, i int, stopReason, note string) Result {
	stripped := StripToolCalls(st.Messages[i], stopReason, note)
	return Result{
		Update:     state.Update{Messages: []model.Message{stripped}},
		Jump:       JumpEnd,
		StopReason: stopReason,
	}
}

// guidance is a run's queue of transient notes for the next model call
// (loop and budget warnings). Notes go into that one request, after the
// tool results, as a trailing user message; they never enter state, and a
// run that ends before its next model call drops them (invariant 3).
type guidance struct {
	notes []string
}

const maxGuidancePerRun = 4

// queueGuidance adds a note for the next model call of this run, keyed by
// the middleware that owns it.
func queueGuidance(rt *Runtime, owner, note string) {
	g := guidanceOf(rt, owner)
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for _, n := range g.notes {
		if n == note {
			return
		}
	}
	if len(g.notes) < maxGuidancePerRun {
		g.notes = append(g.notes, note)
	}
}

// withGuidance returns req with the owner's queued notes appended as one
// trailing user message named after the owner. The queue is kept until
// clearGuidance, so a retried call carries the notes again.
func withGuidance(rt *Runtime, owner string, req *ModelRequest) *ModelRequest {
	g := guidanceOf(rt, owner)
	rt.mu.Lock()
	notes := append([]string(nil), g.notes...)
	rt.mu.Unlock()
	if len(notes) == 0 {
		return req
	}
	out := *req
	out.Messages = append(append([]model.Message(nil), req.Messages...), model.Message{
		Role:    model.RoleUser,
		Name:    owner,
		Content: strings.Join(notes, "\n\n"),
	})
	return &out
}

// clearGuidance empties the owner's queue once a model call carried it.
func clearGuidance(rt *Runtime, owner string) {
	g := guidanceOf(rt, owner)
	rt.mu.Lock()
	g.notes = nil
	rt.mu.Unlock()
}

// pendingGuidance returns the owner's queued notes.
func pendingGuidance(rt *Runtime, owner string) []string {
	g := guidanceOf(rt, owner)
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return append([]string(nil), g.notes...)
}

// ToolCallsWaiting reports whether the last assistant message has tool
// calls without a result (state.ToolCallsWaiting).
func ToolCallsWaiting(st *state.State) bool { return st.ToolCallsWaiting() }

// guidanceKeys names each owner's guidance queue in the run's scratch.
var guidanceKeys = keyCache{prefix: "guidance:"}

func guidanceOf(rt *Runtime, owner string) *guidance {
	return Scratch(rt, guidanceKeys.key(owner), func() *guidance { return &guidance{} })
}

// keyCache keeps the scratch keys built from a prefix and a name, so a
// middleware that finds its scratch value on every call builds the key
// once per process instead of once per call. The names are the code's
// (owners, token encodings): maxCachedKeys bounds the cache against any
// other use, beyond which a key is built per call again.
type keyCache struct {
	prefix string
	mu     sync.RWMutex
	keys   map[string]string
}

const maxCachedKeys = 64

func (c *keyCache) key(name string) string {
	c.mu.RLock()
	k, ok := c.keys[name]
	c.mu.RUnlock()
	if ok {
		return k
	}
	k = c.prefix + name
	c.mu.Lock()
	if c.keys == nil {
		c.keys = make(map[string]string)
	}
	if len(c.keys) < maxCachedKeys {
		c.keys[name] = k
	}
	c.mu.Unlock()
	return k
}
