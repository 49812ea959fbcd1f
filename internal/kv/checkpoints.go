package kv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/state"
)

// Checkpoints stores a thread's checkpoints as a chain of deltas under
// "<tenant>.<thread>.<checkpoint id>". The thread record's Head names the
// latest; each delta names its parent. A delta holds only what its step
// changed, so checkpoint storage grows with new content, not with the
// history. Deltas written by a worker that lost its lease are never
// referenced by a head and are ignored on load.
type Checkpoints struct {
	kv jetstream.KeyValue
	// js and bucket read a checkpoint through the bucket's leader (nil
	// js: never).
	js     jetstream.JetStream
	bucket string
}

// Delta is one checkpoint.
type Delta struct {
	ID     string       `json:"id"`
	Parent string       `json:"parent,omitempty"`
	RunID  string       `json:"run_id"`
	Step   int          `json:"step"`
	Time   time.Time    `json:"time"`
	Update state.Update `json:"update"`
	// Source is set on a checkpoint the gateway wrote outside a run
	// (time travel): SourceUpdate or SourceFork.
	Source string `json:"source,omitempty"`
	// AsNode is the node an update was written as (LangGraph's as_node).
	AsNode string `json:"as_node,omitempty"`
	// Replaced is the head this checkpoint replaced when it was written
	// on an earlier checkpoint: the branch left behind, which stays
	// readable through it.
	Replaced string `json:"replaced,omitempty"`
	// Files are the workdir's file changes since the parent checkpoint,
	// on a checkpoint of a run whose workdir is versioned
	// (files.Versioned) and changed: the content they name is stored
	// before the delta is written. The files at a checkpoint are the
	// changes along its chain (FilesAt).
	Files []files.Change `json:"files,omitempty"`
	// At is set on a checkpoint written on a step the history derives
	// inside a run's delta (the gateway's history shows one checkpoint per
	// step, docs/protocol.md 3.7): Parent is that delta's parent, Update
	// repeats the delta's changes up to the step, and history shows At as
	// the parent.
	At string `json:"at,omitempty"`
}

// FilesOf returns the files at the end of chain (oldest first).
func FilesOf(chain []*Delta) files.Manifest {
	m := files.Manifest{}
	for _, d := range chain {
		m.Apply(d.Files)
	}
	return m
}

// FilesAt returns the files at checkpoint id, from byID (as All read
// it); ok is false when a delta of its chain is not there.
func FilesAt(byID map[string]*Delta, id string) (m files.Manifest, ok bool) {
	var chain []*Delta
	for at := id; at != ""; {
		d, found := byID[at]
		if !found || len(chain) > len(byID) {
			return nil, false
		}
		chain = append(chain, d)
		at = d.Parent
	}
	m = files.Manifest{}
	for i := len(chain) - 1; i >= 0; i-- {
		m.Apply(chain[i].Files)
	}
	return m, true
}

// Sources of checkpoints written outside a run.
const (
	SourceUpdate = "update" // a state update (POST /threads/{id}/state)
	SourceFork   = "fork"   // a run started from an earlier checkpoint
)

// Put writes a delta. Checkpoint ids are unique per lease epoch, so two
// workers never write the same key.
func (s *Checkpoints) Put(ctx context.Context, tenant, thread string, d *Delta) (int, error) {
	data, err := encodeDelta(d)
	if err != nil {
		return 0, err
	}
	// A delta's key is unique to its lease epoch and step and its content
	// fixed, so a write lost with a node that went down (or unanswered
	// through a leader election) is simply written again: a second copy
	// is a second revision of the same delta.
	for attempt := 1; ; attempt++ {
		_, err = writeKey(ctx, s.js, s.kv, bus.Key(tenant, thread, d.ID), data, anyRevision, 0)
		if err == nil {
			return len(data), nil
		}
		if attempt == 3 || !bus.Transient(err) || ctx.Err() != nil {
			return 0, fmt.Errorf("write checkpoint %s of thread %s: %w", d.ID, thread, bus.MarkStoreFull(s.bucket, err))
		}
	}
}

// Load rebuilds the state at checkpoint head by reading the thread's deltas
// and applying the chain that ends at head. It also returns the chain,
// oldest first.
func (s *Checkpoints) Load(ctx context.Context, tenant, thread, head string) (*state.State, []*Delta, error) {
	st := &state.State{}
	if head == "" {
		return st, nil, nil
	}
	byID, err := s.All(ctx, tenant, thread)
	if err != nil {
		return nil, nil, err
	}
	chain, err := s.Chain(ctx, tenant, thread, head, byID)
	if err != nil {
		return nil, nil, err
	}
	for _, d := range chain {
		st.Apply(d.Update)
	}
	return st, chain, nil
}

// All reads every delta of a thread, by id: the chain from its head and
// any other (rolled back, left behind by time travel, lost with a lease).
// A watch that stalls yields none; Chain then walks the chain key by key
// through the bucket's leader.
func (s *Checkpoints) All(ctx context.Context, tenant, thread string) (map[string]*Delta, error) {
	byID, err := s.readDeltas(ctx, tenant, thread)
	if errors.Is(err, errWatchStalled) && s.js != nil {
		return map[string]*Delta{}, nil
	}
	return byID, err
}

// Chain returns the chain of deltas that ends at head, oldest first,
// taking them from byID (as All read them) and adding to it those a
// replica had not delivered.
func (s *Checkpoints) Chain(ctx context.Context, tenant, thread, head string, byID map[string]*Delta) ([]*Delta, error) {
	if head == "" {
		return nil, nil
	}
	chain, err := s.chain(ctx, tenant, thread, head, byID)
	if err != nil {
		return nil, err
	}
	for i, j := 0, len(chain)-1; i < j; i, j = i+1, j-1 {
		chain[i], chain[j] = chain[j], chain[i]
	}
	return chain, nil
}

// chain walks from head to the first checkpoint, newest first.
func (s *Checkpoints) chain(ctx context.Context, tenant, thread, head string, byID map[string]*Delta) ([]*Delta, error) {
	var err error
	var chain []*Delta
	for id := head; id != ""; {
		d, ok := byID[id]
		if !ok && s.js != nil {
			// The watch may have been served by a replica that has not
			// applied the write yet, or restarted across a leader
			// election: ask the leader for the one key.
			for attempt := 0; attempt < 5 && ctx.Err() == nil; attempt++ {
				d, _, err = getLatest[Delta](ctx, s.js, s.bucket, bus.Key(tenant, thread, id))
				if err == nil && d.ID == id {
					byID[id], ok = d, true
				}
				if !bus.Transient(err) {
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
		}
		if !ok {
			return nil, fmt.Errorf("thread %s: %w: %s (chain from head %s)", thread, ErrCheckpointMissing, id, head)
		}
		chain = append(chain, d)
		id = d.Parent
		if len(chain) > len(byID) {
			return nil, fmt.Errorf("thread %s: checkpoint chain from %s has a cycle", thread, head)
		}
	}
	return chain, nil
}

// ErrCheckpointMissing: a checkpoint of the chain asked for is not in
// the bucket (deleted, or never written).
var ErrCheckpointMissing = errors.New("checkpoint is missing")

// errWatchStalled is a watch of a thread's deltas that stopped delivering
// before it caught up.
var errWatchStalled = errors.New("checkpoint watch stalled")

// watchStall is how long readDeltas waits for the next delta (or the
// end of the initial ones) before it gives up on the watch. A watch whose
// consumer was created as a node went down may never deliver: without
// this bound, the run would wait for its own timeout.
var watchStall = 5 * time.Second

// readDeltas reads every delta of a thread.
func (s *Checkpoints) readDeltas(ctx context.Context, tenant, thread string) (map[string]*Delta, error) {
	if watchStall <= 0 {
		// No patience at all (a test of the fallback): stalled at once.
		return nil, errWatchStalled
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Creating the watch is a request of its own (an ordered consumer):
	// one lost with a node that went down would wait for ctx's deadline,
	// the run's. Its context is also the watch's lifetime, so it is
	// cancelled only if the creation is too slow.
	slow := time.AfterFunc(watchStall, cancel)
	w, err := s.kv.Watch(ctx, bus.Key(tenant, thread, "*"), jetstream.IgnoreDeletes())
	if !slow.Stop() {
		if err == nil {
			_ = w.Stop()
		}
		return nil, fmt.Errorf("thread %s: %w (the watch was not created in %s)", thread, errWatchStalled, watchStall)
	}
	if err != nil {
		return nil, err
	}
	// No w.Stop: it deletes the watch's consumer and waits for the
	// server's answer, a round trip the run would wait for before its
	// model call. Cancelling the watch's context (deferred above) stops
	// it the same way, in the background.
	stall := time.NewTimer(watchStall)
	defer stall.Stop()
	byID := make(map[string]*Delta)
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-stall.C:
			return nil, fmt.Errorf("thread %s: %w after %d deltas", thread, errWatchStalled, len(byID))
		case e, ok := <-w.Updates():
			if !ok {
				return nil, fmt.Errorf("thread %s: %w (closed)", thread, errWatchStalled)
			}
			if e == nil {
				return byID, nil
			}
			var d Delta
			if err := json.Unmarshal(e.Value(), &d); err != nil {
				return nil, fmt.Errorf("decode checkpoint %s: %w", e.Key(), err)
			}
			byID[d.ID] = &d
			stall.Reset(watchStall)
		}
	}
}

// CheckpointID builds a checkpoint id unique to one lease epoch.
func CheckpointID(epoch uint64, step int) string {
	return fmt.Sprintf("e%d-%d", epoch, step)
}

// ParseCheckpointID returns the epoch of a checkpoint id.
func ParseCheckpointID(id string) (epoch uint64, ok bool) {
	e, _, found := strings.Cut(strings.TrimPrefix(id, "e"), "-")
	if !found {
		return 0, false
	}
	_, err := fmt.Sscan(e, &epoch)
	return epoch, err == nil
}
