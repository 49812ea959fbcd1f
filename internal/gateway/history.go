package gateway

import (
	"cmp"
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"time"

	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/langgraph"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
)

// threadGraph is a thread's checkpoints as history shows them: the chain
// from the head and the branches time travel left behind (reached through
// Delta.Replaced), newest first. Rolled-back runs and writes of a lost
// lease are on no branch and stay out. A run's delta that holds several
// steps (its input, a model response, tool results) is shown as one
// checkpoint per step, as LangGraph stores one per super-step: the steps
// before the last are derived on each read (steps), never stored. It is
// built from the stored deltas on each read: nothing is cached, and
// storage stays one delta per write.
type threadGraph struct {
	th *protocol.Thread
	// byID holds the checkpoints as history shows them: the derived steps
	// and the stored deltas (a split one holding its last step only).
	byID  map[string]*kv.Delta
	order []*kv.Delta // newest first, as byID holds them
	// stored are the stored deltas on the history, newest first, as
	// written.
	stored []*kv.Delta
	// raw holds every stored delta by id, on the history or not.
	raw   map[string]*kv.Delta
	depth map[string]int
	// input is the thread's input checkpoint (nil without checkpoints).
	input *kv.Delta
	// enc encodes the messages of the states one response shows.
	enc langgraph.Encoder
}

// inputCheckpoint is the id of a thread's first state, before any input:
// LangGraph's "input" checkpoint (step -1, empty values). It is not
// stored: history shows it as the parent of every checkpoint without one,
// so a run or state update from it starts the thread over on a new branch,
// as editing a thread's first message in a LangGraph UI does (useStream
// forks from the parent of the checkpoint that first shows a message).
const inputCheckpoint = "input"

// sourceInput is the metadata source of the input checkpoint.
const sourceInput = "input"

// loadGraph reads a thread's checkpoints.
func (s *Server) loadGraph(ctx context.Context, th *protocol.Thread) (*threadGraph, error) {
	g := &threadGraph{th: th, depth: map[string]int{}}
	if th.Head == "" {
		return g, nil
	}
	byID, err := s.stores.Checkpoints.All(ctx, th.Tenant, th.ThreadID)
	if err != nil {
		return nil, err
	}
	// The chain from the head must be whole (asked of the leader when a
	// replica lags); a branch left behind may have lost checkpoints to
	// retention, and is shown as far as it is whole.
	if _, err := s.stores.Checkpoints.Chain(ctx, th.Tenant, th.ThreadID, th.Head, byID); err != nil {
		return nil, err
	}
	view := make(map[string]*kv.Delta, len(byID))
	for _, d := range byID {
		for _, v := range steps(d) {
			view[v.ID] = v
		}
	}
	for _, d := range byID {
		if d.At != "" && view[d.At] == nil {
			// The step's delta is gone (retention): the checkpoint is
			// shown on its stored parent, whose state it holds.
			v := *view[d.ID]
			v.Parent = d.Parent
			view[d.ID] = &v
		}
	}
	g.byID, g.raw = view, byID
	eff := map[string]time.Time{}
	// whole reports whether every ancestor of id is stored, and sets its
	// depth and its order time: never before its parent's, nor before the
	// head it replaced, so a branch sorts after what it came from.
	var whole func(id string, seen int) bool
	whole = func(id string, seen int) bool {
		if _, ok := g.depth[id]; ok {
			return true
		}
		d, ok := view[id]
		if !ok || seen > len(view) {
			return false
		}
		t, depth := d.Time, 0
		if d.Parent != "" {
			if !whole(d.Parent, seen+1) {
				return false
			}
			depth = g.depth[d.Parent] + 1
			t = later(t, eff[d.Parent])
		}
		if d.Replaced != "" && whole(d.Replaced, seen+1) {
			t = later(t, eff[d.Replaced])
		}
		g.depth[id], eff[id] = depth, t
		return true
	}
	reached := map[string]bool{}
	for todo := []string{th.Head}; len(todo) > 0; {
		id := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
		if reached[id] || !whole(id, 0) {
			continue
		}
		reached[id] = true
		d := view[id]
		g.order = append(g.order, d)
		if d.Parent != "" {
			todo = append(todo, d.Parent)
		}
		if d.Replaced != "" {
			todo = append(todo, d.Replaced)
		}
	}
	slices.SortFunc(g.order, func(a, b *kv.Delta) int {
		if c := eff[b.ID].Compare(eff[a.ID]); c != 0 {
			return c
		}
		if c := cmp.Compare(g.depth[b.ID], g.depth[a.ID]); c != 0 {
			return c
		}
		return cmp.Compare(b.ID, a.ID)
	})
	for _, d := range g.order {
		if sd, ok := byID[d.ID]; ok {
			g.stored = append(g.stored, sd)
		}
	}
	if n := len(g.order); n > 0 {
		g.input = &kv.Delta{ID: inputCheckpoint, Source: sourceInput, Time: g.order[n-1].Time}
		g.depth[inputCheckpoint] = -1
	}
	return g, nil
}

// stepMark joins a run delta's id and the index of a step derived inside
// it ("e3-1_s0"): stored ids never hold it.
const stepMark = "_s"

// steps returns a stored delta as history shows it. A run's delta whose
// messages span several LangGraph steps (input, then each model response,
// then each batch of tool results: a change of node) is cut into one
// checkpoint per step; the last keeps the delta's id, the others are
// derived ("<id>_s<k>"), each the parent of the next. Applied in order
// they make the delta's state: removals and cleared values go with the
// first step (they happen before the step's model call: a summary, a
// settled interrupt), values set with the last. Writes outside a run are
// one step each; one written on a derived step (At) is shown on it.
func steps(d *kv.Delta) []*kv.Delta {
	v := *d
	if d.At != "" {
		v.Parent = d.At
	}
	if d.Source != "" {
		return []*kv.Delta{&v}
	}
	segs := segments(d.Update.Messages)
	if len(segs) < 2 {
		return []*kv.Delta{&v}
	}
	out := make([]*kv.Delta, 0, len(segs))
	parent := d.Parent
	var set map[string]json.RawMessage
	for k, seg := range segs[:len(segs)-1] {
		u := state.Update{Messages: seg}
		if k == 0 {
			u.Remove = d.Update.Remove
			for key, val := range d.Update.Values {
				if isNull(val) {
					if u.Values == nil {
						u.Values = map[string]json.RawMessage{}
					}
					u.Values[key] = val
					continue
				}
				if set == nil {
					set = map[string]json.RawMessage{}
				}
				set[key] = val
			}
		}
		s := &kv.Delta{ID: d.ID + stepMark + strconv.Itoa(k), Parent: parent, RunID: d.RunID, Step: d.Step, Time: d.Time, Update: u}
		out = append(out, s)
		parent = s.ID
	}
	v.Parent, v.Update = parent, state.Update{Messages: segs[len(segs)-1], Values: set}
	return append(out, &v)
}

// segments cuts a delta's messages where the node that wrote them
// changes: input (user and system messages), model, tools.
func segments(ms []model.Message) [][]model.Message {
	var out [][]model.Message
	start := 0
	for i := 1; i <= len(ms); i++ {
		if i == len(ms) || node(ms[i].Role) != node(ms[i-1].Role) {
			out = append(out, ms[start:i:i])
			start = i
		}
	}
	return out
}

func node(role string) string {
	switch role {
	case model.RoleAssistant:
		return langgraph.NodeModel
	case model.RoleTool:
		return langgraph.NodeTools
	}
	return "input"
}

// storedBase is where a checkpoint written on id goes: on id itself, or,
// for a derived step, on the parent of the delta the step is part of,
// repeating the delta's changes up to the step (prefix); step reports
// the latter.
func (g *threadGraph) storedBase(id string) (parent string, prefix state.Update, step bool) {
	var path []*kv.Delta
	cur := id
	for cur != "" && cur != inputCheckpoint && g.isStep(cur) {
		d := g.byID[cur]
		path = append(path, d)
		cur = d.Parent
	}
	for i := len(path) - 1; i >= 0; i-- {
		prefix.Merge(path[i].Update)
	}
	return cur, prefix, len(path) > 0
}

// isStep reports whether id is a step derived inside a stored delta.
func (g *threadGraph) isStep(id string) bool {
	_, shown := g.byID[id]
	_, stored := g.raw[id]
	return shown && !stored
}

// history is what a thread's history lists, newest first: the stored
// checkpoints, then the input checkpoint.
func (g *threadGraph) history() []*kv.Delta {
	if g.input == nil {
		return nil
	}
	return append(slices.Clip(g.order), g.input)
}

// parentOf is the parent a checkpoint is shown with: the input checkpoint
// for a stored one without a parent.
func (g *threadGraph) parentOf(d *kv.Delta) string {
	if d.Parent == "" && d != g.input {
		return inputCheckpoint
	}
	return d.Parent
}

// later returns the later of t and one nanosecond after u.
func later(t, u time.Time) time.Time {
	if u = u.Add(time.Nanosecond); u.After(t) {
		return u
	}
	return t
}

// has reports whether id is a checkpoint of the thread's history.
func (g *threadGraph) has(id string) bool {
	_, ok := g.depth[id]
	return ok
}

// stateAt returns the state at checkpoint id (on the history), replayed
// from the thread's first checkpoint. A replay costs the deltas on the way
// (with the transcript's index, appends are O(1)), far less than encoding
// the state it yields; keeping states between entries would cost memory
// in the square of the thread's length for a long page.
func (g *threadGraph) stateAt(id string) *state.State {
	var path []*kv.Delta
	for cur := id; cur != "" && cur != inputCheckpoint; cur = g.byID[cur].Parent {
		path = append(path, g.byID[cur])
	}
	st := &state.State{}
	for i := len(path) - 1; i >= 0; i-- {
		st.Apply(path[i].Update)
	}
	return st
}

// snapshot is the LangGraph state at checkpoint id ("" for a thread
// without checkpoints).
func (g *threadGraph) snapshot(id string) langgraph.ThreadState {
	th := g.th
	snap := langgraph.Snapshot{ThreadID: th.ThreadID, CheckpointID: id, State: g.stateAt(id), Hidden: []string{protocol.InterruptValue}, Encoder: &g.enc}
	d, ok := g.byID[id]
	if id == inputCheckpoint && g.input != nil {
		d, ok = g.input, true
	}
	if ok && id != "" {
		snap.Parent, snap.CreatedAt, snap.Metadata = g.parentOf(d), d.Time, g.metadata(d)
	}
	// An idle head written outside a run waits for input. A run's last
	// checkpoint says what comes next from its last message, as
	// LangGraph's does: after a run cancelled or failed before the model
	// answered its input (or tool results), the model.
	snap.Settled = id == th.Head && th.Lease == nil && (!ok || d.Source != "")
	var open protocol.Interrupt
	if ok, err := snap.State.Value(protocol.InterruptValue, &open); ok && err == nil {
		snap.Interrupt = &open
	}
	return langgraph.State(snap)
}

// metadata is a checkpoint's LangGraph metadata: source (loop for a
// run's step, update, fork), step (its position on its chain, from 0),
// run_id, thread_id, and natsagent's run_step.
func (g *threadGraph) metadata(d *kv.Delta) map[string]any {
	source := d.Source
	if source == "" {
		source = "loop"
	}
	m := map[string]any{"source": source, "step": g.depth[d.ID], "thread_id": g.th.ThreadID, "parents": map[string]any{}, "writes": nil}
	if d.RunID != "" {
		m["run_id"] = d.RunID
	}
	if d.Source == "" {
		m["run_step"] = d.Step
	}
	if d.AsNode != "" {
		m["writes"] = map[string]any{d.AsNode: nil}
	}
	return m
}

// matches reports whether a checkpoint's metadata holds every key of
// filter with an equal value (compared as JSON).
func matches(meta, filter map[string]any) bool {
	for k, want := range filter {
		got, ok := meta[k]
		if !ok {
			return false
		}
		a, err1 := json.Marshal(got)
		b, err2 := json.Marshal(want)
		if err1 != nil || err2 != nil || string(a) != string(b) {
			return false
		}
	}
	return true
}
