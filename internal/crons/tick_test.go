package crons

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/jobs"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/limits"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/submit"
	"github.com/natsagent/natsagent/internal/testdeploy"
)

func newTicker(t *testing.T, missed string) (*Ticker, *testdeploy.Deployment) {
	t.Helper()
	d := testdeploy.Start(t, bus.Settings{AckWait: 2 * time.Second, MaxDeliver: 3})
	log := zaptest.NewLogger(t)
	q, err := submit.NewQueue(context.Background(), d.JS, d.Settings.Names, d.Stores, "scheduler", log)
	if err != nil {
		t.Fatal(err)
	}
	store, err := Open(context.Background(), d.JS, d.Settings.Names)
	if err != nil {
		t.Fatal(err)
	}
	return &Ticker{Store: store, Queue: q, Missed: missed, Log: log}, d
}

func putCron(t *testing.T, s *Store, tenant, id, thread string) *Record {
	t.Helper()
	r := &Record{Tenant: tenant, Request: protocol.RunRequest{Agent: "chatbot", Tenant: tenant, RunID: "template", ThreadID: "cron",
		Input: &protocol.Input{Messages: []model.Message{{Role: "user", Content: "tick"}}}}}
	r.CronID, r.AssistantID, r.Schedule, r.Enabled = id, "chatbot", "*/10 * * * * *", true
	if thread != "" {
		r.ThreadID = &thread
	}
	if _, err := s.Put(context.Background(), r, 0); err != nil {
		t.Fatal(err)
	}
	return r
}

func runOf(t *testing.T, d *testdeploy.Deployment, tenant, cron string, tick time.Time) *protocol.Run {
	t.Helper()
	rec, _, err := d.Stores.Runs.Get(context.Background(), tenant, TickRunID(cron, tick))
	if errors.Is(err, kv.ErrNotFound) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// A tick is the latest schedule time at or before its firing; firing or
// delivering it again starts no second run.
func TestTickStartsOneRunPerTick(t *testing.T) {
	tk, d := newTicker(t, "")
	putCron(t, tk.Store, "t1", "c1", "")
	ctx := context.Background()
	tick := time.Now().UTC().Truncate(10 * time.Second)
	for _, fired := range []time.Time{tick.Add(300 * time.Millisecond), tick.Add(2 * time.Second), tick.Add(300 * time.Millisecond)} {
		if err := tk.Handle(ctx, &jobs.Job{Kind: JobKind, Tokens: []string{"t1", "c1"}, Stored: fired}); err != nil {
			t.Fatal(err)
		}
	}
	rec := runOf(t, d, "t1", "c1", tick)
	if rec == nil || rec.ThreadID != TickRunID("c1", tick) || rec.Metadata["cron_id"] != "c1" {
		t.Fatalf("tick run %+v", rec)
	}
	ids, err := d.Stores.Threads.RunIDs(ctx, "t1", rec.ThreadID)
	if err != nil || len(ids) != 1 {
		t.Fatalf("the tick's thread holds runs %v (%v)", ids, err)
	}
	// The runs stream holds one request for the tick.
	st, err := d.JS.Stream(ctx, d.Settings.Names.RunsStream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil || info.State.Msgs != 1 {
		t.Fatalf("runs stream holds %d requests (%v)", info.State.Msgs, err)
	}
	// Another tenant's job naming the cron finds nothing.
	if err := tk.Handle(ctx, &jobs.Job{Kind: JobKind, Tokens: []string{"t2", "c1"}, Stored: tick.Add(10 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	if runOf(t, d, "t2", "c1", tick.Add(10*time.Second)) != nil || runOf(t, d, "t1", "c1", tick.Add(10*time.Second)) != nil {
		t.Fatal("a job of another tenant started a run")
	}
}

// Missed ticks: a tick fired beyond the grace (the stream had no leader
// at its time) is skipped by default and run under catch_up_one.
func TestMissedTickPolicy(t *testing.T) {
	ctx := context.Background()
	tick := time.Now().UTC().Truncate(10 * time.Second).Add(-time.Minute)
	late := tick.Add(DefaultLateGrace + 5*time.Second)
	for _, c := range []struct {
		missed string
		runs   bool
	}{{"", false}, {MissedSkip, false}, {MissedCatchUpOne, true}} {
		tk, d := newTicker(t, c.missed)
		r := putCron(t, tk.Store, "t1", "c1", "")
		r.Schedule = "0 * * * * *" // each minute
		if _, err := tk.Store.Put(ctx, r, 1); err != nil {
			t.Fatal(err)
		}
		minute := tick.Truncate(time.Minute)
		if err := tk.Handle(ctx, &jobs.Job{Kind: JobKind, Tokens: []string{"t1", "c1"}, Stored: minute.Add(late.Sub(tick))}); err != nil {
			t.Fatal(err)
		}
		if got := runOf(t, d, "t1", "c1", minute) != nil; got != c.runs {
			t.Errorf("policy %q: a tick %s late ran: %v", c.missed, late.Sub(tick), got)
		}
		// On time, every policy runs it.
		next := minute.Add(time.Minute)
		if err := tk.Handle(ctx, &jobs.Job{Kind: JobKind, Tokens: []string{"t1", "c1"}, Stored: next.Add(time.Second)}); err != nil {
			t.Fatal(err)
		}
		if runOf(t, d, "t1", "c1", next) == nil {
			t.Errorf("policy %q: the tick on time did not run", c.missed)
		}
	}
}

// A thread's cron goes with its thread: the first tick after the thread
// is gone deletes the cron and its schedule.
func TestTickOfDeletedThreadDeletesCron(t *testing.T) {
	tk, d := newTicker(t, "")
	ctx := context.Background()
	r := putCron(t, tk.Store, "t1", "c1", "gone")
	if err := tk.Store.Schedule(ctx, r); err != nil {
		t.Fatal(err)
	}
	if err := tk.Handle(ctx, &jobs.Job{Kind: JobKind, Tokens: []string{"t1", "c1"}, Stored: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := tk.Store.GetLatest(ctx, "t1", "c1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the cron of a deleted thread is still there: %v", err)
	}
	st, _ := d.JS.Stream(ctx, d.Settings.Names.JobsStream())
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(d.Settings.Names.JobScheduleSubject(JobKind, "t1", "c1")))
	if err != nil || len(info.State.Subjects) != 0 {
		t.Fatalf("the cron's schedule is still there: %v (%v)", info.State.Subjects, err)
	}
}

// A tick's run counts against the tenant's runs_per_minute as any
// submission does; a tick over it starts nothing and is not retried.
func TestTickCountsAgainstRateLimit(t *testing.T) {
	tk, d := newTicker(t, "")
	lim, err := limits.Open(context.Background(), d.JS, d.Settings, limits.Policy{Default: limits.Tenant{RunsPerMinute: 1}})
	if err != nil {
		t.Fatal(err)
	}
	tk.Admit = lim.Admit
	putCron(t, tk.Store, "t1", "c1", "")
	ctx := context.Background()
	minute := time.Now().UTC().Truncate(time.Minute)
	if time.Since(minute) > 40*time.Second {
		// Both ticks must be counted in the same calendar minute.
		time.Sleep(time.Until(minute.Add(time.Minute)))
		minute = minute.Add(time.Minute)
	}
	a, b := minute, minute.Add(10*time.Second)
	for _, tick := range []time.Time{a, b, a} {
		if err := tk.Handle(ctx, &jobs.Job{Kind: JobKind, Tokens: []string{"t1", "c1"}, Stored: tick.Add(time.Second)}); err != nil {
			t.Fatal(err)
		}
	}
	if runOf(t, d, "t1", "c1", a) == nil {
		t.Fatal("the first tick did not run")
	}
	if runOf(t, d, "t1", "c1", b) != nil {
		t.Fatal("a tick over runs_per_minute ran")
	}
}
