package middleware

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/suggest"
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
		// Assemble places tool_exclusion itself, around every other one.
		{Name: "tool_exclusion", Segment: SegmentTail},
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
	// places they hold; it may name user entries (by their names) to
	// order the user segment.
	Order []string `json:"order,omitempty"`
	// User is the user segment, in order. An entry whose name is an
	// optional built-in's replaces that built-in in its place (upsert).
	User []UserMiddleware `json:"user,omitempty"`
}

// UserMiddleware adds a configured middleware to the user segment: a
// built-in (Use), a middleware registered in code (Use, see Register), or
// an instance built in Go (Instance, which wins over Use).
type UserMiddleware struct {
	Use      string          `json:"use"`
	Name     string          `json:"name,omitempty"`
	Settings json.RawMessage `json:"settings,omitempty"`
	// Instance is a middleware built in code; it has no JSON form.
	Instance Middleware `json:"-"`
}

// ToolProvider is implemented by a middleware that offers tools of its own
// (write_todos, task, ask_clarification...): tool exclusion may name them.
type ToolProvider interface {
	ProvidedTools() []string
}

// ToolExclusionTrim names the innermost half of tool exclusion, which
// removes the excluded tools from the request the model receives.
const ToolExclusionTrim = "tool_exclusion_trim"

// toolExclusion is the built-in that Assemble places itself: the very
// last step on the tools, whatever the other middlewares added.
const toolExclusion = "tool_exclusion"

var (
	registryMu sync.RWMutex
	registered = map[string]func(json.RawMessage, Env) (Middleware, error){}
)

// Register makes a middleware defined in code available to configurations
// by name (user: [{use: name, settings: ...}]). A name that a built-in or
// an earlier registration holds is an error.
func Register(name string, build func(settings json.RawMessage, env Env) (Middleware, error)) error {
	if name == "" || build == nil {
		return fmt.Errorf("register middleware: a name and a build function are required")
	}
	for _, b := range Builtins() {
		if b.Name == name {
			return fmt.Errorf("register middleware %q: a built-in has that name; a user entry with it replaces the built-in", name)
		}
	}
	registryMu.Lock()
	defer registryMu.Unlock()
	if _, dup := registered[name]; dup {
		return fmt.Errorf("register middleware %q: already registered", name)
	}
	registered[name] = build
	return nil
}

func registeredBuild(name string) func(json.RawMessage, Env) (Middleware, error) {
	registryMu.RLock()
	defer registryMu.RUnlock()
	return registered[name]
}

func knownNames(all []Builtin) string {
	names := builtinNames(all)
	registryMu.RLock()
	for n := range registered {
		names = append(names, n)
	}
	registryMu.RUnlock()
	slices.Sort(names[len(all):])
	return strings.Join(names, ", ")
}

// placed is one middleware of the chain being assembled.
type placed struct {
	name    string
	seg     Segment
	builtin *Builtin // nil for a user entry that replaces nothing
	m       Middleware
}

// Assemble builds a profile's chain: the built-ins in their default order,
// as the configuration enables, orders and sets them, with the user
// segment between base and tail, and tool exclusion around everything.
// Every error names the setting at fault.
func Assemble(cfg ChainConfig, env Env) (*Chain, error) {
	all := Builtins()
	byName := make(map[string]Builtin, len(all))
	for _, b := range all {
		byName[b.Name] = b
	}
	if env.Kind == "" {
		env.Kind = KindLead
	}
	// Every mistake is collected, each with its path, so a person sees
	// them all at once; what depends on a part in error is not checked.
	var errs []error
	bad := func(path string, err error) { errs = append(errs, &SettingError{Path: path, Err: err}) }

	enabled := make(map[string]bool)
	settings := make(map[string]json.RawMessage)
	for _, name := range slices.Sorted(maps.Keys(cfg.Settings)) {
		raw := cfg.Settings[name]
		b, ok := byName[name]
		if !ok {
			bad("settings."+name, fmt.Errorf("unknown middleware%s (known: %s)", suggest.DidYouMean(name, builtinNames(all)), strings.Join(builtinNames(all), ", ")))
			continue
		}
		if b.UserOnly {
			bad("settings."+name, fmt.Errorf("add it to the user segment (user: [{use: %s, settings: ...}])", name))
			continue
		}
		on, rest, err := splitEnabled(raw)
		if err != nil {
			bad("settings."+name, err)
			continue
		}
		if on != nil {
			if !*on && b.Required {
				bad("settings."+name+".enabled", fmt.Errorf("%s keeps transcripts valid and cannot be disabled", name))
				continue
			}
			enabled[name] = *on
		}
		settings[name] = rest
	}
	limits, err := contextLimitsOf(settings["token_usage"])
	if err != nil {
		bad("settings.token_usage", err)
	}
	limits.Models = env.ContextWindows
	env.Context = limits

	// The user entries first: one named like a built-in takes its place.
	var user []placed
	replaces := make(map[string]Middleware)
	userNames := make(map[string]bool)
	for i, u := range cfg.User {
		m, err := buildUser(i, u, env, byName, all)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		name := m.Name()
		at := fmt.Sprintf("user[%d].name", i)
		if name == "" {
			bad(fmt.Sprintf("user[%d]", i), fmt.Errorf("middleware %T has an empty name", m))
			continue
		}
		if userNames[name] {
			bad(at, fmt.Errorf("%q is already in the chain; give each one a distinct name", name))
			continue
		}
		userNames[name] = true
		if b, ok := byName[name]; ok && !b.UserOnly {
			switch {
			case b.Required:
				bad(at, fmt.Errorf("%s keeps transcripts valid and cannot be replaced", name))
				continue
			case name == toolExclusion:
				bad(at, errors.New("tool_exclusion is configured with settings.tool_exclusion, not replaced"))
				continue
			case b.LeadOnly && env.Kind == KindSubagent:
				bad(at, fmt.Errorf("%s needs a human and cannot run in a subagent", name))
				continue
			}
			replaces[name] = m
			continue
		}
		user = append(user, placed{name: name, seg: SegmentUser, m: m})
	}

	var list []placed
	for _, b := range all {
		if b.UserOnly || b.Name == toolExclusion || (b.LeadOnly && env.Kind == KindSubagent) {
			continue
		}
		on, set := enabled[b.Name]
		_, replaced := replaces[b.Name]
		if !replaced && ((b.Off && !(set && on)) || (set && !on)) {
			continue
		}
		if b.Segment == SegmentTail && len(user) > 0 {
			list = append(list, user...)
			user = nil
		}
		list = append(list, placed{name: b.Name, seg: b.Segment, builtin: &b, m: replaces[b.Name]})
	}
	list = append(list, user...)
	if err := reorder(list, cfg.Order, byName); err != nil {
		errs = append(errs, err)
	}

	mws := make([]Middleware, 0, len(list)+2)
	for _, p := range list {
		if p.m == nil {
			m, err := p.builtin.Build(settings[p.name], env)
			if err != nil {
				bad("settings."+p.name, err)
				continue
			}
			p.m = m
		}
		mws = append(mws, p.m)
	}
	if len(errs) > 0 {
		// Tool exclusion and the order checks need the whole chain.
		return nil, errors.Join(errs...)
	}
	gate, trim, err := buildExclusion(enabled, settings[toolExclusion], env, mws)
	if err != nil {
		return nil, &SettingError{Path: "settings." + toolExclusion, Err: err}
	}
	chain, err := NewChain([]Middleware{gate}, mws, []Middleware{trim})
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
				errs = append(errs, &SettingError{Path: "order", Err: fmt.Errorf("%s must come after %s (it must see a model response before %s does)", b.Name, dep, dep)})
			}
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return chain, nil
}

// SettingError is one mistake of a chain's configuration: Path is where
// in it (settings.<middleware>, user[<i>].use, order[<i>]), as the
// profile's YAML spells it under middleware.
type SettingError struct {
	Path string
	Err  error
}

func (e *SettingError) Error() string { return e.Path + ": " + e.Err.Error() }

func (e *SettingError) Unwrap() error { return e.Err }

// buildUser builds one user entry: its instance, a built-in, or a
// middleware registered in code.
func buildUser(i int, u UserMiddleware, env Env, byName map[string]Builtin, all []Builtin) (Middleware, error) {
	if u.Instance != nil {
		return u.Instance, nil
	}
	raw := u.Settings
	if b, ok := byName[u.Use]; ok {
		if b.Required {
			return nil, &SettingError{Path: fmt.Sprintf("user[%d].use", i), Err: fmt.Errorf("%s is always in the chain already", u.Use)}
		}
		if b.LeadOnly && env.Kind == KindSubagent {
			return nil, &SettingError{Path: fmt.Sprintf("user[%d].use", i), Err: fmt.Errorf("%s needs a human and cannot run in a subagent", u.Use)}
		}
		if u.Use == toolExclusion {
			return nil, &SettingError{Path: fmt.Sprintf("user[%d].use", i), Err: errors.New("configure tool_exclusion with settings.tool_exclusion")}
		}
		if u.Name != "" {
			raw = withName(raw, u.Name)
		}
		m, err := b.Build(raw, env)
		if err != nil {
			return nil, &SettingError{Path: fmt.Sprintf("user[%d].settings", i), Err: fmt.Errorf("%s: %w", u.Use, err)}
		}
		return m, nil
	}
	build := registeredBuild(u.Use)
	if build == nil {
		return nil, &SettingError{Path: fmt.Sprintf("user[%d].use", i), Err: fmt.Errorf("unknown middleware %q%s (known: %s)", u.Use, suggest.DidYouMean(u.Use, strings.Split(knownNames(all), ", ")), knownNames(all))}
	}
	m, err := build(raw, env)
	if err != nil {
		return nil, &SettingError{Path: fmt.Sprintf("user[%d].settings", i), Err: fmt.Errorf("%s: %w", u.Use, err)}
	}
	if m == nil {
		return nil, &SettingError{Path: fmt.Sprintf("user[%d].use", i), Err: fmt.Errorf("%s: the registered build returned no middleware", u.Use)}
	}
	if u.Name != "" && m.Name() != u.Name {
		return nil, &SettingError{Path: fmt.Sprintf("user[%d].name", i), Err: fmt.Errorf("%s names itself %q; it cannot be renamed %q", u.Use, m.Name(), u.Name)}
	}
	return m, nil
}

// buildExclusion builds tool exclusion's two halves when it excludes
// anything: a tool named in exclude must be one the profile may use or
// one a middleware of the chain offers.
func buildExclusion(enabled map[string]bool, raw json.RawMessage, env Env, mws []Middleware) (Middleware, Middleware, error) {
	if on, set := enabled[toolExclusion]; set && !on {
		return nil, nil, nil
	}
	var t ToolExclusion
	if err := decodeSettings(raw, &t); err != nil {
		return nil, nil, err
	}
	if len(t.Exclude) == 0 {
		return nil, nil, nil
	}
	offered := make(map[string]bool)
	for _, m := range mws {
		if p, ok := m.(ToolProvider); ok {
			for _, n := range p.ProvidedTools() {
				offered[n] = true
			}
		}
	}
	known := func(name string) bool {
		return offered[name] || (env.KnownTool != nil && env.KnownTool(name))
	}
	ex, err := NewToolExclusion(t, known)
	if err != nil {
		return nil, nil, err
	}
	return ex, toolExclusionTrim{ex}, nil
}

// reorder rearranges the named middlewares among the places they hold.
func reorder(list []placed, order []string, byName map[string]Builtin) error {
	if len(order) == 0 {
		return nil
	}
	at := func(name string) int {
		return slices.IndexFunc(list, func(p placed) bool { return p.name == name })
	}
	var slots []int
	var moved []placed
	seen := make(map[string]bool)
	var seg Segment
	for i, name := range order {
		b, builtin := byName[name]
		k := at(name)
		switch {
		case name == toolExclusion:
			return &SettingError{Path: fmt.Sprintf("order[%d]", i), Err: errors.New("tool_exclusion is always the last step on the tools and keeps its place")}
		case builtin && b.Required:
			return &SettingError{Path: fmt.Sprintf("order[%d]", i), Err: fmt.Errorf("%s is required and keeps its place", name)}
		case k < 0 && builtin:
			return &SettingError{Path: fmt.Sprintf("order[%d]", i), Err: fmt.Errorf("%s is not enabled", name)}
		case k < 0:
			return &SettingError{Path: fmt.Sprintf("order[%d]", i), Err: fmt.Errorf("unknown middleware %q", name)}
		}
		if seen[name] {
			return &SettingError{Path: fmt.Sprintf("order[%d]", i), Err: fmt.Errorf("%s is listed twice", name)}
		}
		seen[name] = true
		if i == 0 {
			seg = list[k].seg
		} else if list[k].seg != seg {
			return &SettingError{Path: fmt.Sprintf("order[%d]", i), Err: fmt.Errorf("%s is in the %s segment and %s in the %s segment; order moves middlewares within one segment", name, list[k].seg, order[0], seg)}
		}
		slots = append(slots, k)
		moved = append(moved, list[k])
	}
	slices.Sort(slots)
	for i, k := range slots {
		list[k] = moved[i]
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
		if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			name = strings.Trim(name, `"`)
			return fmt.Errorf("invalid settings: unknown key %q%s", name, suggest.DidYouMean(name, settingKeys(reflect.TypeOf(v))))
		}
		return fmt.Errorf("invalid settings: %w", err)
	}
	return nil
}

// settingKeys lists the JSON keys of a settings type and of the objects
// it holds, for the nearest key to an unknown one (the decoder does not
// say at which depth it found it).
func settingKeys(t reflect.Type) []string {
	var out []string
	var walk func(t reflect.Type, depth int)
	walk = func(t reflect.Type, depth int) {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Map {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct || depth > 3 {
			return
		}
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "-" {
				continue
			}
			if f.Anonymous && name == "" {
				walk(f.Type, depth)
				continue
			}
			if name == "" {
				name = f.Name
			}
			if !slices.Contains(out, name) {
				out = append(out, name)
			}
			walk(f.Type, depth+1)
		}
	}
	walk(t, 0)
	return out
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
