package jobs

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/natstest"
)

// TestScheduledJobOnACluster: the jobs stream is replicated (R3) and its
// schedules fire on the stream leader.
func TestScheduledJobOnACluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	t.Parallel()
	c := natstest.StartCluster(t, 3)
	nc := c.Connect()
	settings := bus.Settings{Replicas: 3, AckWait: time.Second, MaxDeliver: 3}.WithDefaults()
	natstest.Provision(t, nc, settings)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan time.Time, 2)
	r, err := NewRunner(context.Background(), js, Config{Settings: settings, Logger: zaptest.NewLogger(t),
		Handlers: map[string]Handler{"demo": func(ctx context.Context, j *Job) error { ran <- time.Now(); return nil }}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	t.Cleanup(func() { cancel(); natstest.Recv(t, done, "the job runner to stop") })
	due := time.Now().Add(2 * time.Second).Truncate(time.Second)
	if _, err := Enqueue(context.Background(), js, settings.Names, Spec{Kind: "demo", Key: "k", ID: "c-1", Due: due}); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-ran:
		if at.Before(due) {
			t.Fatalf("ran at %s, due %s", at, due)
		}
	case <-time.After(natstest.Patience):
		t.Fatal("the scheduled job never ran on the cluster")
	}
}
