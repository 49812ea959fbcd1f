package middleware

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/tools"
)

// Segment is one of the chain's three fixed parts.
type Segment int

const (
	// SegmentBase holds capabilities (files, skills, memory, subagents,
	// summarization, todos, tool-call repair, retries).
	SegmentBase Segment = iota
	// SegmentUser holds middlewares a profile adds.
	SegmentUser
	// SegmentTail holds final governance: guards, tool exclusion, usage,
	// approval, clarification last.
	SegmentTail
)

func (s Segment) String() string {
	return [...]string{"base", "user", "tail"}[s]
}

// Profile kinds: the lead agent and subagents assemble different chains
// from the same parts.
const (
	KindLead     = "lead"
	KindSubagent = "subagent"
)

// Env is what a middleware may need to be built: the model provider (for
// middlewares that call a model of their own) and the tool names a profile
// may use.
type Env struct {
	Model     model.Model
	KnownTool func(name string) bool
	Kind      string
	// Tools is the deployment's tool registry (all tools, not only the
	// profile's), for middlewares that reveal tools later (skills, tool
	// search).
	Tools *tools.Registry
	// Context is the agent's context window and summarization trigger
	// (token_usage's context_window and summarization_trigger_fraction),
	// one figure for the usage snapshot and context compression.
	Context ContextLimits
	// ContextWindows are the deployment's configured context windows by
	// model name (config models[]); Assemble puts them in Context.
	ContextWindows map[string]int
	// Memory is the deployment's per-user memory store (nil when the
	// process has none).
	Memory MemoryStore
	// Subagents are the subagents a lead profile may start (none for a
	// subagent).
	Subagents []SubagentInfo
}

// Builtin is a middleware the configuration can name.
type Builtin struct {
	Name    string
	Segment Segment
	// Required middlewares keep every transcript valid; they cannot be
	// disabled or moved.
	Required bool
	// Off means the middleware is in the chain only when its settings say
	// enabled: true.
	Off bool
	// LeadOnly middlewares need a human (approval, clarification) and are
	// never in a subagent's chain.
	LeadOnly bool
	// UserOnly middlewares are not in the default chain; a profile adds
	// them to its user segment, possibly several times under other names.
	UserOnly bool
	// After names middlewares that must come earlier in the chain when
	// both are present.
	After []string
	Build func(settings json.RawMessage, env Env) (Middleware, error)
}

// Builtins lists every built-in middleware in its default chain order.
// Later issues add theirs here at the position their semantics need.
func Builtins() []Builtin {
	return []Builtin{
		{Name: "tool_error_guard", Segment: SegmentBase, Required: true,
			Build: noSettings(ToolErrorGuard{})},
		{Name: "tool_call_repair", Segment: SegmentBase, Required: true,
			Build: noSettings(ToolCallRepair{})},
		{Name: "large_result_offload", Segment: SegmentBase,
			Build: build(NewLargeResultOffload)},
		{Name: "attachments", Segment: SegmentBase,
			Build: build(NewAttachments)},
		// [files]
		{Name: "skills", Segment: SegmentBase,
			Build: func(raw json.RawMessage, env Env) (Middleware, error) {
				var s Skills
				if err := decodeSettings(raw, &s); err != nil {
					return nil, err
				}
				return NewSkills(s, env.Tools)
			}},
		// [skills]
		{Name: "memory", Segment: SegmentBase, Off: true,
			Build: func(raw json.RawMessage, env Env) (Middleware, error) {
				var m Memory
				if err := decodeSettings(raw, &m); err != nil {
					return nil, err
				}
				return NewMemory(m, env)
			}},
		// [memory]
		{Name: "subagents", Segment: SegmentBase,
			Build: func(raw json.RawMessage, env Env) (Middleware, error) {
				var sa Subagents
				if err := decodeSettings(raw, &sa); err != nil {
					return nil, err
				}
				return NewSubagents(sa, env)
			}},
		// [subagents]
		{Name: "todos", Segment: SegmentBase,
			Build: build(NewTodos)},
		// [todos]
		{Name: "dynamic_context", Segment: SegmentBase,
			Build: build(NewDynamicContext)},
		{Name: "title", Segment: SegmentBase,
			Build: func(raw json.RawMessage, env Env) (Middleware, error) {
				var t Title
				if err := decodeSettings(raw, &t); err != nil {
					return nil, err
				}
				return NewTitle(t, env.Model)
			}},
		{Name: "context_compression", Segment: SegmentBase,
			Build: func(raw json.RawMessage, env Env) (Middleware, error) {
				var c ContextCompression
				if err := decodeSettings(raw, &c); err != nil {
					return nil, err
				}
				return NewContextCompression(c, env.Context)
			}},
		// [context_compression]
		{Name: "model_retry", Segment: SegmentBase,
			Build: func(raw json.RawMessage, env Env) (Middleware, error) {
				var r struct {
					MaxRetries           *int     `json:"max_retries"`
					NetworkBudgetSeconds *float64 `json:"network_budget_seconds"`
					Fallbacks            []string `json:"fallback_models"`
				}
				if err := decodeSettings(raw, &r); err != nil {
					return nil, err
				}
				retry := Retry{Fallbacks: r.Fallbacks}
				// Retry reads a zero as "the default"; a configured 0
				// means none.
				if n := r.MaxRetries; n != nil {
					if *n < 0 {
						return nil, fmt.Errorf("max_retries must not be negative")
					}
					retry.MaxRetries = cmp.Or(*n, -1)
				}
				if s := r.NetworkBudgetSeconds; s != nil {
					if *s < 0 {
						return nil, fmt.Errorf("network_budget_seconds must not be negative")
					}
					retry.NetworkBudget = cmp.Or(seconds(*s), -1)
				}
				return NewRetry(retry), nil
			}},
		{Name: "tool_call_limit", Segment: SegmentUser, UserOnly: true,
			Build: build(NewToolCallLimit)},
		{Name: "subagent_limit", Segment: SegmentTail, LeadOnly: true,
			Build: build(NewSubagentLimit)},
		// [subagent_limit]
		{Name: "loop_detection", Segment: SegmentTail,
			Build: build(NewLoopDetection)},
		{Name: "token_budget", Segment: SegmentTail, Off: true,
			Build: build(NewTokenBudget)},
		{Name: "tool_search", Segment: SegmentTail, Off: true,
			Build: build(NewToolSearch)},
		// [tool_search]
		{Name: "view_image", Segment: SegmentTail, Off: true,
			Build: build(NewViewImage)},
		// [view_image]
		{Name: "tool_exclusion", Segment: SegmentTail,
			Build: func(raw json.RawMessage, env Env) (Middleware, error) {
				var t ToolExclusion
				if err := decodeSettings(raw, &t); err != nil {
					return nil, err
				}
				known := env.KnownTool
				if known == nil {
					known = func(string) bool { return false }
				}
				return NewToolExclusion(t, known)
			}},
		{Name: "token_usage", Segment: SegmentTail,
			Build: func(raw json.RawMessage, env Env) (Middleware, error) {
				var t TokenUsage
				if err := decodeSettings(raw, &t); err != nil {
					return nil, err
				}
				t.Models = env.ContextWindows
				return NewTokenUsage(t)
			}},
		// [token_usage]
		{Name: "tool_approval", Segment: SegmentTail,
			Build: func(raw json.RawMessage, env Env) (Middleware, error) {
				var a ToolApproval
				if err := decodeSettings(raw, &a); err != nil {
					return nil, err
				}
				return NewToolApproval(a, env.Kind)
			}},
		// [approval]
		{Name: "safety_finish_reason", Segment: SegmentTail, After: []string{"loop_detection", "token_budget"},
			Build: build(NewSafetyFinishReason)},
		// [clarification]
		{Name: "clarification", Segment: SegmentTail, LeadOnly: true,
			Build: build(NewClarification)},
	}
}

// ChainConfig is a profile's middleware configuration.
type ChainConfig struct {
	// Settings configure built-in middlewares by name. Every optional one
	// accepts "enabled": false; those off by default need "enabled": true.
	Settings map[string]json.RawMessage `json:"settings,omitempty"`
	// Order rearranges optional middlewares of one segment among the
	// places they hold.
	Order []string `json:"order,omitempty"`
	// User is the user segment, in order.
	User []UserMiddleware `json:"user,omitempty"`
}

// UserMiddleware adds a configured middleware to the user segment.
type UserMiddleware struct {
	Use      string          `json:"use"`
	Name     string          `json:"name,omitempty"`
	Settings json.RawMessage `json:"settings,omitempty"`
}

// Assemble builds a profile's chain: the built-ins in their default order,
// as the configuration enables, orders and sets them, with the user
// segment between base and tail. Every error names the setting at fault.
func Assemble(cfg ChainConfig, env Env) (*Chain, error) {
	all := Builtins()
	byName := make(map[string]Builtin, len(all))
	for _, b := range all {
		byName[b.Name] = b
	}
	if env.Kind == "" {
		env.Kind = KindLead
	}

	enabled := make(map[string]bool)
	settings := make(map[string]json.RawMessage)
	for name, raw := range cfg.Settings {
		b, ok := byName[name]
		if !ok {
			return nil, fmt.Errorf("settings.%s: unknown middleware (known: %s)", name, strings.Join(builtinNames(all), ", "))
		}
		if b.UserOnly {
			return nil, fmt.Errorf("settings.%s: add it to the user segment (user: [{use: %s, settings: ...}])", name, name)
		}
		on, rest, err := splitEnabled(raw)
		if err != nil {
			return nil, fmt.Errorf("settings.%s: %w", name, err)
		}
		if on != nil {
			if !*on && b.Required {
				return nil, fmt.Errorf("settings.%s.enabled: %s keeps transcripts valid and cannot be disabled", name, name)
			}
			enabled[name] = *on
		}
		settings[name] = rest
	}
	limits, err := contextLimitsOf(settings["token_usage"])
	if err != nil {
		return nil, fmt.Errorf("settings.token_usage: %w", err)
	}
	limits.Models = env.ContextWindows
	env.Context = limits

	var names []string
	for _, b := range all {
		if b.UserOnly || (b.LeadOnly && env.Kind == KindSubagent) {
			continue
		}
		on, set := enabled[b.Name]
		if (b.Off && !(set && on)) || (set && !on) {
			continue
		}
		names = append(names, b.Name)
	}
	if err := reorder(names, cfg.Order, byName); err != nil {
		return nil, err
	}

	var segs [3][]Middleware
	for _, name := range names {
		b := byName[name]
		m, err := b.Build(settings[name], env)
		if err != nil {
			return nil, fmt.Errorf("settings.%s: %w", name, err)
		}
		segs[b.Segment] = append(segs[b.Segment], m)
	}
	used := make(map[string]bool)
	for _, n := range names {
		used[n] = true
	}
	for i, u := range cfg.User {
		b, ok := byName[u.Use]
		if !ok {
			return nil, fmt.Errorf("user[%d].use: unknown middleware %q (known: %s)", i, u.Use, strings.Join(builtinNames(all), ", "))
		}
		if b.Required {
			return nil, fmt.Errorf("user[%d].use: %s is always in the chain already", i, u.Use)
		}
		if b.LeadOnly && env.Kind == KindSubagent {
			return nil, fmt.Errorf("user[%d].use: %s needs a human and cannot run in a subagent", i, u.Use)
		}
		raw := u.Settings
		if u.Name != "" {
			raw = withName(raw, u.Name)
		}
		m, err := b.Build(raw, env)
		if err != nil {
			return nil, fmt.Errorf("user[%d] (%s): %w", i, u.Use, err)
		}
		if used[m.Name()] {
			return nil, fmt.Errorf("user[%d].name: %q is already in the chain; give each one a distinct name", i, m.Name())
		}
		used[m.Name()] = true
		segs[SegmentUser] = append(segs[SegmentUser], m)
	}
	chain, err := NewChain(segs[SegmentBase], segs[SegmentUser], segs[SegmentTail])
	if err != nil {
		return nil, err
	}
	pos := make(map[string]int)
	for i, n := range chain.Names() {
		pos[n] = i
	}
	for _, b := range all {
		p, ok := pos[b.Name]
		if !ok {
			continue
		}
		for _, dep := range b.After {
			if q, ok := pos[dep]; ok && q > p {
				return nil, fmt.Errorf("order: %s must come after %s (it must see a model response before %s does)", b.Name, dep, dep)
			}
		}
	}
	return chain, nil
}

// reorder rearranges the named middlewares among the places they hold.
func reorder(names []string, order []string, byName map[string]Builtin) error {
	if len(order) == 0 {
		return nil
	}
	var slots []int
	seen := make(map[string]bool)
	var seg Segment
	for i, name := range order {
		b, ok := byName[name]
		if !ok {
			return fmt.Errorf("order[%d]: unknown middleware %q", i, name)
		}
		if b.Required {
			return fmt.Errorf("order[%d]: %s is required and keeps its place", i, name)
		}
		if seen[name] {
			return fmt.Errorf("order[%d]: %s is listed twice", i, name)
		}
		seen[name] = true
		if i == 0 {
			seg = b.Segment
		} else if b.Segment != seg {
			return fmt.Errorf("order[%d]: %s is in the %s segment and %s in the %s segment; order moves middlewares within one segment", i, name, b.Segment, order[0], seg)
		}
		at := slices.Index(names, name)
		if at < 0 {
			return fmt.Errorf("order[%d]: %s is not enabled", i, name)
		}
		slots = append(slots, at)
	}
	slices.Sort(slots)
	for i, at := range slots {
		names[at] = order[i]
	}
	return nil
}

func builtinNames(all []Builtin) []string {
	out := make([]string, len(all))
	for i, b := range all {
		out[i] = b.Name
	}
	return out
}

// noSettings is the Build of a middleware without settings: any key
// besides "enabled" is an error.
func noSettings(m Middleware) func(json.RawMessage, Env) (Middleware, error) {
	return func(raw json.RawMessage, _ Env) (Middleware, error) {
		if err := decodeSettings(raw, &struct{}{}); err != nil {
			return nil, err
		}
		return m, nil
	}
}

// build adapts a typed constructor to Builtin.Build.
func build[T any, M Middleware](ctor func(T) (M, error)) func(json.RawMessage, Env) (Middleware, error) {
	return func(raw json.RawMessage, _ Env) (Middleware, error) {
		var v T
		if err := decodeSettings(raw, &v); err != nil {
			return nil, err
		}
		return ctor(v)
	}
}

// decodeSettings decodes settings strictly: an unknown key is an error.
func decodeSettings(raw json.RawMessage, v any) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		// Say what the key takes in words, not as a Go type.
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return fmt.Errorf("invalid settings: %s must be %s, not a JSON %s", te.Field, settingKind(te.Type), te.Value)
		}
		return fmt.Errorf("invalid settings: %w", err)
	}
	return nil
}

// settingKind names what a setting of type t takes.
func settingKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.Map, reflect.Struct:
		return "a mapping"
	}
	return "another kind of value"
}

// splitEnabled removes the "enabled" key from settings.
func splitEnabled(raw json.RawMessage) (*bool, json.RawMessage, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, nil, fmt.Errorf("settings must be an object: %w", err)
	}
	e, ok := m["enabled"]
	if !ok {
		return nil, raw, nil
	}
	var on bool
	if err := json.Unmarshal(e, &on); err != nil {
		return nil, nil, fmt.Errorf("enabled must be true or false")
	}
	delete(m, "enabled")
	rest, _ := json.Marshal(m)
	return &on, rest, nil
}

func withName(raw json.RawMessage, name string) json.RawMessage {
	m := map[string]json.RawMessage{}
	if len(raw) > 0 {
		_ = json.Unmarshal(raw, &m)
	}
	m["name"], _ = json.Marshal(name)
	out, _ := json.Marshal(m)
	return out
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
