// Package middleware owns the chain engine every agent capability plugs
// into: the hook interfaces, their ordering (before-hooks in list order,
// after-hooks in reverse, wrappers nested first-outermost), jumps, and the
// split between request-only edits and explicit state updates. It also
// holds the built-in middlewares, one file each. It must not touch NATS or
// storage: a middleware sees the run's state and returns updates; the
// agent loop persists them.
package middleware

import (
	"context"
	"fmt"
	"sync"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/metrics"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
	"github.com/natsagent/natsagent/internal/tools"
)

// Middleware is anything with a unique name that implements one or more of
// the hook interfaces below.
type Middleware interface {
	Name() string
}

// Jump tells the loop where to go after a before/after hook.
type Jump int

const (
	// JumpNone continues normally.
	JumpNone Jump = iota
	// JumpEnd ends the run; after-agent hooks still run.
	JumpEnd
	// JumpModel goes back to the first before-model hook.
	JumpModel
	// JumpTools runs the unanswered tool calls of the last assistant
	// message (a resumed approval), then goes on to the model.
	JumpTools
)

// Result is what a before/after hook returns: a state update persisted
// with the next checkpoint, and an optional jump.
type Result struct {
	Update state.Update
	Jump   Jump
	// StopReason is recorded on the run when the hook ends it (Jump ==
	// JumpEnd) because a guard tripped.
	StopReason string
	// Interrupt pauses the run for a person: it ends "interrupted" with
	// this request, without running the pending tool calls or the
	// after-agent hooks. A resume run on the thread continues it.
	Interrupt *protocol.Interrupt
}

// BeforeAgent runs once per run, in list order, before the first model call.
type BeforeAgent interface {
	BeforeAgent(ctx context.Context, rt *Runtime, st *state.State) (Result, error)
}

// BeforeModel runs before every model call, in list order.
type BeforeModel interface {
	BeforeModel(ctx context.Context, rt *Runtime, st *state.State) (Result, error)
}

// AfterModel runs after every model response, in reverse list order (the
// last middleware sees the response first).
type AfterModel interface {
	AfterModel(ctx context.Context, rt *Runtime, st *state.State) (Result, error)
}

// AfterAgent runs once at the end of a run, in reverse list order, also
// after a jump to the end.
type AfterAgent interface {
	AfterAgent(ctx context.Context, rt *Runtime, st *state.State) (Result, error)
}

// ModelRequest is one model call as the wrappers see it. Edits to it affect
// this call only; to change state, set ModelResponse.Update. Messages is
// the state's own transcript (capped, so append copies it): a wrapper that
// changes messages builds a new slice (or Clones the request) and never
// assigns to an element or edits a message's slices or maps in place.
type ModelRequest struct {
	// System is the system prompt; the loop sends it as the one leading
	// system message.
	System   string
	Messages []model.Message
	// Tools is shared by the runs of a profile (tools.Set.Specs, and the
	// lists withTools made from it, known by their array): a wrapper that
	// changes the tools builds a new slice, never writes into this one or
	// reuses an array of its own for another call's list.
	Tools []model.ToolSpec
	// Context holds the sections of the trailing context message: what
	// changes during a run (the todo list, notes saved to memory), sent
	// after every other message so the request's prefix stays the same
	// from call to call (promptcontext.go). Append, never assign to an
	// element.
	Context []string
	// Model is the provider and ModelName its model name.
	Model     model.Model
	ModelName string
	// State is the run's state before the call; read it, never edit it.
	State *state.State
	// ownSystem says System holds a section of the run's own (its
	// memory): the sections appended after it are not shared
	// (prompttext.go).
	ownSystem bool
}

// Clone deep-copies the request for a wrapper that edits it.
func (r *ModelRequest) Clone() *ModelRequest {
	c := *r
	c.Messages = model.CloneMessages(r.Messages)
	c.Tools = append([]model.ToolSpec(nil), r.Tools...)
	c.Context = append([]string(nil), r.Context...)
	return &c
}

// ModelResponse is a model call's result plus an optional state update
// applied after the call (the way a wrapper persists something).
type ModelResponse struct {
	Response *model.Response
	Update   state.Update
	// Usage, when a wrapper set it (token_usage), is the usage the loop
	// records on the response's message instead of its own reading.
	Usage *Usage
}

// ModelHandler performs (the rest of) a model call.
type ModelHandler func(ctx context.Context, req *ModelRequest) (*ModelResponse, error)

// WrapModelCall wraps every model call; the first middleware is outermost.
// A wrapper may call next zero times (short-circuit) or several (retry).
type WrapModelCall interface {
	WrapModelCall(ctx context.Context, rt *Runtime, req *ModelRequest, next ModelHandler) (*ModelResponse, error)
}

// ToolCall is one tool call as the tool wrappers see it.
type ToolCall struct {
	Call model.ToolCall
	// Tool is nil when the run may not use a tool of that name.
	Tool  tools.Tool
	State *state.State
	// Env is what the tool gets of the run (workdir, identity).
	Env *tools.Env
}

// ToolResult is a tool call's result: the tool message, an optional state
// update, and an optional interrupt that pauses the run after the batch.
type ToolResult struct {
	Message   model.Message
	Update    state.Update
	Interrupt *protocol.Interrupt
}

// ToolHandler performs (the rest of) a tool call.
type ToolHandler func(ctx context.Context, call *ToolCall) (*ToolResult, error)

// WrapToolCall wraps every tool call; the first middleware is outermost.
type WrapToolCall interface {
	WrapToolCall(ctx context.Context, rt *Runtime, call *ToolCall, next ToolHandler) (*ToolResult, error)
}

// Runtime is the run a middleware works in: its identity and the resources
// resolved for it before the chain was built. Middlewares enforce at their
// boundary and never re-authorise.
type Runtime struct {
	RunID    string
	ThreadID string
	Tenant   string
	Agent    string
	Config   protocol.RunConfig
	// Resume is the value of a command run, nil otherwise.
	Resume []byte
	// User owns per-user data (memory); "default" when the run names none.
	User string
	// Principal is who submitted the run (nil: a submitter that names
	// none); a subagent run inherits its lead's.
	Principal *protocol.Principal
	// Files is the thread's workdir, nil when the deployment has none.
	Files files.Workdir
	// NoImages is set when the run's model takes no image input (the
	// profile's or models[].vision false): the loop sends it image parts
	// as text notes, and a middleware that would show it an image sends
	// a note instead.
	NoImages bool
	// Step counts the model calls of this run so far.
	Step int
	// Tools are the tools this run may call.
	Tools  *tools.Set
	Logger *zap.Logger
	// Metrics receives the run's measurements (model calls, tokens,
	// retries); nil records nothing.
	Metrics metrics.Recorder
	// Emit publishes a run event of the given type; data is encoded as
	// JSON. Types a middleware invents go to the custom kind unless the
	// middleware documents another.
	Emit func(eventType string, data any)
	// Subagents starts and follows the subagent runs of a lead run (nil
	// when the process serves none).
	Subagents Delegator
	// Preempt is done when the run must stop at its next safe boundary:
	// a steer, or (cause ErrHandOff) the worker handing the run to
	// another. A tool call waiting a long time (for a subagent) ends its
	// wait on it. Nil when nothing preempts the run.
	Preempt context.Context
	// scratch holds per-run, non-persisted values of middlewares; parallel
	// tool calls may reach it at once.
	mu      sync.Mutex
	scratch []scratchEntry
}

// scratchEntry is one per-run scratch value. A run holds a handful (one
// or two per middleware that keeps any), so a slice searched in order
// costs less than a map, which every run would build and grow.
type scratchEntry struct {
	key string
	v   any
}

// Scratch returns the per-run scratch value stored under key, creating it
// with init on first use. Scratch is never persisted: anything that must
// survive a worker loss belongs in state.
func Scratch[T any](rt *Runtime, key string, init func() T) T {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for i := range rt.scratch {
		if rt.scratch[i].key == key {
			return rt.scratch[i].v.(T)
		}
	}
	if rt.scratch == nil {
		// The lead profile's run keeps about eight; a run that keeps
		// more grows the slice once.
		rt.scratch = make([]scratchEntry, 0, 8)
	}
	v := init()
	rt.scratch = append(rt.scratch, scratchEntry{key: key, v: v})
	return v
}

// Chain is an ordered list of middlewares with its hooks resolved once.
type Chain struct {
	all         []Middleware
	beforeAgent []BeforeAgent
	beforeModel []BeforeModel
	afterModel  []AfterModel
	afterAgent  []AfterAgent
	wrapModel   []WrapModelCall
	wrapTool    []WrapToolCall
}

// NewChain builds a chain from segments (base, user, tail), in order.
// Names must be unique.
func NewChain(segments ...[]Middleware) (*Chain, error) {
	c := &Chain{}
	seen := make(map[string]bool)
	for _, seg := range segments {
		for _, m := range seg {
			if m == nil {
				continue
			}
			name := m.Name()
			if name == "" {
				return nil, fmt.Errorf("middleware %T has an empty name", m)
			}
			if seen[name] {
				return nil, fmt.Errorf("middleware %q appears twice in the chain", name)
			}
			seen[name] = true
			c.all = append(c.all, m)
			if h, ok := m.(BeforeAgent); ok {
				c.beforeAgent = append(c.beforeAgent, h)
			}
			if h, ok := m.(BeforeModel); ok {
				c.beforeModel = append(c.beforeModel, h)
			}
			if h, ok := m.(AfterModel); ok {
				c.afterModel = append(c.afterModel, h)
			}
			if h, ok := m.(AfterAgent); ok {
				c.afterAgent = append(c.afterAgent, h)
			}
			if h, ok := m.(WrapModelCall); ok {
				c.wrapModel = append(c.wrapModel, h)
			}
			if h, ok := m.(WrapToolCall); ok {
				c.wrapTool = append(c.wrapTool, h)
			}
		}
	}
	return c, nil
}

// Middlewares returns the chain's middlewares in order.
func (c *Chain) Middlewares() []Middleware { return append([]Middleware(nil), c.all...) }

// Names returns the middleware names in order.
func (c *Chain) Names() []string {
	names := make([]string, len(c.all))
	for i, m := range c.all {
		names[i] = m.Name()
	}
	return names
}

// Hook identifies a before/after hook kind.
type Hook int

const (
	HookBeforeAgent Hook = iota
	HookBeforeModel
	HookAfterModel
	HookAfterAgent
)

// RunHooks runs every hook of one kind in its order, applying each result's
// update to st before the next hook sees it, and merging the updates into
// one. It stops at the first jump or error.
func (c *Chain) RunHooks(ctx context.Context, hook Hook, rt *Runtime, st *state.State) (Result, error) {
	var out Result
	// The hook's name is looked up only for an error: most hooks of a
	// run have nothing to do and return none.
	apply := func(h any, r Result, err error) (bool, error) {
		if err != nil {
			return true, fmt.Errorf("middleware %s: %w", nameOf(h), err)
		}
		if !r.Update.Empty() {
			st.Apply(r.Update)
			out.Update.Merge(r.Update)
		}
		if r.Interrupt != nil {
			out.Interrupt = r.Interrupt
			return true, nil
		}
		if r.Jump != JumpNone {
			out.Jump, out.StopReason = r.Jump, r.StopReason
			return true, nil
		}
		return false, nil
	}
	switch hook {
	case HookBeforeAgent:
		for _, h := range c.beforeAgent {
			r, err := h.BeforeAgent(ctx, rt, st)
			if stop, err := apply(h, r, err); stop {
				return out, err
			}
		}
	case HookBeforeModel:
		for _, h := range c.beforeModel {
			r, err := h.BeforeModel(ctx, rt, st)
			if stop, err := apply(h, r, err); stop {
				return out, err
			}
		}
	case HookAfterModel:
		for i := len(c.afterModel) - 1; i >= 0; i-- {
			h := c.afterModel[i]
			r, err := h.AfterModel(ctx, rt, st)
			if stop, err := apply(h, r, err); stop {
				return out, err
			}
		}
	case HookAfterAgent:
		for i := len(c.afterAgent) - 1; i >= 0; i-- {
			h := c.afterAgent[i]
			r, err := h.AfterAgent(ctx, rt, st)
			// After-agent hooks all run; a jump here has nowhere to go.
			if _, err := apply(h, Result{Update: r.Update}, err); err != nil {
				return out, err
			}
		}
	}
	return out, nil
}

func nameOf(h any) string {
	if m, ok := h.(Middleware); ok {
		return m.Name()
	}
	return fmt.Sprintf("%T", h)
}

// ModelCall composes the model wrappers around base, first outermost.
//
// Frames: while the model answers, every wrapper's frame is on the run's
// goroutine stack, under the agent loop's and the worker's, and a
// goroutine's stack is sized by the deepest point it ever reached (a
// power of two, shrunk by the collector only below a quarter in use). A
// run waits on its model for nearly all of its life, so a wrapper builds
// its request and reads the answer in helpers that have returned by then,
// and calls next from a small frame: that keeps a waiting run within a
// 16 KiB stack instead of 32 KiB (operations.md, "Memory per run").
func (c *Chain) ModelCall(rt *Runtime, base ModelHandler) ModelHandler {
	h := base
	for i := len(c.wrapModel) - 1; i >= 0; i-- {
		w, next := c.wrapModel[i], h
		h = func(ctx context.Context, req *ModelRequest) (*ModelResponse, error) {
			return w.WrapModelCall(ctx, rt, req, next)
		}
	}
	return h
}

// ToolCall composes the tool wrappers around base, first outermost.
func (c *Chain) ToolCall(rt *Runtime, base ToolHandler) ToolHandler {
	h := base
	for i := len(c.wrapTool) - 1; i >= 0; i-- {
		w, next := c.wrapTool[i], h
		h = func(ctx context.Context, call *ToolCall) (*ToolResult, error) {
			return w.WrapToolCall(ctx, rt, call, next)
		}
	}
	return h
}

type messageIDKey struct{}

// WithMessageID returns ctx carrying the id the assistant message of the
// model call in progress will have (its deltas are streamed under it).
func WithMessageID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, messageIDKey{}, id)
}

// MessageID returns the id set by WithMessageID, or "".
func MessageID(ctx context.Context) string {
	id, _ := ctx.Value(messageIDKey{}).(string)
	return id
}
