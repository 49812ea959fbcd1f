package retention

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
)

// On R3 buckets of a 3-node cluster, two workers on different nodes
// sweeping one tenant at once remove every old run once (a refused
// compare-and-set there is 10164, not 10071) and neither fails.
func TestTwoSweepsAtOnceOnACluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	c := natstest.StartCluster(t, 3)
	settings := bus.Settings{Replicas: 3}.WithDefaults()
	natstest.Provision(t, c.Connect(), settings)
	ctx := context.Background()
	sweepers := make([]*Sweeper, 2)
	var seed *kv.Stores
	for i := range sweepers {
		js, err := jetstream.New(c.Connect())
		if err != nil {
			t.Fatal(err)
		}
		stores, err := kv.Open(ctx, js, settings.Names)
		if err != nil {
			t.Fatal(err)
		}
		seed = stores
		sweepers[i] = New(Config{JS: js, Names: settings.Names, Stores: stores,
			Policy: Policy{Tenants: map[string]Rules{"acme": {Runs: time.Hour}}}})
	}
	const n = 30
	old := time.Now().Add(-2 * time.Hour)
	for i := range n {
		for _, run := range []*protocol.Run{
			finishedRun("acme", "h1", fmt.Sprintf("old%d", i), protocol.StatusSuccess, old),
			finishedRun("acme", "h1", fmt.Sprintf("young%d", i), protocol.StatusSuccess, time.Now()),
		} {
			if _, err := seed.Runs.Create(ctx, run); err != nil {
				t.Fatal(err)
			}
		}
	}
	var wg sync.WaitGroup
	reps := make([]Report, 2)
	for i, s := range sweepers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			if reps[i], err = s.Sweep(ctx, "acme"); err != nil {
				t.Errorf("sweep %d: %v", i, err)
			}
		}()
	}
	natstest.Wait(t, &wg, "the concurrent sweeps")
	if got := reps[0].Runs + reps[1].Runs; got != n {
		t.Errorf("runs removed %d + %d, want %d", reps[0].Runs, reps[1].Runs, n)
	}
	left, err := seed.Runs.List(ctx, "acme", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != n {
		t.Fatalf("%d runs left, want the %d young ones", len(left), n)
	}
	for _, r := range left {
		if r.FinishedAt.Before(old.Add(time.Minute)) {
			t.Fatalf("old run %s left", r.RunID)
		}
	}
}
