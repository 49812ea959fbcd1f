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

// maxSharedPrompts bounds the prompts kept for sharing: a deployment has
// a few profiles, each with a few variants (the date, the skills listed).
// A prompt a thread's memory extended before makes an entry no other run
// finds; when such entries fill the cache, it starts over, so it holds at
// most this many prompts whatever the runs build.
const maxSharedPrompts = 64

// sharedPrompts maps a system prompt and the section appended to it to
// the one copy of the result the runs share.
var sharedPrompts struct {
	mu sync.Mutex
	m  map[[2]string]string
}

// appendSharedSection is appendSection for a section that is the same
// for many runs (a guide, the date, the skills listed, the delegation
// prompt): runs that build the same prompt share one copy of it. A
// section that is a run's or a thread's own (its memory) goes through
// appendSection, so it never pushes the shared prompts out.
func appendSharedSection(system, section string) string {
	if section == "" || system == "" {
		return appendSection(system, section)
	}
	k := [2]string{system, section}
	sharedPrompts.mu.Lock()
	p, ok := sharedPrompts.m[k]
	sharedPrompts.mu.Unlock()
	if ok {
		return p
	}
	p = appendSection(system, section)
	sharedPrompts.mu.Lock()
	if sharedPrompts.m == nil || len(sharedPrompts.m) >= maxSharedPrompts {
		sharedPrompts.m = make(map[[2]string]string)
	}
	sharedPrompts.m[k] = p
	sharedPrompts.mu.Unlock()
	return p
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
	sharedTools.mu.Lock()
	l, ok := sharedTools.m[k]
	sharedTools.mu.Unlock()
	if ok && sameSpec(l.out[len(l.out)-1], add[0]) {
		return l.out
	}
	out := joinTools(tools, add)
	sharedTools.mu.Lock()
	if sharedTools.m == nil || len(sharedTools.m) >= maxSharedTools {
		sharedTools.m = make(map[toolsKey]toolList)
	}
	sharedTools.m[k] = toolList{in: tools, out: out}
	sharedTools.mu.Unlock()
	return out
}

func joinTools(tools, add []model.ToolSpec) []model.ToolSpec {
	out := make([]model.ToolSpec, len(tools)+len(add))
	copy(out[copy(out, tools):], add)
	return out
}

// maxSharedTools bounds the tool lists kept for sharing; a run whose
// list is its own (filtered by a policy) adds one that no other run
// finds, and when they fill the cache it starts over.
const maxSharedTools = 64

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

var sharedTools struct {
	mu sync.Mutex
	m  map[toolsKey]toolList
}

// sameSpec reports whether two specs say the same.
func sameSpec(a, b model.ToolSpec) bool {
	return a.Name == b.Name && a.Description == b.Description && bytes.Equal(a.Parameters, b.Parameters)
}
