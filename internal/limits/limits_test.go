package limits

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/natstest"
)

func open(t *testing.T, p Policy) (*Limiter, jetstream.JetStream) {
	t.Helper()
	srv := natstest.Start(t)
	nc := srv.Connect()
	natstest.Provision(t, nc, bus.Settings{})
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	l, err := Open(context.Background(), js, bus.Settings{}, p)
	if err != nil {
		t.Fatal(err)
	}
	return l, js
}

// Many submitters at once (each its own Limiter, as gateways are) admit
// exactly the limit; the next minute admits again.
func TestAdmitCountsExactlyUnderContention(t *testing.T) {
	p := Policy{Tenants: map[string]Tenant{"acme": {RunsPerMinute: 10}}}
	l, js := open(t, p)
	now := time.Date(2026, 12, 1, 10, 0, 5, 0, time.UTC)
	var mu sync.Mutex
	admitted, refused := 0, 0
	var wg sync.WaitGroup
	for range 25 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			li, err := Open(context.Background(), js, bus.Settings{}, p)
			if err != nil {
				t.Error(err)
				return
			}
			li.now = func() time.Time { return now }
			err = li.Admit(context.Background(), "acme")
			mu.Lock()
			defer mu.Unlock()
			var re *RateError
			switch {
			case err == nil:
				admitted++
			case errors.As(err, &re) && re.RetryAfter == 55*time.Second && errors.Is(err, ErrRateLimited):
				refused++
			default:
				t.Errorf("admit: %v", err)
			}
		}()
	}
	natstest.Wait(t, &wg, "the concurrent admissions")
	if admitted != 10 || refused != 15 {
		t.Fatalf("admitted %d and refused %d of 25, want 10 and 15", admitted, refused)
	}
	l.now = func() time.Time { return now.Add(time.Minute) }
	if err := l.Admit(context.Background(), "acme"); err != nil {
		t.Fatalf("next minute: %v", err)
	}
	if err := l.Admit(context.Background(), "globex"); err != nil {
		t.Fatalf("unlimited tenant: %v", err)
	}
}

// Slots: the limit holds, a run keeps its own slot, a dead holder's slot
// is taken over, and a released slot is free.
func TestSlots(t *testing.T) {
	l, _ := open(t, Policy{Default: Tenant{MaxConcurrentRuns: 2}})
	ctx := context.Background()
	now := time.Now()
	l.now = func() time.Time { return now }
	dead := map[string]bool{}
	asked := 0
	live := func(_ context.Context, s Slot) (bool, error) { asked++; return !dead[s.Run], nil }
	take := func(run string) bool {
		t.Helper()
		ok, err := l.Acquire(ctx, "acme", Slot{Thread: "t-" + run, Run: run, Worker: "w1"}, live)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !take("r1") || !take("r2") {
		t.Fatal("the first two runs got no slot")
	}
	if take("r3") {
		t.Fatal("a third run got a slot over the limit of 2")
	}
	if !take("r1") {
		t.Fatal("a run lost its own slot on a second acquire")
	}
	// Full slots found live are trusted for a while at the same revision:
	// waiting runs poll, and must not read every holder's lease each time.
	asked = 0
	if take("r3") || asked != 0 {
		t.Fatalf("a second look at the same full slots asked about %d holders", asked)
	}
	dead["r2"] = true
	now = now.Add(recheckLive)
	if !take("r3") {
		t.Fatal("a dead holder's slot was not taken over")
	}
	if err := l.Release(ctx, "acme", "r1"); err != nil {
		t.Fatal(err)
	}
	if !take("r4") || take("r5") {
		t.Fatal("release did not free exactly one slot")
	}
	if s, err := l.Running(ctx, "acme"); err != nil || len(s) != 2 {
		t.Fatalf("running %v %v", s, err)
	}
}
