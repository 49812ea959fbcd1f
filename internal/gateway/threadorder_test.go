package gateway

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/testdeploy"
)

// setStatus moves a thread into st through the store, as a worker's
// release does (kv.Threads.MutateFrom).
func setStatus(t *testing.T, e *env, tenant, thread, st string) {
	t.Helper()
	if _, _, err := e.stores.Threads.Mutate(context.Background(), tenant, thread, func(th *protocol.Thread) error {
		th.Status = st
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// breakRecord overwrites a thread's record with bytes no reader decodes:
// a search or count that reads it fails.
func breakRecord(t *testing.T, e *env, tenant, thread string) {
	t.Helper()
	if _, err := e.js.Publish(context.Background(), "$KV."+e.settings.Names.ThreadsBucket()+"."+bus.Key(tenant, thread), []byte("not a thread")); err != nil {
		t.Fatal(err)
	}
}

func threadIDs(ts []threadView) string {
	var out []string
	for _, th := range ts {
		out = append(out, th.ThreadID)
	}
	return fmt.Sprint(out)
}

// TestThreadsByStatusFromIndex: status filters, counts by status and the
// thread_id and status orders come from the indexes: a running thread
// is busy while its run holds it, interrupted and error threads are
// those the status index names, and a thread leaving those statuses
// leaves the index; a search reads only the records its page shows.
func TestThreadsByStatusFromIndex(t *testing.T) {
	m, release := blockingModel()
	e := newEnv(t, m)
	t.Cleanup(release)
	for i := range 6 {
		e.do("POST", "/threads", map[string]any{"thread_id": fmt.Sprintf("t%d", i), "metadata": map[string]any{"odd": i%2 == 1}}).expect(t, http.StatusOK)
	}
	setStatus(t, e, "default", "t2", protocol.ThreadInterrupted)
	setStatus(t, e, "default", "t3", protocol.ThreadError)
	setStatus(t, e, "default", "t4", protocol.ThreadInterrupted)
	setStatus(t, e, "default", "t4", protocol.ThreadIdle) // out again: its key goes
	e.do("POST", "/threads/t1/runs", input("hi")).expect(t, http.StatusOK)

	search := func(body map[string]any) string {
		t.Helper()
		var out []threadView
		e.do("POST", "/threads/search", body).expect(t, http.StatusOK).decode(t, &out)
		return threadIDs(out)
	}
	count := func(body map[string]any) int {
		t.Helper()
		var n int
		e.do("POST", "/threads/count", body).expect(t, http.StatusOK).decode(t, &n)
		return n
	}
	testdeploy.WaitFor(t, 30*time.Second, "t1 busy", func() bool { return count(map[string]any{"status": "busy"}) == 1 })
	for st, want := range map[string]int{"busy": 1, "interrupted": 1, "error": 1, "idle": 3} {
		if n := count(map[string]any{"status": st}); n != want {
			t.Fatalf("count %s: %d, want %d", st, n, want)
		}
	}
	if n := count(map[string]any{"status": "interrupted", "metadata": map[string]any{"odd": true}}); n != 0 {
		t.Fatalf("count interrupted odd: %d", n)
	}
	for _, c := range []struct {
		body map[string]any
		want string
	}{
		{map[string]any{"status": "busy"}, "[t1]"},
		{map[string]any{"status": "interrupted"}, "[t2]"},
		{map[string]any{"status": "error", "metadata": map[string]any{"odd": true}}, "[t3]"},
		{map[string]any{"status": "error", "metadata": map[string]any{"odd": false}}, "[]"},
		{map[string]any{"sort_by": "status", "sort_order": "asc"}, "[t1 t3 t0 t4 t5 t2]"},
		{map[string]any{"sort_by": "status", "sort_order": "desc", "limit": 3}, "[t2 t5 t4]"},
		{map[string]any{"sort_by": "thread_id", "sort_order": "asc", "limit": 2, "offset": 1}, "[t1 t2]"},
		{map[string]any{"sort_by": "thread_id", "sort_order": "desc", "metadata": map[string]any{"odd": true}}, "[t5 t3 t1]"},
		{map[string]any{"sort_by": "thread_id", "sort_order": "asc", "status": "idle"}, "[t0 t4 t5]"},
		{map[string]any{"sort_by": "status", "sort_order": "asc", "status": "error"}, "[t3]"},
	} {
		if got := search(c.body); got != c.want {
			t.Fatalf("search %v: %s, want %s", c.body, got, c.want)
		}
	}

	// The run ends: t1 is idle again.
	release()
	testdeploy.WaitFor(t, 30*time.Second, "t1 idle", func() bool { return count(map[string]any{"status": "busy"}) == 0 })
	if n := count(map[string]any{"status": "idle"}); n != 4 {
		t.Fatalf("idle after the run: %d", n)
	}

	// Only the page's records are read: a record no reader can decode,
	// last in id order, fails the pages that show it and no other.
	e.do("POST", "/threads", map[string]any{"thread_id": "zz"}).expect(t, http.StatusOK)
	breakRecord(t, e, "default", "zz")
	if got := search(map[string]any{"sort_by": "thread_id", "sort_order": "asc", "limit": 3}); got != "[t0 t1 t2]" {
		t.Fatalf("first page by id %s", got)
	}
	if got := search(map[string]any{"status": "interrupted"}); got != "[t2]" {
		t.Fatalf("interrupted %s", got)
	}
	if n := count(map[string]any{"status": "idle"}); n != 5 {
		t.Fatalf("idle with zz: %d", n)
	}
	e.do("POST", "/threads/search", map[string]any{"sort_by": "thread_id", "sort_order": "desc", "limit": 3}).expect(t, http.StatusServiceUnavailable)
}

// TestThreadsByStatusOwnThreadsOnly: a user who may see only their own
// threads gets their own from the indexes, and another user's record is
// never read (bob's is unreadable, yet alice's searches and counts
// answer).
func TestThreadsByStatusOwnThreadsOnly(t *testing.T) {
	p := newPolicyEnv(t)
	alice, bob, ops := []string{"X-API-Key", aliceKey}, []string{"X-API-Key", bobKey}, []string{"X-API-Key", opsKey}
	for _, c := range []struct {
		who []string
		id  string
	}{{alice, "a1"}, {alice, "a2"}, {bob, "b1"}, {bob, "b2"}} {
		p.do("POST", "/threads", map[string]any{"thread_id": c.id}, c.who...).expect(t, http.StatusOK)
	}
	setStatus(t, p.env, "acme", "a2", protocol.ThreadInterrupted)
	setStatus(t, p.env, "acme", "b1", protocol.ThreadInterrupted)
	setStatus(t, p.env, "acme", "b2", protocol.ThreadError)

	count := func(who []string, body map[string]any) int {
		t.Helper()
		var n int
		p.do("POST", "/threads/count", body, who...).expect(t, http.StatusOK).decode(t, &n)
		return n
	}
	search := func(who []string, body map[string]any) string {
		t.Helper()
		var out []threadView
		p.do("POST", "/threads/search", body, who...).expect(t, http.StatusOK).decode(t, &out)
		return threadIDs(out)
	}
	if n := count(ops, map[string]any{"status": "interrupted"}); n != 2 {
		t.Fatalf("ops counts %d interrupted", n)
	}
	breakRecord(t, p.env, "acme", "b1")
	breakRecord(t, p.env, "acme", "b2")
	for st, want := range map[string]int{"interrupted": 1, "error": 0, "idle": 1, "busy": 0} {
		if n := count(alice, map[string]any{"status": st}); n != want {
			t.Fatalf("alice counts %d %s, want %d", n, st, want)
		}
	}
	for _, c := range []struct {
		body map[string]any
		want string
	}{
		{map[string]any{"status": "interrupted"}, "[a2]"},
		{map[string]any{"status": "error"}, "[]"},
		{map[string]any{"sort_by": "thread_id", "sort_order": "desc"}, "[a2 a1]"},
		{map[string]any{"sort_by": "status", "sort_order": "asc"}, "[a1 a2]"},
		{map[string]any{"sort_by": "status", "status": "idle"}, "[a1]"},
	} {
		if got := search(alice, c.body); got != c.want {
			t.Fatalf("alice searches %v: %s, want %s", c.body, got, c.want)
		}
	}
	// The reads that do reach bob's records fail: they were read above
	// only if these fail too.
	p.do("POST", "/threads/search", map[string]any{"status": "interrupted"}, ops...).expect(t, http.StatusServiceUnavailable)
	p.do("POST", "/threads/search", map[string]any{"status": "error"}, bob...).expect(t, http.StatusServiceUnavailable)
}

// TestThreadsByMetadataFromIndex: counts with scalar metadata filters
// come from the metadata index, which follows creation and patches; a
// filter only old threads match reads their records only; a value the
// index does not hold (an object) reads the records as before; another
// owner's thread is neither read nor counted.
func TestThreadsByMetadataFromIndex(t *testing.T) {
	p := newPolicyEnv(t)
	alice, bob := []string{"X-API-Key", aliceKey}, []string{"X-API-Key", bobKey}
	for i := range 6 {
		who := alice
		if i >= 4 {
			who = bob
		}
		p.do("POST", "/threads", map[string]any{"thread_id": fmt.Sprintf("m%d", i), "metadata": map[string]any{
			"graph_id": "agent", "n": i % 2, "tags": map[string]any{"x": i},
		}}, who...).expect(t, http.StatusOK)
	}
	p.do("PATCH", "/threads/m0", map[string]any{"metadata": map[string]any{"graph_id": "other"}}, alice...).expect(t, http.StatusOK)
	setStatus(t, p.env, "acme", "m3", protocol.ThreadError)
	count := func(who []string, body map[string]any) int {
		t.Helper()
		var n int
		p.do("POST", "/threads/count", body, who...).expect(t, http.StatusOK).decode(t, &n)
		return n
	}
	search := func(who []string, body map[string]any) string {
		t.Helper()
		var out []threadView
		p.do("POST", "/threads/search", body, who...).expect(t, http.StatusOK).decode(t, &out)
		return threadIDs(out)
	}
	if n := count(bob, map[string]any{"metadata": map[string]any{"graph_id": "agent"}}); n != 2 {
		t.Fatalf("bob counts %d agent threads", n)
	}
	breakRecord(t, p.env, "acme", "m4")
	breakRecord(t, p.env, "acme", "m5")
	for _, c := range []struct {
		body map[string]any
		want int
	}{
		{map[string]any{"metadata": map[string]any{"graph_id": "agent"}}, 3},
		{map[string]any{"metadata": map[string]any{"graph_id": "other"}}, 1},
		{map[string]any{"metadata": map[string]any{"graph_id": "agent", "n": 1}}, 2},
		{map[string]any{"metadata": map[string]any{"graph_id": "agent", "n": 1.0}, "status": "error"}, 1},
		{map[string]any{"metadata": map[string]any{"graph_id": "agent"}, "status": "idle"}, 2},
		{map[string]any{"metadata": map[string]any{"graph_id": "nope"}}, 0},
	} {
		if n := count(alice, c.body); n != c.want {
			t.Fatalf("alice counts %v: %d, want %d", c.body, n, c.want)
		}
	}
	for _, c := range []struct {
		body map[string]any
		want string
	}{
		{map[string]any{"metadata": map[string]any{"graph_id": "agent"}, "sort_by": "thread_id", "sort_order": "asc"}, "[m1 m2 m3]"},
		{map[string]any{"metadata": map[string]any{"graph_id": "other"}}, "[m0]"},
		{map[string]any{"metadata": map[string]any{"n": 0}, "sort_by": "created_at", "sort_order": "asc"}, "[m0 m2]"},
	} {
		if got := search(alice, c.body); got != c.want {
			t.Fatalf("alice searches %v: %s, want %s", c.body, got, c.want)
		}
	}
	// Not indexed (an object): the records are read, as before the index.
	if n := count(alice, map[string]any{"metadata": map[string]any{"tags": map[string]any{"x": 1}}}); n != 1 {
		t.Fatalf("alice counts %d threads tagged x 1", n)
	}
}
