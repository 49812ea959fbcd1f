package kv

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/protocol"
)

func withStatus(t *testing.T, s *Stores, tenant, st string, owners []string) string {
	t.Helper()
	ids, err := s.Threads.WithStatus(context.Background(), tenant, st, owners)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(ids)
	return fmt.Sprint(ids)
}

func moveTo(t *testing.T, s *Stores, tenant, thread, st, owner string) {
	t.Helper()
	if _, _, err := s.Threads.Mutate(context.Background(), tenant, thread, func(th *protocol.Thread) error {
		th.Status, th.Owner = st, owner
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestThreadStatusIndex: a write into interrupted or error indexes the
// thread under its owner, a write out of it removes the key, writes that
// keep the status write nothing more, and the listings stay within the
// tenant and the owners asked for.
func TestThreadStatusIndex(t *testing.T) {
	s := openStores(t)
	ctx := context.Background()
	for _, id := range []string{"a", "b", "c"} {
		if _, err := s.Threads.Put(ctx, indexThread("ts", id, "alice"), 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Threads.Put(ctx, indexThread("other", "a", "alice"), 0); err != nil {
		t.Fatal(err)
	}
	moveTo(t, s, "ts", "a", protocol.ThreadInterrupted, "alice")
	moveTo(t, s, "ts", "b", protocol.ThreadError, "bob")
	moveTo(t, s, "other", "a", protocol.ThreadInterrupted, "alice")
	if got := withStatus(t, s, "ts", protocol.ThreadInterrupted, nil); got != "[a]" {
		t.Fatalf("interrupted %s", got)
	}
	if got := withStatus(t, s, "ts", protocol.ThreadError, nil); got != "[b]" {
		t.Fatalf("error %s", got)
	}
	if got := withStatus(t, s, "ts", protocol.ThreadError, []string{"alice", ""}); got != "[]" {
		t.Fatalf("alice's errors %s", got)
	}
	if got := withStatus(t, s, "ts", protocol.ThreadError, []string{"bob"}); got != "[b]" {
		t.Fatalf("bob's errors %s", got)
	}
	// The run after the interrupt takes the lease (busy) and fails: a
	// moves from interrupted to error, leaving one key.
	moveTo(t, s, "ts", "a", protocol.ThreadBusy, "alice")
	if got := withStatus(t, s, "ts", protocol.ThreadInterrupted, nil); got != "[]" {
		t.Fatalf("interrupted after the lease %s", got)
	}
	moveTo(t, s, "ts", "a", protocol.ThreadError, "alice")
	moveTo(t, s, "ts", "a", protocol.ThreadError, "alice") // no second key, no purge
	st, err := s.Threads.bucketStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter("$KV."+s.Threads.bucket+".ts.*.status.>"))
	if err != nil {
		t.Fatal(err)
	}
	if len(info.State.Subjects) != 2 {
		t.Fatalf("status keys %v", info.State.Subjects)
	}
	if got := withStatus(t, s, "ts", protocol.ThreadError, nil); got != "[a b]" {
		t.Fatalf("error %s", got)
	}
	if _, err := s.Threads.WithStatus(ctx, "ts", protocol.ThreadBusy, nil); err == nil {
		t.Fatal("busy listed from the status index")
	}
	ids, err := s.Threads.IDs(ctx, "ts", nil)
	slices.Sort(ids)
	if err != nil || fmt.Sprint(ids) != "[a b c]" {
		t.Fatalf("ids %v %v", ids, err)
	}
}

// TestThreadStatusReindex: threads that were interrupted before the index
// existed are added once, a key its record does not confirm is removed
// once old enough, and the tenant's marker says it is done.
func TestThreadStatusReindex(t *testing.T) {
	s := openStores(t)
	ctx := context.Background()
	for _, id := range []string{"old", "calm"} {
		th := indexThread("tr", id, "")
		if id == "old" {
			th.Status = protocol.ThreadInterrupted
		}
		// Written as before the index: the record only.
		if _, err := put(ctx, s.Threads.js, s.Threads.kv, bus.Key("tr", id), th, 0); err != nil {
			t.Fatal(err)
		}
	}
	// A key the record does not confirm: a writer died after it.
	if _, err := s.Threads.kv.Put(ctx, StatusKey("tr", "calm", protocol.ThreadError, ""), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if done, err := s.Threads.StatusIndexed(ctx, "tr"); done || err != nil {
		t.Fatalf("indexed %v %v before the repair", done, err)
	}
	added, removed, err := s.Threads.ReindexStatus(ctx, "tr")
	if err != nil || added != 1 || removed != 0 {
		t.Fatalf("reindex: added %d removed %d, %v; want 1 added, the young key kept", added, removed, err)
	}
	if done, err := s.Threads.StatusIndexed(ctx, "tr"); !done || err != nil {
		t.Fatalf("indexed %v %v after the repair", done, err)
	}
	orphanGrace = 0
	t.Cleanup(func() { orphanGrace = time.Minute })
	added, removed, err = s.Threads.ReindexStatus(ctx, "tr")
	if err != nil || added != 0 || removed != 1 {
		t.Fatalf("second reindex: added %d removed %d, %v", added, removed, err)
	}
	if got := withStatus(t, s, "tr", protocol.ThreadInterrupted, nil); got != "[old]" {
		t.Fatalf("interrupted %s", got)
	}
	if got := withStatus(t, s, "tr", protocol.ThreadError, nil); got != "[]" {
		t.Fatalf("error %s", got)
	}
	// The marker is no thread: not counted, not listed.
	if n, err := s.Threads.Count(ctx, "tr", nil); n != 2 || err != nil {
		t.Fatalf("count %d %v", n, err)
	}
}

// TestThreadMetadataIndex: creation indexes scalar metadata, a patch that
// changes a value moves its key, writes that leave metadata alone (a
// run's) write no key, and objects and long strings are not indexed.
func TestThreadMetadataIndex(t *testing.T) {
	s := openStores(t)
	ctx := context.Background()
	th := indexThread("tm", "a", "alice")
	th.Metadata = map[string]any{"graph_id": "agent", "n": 2.0, "obj": map[string]any{"x": 1}, "long": string(make([]byte, MaxIndexedMetadataBytes+1))}
	if _, err := s.Threads.Put(ctx, th, 0); err != nil {
		t.Fatal(err)
	}
	list := func(field string, v any) string {
		t.Helper()
		ids, ok, err := s.Threads.WithMetadata(ctx, "tm", field, v, []string{"alice"})
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return "not indexed"
		}
		return fmt.Sprint(ids)
	}
	if got := list("graph_id", "agent"); got != "[a]" {
		t.Fatalf("graph_id %s", got)
	}
	if got := list("n", 2); got != "[a]" {
		t.Fatalf("n %s", got)
	}
	if got := list("obj", map[string]any{"x": 1}); got != "not indexed" {
		t.Fatalf("obj %s", got)
	}
	if got := list("long", string(make([]byte, MaxIndexedMetadataBytes+1))); got != "not indexed" {
		t.Fatalf("long %s", got)
	}
	if ids, _, _ := s.Threads.WithMetadata(ctx, "tm", "graph_id", "agent", []string{"bob"}); len(ids) != 0 {
		t.Fatalf("bob's %v", ids)
	}
	st, err := s.Threads.bucketStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	before, _ := st.Info(ctx)
	moveTo(t, s, "tm", "a", protocol.ThreadBusy, "alice")
	moveTo(t, s, "tm", "a", protocol.ThreadIdle, "alice")
	after, _ := st.Info(ctx)
	if after.State.LastSeq-before.State.LastSeq != 2 {
		t.Fatalf("two record writes stored %d messages", after.State.LastSeq-before.State.LastSeq)
	}
	if _, _, err := s.Threads.Mutate(ctx, "tm", "a", func(th *protocol.Thread) error {
		th.Metadata["graph_id"] = "other"
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := list("graph_id", "agent"); got != "[]" {
		t.Fatalf("graph_id agent after the patch %s", got)
	}
	if got := list("graph_id", "other"); got != "[a]" {
		t.Fatalf("graph_id other after the patch %s", got)
	}
}
