package kv

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/natstest"
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

// Issue 7, found by the soak under CPU load: a run that started just as
// a node went down waited 30 s (until the worker stopped) in
// Checkpoints.Load, because creating the watch is a JetStream request of
// its own and the one sent was never answered: under the run's context it
// would have waited for the run's timeout. Here a proxy in front of the
// JetStream API answers everything but consumer creation.
func TestIssue7CheckpointLoadSurvivesAnUnansweredWatchCreation(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect()
	settings := bus.Settings{}.WithDefaults()
	natstest.Provision(t, nc, settings)
	js := natstest.LossyAPI(t, nc, natstest.ConsumerCreate)
	stores, err := Open(context.Background(), js, settings.Names)
	if err != nil {
		t.Fatal(err)
	}
	// The run's context: a deadline far away.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d := &Delta{ID: CheckpointID(1, 1), RunID: "r1", Step: 1, Update: state.Update{Values: map[string]json.RawMessage{"a": json.RawMessage(`1`)}}}
	direct, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	writer, err := Open(ctx, direct, settings.Names)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := writer.Checkpoints.Put(ctx, "default", "t1", d); err != nil {
		t.Fatal(err)
	}
	old := watchStall
	watchStall = 500 * time.Millisecond
	defer func() { watchStall = old }()

	start := time.Now()
	st, chain, err := stores.Checkpoints.Load(ctx, "default", "t1", d.ID)
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 15*time.Second {
		t.Fatalf("Load took %s: it waited on the unanswered request", took)
	}
	if len(chain) != 1 || string(st.Values["a"]) != "1" {
		t.Fatalf("chain %v, values %v", chain, st.Values)
	}
}
