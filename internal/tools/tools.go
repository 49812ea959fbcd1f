// Package tools owns the Tool interface, the set of tools a run may use,
// and the built-in tools. A tool gets its parsed arguments and returns
// text; it never sees the transcript, NATS or another run.
package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"
	// Embed the time zone database: current_time must not depend on the
	// host having one.
	_ "time/tzdata"

	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/state"
	"github.com/natsagent/natsagent/internal/suggest"
)

// Tool is something the model can call.
type Tool interface {
	Spec() model.ToolSpec
	// Call runs the tool. call.Args is the JSON object the model sent
	// (already checked to be valid JSON). An error becomes an error tool
	// result the model can read; it never fails the run.
	Call(ctx context.Context, call *Call) (*Result, error)
}

// Call is one invocation of a tool.
type Call struct {
	ID   string
	Name string
	Args json.RawMessage
	Env  *Env
}

// Env is what a tool may use of the run that calls it.
type Env struct {
	Tenant string
	Thread string
	Run    string
	// User owns per-user data (memory); "default" when the run names none.
	User string
	// Files is the thread's workdir, nil when the deployment has none.
	Files files.Workdir
	// State is the run's state when the tool batch started; read only.
	State *state.State
	// Emit publishes a run event.
	Emit func(eventType string, data any)
}

// Result is what a tool returns.
type Result struct {
	Content string
	// Error marks the result as an error the model should react to.
	Error bool
	// Update changes state (todos, activated skills...), persisted with
	// the tool batch.
	Update state.Update
}

// Text is a successful result with content s.
func Text(s string) *Result { return &Result{Content: s} }

// ErrNoWorkdir is returned by file tools when the run has no workdir.
var ErrNoWorkdir = errors.New("this run has no workdir: the deployment configures no file storage")

// Func builds a Tool from a spec and a function of the arguments.
func Func(spec model.ToolSpec, fn func(ctx context.Context, args json.RawMessage) (string, error)) Tool {
	return funcTool{spec: spec, fn: fn}
}

type funcTool struct {
	spec model.ToolSpec
	fn   func(ctx context.Context, args json.RawMessage) (string, error)
}

func (t funcTool) Spec() model.ToolSpec { return t.spec }
func (t funcTool) Call(ctx context.Context, call *Call) (*Result, error) {
	out, err := t.fn(ctx, call.Args)
	if err != nil {
		return nil, err
	}
	return Text(out), nil
}

// Set is the tools a run may use, by name. It never changes once built,
// so the runs of a profile share one (Registry.Select).
type Set struct {
	byName map[string]Tool
	order  []string
	// specs is what Specs returns: built once, shared by every model
	// call of every run that holds the set.
	specs []model.ToolSpec
}

// NewSet builds a set; two tools with one name is an error.
func NewSet(ts ...Tool) (*Set, error) {
	s := &Set{byName: make(map[string]Tool, len(ts)), order: make([]string, 0, len(ts)), specs: make([]model.ToolSpec, 0, len(ts))}
	for _, t := range ts {
		name := t.Spec().Name
		if name == "" {
			return nil, fmt.Errorf("tool %T has an empty name", t)
		}
		if _, dup := s.byName[name]; dup {
			return nil, fmt.Errorf("two tools are named %q", name)
		}
		s.byName[name] = t
		s.order = append(s.order, name)
		s.specs = append(s.specs, t.Spec())
	}
	return s, nil
}

// Get returns the named tool, or nil.
func (s *Set) Get(name string) Tool {
	if s == nil {
		return nil
	}
	return s.byName[name]
}

// Names lists the tool names in order.
func (s *Set) Names() []string {
	if s == nil {
		return nil
	}
	return append([]string(nil), s.order...)
}

// Specs lists the tool specs in order. The slice is the set's own,
// shared by everyone who holds the set: read it, never write into it (an
// append copies it, as its capacity is its length).
func (s *Set) Specs() []model.ToolSpec {
	if s == nil {
		return nil
	}
	return s.specs
}

// Registry holds every tool a deployment knows, from which agent profiles
// pick theirs.
type Registry struct {
	tools map[string]Tool
	// sets holds the sets Select built, by the names asked for: every run
	// of a profile asks for the same names, and shares one set. Register
	// forgets them.
	mu   sync.Mutex
	sets map[string]*Set
}

// NewRegistry returns a registry holding the built-in tools.
func NewRegistry() *Registry {
	r := &Registry{tools: make(map[string]Tool)}
	r.Register(CurrentTime())
	for _, t := range FileTools() {
		r.Register(t)
	}
	return r
}

// Register adds or replaces a tool.
func (r *Registry) Register(t Tool) {
	r.tools[t.Spec().Name] = t
	r.mu.Lock()
	r.sets = nil
	r.mu.Unlock()
}

// Get returns the named tool or nil.
func (r *Registry) Get(name string) Tool { return r.tools[name] }

// Names lists every registered tool, sorted.
func (r *Registry) Names() []string {
	names := make([]string, 0, len(r.tools))
	for n := range r.tools {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Select returns the set of the named tools, built on the first call for
// these names and shared after; an unknown name is an error that lists
// what exists.
func (r *Registry) Select(names []string) (*Set, error) {
	key := strings.Join(names, "\x00")
	r.mu.Lock()
	s := r.sets[key]
	r.mu.Unlock()
	if s != nil {
		return s, nil
	}
	s, err := r.build(names)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	if r.sets == nil {
		r.sets = make(map[string]*Set)
	}
	r.sets[key] = s
	r.mu.Unlock()
	return s, nil
}

// build makes the set of the named tools.
func (r *Registry) build(names []string) (*Set, error) {
	ts := make([]Tool, 0, len(names))
	for _, n := range names {
		t := r.tools[n]
		if t == nil {
			return nil, fmt.Errorf("unknown tool %q%s (known tools: %s)", n, suggest.DidYouMean(n, r.Names()), strings.Join(r.Names(), ", "))
		}
		ts = append(ts, t)
	}
	return NewSet(ts...)
}

// CurrentTime is a harmless built-in tool: it returns the current time,
// optionally in an IANA time zone.
func CurrentTime() Tool {
	return Func(model.ToolSpec{
		Name:        "current_time",
		Description: "Returns the current date and time. Optionally pass an IANA time zone such as Europe/Paris.",
		Parameters:  SchemaJSON[currentTimeArgs](),
	}, func(ctx context.Context, args json.RawMessage) (string, error) {
		var in currentTimeArgs
		if len(args) > 0 {
			if err := json.Unmarshal(args, &in); err != nil {
				return "", fmt.Errorf("arguments must be an object like {\"timezone\":\"UTC\"}: %v", err)
			}
		}
		loc := time.UTC
		if in.Timezone != "" {
			l, err := time.LoadLocation(in.Timezone)
			if err != nil {
				return "", fmt.Errorf("unknown time zone %q; use an IANA name such as Europe/Paris", in.Timezone)
			}
			loc = l
		}
		return time.Now().In(loc).Format(time.RFC1123Z), nil
	})
}

type currentTimeArgs struct {
	Timezone string `json:"timezone,omitempty" jsonschema:"IANA time zone name; UTC when omitted"`
}
