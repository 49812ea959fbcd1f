package crons

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/jobs"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/submit"
)

// TestCronSurvivesJobsLeaderLoss: on a 3-node cluster (R3), a cron
// taken by two job runners on their own connections fires every tick of
// its schedule once, before and after the jobs stream's leader is
// stopped: no tick lost, none doubled.
func TestCronSurvivesJobsLeaderLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	c := natstest.StartCluster(t, 3)
	settings := bus.Settings{Replicas: 3, AckWait: 2 * time.Second, MaxDeliver: 5}.WithDefaults()
	admin := c.Connect()
	natstest.Provision(t, admin, settings)
	ctx := context.Background()
	log := zaptest.NewLogger(t)

	var store *Store
	var stores *kv.Stores
	for i := range 2 {
		nc := c.Connect()
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		st, err := kv.Open(ctx, js, settings.Names)
		if err != nil {
			t.Fatal(err)
		}
		q, err := submit.NewQueue(ctx, js, settings.Names, st, "scheduler", log)
		if err != nil {
			t.Fatal(err)
		}
		cs, err := Open(ctx, js, settings.Names)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			store, stores = cs, st
		}
		r, err := jobs.NewRunner(ctx, js, jobs.Config{Settings: settings, Logger: log,
			Backoff:  func(int) time.Duration { return 200 * time.Millisecond },
			Handlers: map[string]jobs.Handler{JobKind: (&Ticker{Store: cs, Queue: q, Log: log}).Handle}})
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = r.Run(rctx) }()
		t.Cleanup(func() { cancel(); natstest.Recv(t, done, "the cron runner to stop"); nc.Close() })
	}

	// Every 5 seconds: longer than a leader election, so no tick falls
	// wholly inside one.
	const every = 5 * time.Second
	r := putCron(t, store, "t1", "c1", "")
	r.Schedule = "*/5 * * * * *"
	if _, err := store.Put(ctx, r, 1); err != nil {
		t.Fatal(err)
	}
	if err := store.Schedule(ctx, r); err != nil {
		t.Fatal(err)
	}
	first := time.Now().Truncate(every).Add(every)

	ran := func(tick time.Time) bool {
		_, _, err := stores.Runs.Get(ctx, "t1", TickRunID("c1", tick))
		return err == nil
	}
	waitTick := func(tick time.Time) {
		t.Helper()
		deadline := time.Now().Add(45 * time.Second)
		for !ran(tick) {
			if time.Now().After(deadline) {
				t.Fatalf("tick %s never ran", tick.Format(time.TimeOnly))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitTick(first)
	waitTick(first.Add(every))

	info, err := func() (*jetstream.StreamInfo, error) {
		js, _ := jetstream.New(admin)
		st, err := js.Stream(ctx, settings.Names.JobsStream())
		if err != nil {
			return nil, err
		}
		return st.Info(ctx)
	}()
	if err != nil {
		t.Fatal(err)
	}
	leader := info.Cluster.Leader
	t.Logf("stopping %s, the jobs stream's leader", leader)
	stopped := time.Now()
	c.Shutdown(leader)

	// Every tick from the first to three after the loss ran, once each.
	last := stopped.Truncate(every).Add(3 * every)
	for tick := first; !tick.After(last); tick = tick.Add(every) {
		waitTick(tick)
	}
	// One run per tick: the runs stream holds one request each (its
	// message ids are the run ids, and run records are keyed by them).
	for tick := first; !tick.After(last); tick = tick.Add(every) {
		ids, err := stores.Threads.RunIDs(ctx, "t1", TickRunID("c1", tick))
		if err != nil {
			t.Fatal(err)
		}
		if len(ids) != 1 || ids[0] != TickRunID("c1", tick) {
			t.Fatalf("tick %s: its thread holds runs %v", tick.Format(time.TimeOnly), ids)
		}
	}
	// No run of a time that is not a tick.
	all, err := stores.Threads.List(ctx, "t1")
	if err != nil {
		t.Fatal(err)
	}
	for _, th := range all {
		var unix int64
		for _, ch := range th.ThreadID[len("cron-c1-"):] {
			unix = unix*10 + int64(ch-'0')
		}
		if unix%5 != 0 {
			t.Fatalf("thread %s is not a tick of the schedule", th.ThreadID)
		}
	}
}
