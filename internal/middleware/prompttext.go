package middleware

// Shared request parts. A waiting run holds its model call's request for
// as long as the model takes (nearly all of its life), so what that
// request carries is what a run costs in memory. The parts that are the
// same for every run of a profile (the system prompt a guide or the date
// extends, the tool list a middleware adds its tool to) are built to the
// size they need, and the system prompts are shared between the runs
// that build the same one (operations.md, "Memory per run").

import (
	"bytes"
	"sync"

	"github.com/natsagent/natsagent/internal/model"
)

// appendSection returns system with section appended as a paragraph of
// its own.
func appendSection(system, section string) string {
	if section == "" {
		return system
	}
	if system == "" {
		return section
	}
	return system + "\n\n" + section
}

// sharedCache maps a key to the one value the runs that build it share.
// It holds at most maxShared entries: one that no other run will find (a
// tool list a policy filtered for one run) still takes a place, and when
// such entries fill it, it starts over, so it stays small whatever the
// runs build. A prompt a thread's memory extended is kept out of it
// (appendShared).
type sharedCache[K comparable, V any] struct {
	mu sync.Mutex
	m  map[K]V
}

// maxShared bounds each shared cache: a deployment has a few profiles,
// each with a few variants (the date, the skills listed, the switches).
const maxShared = 64

func (c *sharedCache[K, V]) get(k K) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.m[k]
	return v, ok
}

func (c *sharedCache[K, V]) put(k K, v V) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= maxShared {
		c.m = make(map[K]V)
	}
	c.m[k] = v
}

// sharedPrompts maps a system prompt and the section appended to it to
// the one copy of the result the runs share.
var sharedPrompts sharedCache[[2]string, string]

// appendShared appends a section that is the same for many runs (a
// guide, the date, the skills listed, the delegation prompt) to the
// request's system prompt: runs that build the same prompt share one
// copy of it. Once a section of the run's own is in the prompt
// (appendOwn), no other run builds what follows, so it is built without
// the cache: such prompts would fill it, it would start over, and the
// profile's shared prompts would be built anew for every run.
func (r *ModelRequest) appendShared(section string) {
	if r.ownSystem || section == "" || r.System == "" {
		r.System = appendSection(r.System, section)
		return
	}
	k := [2]string{r.System, section}
	if p, ok := sharedPrompts.get(k); ok {
		r.System = p
		return
	}
	r.System = appendSection(r.System, section)
	sharedPrompts.put(k, r.System)
}

// appendOwn appends a section that is a run's or a thread's own (its
// memory) to the request's system prompt, which is then the run's own.
func (r *ModelRequest) appendOwn(section string) {
	if section == "" {
		return
	}
	r.System = appendSection(r.System, section)
	r.ownSystem = true
}

// withTools returns tools followed by add, in a slice of exactly that
// length and capacity: never written into tools' array, and an append by
// a later wrapper copies it in turn. The runs of a profile start from its
// tool set's one slice (tools.Set.Specs) and add the same tools to it, so
// one tool added to a slice seen before returns the list built then.
func withTools(tools []model.ToolSpec, add ...model.ToolSpec) []model.ToolSpec {
	if len(add) != 1 || len(tools) == 0 {
		return joinTools(tools, add)
	}
	k := toolsKey{first: &tools[0], n: len(tools), name: add[0].Name}
	if l, ok := sharedTools.get(k); ok && sameSpec(l.out[len(l.out)-1], add[0]) {
		return l.out
	}
	out := joinTools(tools, add)
	sharedTools.put(k, toolList{in: tools, out: out})
	return out
}

func joinTools(tools, add []model.ToolSpec) []model.ToolSpec {
	out := make([]model.ToolSpec, len(tools)+len(add))
	copy(out[copy(out, tools):], add)
	return out
}

// toolsKey names a tool list by the array it was built from: nobody
// writes into a request's tool list, and the entry holds that array
// (toolList.in), so no other list can take its address while the entry
// lives.
type toolsKey struct {
	first *model.ToolSpec
	n     int
	name  string
}

type toolList struct{ in, out []model.ToolSpec }

// sharedTools maps a tool list and the tool added to it to the list the
// runs share.
var sharedTools sharedCache[toolsKey, toolList]

// sameSpec reports whether two specs say the same.
func sameSpec(a, b model.ToolSpec) bool {
	return a.Name == b.Name && a.Description == b.Description && bytes.Equal(a.Parameters, b.Parameters)
}
