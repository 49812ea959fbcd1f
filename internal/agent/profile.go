package agent

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/tools"
)

// Profile is an agent a run can ask for by name.
type Profile struct {
	Name         string
	Description  string
	SystemPrompt string
	// Model is the model name sent to the provider ("" = provider default).
	Model string
	// Tools names the tools of the registry this agent may call.
	Tools []string
	// MaxSteps bounds model calls per run unless the run sets its own.
	MaxSteps int
	// Kind is middleware.KindLead (default) or middleware.KindSubagent.
	Kind string
	// Middleware configures the profile's chain.
	Middleware middleware.ChainConfig
}

// DefaultMaxSteps bounds model calls per run when a profile sets none.
const DefaultMaxSteps = 50

// ChatbotPrompt is the lead agent's built-in system prompt.
const ChatbotPrompt = "You are a helpful assistant running as a natsagent job. Use the tools you are given when they help, and answer concisely."

// Chatbot is the built-in lead profile.
func Chatbot() Profile {
	return Profile{
		Name:         protocol.DefaultAgent,
		Description:  "General assistant with the built-in tools.",
		SystemPrompt: ChatbotPrompt,
		Tools:        []string{"current_time"},
		MaxSteps:     DefaultMaxSteps,
	}
}

// Prepared is everything a run needs, resolved before its chain exists:
// the model, the tools it may call, the prompt and the chain.
type Prepared struct {
	Profile   Profile
	Model     model.Model
	ModelName string
	Tools     *tools.Set
	Chain     *middleware.Chain
	MaxSteps  int
}

// ErrUnknownAgent is returned for a run naming an agent that no profile
// defines.
var ErrUnknownAgent = errors.New("unknown agent")

// Agents resolves a run request to a prepared run.
type Agents struct {
	profiles map[string]Profile
	chains   map[string]*middleware.Chain
	model    model.Model
	tools    *tools.Registry
}

// NewAgents checks every profile and assembles its chain, so a profile
// naming a tool that does not exist, or an impossible middleware
// configuration, fails at start rather than at run time. Chains hold no
// per-run state and are shared by all runs of a profile.
func NewAgents(m model.Model, reg *tools.Registry, profiles ...Profile) (*Agents, error) {
	if m == nil {
		return nil, errors.New("agents need a model")
	}
	a := &Agents{profiles: make(map[string]Profile), chains: make(map[string]*middleware.Chain), model: m, tools: reg}
	for _, p := range profiles {
		if !protocol.ValidToken(p.Name) {
			return nil, fmt.Errorf("agent profile name %q is not valid", p.Name)
		}
		if _, dup := a.profiles[p.Name]; dup {
			return nil, fmt.Errorf("agent profile %q is defined twice", p.Name)
		}
		switch p.Kind {
		case "":
			p.Kind = middleware.KindLead
		case middleware.KindLead, middleware.KindSubagent:
		default:
			return nil, fmt.Errorf("agent profile %q: kind %q is not lead or subagent", p.Name, p.Kind)
		}
		set, err := reg.Select(p.Tools)
		if err != nil {
			return nil, fmt.Errorf("agent profile %q: %w", p.Name, err)
		}
		chain, err := middleware.Assemble(p.Middleware, middleware.Env{
			Model:     m,
			KnownTool: func(name string) bool { return set.Get(name) != nil },
			Kind:      p.Kind,
			Tools:     reg,
		})
		if err != nil {
			return nil, fmt.Errorf("agent profile %q: middleware %w", p.Name, err)
		}
		a.profiles[p.Name] = p
		a.chains[p.Name] = chain
	}
	return a, nil
}

// Chain returns the assembled chain of a profile.
func (a *Agents) Chain(name string) *middleware.Chain { return a.chains[name] }

// Names lists the profile names, sorted.
func (a *Agents) Names() []string {
	names := make([]string, 0, len(a.profiles))
	for n := range a.profiles {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Has reports whether an agent profile exists.
func (a *Agents) Has(name string) bool {
	_, ok := a.profiles[name]
	return ok
}

// Prepare resolves the profile, model, tools and chain of a run.
func (a *Agents) Prepare(req *protocol.RunRequest) (*Prepared, error) {
	p, ok := a.profiles[req.Agent]
	if !ok {
		return nil, fmt.Errorf("%w %q (known agents: %s)", ErrUnknownAgent, req.Agent, strings.Join(a.Names(), ", "))
	}
	set, err := a.tools.Select(p.Tools)
	if err != nil {
		return nil, err
	}
	chain := a.chains[p.Name]
	maxSteps := p.MaxSteps
	if maxSteps == 0 {
		maxSteps = DefaultMaxSteps
	}
	if n := req.Config.MaxSteps; n > 0 {
		maxSteps = n
	}
	name := p.Model
	if req.Config.Model != "" {
		name = req.Config.Model
	}
	return &Prepared{Profile: p, Model: a.model, ModelName: name, Tools: set, Chain: chain, MaxSteps: maxSteps}, nil
}
