package natsagent

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"

	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/protocol"
)

// Parts registered by name, for YAML configurations: every [Worker] of the
// process knows them.
var registry = struct {
	sync.RWMutex
	tools  map[string]Tool
	models map[string]Model
}{tools: map[string]Tool{}, models: map[string]Model{}}

// RegisterTool makes a tool defined in code available to every worker of
// the process, so an agent of the YAML configuration can list it by name
// (tools: [name]). A second tool of the same name is an error; a tool named
// like a built-in replaces the built-in.
func RegisterTool(t Tool) error {
	if t == nil {
		return fmt.Errorf("natsagent.RegisterTool: nil tool")
	}
	name := t.Spec().Name
	if !protocol.ValidToken(name) {
		return fmt.Errorf("natsagent.RegisterTool: tool name %q must match ^[A-Za-z0-9_-]{1,128}$", name)
	}
	registry.Lock()
	defer registry.Unlock()
	if _, dup := registry.tools[name]; dup {
		return fmt.Errorf("natsagent.RegisterTool: a tool named %q is already registered", name)
	}
	registry.tools[name] = t
	return nil
}

// RegisterMiddleware makes a middleware defined in code available to
// configurations by name: an agent's middleware.user entry
// {use: name, settings: {...}} calls build with the entry's settings (JSON;
// nil when it has none) once per agent, when the worker starts. The
// middleware built may name itself anything; named like an optional
// built-in, it replaces that built-in in its place.
func RegisterMiddleware(name string, build func(settings json.RawMessage) (Middleware, error)) error {
	if build == nil {
		return fmt.Errorf("natsagent.RegisterMiddleware(%q): nil build", name)
	}
	err := middleware.Register(name, func(raw json.RawMessage, _ middleware.Env) (Middleware, error) {
		return build(raw)
	})
	if err != nil {
		return fmt.Errorf("natsagent.RegisterMiddleware: %w", err)
	}
	return nil
}

// RegisterModel routes the model name to a provider defined in code: a run
// whose agent (in YAML or Go) or whose config.model names it is served by
// m; every other model name goes to the configured provider.
func RegisterModel(name string, m Model) error {
	if name == "" || m == nil {
		return fmt.Errorf("natsagent.RegisterModel: a name and a model are required")
	}
	registry.Lock()
	defer registry.Unlock()
	if _, dup := registry.models[name]; dup {
		return fmt.Errorf("natsagent.RegisterModel: a model named %q is already registered", name)
	}
	registry.models[name] = m
	return nil
}

func registeredTools() []Tool {
	registry.RLock()
	defer registry.RUnlock()
	names := make([]string, 0, len(registry.tools))
	for n := range registry.tools {
		names = append(names, n)
	}
	sort.Strings(names)
	out := make([]Tool, len(names))
	for i, n := range names {
		out[i] = registry.tools[n]
	}
	return out
}

// modelRouter sends a call to the provider registered for its model name,
// or to the fallback.
type modelRouter struct {
	fallback Model
	extra    map[string]Model
}

func newModelRouter(fallback Model, extra map[string]Model) Model {
	registry.RLock()
	routes := make(map[string]Model, len(registry.models)+len(extra))
	for n, m := range registry.models {
		routes[n] = m
	}
	registry.RUnlock()
	for n, m := range extra {
		routes[n] = m
	}
	if len(routes) == 0 {
		return fallback
	}
	return &modelRouter{fallback: fallback, extra: routes}
}

func (r *modelRouter) Generate(ctx context.Context, req *GenerateRequest, onDelta func(Delta)) (*GenerateResponse, error) {
	if m, ok := r.extra[req.Model]; ok {
		return m.Generate(ctx, req, onDelta)
	}
	return r.fallback.Generate(ctx, req, onDelta)
}
