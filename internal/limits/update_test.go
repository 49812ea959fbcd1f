package limits

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/natstest"
)

// Every compare-and-set count of the limits bucket is exact when many
// limiters (gateways, workers) write one tenant's keys at once: event
// bytes, file bytes and slot releases each lose no write to a conflict.
func TestCountsExactUnderContention(t *testing.T) {
	p := Policy{Default: Tenant{MaxEventBytes: 1 << 30, MaxFileBytes: 1 << 30, MaxConcurrentRuns: 100}}
	l, js := open(t, p)
	ctx := context.Background()
	now := time.Date(2026, 12, 1, 10, 30, 0, 0, time.UTC)
	l.now = func() time.Time { return now }
	const writers = 20
	live := func(context.Context, Slot) (bool, error) { return true, nil }
	for i := range writers {
		if ok, err := l.Acquire(ctx, "acme", Slot{Thread: "t", Run: "r" + string(rune('a'+i)), Worker: "w"}, live); err != nil || !ok {
			t.Fatalf("acquire: %v %v", ok, err)
		}
	}
	var wg sync.WaitGroup
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			li, err := Open(ctx, js, bus.Settings{}, p)
			if err != nil {
				t.Error(err)
				return
			}
			li.now = l.now
			if err := li.AddEventBytes(ctx, "acme", 10); err != nil {
				t.Error(err)
			}
			if err := li.addFileBytes(ctx, "acme", 7, true); err != nil {
				t.Error(err)
			}
			if err := li.Release(ctx, "acme", "r"+string(rune('a'+i))); err != nil {
				t.Error(err)
			}
		}()
	}
	natstest.Wait(t, &wg, "the concurrent limit updates")
	if n, err := l.EventBytes(ctx, "acme"); err != nil || n != 10*writers {
		t.Errorf("event bytes %d (%v), want %d", n, err, 10*writers)
	}
	if n, err := l.FileBytes(ctx, "acme"); err != nil || n != 7*writers {
		t.Errorf("file bytes %d (%v), want %d", n, err, 7*writers)
	}
	if s, err := l.Running(ctx, "acme"); err != nil || len(s) != 0 {
		t.Errorf("%d slots still held after every run released its own (%v)", len(s), err)
	}
}
