package kv

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
)

func indexThread(tenant, id, owner string) *protocol.Thread {
	now := time.Now().UTC()
	return &protocol.Thread{ThreadID: id, Tenant: tenant, Owner: owner, CreatedAt: now, UpdatedAt: now, Status: protocol.ThreadIdle}
}

// created lists tenant's threads through the creation index, in order.
func created(t *testing.T, s *Stores, tenant string, desc bool, owner func(string) bool) []string {
	t.Helper()
	var out []string
	complete, err := s.Threads.Created(context.Background(), tenant, desc, 1000, owner, func(id string, _ uint64) { out = append(out, id) }, func() bool { return false })
	if err != nil || !complete {
		t.Fatalf("created: complete %v, err %v", complete, err)
	}
	return out
}

// TestThreadCreationIndex: creating a thread indexes it (in creation
// order, both ways), counts come from the index per tenant and owner,
// a concurrent create of the same thread indexes it once, and deleting
// the thread's keys (as erase does) leaves nothing behind.
func TestThreadCreationIndex(t *testing.T) {
	s := openStores(t)
	ctx := context.Background()
	for i, owner := range []string{"", "alice", "bob", "alice"} {
		if _, err := s.Threads.Put(ctx, indexThread("ta", fmt.Sprintf("h%d", i), owner), 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Threads.Put(ctx, indexThread("tb", "h9", ""), 0); err != nil {
		t.Fatal(err)
	}
	if got := created(t, s, "ta", false, nil); fmt.Sprint(got) != "[h0 h1 h2 h3]" {
		t.Fatalf("ta oldest first: %v", got)
	}
	if got := created(t, s, "ta", true, nil); fmt.Sprint(got) != "[h3 h2 h1 h0]" {
		t.Fatalf("ta newest first: %v", got)
	}
	alice := OwnerToken("alice")
	if got := created(t, s, "ta", true, func(tok string) bool { return tok == alice }); fmt.Sprint(got) != "[h3 h1]" {
		t.Fatalf("alice's: %v", got)
	}
	for _, c := range []struct {
		tenant string
		owners []string
		want   int
	}{{"ta", nil, 4}, {"tb", nil, 1}, {"ta", []string{"", "alice"}, 3}, {"ta", []string{"bob"}, 1}, {"tc", nil, 0}, {"t*", nil, 0}} {
		n, err := s.Threads.Count(ctx, c.tenant, c.owners)
		if err != nil || n != c.want {
			t.Fatalf("count %s %v: %d, %v; want %d", c.tenant, c.owners, n, err, c.want)
		}
	}

	// Two writers create the same thread: one record, one index key.
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { _, _ = s.Threads.Put(ctx, indexThread("ta", "race", "carol"), 0) })
	}
	natstest.Wait(t, &wg, "the concurrent creates of race")
	if n, _ := s.Threads.Count(ctx, "ta", []string{"carol"}); n != 1 {
		t.Fatalf("carol's threads after a racing create: %d", n)
	}
	// Another owner's create of an existing thread leaves no key of its own.
	if _, err := s.Threads.Put(ctx, indexThread("ta", "race", "mallory"), 0); err == nil {
		t.Fatal("a second create succeeded")
	}
	if n, _ := s.Threads.Count(ctx, "ta", []string{"mallory"}); n != 0 {
		t.Fatalf("mallory counts %d threads after a refused create", n)
	}

	// Deleted as erase deletes a thread: its keys, then its record.
	for _, k := range []string{bus.Key("ta", "h1", ">"), bus.Key("ta", "h1")} {
		if err := s.Threads.purgeKey(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	if n, _ := s.Threads.Count(ctx, "ta", []string{"alice"}); n != 1 {
		t.Fatalf("alice counts %d after a deletion", n)
	}
	if behind, err := s.Threads.IndexBehind(ctx, "ta"); behind || err != nil {
		t.Fatalf("behind %v, %v", behind, err)
	}
}

// TestThreadReindex: records written without the index (before it
// existed) are indexed oldest created first, once however often the
// repair runs; a key whose record is gone is removed once old enough.
func TestThreadReindex(t *testing.T) {
	s := openStores(t)
	ctx := context.Background()
	base := time.Now().UTC().Add(-time.Hour)
	for i, id := range []string{"c", "a", "b"} {
		th := indexThread("tr", id, "")
		th.CreatedAt = base.Add(time.Duration(i) * time.Minute)
		if _, err := put(ctx, s.Threads.js, s.Threads.kv, bus.Key("tr", id), th, 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Threads.Put(ctx, indexThread("tr", "new", ""), 0); err != nil {
		t.Fatal(err)
	}
	// A key without a record: a writer died between its two writes.
	data, _ := json.Marshal(CreatedEntry{CreatedAt: base})
	if _, err := s.Threads.kv.Create(ctx, CreatedKey("tr", "ghost", ""), data); err != nil {
		t.Fatal(err)
	}
	if behind, err := s.Threads.IndexBehind(ctx, "tr"); !behind || err != nil {
		t.Fatalf("behind %v, %v; want behind", behind, err)
	}
	added, removed, err := s.Threads.Reindex(ctx, "tr")
	if err != nil || added != 3 || removed != 0 {
		t.Fatalf("reindex: added %d removed %d, %v; want 3 added, the young ghost kept", added, removed, err)
	}
	if got := created(t, s, "tr", false, nil); fmt.Sprint(got) != "[new ghost c a b]" {
		t.Fatalf("after the repair: %v", got)
	}
	orphanGrace = 0
	t.Cleanup(func() { orphanGrace = time.Minute })
	added, removed, err = s.Threads.Reindex(ctx, "tr")
	if err != nil || added != 0 || removed != 1 {
		t.Fatalf("second reindex: added %d removed %d, %v; want the ghost removed only", added, removed, err)
	}
	got := created(t, s, "tr", true, nil)
	if fmt.Sprint(got) != "[b a c new]" {
		t.Fatalf("after the second repair: %v", got)
	}
	if behind, _ := s.Threads.IndexBehind(ctx, "tr"); behind {
		t.Fatal("still behind")
	}
	if n, _ := s.Threads.Count(ctx, "tr", []string{""}); n != 4 || !slices.Contains(got, "new") {
		t.Fatalf("count %d", n)
	}
}

// TestCreateNewIndexesTheThread: the worker's one-round-trip create of a
// new thread (a plain publish's first run) indexes it like Put does, and
// a refused create of another owner's thread leaves no key of its own.
func TestCreateNewIndexesTheThread(t *testing.T) {
	s := openStores(t)
	ctx := context.Background()
	if _, err := s.Threads.Put(ctx, indexThread("ta", "first", ""), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Threads.CreateNew(ctx, indexThread("ta", "second", "alice")); err != nil {
		t.Fatal(err)
	}
	if got := created(t, s, "ta", false, nil); fmt.Sprint(got) != "[first second]" {
		t.Fatalf("threads by creation: %v, want [first second]", got)
	}
	if _, err := s.Threads.CreateNew(ctx, indexThread("ta", "second", "mallory")); err != ErrExists {
		t.Fatalf("a second create: %v, want ErrExists", err)
	}
	if n, _ := s.Threads.Count(ctx, "ta", []string{"mallory"}); n != 0 {
		t.Fatalf("mallory has %d indexed threads after a refused create", n)
	}
	if n, _ := s.Threads.Count(ctx, "ta", nil); n != 2 {
		t.Fatalf("ta has %d threads, want 2", n)
	}
}
