package kv

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/state"
)

// Issue 7 (node loss), found by the soak: a run that started as a node
// went down waited for its run timeout in Checkpoints.Load, on a watch
// whose consumer never delivered. A watch that delivers nothing within
// watchStall is given up, and the chain is read key by key through the
// bucket's leader. Here the watch counts as stalled at once (watchStall 0): the load
// must still rebuild the state, from the leader.
func TestIssue7CheckpointLoadSurvivesAStalledWatch(t *testing.T) {
	stores := clusterStores(t, 1)[0]
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	first := &Delta{ID: CheckpointID(1, 1), RunID: "r1", Step: 1, Update: state.Update{Values: map[string]json.RawMessage{"a": json.RawMessage(`1`)}}}
	second := &Delta{ID: CheckpointID(1, 2), Parent: first.ID, RunID: "r1", Step: 2, Update: state.Update{Values: map[string]json.RawMessage{"b": json.RawMessage(`2`)}}}
	for _, d := range []*Delta{first, second} {
		if _, err := stores.Checkpoints.Put(ctx, "default", "t1", d); err != nil {
			t.Fatal(err)
		}
	}
	old := watchStall
	watchStall = 0
	defer func() { watchStall = old }()
	st, chain, err := stores.Checkpoints.Load(ctx, "default", "t1", second.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(chain) != 2 || chain[0].ID != first.ID || chain[1].ID != second.ID {
		t.Fatalf("chain %v, want %s then %s", chain, first.ID, second.ID)
	}
	if string(st.Values["a"]) != "1" || string(st.Values["b"]) != "2" {
		t.Fatalf("state values %v, want a=1 b=2", st.Values)
	}
	if _, _, err := stores.Checkpoints.Load(ctx, "default", "t1", "e9-9"); err == nil {
		t.Fatal("a head with no checkpoint loaded")
	}
}
