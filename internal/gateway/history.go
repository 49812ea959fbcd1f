package gateway

import (
	"cmp"
	"context"
	"encoding/json"
	"slices"
	"time"

	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/langgraph"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
)

// threadGraph is a thread's checkpoints as history shows them: the chain
// from the head and the branches time travel left behind (reached through
// Delta.Replaced), newest first. Rolled-back runs and writes of a lost
// lease are on no branch and stay out. It is built from the stored deltas
// on each read: nothing is cached, and storage stays one delta per step.
type threadGraph struct {
	th    *protocol.Thread
	byID  map[string]*kv.Delta
	order []*kv.Delta // newest first, stored checkpoints only
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
	g.byID = byID
	eff := map[string]time.Time{}
	// whole reports whether every ancestor of id is stored, and sets its
	// depth and its order time: never before its parent's, nor before the
	// head it replaced, so a branch sorts after what it came from.
	var whole func(id string, seen int) bool
	whole = func(id string, seen int) bool {
		if _, ok := g.depth[id]; ok {
			return true
		}
		d, ok := byID[id]
		if !ok || seen > len(byID) {
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
		d := byID[id]
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
	if n := len(g.order); n > 0 {
		g.input = &kv.Delta{ID: inputCheckpoint, Source: sourceInput, Time: g.order[n-1].Time}
		g.depth[inputCheckpoint] = -1
	}
	return g, nil
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
	snap.Settled = id == th.Head && th.Lease == nil
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
