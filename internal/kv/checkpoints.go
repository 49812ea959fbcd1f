package kv

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
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
}

// Delta is one checkpoint.
type Delta struct {
	ID     string       `json:"id"`
	Parent string       `json:"parent,omitempty"`
	RunID  string       `json:"run_id"`
	Step   int          `json:"step"`
	Time   time.Time    `json:"time"`
	Update state.Update `json:"update"`
}

// Put writes a delta. Checkpoint ids are unique per lease epoch, so two
// workers never write the same key.
func (s *Checkpoints) Put(ctx context.Context, tenant, thread string, d *Delta) (int, error) {
	data, err := json.Marshal(d)
	if err != nil {
		return 0, err
	}
	if _, err := s.kv.Put(ctx, bus.Key(tenant, thread, d.ID), data); err != nil {
		return 0, fmt.Errorf("write checkpoint %s of thread %s: %w", d.ID, thread, err)
	}
	return len(data), nil
}

// Load rebuilds the state at checkpoint head by reading the thread's deltas
// and applying the chain that ends at head. It also returns the chain,
// oldest first.
func (s *Checkpoints) Load(ctx context.Context, tenant, thread, head string) (*state.State, []*Delta, error) {
	st := &state.State{}
	if head == "" {
		return st, nil, nil
	}
	w, err := s.kv.Watch(ctx, bus.Key(tenant, thread, "*"), jetstream.IgnoreDeletes())
	if err != nil {
		return nil, nil, err
	}
	defer w.Stop()
	byID := make(map[string]*Delta)
	for e := range w.Updates() {
		if e == nil {
			break
		}
		var d Delta
		if err := json.Unmarshal(e.Value(), &d); err != nil {
			return nil, nil, fmt.Errorf("decode checkpoint %s: %w", e.Key(), err)
		}
		byID[d.ID] = &d
	}
	var chain []*Delta
	for id := head; id != ""; {
		d, ok := byID[id]
		if !ok {
			return nil, nil, fmt.Errorf("thread %s: checkpoint %s is missing (chain from head %s)", thread, id, head)
		}
		chain = append(chain, d)
		id = d.Parent
		if len(chain) > len(byID) {
			return nil, nil, fmt.Errorf("thread %s: checkpoint chain from %s has a cycle", thread, head)
		}
	}
	for i, j := 0, len(chain)-1; i < j; i, j = i+1, j-1 {
		chain[i], chain[j] = chain[j], chain[i]
	}
	for _, d := range chain {
		st.Apply(d.Update)
	}
	return st, chain, nil
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
