package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/erase"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
)

func TestThreadsSearchAndCount(t *testing.T) {
	e := newEnv(t, echoModel())
	for i, color := range []string{"red", "blue", "red", "green"} {
		e.do("POST", "/threads", map[string]any{"thread_id": fmt.Sprintf("t%d", i), "metadata": map[string]any{"color": color, "n": i}}).expect(t, http.StatusOK)
	}
	// A run makes t1 the most recently updated.
	e.do("POST", "/threads/t1/runs/wait", input("hi")).expect(t, http.StatusOK)

	search := func(body map[string]any) []threadView {
		t.Helper()
		var out []threadView
		e.do("POST", "/threads/search", body).expect(t, http.StatusOK).decode(t, &out)
		return out
	}
	idsOf := func(ts []threadView) []string {
		var out []string
		for _, th := range ts {
			out = append(out, th.ThreadID)
		}
		return out
	}
	// Default: updated_at, newest first; a thread written a moment ago is
	// there (the search waits for the index to hold the bucket's writes).
	if got := idsOf(search(map[string]any{})); fmt.Sprint(got) != "[t1 t3 t2 t0]" {
		t.Fatalf("default order %v", got)
	}
	if got := idsOf(search(map[string]any{"sort_by": "created_at", "sort_order": "asc", "limit": 2, "offset": 1})); fmt.Sprint(got) != "[t1 t2]" {
		t.Fatalf("created_at asc page %v", got)
	}
	if got := idsOf(search(map[string]any{"metadata": map[string]any{"color": "red"}, "sort_by": "thread_id", "sort_order": "asc"})); fmt.Sprint(got) != "[t0 t2]" {
		t.Fatalf("metadata filter %v", got)
	}
	if got := idsOf(search(map[string]any{"metadata": map[string]any{"n": 2}})); fmt.Sprint(got) != "[t2]" {
		t.Fatalf("numeric metadata filter %v", got)
	}
	if got := idsOf(search(map[string]any{"ids": []string{"t3", "t0", "nope", "t3"}, "sort_by": "thread_id"})); fmt.Sprint(got) != "[t3 t0]" {
		t.Fatalf("ids %v", got)
	}
	if got := idsOf(search(map[string]any{"status": "idle", "metadata": map[string]any{"color": "green"}})); fmt.Sprint(got) != "[t3]" {
		t.Fatalf("status %v", got)
	}
	if got := search(map[string]any{"status": "busy"}); len(got) != 0 {
		t.Fatalf("busy %v", got)
	}
	r := e.do("POST", "/threads/search", map[string]any{"limit": 1}).expect(t, http.StatusOK)
	if r.header.Get("X-Pagination-Next") != "1" {
		t.Fatalf("pagination header %v", r.header)
	}
	var sel []map[string]any
	e.do("POST", "/threads/search", map[string]any{"select": []string{"thread_id", "status"}, "limit": 1}).expect(t, http.StatusOK).decode(t, &sel)
	if len(sel) != 1 || len(sel[0]) != 2 || sel[0]["thread_id"] != "t1" {
		t.Fatalf("select %v", sel)
	}
	for body, field := range map[string]string{
		`{"values": {"messages": []}}`: "values", `{"status": "deleting"}`: "status", `{"sort_by": "owner"}`: "sort_by",
		`{"select": ["lease"]}`: "select", `{"limit": 0}`: "limit", `{"sort_order": "up"}`: "sort_order",
	} {
		if er := e.do("POST", "/threads/search", body).expect(t, http.StatusBadRequest).apiError(t); er.Field != field {
			t.Fatalf("%s: field %q", body, er.Field)
		}
	}

	count := func(body map[string]any, headers ...string) int {
		t.Helper()
		var n int
		e.do("POST", "/threads/count", body, headers...).expect(t, http.StatusOK).decode(t, &n)
		return n
	}
	if n := count(nil); n != 4 {
		t.Fatalf("count %d", n)
	}
	if n := count(map[string]any{"metadata": map[string]any{"color": "red"}, "status": "idle"}); n != 2 {
		t.Fatalf("count red %d", n)
	}
	e.do("POST", "/threads/count", map[string]any{"values": map[string]any{"x": 1}}).expect(t, http.StatusBadRequest)

	// Deletion leaves the index with the record.
	e.do("DELETE", "/threads/t0", nil).expect(t, http.StatusNoContent)
	testDeadline := time.Now().Add(30 * time.Second)
	for count(nil) != 3 {
		if time.Now().After(testDeadline) {
			t.Fatalf("deleted thread still counted: %d", count(nil))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := idsOf(search(map[string]any{"ids": []string{"t0"}})); len(got) != 0 {
		t.Fatalf("deleted thread found %v", got)
	}
}

func TestThreadsSearchTenantIsolation(t *testing.T) {
	e := newEnv(t, nil)
	e.do("POST", "/threads", map[string]any{"thread_id": "a1", "metadata": map[string]any{"k": "v"}}, "X-Tenant", "ta").expect(t, http.StatusOK)
	e.do("POST", "/threads", map[string]any{"thread_id": "b1", "metadata": map[string]any{"k": "v"}}, "X-Tenant", "tb").expect(t, http.StatusOK)
	var out []threadView
	e.do("POST", "/threads/search", map[string]any{"ids": []string{"a1", "b1"}}, "X-Tenant", "tb").expect(t, http.StatusOK).decode(t, &out)
	if len(out) != 1 || out[0].ThreadID != "b1" {
		t.Fatalf("tb searching both ids: %+v", out)
	}
	e.do("POST", "/threads/search", map[string]any{"metadata": map[string]any{"k": "v"}}, "X-Tenant", "ta").expect(t, http.StatusOK).decode(t, fresh(&out))
	if len(out) != 1 || out[0].ThreadID != "a1" {
		t.Fatalf("ta by metadata: %+v", out)
	}
	var n int
	e.do("POST", "/threads/count", nil, "X-Tenant", "tc").expect(t, http.StatusOK).decode(t, &n)
	if n != 0 {
		t.Fatalf("tc counts %d", n)
	}
}

func TestThreadsSearchOwnThreadsOnly(t *testing.T) {
	p := newPolicyEnv(t)
	alice, bob, ops := []string{"X-API-Key", aliceKey}, []string{"X-API-Key", bobKey}, []string{"X-API-Key", opsKey}
	p.do("POST", "/threads", map[string]any{"thread_id": "ta"}, alice...).expect(t, http.StatusOK)
	p.do("POST", "/threads", map[string]any{"thread_id": "tb"}, bob...).expect(t, http.StatusOK)
	for _, c := range []struct {
		who  []string
		want int
	}{{alice, 1}, {bob, 1}, {ops, 2}} {
		var n int
		p.do("POST", "/threads/count", nil, c.who...).expect(t, http.StatusOK).decode(t, &n)
		if n != c.want {
			t.Fatalf("%s counts %d, want %d", c.who[1][:5], n, c.want)
		}
	}
	var out []threadView
	p.do("POST", "/threads/search", map[string]any{"ids": []string{"ta", "tb"}}, bob...).expect(t, http.StatusOK).decode(t, &out)
	if len(out) != 1 || out[0].ThreadID != "tb" {
		t.Fatalf("bob sees %+v", out)
	}
	// By creation, from the index: each user's own, all for ops.
	for _, c := range []struct {
		who  []string
		want string
	}{{alice, "[ta]"}, {bob, "[tb]"}, {ops, "[tb ta]"}} {
		for _, path := range []string{"/threads/search", "/threads?limit=10"} {
			var got []threadView
			if path == "/threads/search" {
				p.do("POST", path, map[string]any{"sort_by": "created_at"}, c.who...).expect(t, http.StatusOK).decode(t, &got)
			} else {
				p.do("GET", path, nil, c.who...).expect(t, http.StatusOK).decode(t, &got)
			}
			var ids []string
			for _, th := range got {
				ids = append(ids, th.ThreadID)
			}
			if fmt.Sprint(ids) != c.want {
				t.Fatalf("%s: %s lists %v, want %s", path, c.who[1][:5], ids, c.want)
			}
		}
	}
}

// TestThreadIndexFollowsOtherWriters: a thread written by another process
// (here the store directly, as a worker or the retention sweep does) is
// found, and a removed one is gone.
func TestThreadIndexFollowsOtherWriters(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	th := newThread("default", "w1", map[string]any{"by": "worker"})
	if _, err := e.stores.Threads.Put(ctx, th, 0); err != nil {
		t.Fatal(err)
	}
	var n int
	e.do("POST", "/threads/count", map[string]any{"metadata": map[string]any{"by": "worker"}}).expect(t, http.StatusOK).decode(t, &n)
	if n != 1 {
		t.Fatalf("count %d", n)
	}
	if _, _, err := e.stores.Threads.Mutate(ctx, "default", "w1", func(t *protocol.Thread) error {
		t.Status = protocol.ThreadInterrupted
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	e.do("POST", "/threads/count", map[string]any{"status": "interrupted"}).expect(t, http.StatusOK).decode(t, &n)
	if n != 1 {
		t.Fatalf("interrupted count %d", n)
	}
	// Removed as every deletion removes a thread (erase.DeleteThread, as
	// the retention sweep and DELETE /threads/{id} do): its keys purged,
	// no marker left.
	if err := e.gw.eraser.DeleteThread(ctx, "default", "w1", erase.ThreadOptions{}); err != nil {
		t.Fatal(err)
	}
	e.do("POST", "/threads/count", nil).expect(t, http.StatusOK).decode(t, &n)
	if n != 0 {
		t.Fatalf("count after deletion %d", n)
	}
	var out []threadView
	e.do("POST", "/threads/search", map[string]any{"sort_by": "created_at"}).expect(t, http.StatusOK).decode(t, &out)
	if len(out) != 0 {
		t.Fatalf("a created_at search after deletion finds %+v", out)
	}
}

// writeThreads stores n thread records of tenant and their creation
// index keys directly (as kv.Threads.Put does), t<prefix>00000 first, each written after the one before, with
// metadata "user" = u<i%10>.
func writeThreads(tb testing.TB, js jetstream.JetStream, bucket, tenant, prefix string, n int) {
	tb.Helper()
	writeThreadsOf(tb, js, bucket, tenant, prefix, n, func(int) string { return "" })
}

// writeThreadsOf is writeThreads with thread i owned by owner(i).
func writeThreadsOf(tb testing.TB, js jetstream.JetStream, bucket, tenant, prefix string, n int, owner func(i int) string) {
	tb.Helper()
	for i := range n {
		th := newThread(tenant, fmt.Sprintf("%s%05d", prefix, i), map[string]any{"user": fmt.Sprintf("u%d", i%10)})
		th.Owner = owner(i)
		data, err := protocol.AppendThreadJSON(nil, th)
		if err != nil {
			tb.Fatal(err)
		}
		// The creation index key first, then the record, as
		// kv.Threads.Put writes them.
		entry, _ := json.Marshal(kv.CreatedEntry{CreatedAt: th.CreatedAt})
		if _, err := js.PublishAsync("$KV."+bucket+"."+kv.CreatedKey(tenant, th.ThreadID, th.Owner), entry); err != nil {
			tb.Fatal(err)
		}
		if _, err := js.PublishAsync("$KV."+bucket+"."+bus.Key(tenant, th.ThreadID), data); err != nil {
			tb.Fatal(err)
		}
		if i%2000 == 1999 {
			natstest.Recv(tb, js.PublishAsyncComplete(), "the stream's acks of 2000 threads")
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		tb.Fatal("the thread writes were not acknowledged")
	}
}

// TestThreadsSearchReadsBackFromTheNewest: with thousands of threads a
// newest-first search answers from the last writes (it visits a small
// part of the tenant's records), the same page the full read gives; a
// filter matching only old threads reads further back and still finds
// them; rewriting an old thread brings it to the front; other orders and
// counts read the tenant in full; another tenant's threads never show.
func TestThreadsSearchReadsBackFromTheNewest(t *testing.T) {
	const n = 6000
	e := newEnv(t, nil)
	ctx := context.Background()
	bucket := e.settings.Names.ThreadsBucket()
	writeThreads(t, e.js, bucket, "big", "t", n)
	writeThreads(t, e.js, bucket, "other", "o", 300) // written last: newest in the stream

	ids := func(body map[string]any) []string {
		t.Helper()
		var out []threadView
		e.do("POST", "/threads/search", body, "X-Tenant", "big").expect(t, http.StatusOK).decode(t, &out)
		var got []string
		for _, th := range out {
			got = append(got, th.ThreadID)
		}
		return got
	}
	want := func(from, step, count int) string {
		var w []string
		for i := from; len(w) < count; i -= step {
			w = append(w, fmt.Sprintf("t%05d", i))
		}
		return fmt.Sprint(w)
	}
	if got := ids(map[string]any{"limit": 5}); fmt.Sprint(got) != want(n-1, 1, 5) {
		t.Fatalf("newest 5: %v, want %s", got, want(n-1, 1, 5))
	}
	if got := ids(map[string]any{"limit": 3, "offset": 2, "metadata": map[string]any{"user": "u3"}}); fmt.Sprint(got) != want(5973, 10, 3) {
		t.Fatalf("u3 page: %v, want %s", got, want(5973, 10, 3))
	}
	// The same search answered from every record (the order by thread id
	// reads them all) agrees on which threads match.
	var all int
	e.do("POST", "/threads/count", map[string]any{"metadata": map[string]any{"user": "u3"}}, "X-Tenant", "big").expect(t, http.StatusOK).decode(t, &all)
	if all != n/10 {
		t.Fatalf("count u3 %d, want %d", all, n/10)
	}
	if got := ids(map[string]any{"limit": 2, "sort_by": "thread_id", "sort_order": "asc"}); fmt.Sprint(got) != "[t00000 t00001]" {
		t.Fatalf("by thread id: %v", got)
	}

	// Only the newest part is read for a page of the newest.
	visited := 0
	complete, err := e.stores.Threads.Updated(ctx, "big", true, 10, func(*protocol.Thread, uint64) { visited++ }, func() bool { return visited >= 10 })
	if err != nil || complete {
		t.Fatalf("recent: complete %v, err %v", complete, err)
	}
	if visited < 10 || visited >= n/2 {
		t.Fatalf("a page of 10 visited %d of %d records", visited, n)
	}
	r := e.do("POST", "/threads/search", map[string]any{"limit": 10}, "X-Tenant", "big").expect(t, http.StatusOK)
	if r.header.Get("X-Pagination-Next") != "10" || r.header.Get("X-Pagination-Total") != "" {
		t.Fatalf("a partial read's pagination headers: %v", r.header)
	}

	// A filter matching only the oldest threads reads back to them.
	if _, _, err := e.stores.Threads.Mutate(ctx, "big", "t00001", func(th *protocol.Thread) error {
		th.Metadata = map[string]any{"user": "rare"}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := ids(map[string]any{"metadata": map[string]any{"user": "u0"}, "limit": 1, "offset": n/10 - 1}); fmt.Sprint(got) != "[t00000]" {
		t.Fatalf("the oldest u0: %v", got)
	}
	// t00001 was rewritten last: it is the newest now, and the only rare.
	if got := ids(map[string]any{"limit": 2}); fmt.Sprint(got) != fmt.Sprint([]string{"t00001", fmt.Sprintf("t%05d", n-1)}) {
		t.Fatalf("after rewriting t00001: %v", got)
	}
	if got := ids(map[string]any{"metadata": map[string]any{"user": "rare"}}); fmt.Sprint(got) != "[t00001]" {
		t.Fatalf("rare: %v", got)
	}
	// Deleted: gone from the newest page at once.
	e.do("DELETE", "/threads/t00001", nil, "X-Tenant", "big").expect(t, http.StatusNoContent)
	deadline := time.Now().Add(30 * time.Second)
	for got := ids(map[string]any{"limit": 1}); fmt.Sprint(got) != want(n-1, 1, 1); got = ids(map[string]any{"limit": 1}) {
		if time.Now().After(deadline) {
			t.Fatalf("after deleting t00001 the newest is %v", got)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var other []threadView
	e.do("POST", "/threads/search", map[string]any{"limit": 1000}, "X-Tenant", "other").expect(t, http.StatusOK).decode(t, &other)
	if len(other) != 300 {
		t.Fatalf("tenant other sees %d threads", len(other))
	}
	for _, th := range other {
		if !strings.HasPrefix(th.ThreadID, "o") {
			t.Fatalf("tenant other sees %s", th.ThreadID)
		}
	}
}

// TestThreadsSearchByCreation: a created_at search reads the creation
// index from the end its order starts at, only as far as its page needs,
// in both orders, with filters; a tenant whose threads were written
// before the index existed is repaired by its first such search; a count
// without filters reads no record; another tenant's threads never show.
func TestThreadsSearchByCreation(t *testing.T) {
	const n = 3000
	e := newEnv(t, nil)
	ctx := context.Background()
	bucket := e.settings.Names.ThreadsBucket()
	writeThreads(t, e.js, bucket, "big", "t", n)
	writeThreads(t, e.js, bucket, "other", "o", 200)
	// Written before the index existed: no creation index keys.
	st, err := e.js.Stream(ctx, "KV_"+bucket)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Purge(ctx, jetstream.WithPurgeSubject("$KV."+bucket+".big.*.created.*")); err != nil {
		t.Fatal(err)
	}
	if behind, err := e.stores.Threads.IndexBehind(ctx, "big"); !behind || err != nil {
		t.Fatalf("behind %v, %v", behind, err)
	}

	ids := func(body map[string]any) []string {
		t.Helper()
		var out []threadView
		e.do("POST", "/threads/search", body, "X-Tenant", "big").expect(t, http.StatusOK).decode(t, &out)
		got := []string{}
		for _, th := range out {
			got = append(got, th.ThreadID)
		}
		return got
	}
	if got := ids(map[string]any{"limit": 3, "sort_by": "created_at"}); fmt.Sprint(got) != "[t02999 t02998 t02997]" {
		t.Fatalf("newest created: %v", got)
	}
	if behind, err := e.stores.Threads.IndexBehind(ctx, "big"); behind || err != nil {
		t.Fatalf("after the first search: behind %v, %v", behind, err)
	}
	if got := ids(map[string]any{"limit": 3, "offset": 1, "sort_by": "created_at", "sort_order": "asc"}); fmt.Sprint(got) != "[t00001 t00002 t00003]" {
		t.Fatalf("oldest created: %v", got)
	}
	// A page of the newest reads a small part of the index.
	visited := 0
	complete, err := e.stores.Threads.Created(ctx, "big", true, 10, nil, func(string, uint64) { visited++ }, func() bool { return visited >= 10 })
	if err != nil || complete || visited < 10 || visited >= n/2 {
		t.Fatalf("a page of 10 visited %d of %d (complete %v, %v)", visited, n, complete, err)
	}
	visited = 0
	complete, err = e.stores.Threads.Created(ctx, "big", false, 10, nil, func(string, uint64) { visited++ }, func() bool { return visited >= 10 })
	if err != nil || complete || visited < 10 || visited >= n/2 {
		t.Fatalf("a page of the 10 oldest visited %d of %d (complete %v, %v)", visited, n, complete, err)
	}
	// (After the checks above: the first metadata filter completes the
	// status and metadata indexes of threads written before them, keys
	// written at the stream's end, which a newest-first read of the
	// creation index then reads through.)
	if got := ids(map[string]any{"limit": 2, "sort_by": "created_at", "sort_order": "asc", "metadata": map[string]any{"user": "u7"}}); fmt.Sprint(got) != "[t00007 t00017]" {
		t.Fatalf("oldest u7: %v", got)
	}

	// Created now (through the gateway, and as a worker creates one):
	// first newest, last oldest.
	e.do("POST", "/threads", map[string]any{"thread_id": "fresh1"}, "X-Tenant", "big").expect(t, http.StatusOK)
	if _, err := e.stores.Threads.Put(ctx, newThread("big", "fresh2", nil), 0); err != nil {
		t.Fatal(err)
	}
	if got := ids(map[string]any{"limit": 3, "sort_by": "created_at", "sort_order": "desc"}); fmt.Sprint(got) != "[fresh2 fresh1 t02999]" {
		t.Fatalf("newest created after two creates: %v", got)
	}
	var listed []threadView
	e.do("GET", "/threads?limit=2", nil, "X-Tenant", "big").expect(t, http.StatusOK).decode(t, &listed)
	if len(listed) != 2 || listed[0].ThreadID != "fresh2" || listed[1].ThreadID != "fresh1" {
		t.Fatalf("GET /threads: %+v", listed)
	}
	count := func(tenant string, body any) int {
		t.Helper()
		var c int
		e.do("POST", "/threads/count", body, "X-Tenant", tenant).expect(t, http.StatusOK).decode(t, &c)
		return c
	}
	if c := count("big", nil); c != n+2 {
		t.Fatalf("count %d, want %d", c, n+2)
	}
	if c := count("big", map[string]any{"metadata": map[string]any{"user": "u3"}}); c != n/10 {
		t.Fatalf("count u3 %d", c)
	}
	if c := count("other", nil); c != 200 {
		t.Fatalf("count other %d", c)
	}
	if c := count("nobody", nil); c != 0 {
		t.Fatalf("count of an empty tenant %d", c)
	}
	// Deleted: gone from the index and the count.
	e.do("DELETE", "/threads/fresh2", nil, "X-Tenant", "big").expect(t, http.StatusNoContent)
	if got := ids(map[string]any{"limit": 1, "sort_by": "created_at"}); fmt.Sprint(got) != "[fresh1]" {
		t.Fatalf("newest created after deleting fresh2: %v", got)
	}
	if c := count("big", nil); c != n+1 {
		t.Fatalf("count after a deletion %d", c)
	}
	var other []threadView
	e.do("POST", "/threads/search", map[string]any{"limit": 1000, "sort_by": "created_at", "sort_order": "asc"}, "X-Tenant", "other").expect(t, http.StatusOK).decode(t, &other)
	if len(other) != 200 || other[0].ThreadID != "o00000" {
		t.Fatalf("tenant other sees %d threads by creation", len(other))
	}
	for _, th := range other {
		if !strings.HasPrefix(th.ThreadID, "o") {
			t.Fatalf("tenant other sees %s", th.ThreadID)
		}
	}
}

// A create that writes no record leaves no metadata index key: not when
// the thread exists (a do_nothing create of one's own thread with other
// metadata, another user's create of the same id), nor when the record
// cannot be written (over the server's payload limit). Counts read those
// keys alone, and a key of a thread that was never created is under no
// record a deletion would find.
func TestRefusedCreatesLeaveNoMetadataKeys(t *testing.T) {
	p := newPolicyEnv(t)
	alice, bob, ops := []string{"X-API-Key", aliceKey}, []string{"X-API-Key", bobKey}, []string{"X-API-Key", opsKey}
	p.do("POST", "/threads", map[string]any{"thread_id": "m1", "metadata": map[string]any{"team": "red"}}, alice...).expect(t, http.StatusOK)
	var th threadView
	p.do("POST", "/threads", map[string]any{"thread_id": "m1", "metadata": map[string]any{"team": "blue"}, "if_exists": "do_nothing"}, alice...).
		expect(t, http.StatusOK).decode(t, &th)
	if th.Metadata["team"] != "red" {
		t.Fatalf("do_nothing changed the thread: %+v", th.Metadata)
	}
	p.do("POST", "/threads", map[string]any{"thread_id": "m1", "metadata": map[string]any{"team": "green"}}, bob...).expect(t, http.StatusConflict)

	// The record would be over the server's payload limit; the body is
	// not over the gateway's.
	pad := strings.Repeat("x", int(p.nc.MaxPayload())-120)
	if r := p.do("POST", "/threads", map[string]any{"thread_id": "m2", "metadata": map[string]any{"team": "gold", "pad": pad}}, alice...); r.status < 400 {
		t.Fatalf("an over-large thread record was written: %d", r.status)
	}
	p.do("GET", "/threads/m2", nil, alice...).expect(t, http.StatusNotFound)
	if r := p.do("PATCH", "/threads/m1", map[string]any{"metadata": map[string]any{"team": "gold", "pad": pad}}, alice...); r.status < 400 {
		t.Fatalf("an over-large thread record was written: %d", r.status)
	}

	count := func(who []string, team string) int {
		var n int
		p.do("POST", "/threads/count", map[string]any{"metadata": map[string]any{"team": team}}, who...).expect(t, http.StatusOK).decode(t, &n)
		return n
	}
	for _, c := range []struct {
		who  []string
		team string
		want int
	}{{ops, "red", 1}, {alice, "red", 1}, {ops, "blue", 0}, {alice, "blue", 0}, {ops, "green", 0}, {bob, "green", 0}, {ops, "gold", 0}, {alice, "gold", 0}} {
		if n := count(c.who, c.team); n != c.want {
			t.Errorf("%s counts %d threads of team %s, want %d", c.who[1][:5], n, c.team, c.want)
		}
	}
	bucket, err := p.js.KeyValue(context.Background(), p.settings.Names.ThreadsBucket())
	if err != nil {
		t.Fatal(err)
	}
	keys, err := bucket.ListKeysFiltered(context.Background(), "acme.m1.meta.>", "acme.m2", "acme.m2.>")
	if err != nil && !errors.Is(err, jetstream.ErrNoKeysFound) {
		t.Fatal(err)
	}
	var left []string
	for k := range keys.Keys() {
		left = append(left, k)
	}
	if len(left) != 1 {
		t.Fatalf("metadata index keys of m1 and keys of m2 left: %v, want m1's one pair", left)
	}
}

// A thread's metadata fields, and a search's or count's metadata filter,
// are bounded: each field of a thread is an index key written with it,
// each field of a filter one or two server requests (a count, a listing)
// of the index.
func TestThreadMetadataIsBounded(t *testing.T) {
	e := newEnv(t, nil)
	fields := func(n int, prefix string) map[string]any {
		m := map[string]any{}
		for i := range n {
			m[fmt.Sprintf("%s%d", prefix, i)] = i
		}
		return m
	}
	most := protocol.MaxThreadMetadataFields
	er := e.do("POST", "/threads", map[string]any{"thread_id": "big", "metadata": fields(most+1, "k")}).expect(t, http.StatusBadRequest).apiError(t)
	if er.Field != "metadata" {
		t.Fatalf("refused on %q: %s", er.Field, er.Message)
	}
	e.do("GET", "/threads/big", nil).expect(t, http.StatusNotFound)
	e.do("POST", "/threads", map[string]any{"thread_id": "full", "metadata": fields(most, "k")}).expect(t, http.StatusOK)
	// A patch may change the fields a full thread has, not add one.
	e.do("PATCH", "/threads/full", map[string]any{"metadata": map[string]any{"k0": "changed"}}).expect(t, http.StatusOK)
	er = e.do("PATCH", "/threads/full", map[string]any{"metadata": map[string]any{"one_more": 1}}).expect(t, http.StatusBadRequest).apiError(t)
	if er.Field != "metadata" {
		t.Fatalf("patch refused on %q: %s", er.Field, er.Message)
	}
	var th threadView
	e.do("GET", "/threads/full", nil).expect(t, http.StatusOK).decode(t, &th)
	if len(th.Metadata) != most || th.Metadata["k0"] != "changed" {
		t.Fatalf("the full thread has %d fields, k0 %v", len(th.Metadata), th.Metadata["k0"])
	}
	for _, path := range []string{"/threads/search", "/threads/count"} {
		er := e.do("POST", path, map[string]any{"metadata": fields(most+1, "f")}).expect(t, http.StatusBadRequest).apiError(t)
		if er.Field != "metadata" {
			t.Fatalf("%s refused on %q: %s", path, er.Field, er.Message)
		}
		e.do("POST", path, map[string]any{"metadata": fields(most, "k")}).expect(t, http.StatusOK)
	}
}
