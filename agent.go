package natsagent

import (
	"encoding/json"
	"fmt"
	"maps"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/middleware"
)

// Agent is an agent defined in Go: what a YAML agents[] entry holds, plus
// parts that only code can give (tools, middleware and a model provider as
// values). A run names it with its Name.
type Agent struct {
	// Name is what runs ask for (RunRequest.Agent); "chatbot" replaces
	// the built-in lead agent.
	Name        string
	Description string
	// SystemPrompt is the agent's system prompt.
	SystemPrompt string
	// Model is the model name sent to the provider ("": the configured
	// one). A name given to RegisterModel, or to Provider, routes there.
	Model string
	// Provider serves this agent's model calls (nil: the worker's model).
	// It is routed by model name: set Model to a name of its own.
	Provider Model
	// Tools are tools defined in code this agent may call.
	Tools []Tool
	// ToolNames are further tools by name: built-in (current_time,
	// read_file...), registered with RegisterTool, MCP or remote tools.
	ToolNames []string
	// Middleware is the agent's user segment, in order, between the
	// built-in capabilities and the final governance. A middleware named
	// like an optional built-in replaces that built-in in its place.
	Middleware []Middleware
	// Settings configure built-in middlewares by name, as the YAML's
	// middleware.settings do (docs/middleware.md); values encode to JSON.
	Settings map[string]any
	// Disable removes optional built-in middlewares (title, todos...).
	Disable []string
	// Order rearranges middlewares within one segment (built-in names, or
	// the names of Middleware).
	Order []string
	// ExcludeTools hides tools from the model and refuses them when
	// called anyway; it is the last step on the tools, so it removes tools
	// middlewares add (write_todos, task, ask_clarification) too.
	ExcludeTools []string
	// Subagents are the subagents this agent may delegate to (the task
	// tool). None: every subagent the worker serves.
	Subagents []Agent
	// MaxSteps bounds model calls per run (0: 50).
	MaxSteps int
	// NoVision says the agent's model takes no image input: the images
	// of a run reach it as text notes naming their files in the
	// thread's workdir (the YAML's vision: false).
	NoVision bool
}

// profiles converts the agent, and its subagents, into the engine's
// profiles; kind is the agent's own.
func (a Agent) profiles(kind string) ([]agent.Profile, []Tool, map[string]Model, error) {
	var (
		out    []agent.Profile
		ts     []Tool
		models = map[string]Model{}
	)
	if a.Provider != nil {
		if a.Model == "" {
			return nil, nil, nil, fmt.Errorf("agent %q: a Provider needs a Model name to route by", a.Name)
		}
		models[a.Model] = a.Provider
	}
	chain, err := a.chainConfig()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("agent %q: %w", a.Name, err)
	}
	p := agent.Profile{
		Name:         a.Name,
		Description:  a.Description,
		SystemPrompt: a.SystemPrompt,
		Model:        a.Model,
		MaxSteps:     a.MaxSteps,
		Kind:         kind,
		Middleware:   chain,
		Tools:        append([]string(nil), a.ToolNames...),
	}
	if a.NoVision {
		sees := false
		p.Vision = &sees
	}
	for _, t := range a.Tools {
		if t == nil {
			return nil, nil, nil, fmt.Errorf("agent %q: a nil tool", a.Name)
		}
		p.Tools = append(p.Tools, t.Spec().Name)
		ts = append(ts, t)
	}
	if len(a.Subagents) > 0 {
		if kind == middleware.KindSubagent {
			return nil, nil, nil, fmt.Errorf("agent %q: a subagent has no subagents of its own", a.Name)
		}
		p.Subagents = []string{}
		for _, sa := range a.Subagents {
			sps, sts, sms, err := sa.profiles(middleware.KindSubagent)
			if err != nil {
				return nil, nil, nil, err
			}
			p.Subagents = append(p.Subagents, sa.Name)
			out = append(out, sps...)
			ts = append(ts, sts...)
			maps.Copy(models, sms)
		}
	}
	return append([]agent.Profile{p}, out...), ts, models, nil
}

func (a Agent) chainConfig() (middleware.ChainConfig, error) {
	c := middleware.ChainConfig{Order: a.Order}
	set := make(map[string]map[string]any)
	for name, v := range a.Settings {
		raw, err := json.Marshal(v)
		if err != nil {
			return c, fmt.Errorf("settings.%s: %w", name, err)
		}
		var m map[string]any
		if err := json.Unmarshal(raw, &m); err != nil {
			return c, fmt.Errorf("settings.%s: must encode to a JSON object: %w", name, err)
		}
		set[name] = m
	}
	with := func(name string) map[string]any {
		if set[name] == nil {
			set[name] = map[string]any{}
		}
		return set[name]
	}
	for _, name := range a.Disable {
		with(name)["enabled"] = false
	}
	if len(a.ExcludeTools) > 0 {
		ex := with("tool_exclusion")
		list, _ := ex["exclude"].([]any)
		for _, n := range a.ExcludeTools {
			list = append(list, n)
		}
		ex["exclude"] = list
	}
	if len(set) > 0 {
		c.Settings = make(map[string]json.RawMessage, len(set))
		for name, m := range set {
			raw, _ := json.Marshal(m)
			c.Settings[name] = raw
		}
	}
	for _, m := range a.Middleware {
		if m == nil {
			return c, fmt.Errorf("middleware: a nil middleware")
		}
		c.User = append(c.User, middleware.UserMiddleware{Instance: m})
	}
	return c, nil
}
