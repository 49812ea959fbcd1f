package worker

import (
	"context"
	"sync"
	"testing"
	"time"
)

// A lease renewal the server does not answer holds neither the heartbeat
// tick nor the other leases' renewals: renewLeases returns at once, the
// other lease is renewed, the slow one is not sent again while it is out,
// and its bound ends it.
func TestRenewLeasesDoesNotWaitForASlowRenewal(t *testing.T) {
	slow, fast := &leaseHandle{run: "slow"}, &leaseHandle{run: "fast"}
	var mu sync.Mutex
	calls := map[string]int{}
	fastDone := make(chan struct{}, 4)
	slowEnded := make(chan error, 4)
	release := make(chan struct{})
	slowStarted := make(chan struct{}, 1)
	renew := func(l *leaseHandle, ctx context.Context) {
		mu.Lock()
		calls[l.run]++
		mu.Unlock()
		if l == slow {
			slowStarted <- struct{}{}
		}
		if l == fast {
			fastDone <- struct{}{}
			return
		}
		if l.run == "stuck" {
			<-ctx.Done()
			slowEnded <- ctx.Err()
			return
		}
		select {
		case <-release:
			slowEnded <- nil
		case <-ctx.Done():
			slowEnded <- ctx.Err()
		}
	}
	ctx := context.Background()
	slots := make(chan struct{}, 16)
	returned := make(chan struct{})
	go func() {
		renewLeases(ctx, []*leaseHandle{slow, fast}, time.Hour, slots, renew)
		close(returned)
	}()
	select {
	case <-returned:
	case <-time.After(30 * time.Second):
		t.Fatal("renewLeases waited for a renewal that does not end")
	}
	select {
	case <-fastDone:
	case <-time.After(30 * time.Second):
		t.Fatal("the other lease was not renewed")
	}
	// Renewals run on their own goroutines: under load the slow one may
	// not have been sent yet when the fast one is done.
	select {
	case <-slowStarted:
	case <-time.After(30 * time.Second):
		t.Fatal("the slow lease's renewal was never sent")
	}
	// The next tick: the slow renewal is still out, so it is not sent
	// again; the other lease is renewed again.
	renewLeases(ctx, []*leaseHandle{slow, fast}, time.Hour, slots, renew)
	select {
	case <-fastDone:
	case <-time.After(30 * time.Second):
		t.Fatal("the other lease was not renewed at the next tick")
	}
	mu.Lock()
	if calls["slow"] != 1 || calls["fast"] != 2 {
		t.Errorf("renewals sent: %v, want slow once (still out), fast twice", calls)
	}
	mu.Unlock()
	close(release)
	if err := <-slowEnded; err != nil {
		t.Fatalf("slow renewal ended with %v", err)
	}

	// Each renewal is bounded.
	for slow.renewing.Load() {
		time.Sleep(time.Millisecond)
	}
	stuck := &leaseHandle{run: "stuck"}
	renewLeases(ctx, []*leaseHandle{stuck}, 50*time.Millisecond, slots, renew)
	select {
	case err := <-slowEnded:
		if err != context.DeadlineExceeded {
			t.Fatalf("a renewal past its bound ended with %v, want its deadline", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a renewal past its bound was not ended")
	}
}
