package kv

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/protocol"
)

// waitGone waits for get to report ErrNotFound.
func waitGone(t *testing.T, what string, get func() error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := get()
		if errors.Is(err, ErrNotFound) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s is still there 30s after its 1s TTL: %v", what, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// A finished run's record expires by the server after its tenant's TTL;
// one still running, and one of a tenant that keeps runs, do not. Usage
// totals expire likewise, and a write starts their TTL again.
func TestFinishedRunsAndUsageExpireByTheirTenantsTTL(t *testing.T) {
	s := openStores(t)
	ctx := context.Background()
	ttl := func(tenant string) time.Duration {
		if tenant == "acme" {
			return time.Second
		}
		return 0
	}
	s.SetTTLs(TTLs{Runs: ttl, Usage: ttl})
	runs := map[string]*protocol.Run{}
	revs := map[string]uint64{}
	for _, k := range []struct{ tenant, run string }{{"acme", "done"}, {"acme", "running"}, {"globex", "done"}} {
		r := &protocol.Run{RunID: k.run, ThreadID: "h1", Tenant: k.tenant, Status: protocol.StatusPending, CreatedAt: time.Now()}
		rev, err := s.Runs.Create(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		r.Status = protocol.StatusRunning
		if rev, err = s.Runs.Update(ctx, r, rev); err != nil {
			t.Fatal(err)
		}
		runs[k.tenant+"."+k.run], revs[k.tenant+"."+k.run] = r, rev
	}
	for _, key := range []string{"acme.done", "globex.done"} {
		r := runs[key]
		r.Status = protocol.StatusSuccess
		if _, err := s.Runs.Update(ctx, r, revs[key]-1); !errors.Is(err, ErrConflict) {
			t.Fatalf("a stale finishing write: %v, want ErrConflict", err)
		}
		if _, err := s.Runs.Update(ctx, r, revs[key]); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Usage.Record(ctx, &protocol.RunUsage{RunID: "done", ThreadID: "h1", Tenant: "acme"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Usage.Record(ctx, &protocol.RunUsage{RunID: "done", ThreadID: "h1", Tenant: "globex"}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, "acme's finished run", func() error { _, _, err := s.Runs.Get(ctx, "acme", "done"); return err })
	waitGone(t, "acme's run usage", func() error { _, _, err := s.Usage.Run(ctx, "acme", "done"); return err })
	waitGone(t, "acme's thread usage", func() error { _, _, err := s.Usage.Thread(ctx, "acme", "h1"); return err })
	if _, _, err := s.Runs.Get(ctx, "acme", "running"); err != nil {
		t.Errorf("acme's running run: %v", err)
	}
	if _, _, err := s.Runs.Get(ctx, "globex", "done"); err != nil {
		t.Errorf("globex's finished run: %v", err)
	}
	if _, _, err := s.Usage.Thread(ctx, "globex", "h1"); err != nil {
		t.Errorf("globex's usage: %v", err)
	}
	// The thread's next run writes its totals again over the marker.
	if err := s.Usage.Record(ctx, &protocol.RunUsage{RunID: "next", ThreadID: "h1", Tenant: "acme"}); err != nil {
		t.Fatalf("usage after it expired: %v", err)
	}
}
