package natstest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestClusterNodeLossAndRestart: an R3 bucket keeps taking writes after
// its stream leader and the meta leader are shut down, and the node comes
// back on its own address with its store.
func TestClusterNodeLossAndRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	t.Parallel()
	c := StartCluster(t, 3)
	if got := len(c.ClientURLs()); got != 3 {
		t.Fatalf("%d client URLs, want 3", got)
	}
	nc := c.Connect()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "loss", Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	rev, err := kv.Create(ctx, "k", []byte("1"))
	if err != nil {
		t.Fatal(err)
	}
	leader := c.StreamLeader("KV_loss")
	if leader == nil || c.Leader() == nil {
		t.Fatalf("stream leader %v, meta leader %v", leader, c.Leader())
	}
	// Two of three nodes down is no quorum: lose the node that leads both
	// the meta group and the bucket.
	down := c.Leader().Name()
	if err := c.MoveStreamLeader(ctx, "KV_loss", down); err != nil {
		t.Fatal(err)
	}
	c.Shutdown(down)
	for {
		// Each attempt bounded: a request sent to the node as it went
		// down is never answered, and would wait for ctx's deadline.
		attempt, cancelAttempt := context.WithTimeout(ctx, 2*time.Second)
		rev2, err := kv.Update(attempt, "k", []byte("2"), rev)
		if err != nil {
			// An attempt whose answer was lost may have been applied.
			if e, gerr := kv.Get(attempt, "k"); gerr == nil && string(e.Value()) == "2" {
				rev2, err = e.Revision(), nil
			}
		}
		cancelAttempt()
		if err == nil {
			rev = rev2
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("no write after the leader's loss: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if c.Server(down) != nil {
		t.Fatal("a shut down node is still listed as running")
	}
	s := c.Restart(down)
	if s.ClientURL() != c.ClientURLs()[indexOf(c.Names(), down)] {
		t.Fatalf("restarted on %s, not on its own address", s.ClientURL())
	}
	c.WaitReady()
	if e, err := kv.Get(ctx, "k"); err != nil || string(e.Value()) != "2" || e.Revision() != rev {
		t.Fatalf("after restart: %v %v", e, err)
	}
}

func indexOf(names []string, name string) int {
	for i, n := range names {
		if n == name {
			return i
		}
	}
	return -1
}
