package gateway

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/natsagent/natsagent/internal/protocol"
)

// TestThreadsSearchReadsOwnRecordsOnly: a user who may see only their
// own threads, three among 600 of another user's, gets them by
// updated_at both ways and by created_at from their own records alone:
// the search reads three records (another owner's record is unreadable
// and never read), counts them all and says so. When a user may see
// more threads than a search reads in full, and at least a quarter of
// the tenant's, it reads from one end of the stream as an unrestricted
// search does.
func TestThreadsSearchReadsOwnRecordsOnly(t *testing.T) {
	p := newPolicyEnv(t)
	alice, bob, ops := []string{"X-API-Key", aliceKey}, []string{"X-API-Key", bobKey}, []string{"X-API-Key", opsKey}
	bucket := p.settings.Names.ThreadsBucket()
	bobs := func(prefix string) {
		writeThreadsOf(t, p.js, bucket, "acme", prefix, 300, func(int) string { return "bob" })
	}
	p.do("POST", "/threads", map[string]any{"thread_id": "a1"}, alice...).expect(t, http.StatusOK)
	bobs("b")
	p.do("POST", "/threads", map[string]any{"thread_id": "a2"}, alice...).expect(t, http.StatusOK)
	p.do("POST", "/threads", map[string]any{"thread_id": "a3"}, alice...).expect(t, http.StatusOK)
	bobs("c")
	// a1 written again: the last of alice's writes, older than bob's last
	// 300.
	p.do("PATCH", "/threads/a1", map[string]any{"metadata": map[string]any{"topic": "x"}}, alice...).expect(t, http.StatusOK)
	bobs("d")
	for i := range 300 {
		breakRecord(t, p.env, "acme", fmt.Sprintf("d%05d", i))
	}

	search := func(who []string, body map[string]any) (string, http.Header) {
		t.Helper()
		var out []threadView
		r := p.do("POST", "/threads/search", body, who...).expect(t, http.StatusOK)
		r.decode(t, &out)
		return threadIDs(out), r.header
	}
	threads := p.gw.stores.Threads
	// The one-time rebuild of the status and metadata indexes (threads
	// written before them: bob's, written directly) reads every record;
	// it runs here, before the reads counted.
	p.do("POST", "/threads/count", map[string]any{"status": "idle"}, ops...).expect(t, http.StatusOK)
	for _, c := range []struct {
		body  map[string]any
		want  string
		total string
	}{
		{map[string]any{}, "[a1 a3 a2]", "3"},
		{map[string]any{"sort_order": "asc"}, "[a2 a3 a1]", "3"},
		{map[string]any{"sort_by": "updated_at", "limit": 1, "offset": 1}, "[a3]", "3"},
		{map[string]any{"sort_by": "created_at"}, "[a3 a2 a1]", "3"},
		{map[string]any{"sort_by": "created_at", "sort_order": "asc", "limit": 2}, "[a1 a2]", "3"},
		{map[string]any{"metadata": map[string]any{"topic": map[string]any{"not": "indexed"}}}, "[]", "0"},
		{map[string]any{"status": "idle", "sort_order": "asc"}, "[a2 a3 a1]", "3"},
	} {
		before := threads.RecordsRead()
		got, h := search(alice, c.body)
		if got != c.want || h.Get("X-Pagination-Total") != c.total {
			t.Fatalf("alice searches %v: %s (total %q), want %s (total %s)", c.body, got, h.Get("X-Pagination-Total"), c.want, c.total)
		}
		if n := threads.RecordsRead() - before; n > 3 {
			t.Fatalf("alice's search %v read %d records, she has 3 threads", c.body, n)
		}
	}
	// Bob's newest records are unreadable: a search that reads them finds
	// nothing there (they are skipped): ops sees a1, patched after c00299.
	if got, _ := search(ops, map[string]any{"limit": 2}); got != "[a1 c00299]" {
		t.Fatalf("ops' newest: %s", got)
	}

	// Bob may see 900 of 903 threads: past maxOwnThreads, his search
	// reads from one end of the stream as far as its page needs.
	old := maxOwnThreads
	maxOwnThreads = 100
	t.Cleanup(func() { maxOwnThreads = old })
	before := threads.RecordsRead()
	got, h := search(bob, map[string]any{"limit": 2, "sort_order": "asc"})
	if got != "[b00000 b00001]" || h.Get("X-Pagination-Total") != "" {
		t.Fatalf("bob's oldest: %s (total %q)", got, h.Get("X-Pagination-Total"))
	}
	if n := threads.RecordsRead() - before; n >= 900 {
		t.Fatalf("bob's page of the oldest read %d records", n)
	}
	// By created_at it reads the creation index (its keys name their
	// owner) and the page's records.
	before = threads.RecordsRead()
	if got, _ := search(bob, map[string]any{"sort_by": "created_at", "sort_order": "asc", "limit": 2}); got != "[b00000 b00001]" || threads.RecordsRead()-before >= 900 {
		t.Fatalf("bob's oldest created: %s, %d read", got, threads.RecordsRead()-before)
	}
	// Alice, with fewer than maxOwnThreads, still reads hers only.
	before = threads.RecordsRead()
	if got, _ := search(alice, map[string]any{}); got != "[a1 a3 a2]" || threads.RecordsRead()-before > 3 {
		t.Fatalf("alice after the bound changed: %s, %d read", got, threads.RecordsRead()-before)
	}
}

// TestThreadsSearchOldestUpdatedFirst: a search by updated_at ascending
// reads the tenant's records from the stream's start, as far as its page
// needs, and gives the pages a full read and sort gives, rewritten
// threads last, with or without a filter; another tenant's threads,
// written between, never show.
func TestThreadsSearchOldestUpdatedFirst(t *testing.T) {
	const n = 1500
	e := newEnv(t, nil)
	ctx := context.Background()
	bucket := e.settings.Names.ThreadsBucket()
	writeThreads(t, e.js, bucket, "big", "t", n)
	writeThreads(t, e.js, bucket, "other", "o", 100)
	for _, id := range []string{"t00700", "t00003", "t00013"} {
		if _, _, err := e.stores.Threads.Mutate(ctx, "big", id, func(th *protocol.Thread) error {
			th.Metadata["touched"] = true
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	all, err := e.stores.Threads.List(ctx, "big")
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(all, func(a, b *protocol.Thread) int {
		if c := a.UpdatedAt.Compare(b.UpdatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ThreadID, b.ThreadID)
	})
	want := func(offset, limit int, keep func(*protocol.Thread) bool) string {
		var ids []string
		for _, th := range all {
			if keep == nil || keep(th) {
				ids = append(ids, th.ThreadID)
			}
		}
		return fmt.Sprint(ids[min(offset, len(ids)):min(offset+limit, len(ids))])
	}
	u3 := func(th *protocol.Thread) bool { return th.Metadata["user"] == "u3" }
	for _, c := range []struct {
		body map[string]any
		want string
	}{
		{map[string]any{"sort_order": "asc", "limit": 20}, want(0, 20, nil)},
		{map[string]any{"sort_by": "updated_at", "sort_order": "asc", "limit": 50, "offset": 1460}, want(1460, 50, nil)},
		{map[string]any{"sort_order": "asc", "limit": 7, "offset": 3, "metadata": map[string]any{"user": "u3"}}, want(3, 7, u3)},
		{map[string]any{"sort_order": "asc", "limit": 5, "offset": 148, "metadata": map[string]any{"user": "u3"}}, want(148, 5, u3)},
		{map[string]any{"sort_order": "desc", "limit": 5}, fmt.Sprint([]string{"t00013", "t00003", "t00700", "t01499", "t01498"})},
	} {
		var out []threadView
		e.do("POST", "/threads/search", c.body, "X-Tenant", "big").expect(t, http.StatusOK).decode(t, &out)
		if got := threadIDs(out); got != c.want {
			t.Fatalf("search %v: %s, want %s", c.body, got, c.want)
		}
	}
	if got := want(n-3, 3, nil); got != "[t00700 t00003 t00013]" {
		t.Fatalf("the full sort puts the rewritten threads last: %s", got)
	}
	// A page of the oldest reads a small part of the tenant.
	before := e.gw.stores.Threads.RecordsRead()
	r := e.do("POST", "/threads/search", map[string]any{"sort_order": "asc", "limit": 10}, "X-Tenant", "big").expect(t, http.StatusOK)
	if read := e.gw.stores.Threads.RecordsRead() - before; read < 10 || read >= n/2 {
		t.Fatalf("a page of the 10 oldest read %d of %d records", read, n)
	}
	if r.header.Get("X-Pagination-Total") != "" {
		t.Fatalf("a partial read's total: %v", r.header)
	}
	var other []threadView
	e.do("POST", "/threads/search", map[string]any{"sort_order": "asc", "limit": 1000}, "X-Tenant", "other").expect(t, http.StatusOK).decode(t, &other)
	if len(other) != 100 || other[0].ThreadID != "o00000" || other[99].ThreadID != "o00099" {
		t.Fatalf("tenant other by oldest update: %d threads", len(other))
	}
}
