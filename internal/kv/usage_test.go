package kv

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
)

func runUsage(run, thread string, in, out int) *protocol.RunUsage {
	u := &protocol.RunUsage{RunID: run, ThreadID: thread, Tenant: "default", Final: true}
	u.Own.AddCall("gpt-4o", protocol.PurposeMain, in, out, nil, false)
	u.Recompute()
	return u
}

// Recording a run's totals twice (a replayed finish, a redelivery after a
// crash) leaves the thread's totals as after the first time.
func TestUsage_SameRunAppliedTwiceCountsOnce(t *testing.T) {
	s := openStores(t)
	ctx := context.Background()
	if _, _, err := s.Usage.Thread(ctx, "default", "h1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("thread usage before any run: %v", err)
	}
	if err := s.Usage.Record(ctx, runUsage("r1", "h1", 100, 10)); err != nil {
		t.Fatal(err)
	}
	if err := s.Usage.Record(ctx, runUsage("r2", "h1", 200, 20)); err != nil {
		t.Fatal(err)
	}
	_, rev, err := s.Usage.Thread(ctx, "default", "h1")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Usage.Record(ctx, runUsage("r1", "h1", 100, 10)); err != nil {
		t.Fatal(err)
	}
	th, rev2, err := s.Usage.Thread(ctx, "default", "h1")
	if err != nil {
		t.Fatal(err)
	}
	if th.Total.Input != 300 || th.Total.Output != 30 || th.Total.Calls != 2 || len(th.Runs) != 2 {
		t.Fatalf("thread totals %+v", th.Total.TokenCounts)
	}
	if rev2 != rev {
		t.Fatalf("re-applying the same totals wrote the thread record (rev %d → %d)", rev, rev2)
	}
	// A run whose totals changed (its finish replayed after more of it
	// was checkpointed) replaces its entry.
	if err := s.Usage.Record(ctx, runUsage("r1", "h1", 150, 15)); err != nil {
		t.Fatal(err)
	}
	th, _, _ = s.Usage.Thread(ctx, "default", "h1")
	if th.Total.Input != 350 || th.Total.Calls != 2 {
		t.Fatalf("after r1 changed: %+v", th.Total.TokenCounts)
	}
	ru, _, err := s.Usage.Run(ctx, "default", "r1")
	if err != nil || ru.Total.Input != 150 || !ru.Final || ru.UpdatedAt.IsZero() {
		t.Fatalf("run usage %+v, %v", ru, err)
	}
	if _, _, err := s.Usage.Run(ctx, "default", "nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown run: %v", err)
	}
}

// Workers finishing runs of one thread at once each land exactly once.
func TestUsage_ConcurrentRunsOfOneThread(t *testing.T) {
	s := openStores(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.Usage.Record(ctx, runUsage(fmt.Sprintf("r%d", i), "h1", 10, 1)); err != nil {
				t.Error(err)
			}
		}()
	}
	natstest.Wait(t, &wg, "the concurrent usage records")
	th, _, err := s.Usage.Thread(ctx, "default", "h1")
	if err != nil {
		t.Fatal(err)
	}
	if th.Total.Input != 80 || th.Total.Calls != 8 || len(th.Runs) != 8 {
		t.Fatalf("thread totals %+v over %d runs", th.Total.TokenCounts, len(th.Runs))
	}
}

func TestUsage_FoldsOldRuns(t *testing.T) {
	s := openStores(t)
	s.Usage.Keep = 3
	ctx := context.Background()
	for i := range 5 {
		if err := s.Usage.Record(ctx, runUsage(fmt.Sprintf("r%d", i), "h1", 10, 1)); err != nil {
			t.Fatal(err)
		}
	}
	th, _, err := s.Usage.Thread(ctx, "default", "h1")
	if err != nil {
		t.Fatal(err)
	}
	if len(th.Runs) != 3 || th.FoldedRuns != 2 || th.Folded.Input != 20 || th.Total.Input != 50 || th.Total.Calls != 5 {
		t.Fatalf("thread usage %+v", th)
	}
	for _, id := range []string{"r0", "r1"} {
		if _, ok := th.Runs[id]; ok {
			t.Fatalf("%s, one of the oldest, was kept", id)
		}
	}
}

func TestUsage_RejectsBadKeys(t *testing.T) {
	s := openStores(t)
	ctx := context.Background()
	for _, u := range []*protocol.RunUsage{
		{RunID: "r.1", ThreadID: "h1", Tenant: "default"},
		{RunID: "r1", ThreadID: "h*", Tenant: "default"},
		{RunID: "r1", ThreadID: "h1", Tenant: ""},
	} {
		if err := s.Usage.Record(ctx, u); err == nil {
			t.Errorf("%+v accepted", u)
		}
	}
	if _, _, err := s.Usage.Thread(ctx, "default", "a.b"); err == nil {
		t.Error("a thread id with a dot was accepted")
	}
	if err := s.Usage.Record(ctx, runUsage("r1", "h1", 1, 1)); err != nil {
		t.Fatal(err)
	}
	if err := s.Usage.PutRun(ctx, runUsage("r1", "h2", 1, 1)); err == nil {
		t.Error("a run moved to another thread")
	}
}

// Two workers alternate on one thread: each starts from its own, stale,
// copy of the thread's record, and each run still lands exactly once.
func TestUsage_TwoWorkersAlternate(t *testing.T) {
	s := openStores(t)
	ctx := context.Background()
	a, b := s.Usage, NewUsage(s.Usage.js, bus.DefaultNames())
	for i := range 6 {
		w := a
		if i%2 == 1 {
			w = b
		}
		if err := w.Record(ctx, runUsage(fmt.Sprintf("r%d", i), "h1", 10, 1)); err != nil {
			t.Fatal(err)
		}
	}
	// A replay of r0 through the worker whose copy is stale.
	if err := b.Record(ctx, runUsage("r0", "h1", 10, 1)); err != nil {
		t.Fatal(err)
	}
	th, _, err := s.Usage.Thread(ctx, "default", "h1")
	if err != nil {
		t.Fatal(err)
	}
	if th.Total.Input != 60 || th.Total.Calls != 6 || len(th.Runs) != 6 {
		t.Fatalf("thread totals %+v over %d runs", th.Total.TokenCounts, len(th.Runs))
	}
}

// Protocol v2 readers: a thread's usage is its record's totals plus the
// usage bucket's from runs that ended before v2; a run's is its record's,
// else its bucket entry, else zero.
func TestUsage_ReadersMergeRecordAndLegacyBucket(t *testing.T) {
	s := openStores(t)
	ctx := context.Background()
	// Before v2: r1 ended and wrote the bucket.
	if err := s.Usage.Record(ctx, runUsage("r1", "h1", 100, 10)); err != nil {
		t.Fatal(err)
	}
	// Since v2: r2's total is on the thread record, applied twice (a
	// release written again) and counted once.
	th := &protocol.Thread{ThreadID: "h1", Tenant: "default", Usage: &protocol.ThreadUsage{ThreadID: "h1", Tenant: "default"}}
	th.Usage.Apply("r2", runUsage("r2", "h1", 200, 20).Total, protocol.ThreadRecordUsageRuns)
	th.Usage.Apply("r2", runUsage("r2", "h1", 200, 20).Total, protocol.ThreadRecordUsageRuns)
	got, err := s.Usage.ThreadOf(ctx, th)
	if err != nil {
		t.Fatal(err)
	}
	if got.Total.Input != 300 || got.Total.Output != 30 || got.Total.Calls != 2 || len(got.Runs) != 2 || got.Total.Models["gpt-4o"].Main.Input != 300 {
		t.Fatalf("merged thread usage %+v runs %v", got.Total.TokenCounts, got.Runs)
	}
	// A v2 thread alone, and a thread with nothing yet.
	if got, err := s.Usage.ThreadOf(ctx, &protocol.Thread{ThreadID: "h2", Tenant: "default", Usage: th.Usage}); err != nil || got.Total.Input != 200 {
		t.Fatalf("v2 thread usage %+v, %v", got, err)
	}
	if got, err := s.Usage.ThreadOf(ctx, &protocol.Thread{ThreadID: "h3", Tenant: "default"}); err != nil || got.Total.Calls != 0 || got.ThreadID != "h3" {
		t.Fatalf("empty thread usage %+v, %v", got, err)
	}

	// Runs: the record's figures win; the bucket for a pre-v2 record
	// without them; zero for a running run.
	onRecord := runUsage("r2", "h1", 7, 1)
	if got, err := s.Usage.RunOf(ctx, &protocol.Run{RunID: "r2", ThreadID: "h1", Tenant: "default", Status: protocol.StatusSuccess, Usage: onRecord}); err != nil || got.Total.Input != 7 {
		t.Fatalf("run usage from its record %+v, %v", got, err)
	}
	if got, err := s.Usage.RunOf(ctx, &protocol.Run{RunID: "r1", ThreadID: "h1", Tenant: "default", Status: protocol.StatusSuccess}); err != nil || got.Total.Input != 100 {
		t.Fatalf("legacy run usage %+v, %v", got, err)
	}
	if got, err := s.Usage.RunOf(ctx, &protocol.Run{RunID: "r9", ThreadID: "h1", Tenant: "default", Status: protocol.StatusRunning}); err != nil || got.Final || got.Total.Calls != 0 {
		t.Fatalf("running run usage %+v, %v", got, err)
	}
}
