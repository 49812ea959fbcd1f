package agent

import (
	"errors"
	"fmt"
	"slices"
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
	// Vision false: the model takes no image input, and image parts of
	// the transcript reach it as text notes naming their files; nil:
	// Resources.Vision of the run's model decides, else images are sent.
	Vision *bool
	// Kind is middleware.KindLead (default) or middleware.KindSubagent.
	Kind string
	// Subagents names the subagent profiles a lead may start (nil: every
	// one; empty: none).
	Subagents []string
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
		Tools:        append([]string{"current_time"}, tools.FileToolNames...),
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
	// Vision is false when the run's model takes no image input.
	Vision bool
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
	// source and selections resolve tools per run (remote tools).
	source     ToolSource
	selections map[string]toolSelection
	// subagents lists, per lead profile, the subagents it may start.
	subagents map[string][]middleware.SubagentInfo
	// toolPolicy narrows a run's tools to its principal's (nil: none).
	toolPolicy func(tenant string, p *protocol.Principal) func(name string) bool
	// vision is Resources.Vision.
	vision map[string]bool
}

// NewAgents checks every profile and assembles its chain, so a profile
// naming a tool that does not exist, or an impossible middleware
// configuration, fails at start rather than at run time. Chains hold no
// per-run state and are shared by all runs of a profile.
func NewAgents(m model.Model, reg *tools.Registry, profiles ...Profile) (*Agents, error) {
	return NewAgentsWith(Resources{Model: m, Tools: reg}, profiles...)
}

// Resources are the deployment's shared parts every profile's chain may
// use.
type Resources struct {
	Model model.Model
	Tools *tools.Registry
	// Memory is the per-user memory store (nil: no profile may enable
	// the memory middleware).
	Memory middleware.MemoryStore
	// Source supplies the tools resolved per run, for the run's tenant
	// (remote tools; nil: none).
	Source ToolSource
	// ContextWindows are the configured context windows by model name
	// (config models[]), consulted before the built-in table.
	ContextWindows map[string]int
	// Vision says, by model name (config models[].vision), whether a
	// model sees images; a model not named does.
	Vision map[string]bool
	// ToolPolicy returns which tools a run of a principal may use (nil
	// func, or a nil result: every tool); see policy.Policy.ToolFilter.
	ToolPolicy func(tenant string, p *protocol.Principal) func(name string) bool
}

// NewAgentsWith is NewAgents with every shared resource.
func NewAgentsWith(res Resources, profiles ...Profile) (*Agents, error) {
	m, reg := res.Model, res.Tools
	if m == nil {
		return nil, errors.New("agents need a model")
	}
	a := &Agents{profiles: make(map[string]Profile), chains: make(map[string]*middleware.Chain), model: m, tools: reg,
		source: res.Source, selections: make(map[string]toolSelection), toolPolicy: res.ToolPolicy, vision: res.Vision}
	if err := checkNamespace(reg, res.Source); err != nil {
		return nil, err
	}
	// Every mistake of every profile is collected (errors.Join of
	// *ProfileError), so a person sees them all at once.
	catalog, errs := subagentCatalog(profiles)
	a.subagents = catalog
	for _, p := range profiles {
		bad := func(path string, err error) {
			errs = append(errs, &ProfileError{Profile: p.Name, Path: path, Err: err})
		}
		if !protocol.ValidToken(p.Name) {
			errs = append(errs, fmt.Errorf("agent profile name %q is not valid", p.Name))
			continue
		}
		if _, dup := a.profiles[p.Name]; dup {
			errs = append(errs, fmt.Errorf("agent profile %q is defined twice", p.Name))
			continue
		}
		switch p.Kind {
		case "":
			p.Kind = middleware.KindLead
		case middleware.KindLead, middleware.KindSubagent:
		default:
			bad("kind", fmt.Errorf("%q is not lead or subagent", p.Kind))
			continue
		}
		sel := selectTools(p.Tools, res.Source)
		var known []string
		for _, n := range sel.static {
			if reg.Get(n) != nil {
				known = append(known, n)
				continue
			}
			_, err := reg.Select([]string{n})
			bad(fmt.Sprintf("tools[%d]", slices.Index(p.Tools, n)), err)
		}
		set, err := reg.Select(known)
		if err != nil {
			bad("tools", err)
			continue
		}
		chain, err := middleware.Assemble(p.Middleware, middleware.Env{
			Model:          m,
			KnownTool:      func(name string) bool { return set.Get(name) != nil || sel.selects(name) },
			Kind:           p.Kind,
			Tools:          reg,
			Memory:         res.Memory,
			Subagents:      catalog[p.Name],
			ContextWindows: res.ContextWindows,
		})
		if err != nil {
			for _, e := range unjoin(err) {
				if se, ok := e.(*middleware.SettingError); ok {
					bad("middleware."+se.Path, se.Err)
				} else {
					bad("middleware", e)
				}
			}
			continue
		}
		a.profiles[p.Name] = p
		a.chains[p.Name] = chain
		a.selections[p.Name] = sel
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return a, nil
}

// ProfileError is one mistake of a profile found when it is assembled:
// Path is where in the profile, as its YAML spells it (tools[2],
// subagents[0], middleware.settings.loop_detection, kind).
type ProfileError struct {
	Profile string
	Path    string
	Err     error
}

func (e *ProfileError) Error() string {
	return fmt.Sprintf("agent profile %q: %s: %v", e.Profile, e.Path, e.Err)
}

func (e *ProfileError) Unwrap() error { return e.Err }

// unjoin lists the errors an errors.Join holds (err alone otherwise).
func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
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
	if req.Parent != nil && p.Kind != middleware.KindSubagent {
		// A lead run as a child would nest subagents.
		return nil, fmt.Errorf("agent %q is not a subagent profile; a run with a parent must name one (kind: subagent)", req.Agent)
	}
	set, err := a.toolSet(p.Name, req.Tenant)
	if err != nil {
		return nil, err
	}
	chain := a.chains[p.Name]
	if err := checkSwitches(p.Name, chain, req.Config); err != nil {
		return nil, err
	}
	// The principal's tool policy is the last word on the run's tools:
	// the prepared set loses what it may not use (so no middleware lists
	// it), and the chain is held by the policy's gate and trim (so no
	// middleware's own tool escapes it). The run's switches narrow it
	// further, never widen it.
	var allow func(name string) bool
	if a.toolPolicy != nil {
		allow = a.toolPolicy(req.Tenant, req.Principal)
	}
	if off := switchedOffTools(req.Config); len(off) > 0 {
		policy := allow
		allow = func(name string) bool {
			return !slices.Contains(off, name) && (policy == nil || policy(name))
		}
	}
	if allow != nil {
		if set, err = filterTools(set, allow); err != nil {
			return nil, err
		}
		if chain, err = middleware.WithToolPolicy(chain, allow); err != nil {
			return nil, err
		}
	}
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
	// Named even when the provider's default answers: the span ("chat
	// <model>") and the model label say which model the run called.
	name = model.NameOf(a.model, name)
	return &Prepared{Profile: p, Model: a.model, ModelName: name, Tools: set, Chain: chain, MaxSteps: maxSteps, Vision: a.sees(p, name)}, nil
}

// sees reports whether a run of profile p on model name sends images to
// the model: the profile's vision, else the configured model's (as
// written, then without a provider/ prefix), else true.
func (a *Agents) sees(p Profile, name string) bool {
	if v, said := a.saysVision(p, name); said {
		return v
	}
	return true
}

// saysVision is what the profile p, else the models entry of the model
// name, says of whether the model sees images; said is false when neither
// says.
func (a *Agents) saysVision(p Profile, name string) (sees, said bool) {
	if p.Vision != nil {
		return *p.Vision, true
	}
	if v, ok := a.vision[name]; ok {
		return v, true
	}
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		if v, ok := a.vision[name[i+1:]]; ok {
			return v, true
		}
	}
	return false, false
}

// VisionGuesses are the models of the profiles whose view_image decides
// by the model's name whether it sees images, since nothing says it (not
// the profile's vision, its model's models entry, nor view_image's own),
// each with the guess (middleware.VisionModel). The worker logs them when
// it starts, so a wrong guess can be seen and corrected.
func (a *Agents) VisionGuesses() map[string]bool {
	var out map[string]bool
	for profile, p := range a.profiles {
		name := model.NameOf(a.model, p.Model)
		if _, said := a.saysVision(p, name); said || name == "" || !guessesVision(a.chains[profile]) {
			continue
		}
		if out == nil {
			out = make(map[string]bool)
		}
		out[name] = middleware.VisionModel(name)
	}
	return out
}

// guessesVision reports whether c has a view_image whose vision is unset.
func guessesVision(c *middleware.Chain) bool {
	for _, mw := range c.Middlewares() {
		if v, ok := mw.(*middleware.ViewImage); ok && v.VisionUnset() {
			return true
		}
	}
	return false
}

// filterTools returns the tools of set that allow keeps, in order.
func filterTools(set *tools.Set, allow func(name string) bool) (*tools.Set, error) {
	var keep []tools.Tool
	for _, n := range set.Names() {
		if allow(n) {
			keep = append(keep, set.Get(n))
		}
	}
	return tools.NewSet(keep...)
}

// switches are the per-run switches: the middleware each turns off or
// asks for, and the tools that middleware provides.
var switches = []struct {
	key, middleware string
	get             func(protocol.RunConfig) *bool
	tools           []string
}{
	{"clarification", "clarification", func(c protocol.RunConfig) *bool { return c.Clarification }, []string{middleware.ClarificationTool}},
	{"subagents", "subagents", func(c protocol.RunConfig) *bool { return c.Subagents }, middleware.SubagentTools},
	{"plan_mode", "todos", func(c protocol.RunConfig) *bool { return c.PlanMode }, []string{middleware.WriteTodosTool}},
}

// ErrSwitchUnavailable is the cause of a run that asked for a capability
// (config.clarification, subagents or plan_mode true) its agent profile
// does not have.
var ErrSwitchUnavailable = errors.New("the agent does not have what the run's config asks for")

// checkSwitches refuses a run that turns on what its profile's chain
// lacks: a switch only keeps or removes what the profile has.
func checkSwitches(agent string, chain *middleware.Chain, c protocol.RunConfig) error {
	for _, sw := range switches {
		if on := sw.get(c); on != nil && *on && !slices.Contains(chain.Names(), sw.middleware) {
			return fmt.Errorf("%w: config.%s is true, but agent %q has no %s middleware; leave config.%s out or false", ErrSwitchUnavailable, sw.key, agent, sw.middleware, sw.key)
		}
	}
	return nil
}

// switchedOffTools are the tools the run's switches turn off.
func switchedOffTools(c protocol.RunConfig) []string {
	var off []string
	for _, sw := range switches {
		if middleware.SwitchedOff(sw.get(c)) {
			off = append(off, sw.tools...)
		}
	}
	return off
}
