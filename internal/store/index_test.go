package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/store"
)

// openBudget opens a store with an index of budget bytes and a second
// store on the same bucket without one: the bucket's truth, and another
// process's writes.
func openBudget(t *testing.T, cfg store.Config, budget int64) (indexed, plain *store.Store) {
	t.Helper()
	plain, js := open(t, cfg)
	indexed, err := store.Open(context.Background(), js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := indexed.Index(ctx, store.IndexOptions{MemoryBytes: budget}); err != nil {
		t.Fatal(err)
	}
	return indexed, plain
}

// putItems writes n items of tenant, in two namespaces.
func putItems(t *testing.T, s *store.Store, tenant string, n int) {
	t.Helper()
	for i := range n {
		ns := []string{"docs", []string{"a", "b"}[i%2]}
		if _, err := s.Put(context.Background(), tenant, ns, fmt.Sprint("k", i),
			map[string]any{"text": fmt.Sprintf("item %d of tenant %s", i, tenant), "i": i, "kind": []string{"even", "odd"}[i%2]}, store.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// render is a search's answer as text: each item's namespace, key,
// value and score, in order.
func render(t *testing.T, res []store.Result) string {
	t.Helper()
	var b strings.Builder
	for _, r := range res {
		v, err := json.Marshal(r.Value)
		if err != nil {
			t.Fatal(err)
		}
		score := "-"
		if r.Score != nil {
			score = fmt.Sprintf("%.6f", *r.Score)
		}
		fmt.Fprintf(&b, "%s:%s %s %s\n", strings.Join(r.Namespace, "/"), r.Key, v, score)
	}
	return b.String()
}

// sameAsBucket fails unless the indexed store answers opts for tenant as
// the bucket does, and returns the answer.
func sameAsBucket(t *testing.T, indexed, plain *store.Store, tenant string, opts store.SearchOptions) string {
	t.Helper()
	ctx := context.Background()
	got, err := indexed.Search(ctx, tenant, opts)
	if err != nil {
		t.Fatal(err)
	}
	want, err := plain.Search(ctx, tenant, opts)
	if err != nil {
		t.Fatal(err)
	}
	if g, w := render(t, got), render(t, want); g != w {
		t.Fatalf("tenant %s: the index answered\n%s\nthe bucket\n%s", tenant, g, w)
	}
	return render(t, got)
}

func namespaces(t *testing.T, s *store.Store, tenant string) string {
	t.Helper()
	nss, err := s.ListNamespaces(context.Background(), tenant, store.NamespaceOptions{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	var parts []string
	for _, ns := range nss {
		parts = append(parts, strings.Join(ns, "/"))
	}
	return strings.Join(parts, " ")
}

// evict searches filler tenants until tenant is no longer held.
func evict(t *testing.T, s *store.Store, tenant string, fillers []string) {
	t.Helper()
	for range 3 {
		for _, f := range fillers {
			if !slices.Contains(store.LoadedTenants(s), tenant) {
				return
			}
			if _, err := s.Search(context.Background(), f, store.SearchOptions{Limit: 1}); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Fatalf("tenant %s is still held: %v", tenant, store.LoadedTenants(s))
}

var all = store.SearchOptions{Limit: 1000}

// Many tenants searched in turn: the index never holds more than its
// budget, evicts to stay within it, and answers each as the bucket does.
func TestIndexStaysWithinBudget(t *testing.T) {
	const budget = 32 << 10 // about three tenants of ten small items
	s, plain := openBudget(t, store.Config{}, budget)
	const tenants = 30
	for i := range tenants {
		putItems(t, plain, fmt.Sprint("t", i), 10)
	}
	for round := range 2 {
		for i := range tenants {
			tenant := fmt.Sprint("t", i)
			if got := sameAsBucket(t, s, plain, tenant, all); strings.Count(got, "\n") != 10 {
				t.Fatalf("round %d, %s: %s", round, tenant, got)
			}
			st := s.IndexStats()
			if st.Bytes <= 0 || st.Bytes > budget {
				t.Fatalf("round %d, %s: the index holds %d bytes, budget %d", round, tenant, st.Bytes, budget)
			}
		}
	}
	st := s.IndexStats()
	if st.Tenants < 1 || st.Tenants >= tenants/3 {
		t.Fatalf("%d tenants held within %d bytes", st.Tenants, budget)
	}
	if st.Loads < 2*tenants-uint64(st.Tenants) || st.Evictions == 0 {
		t.Fatalf("loads %d, evictions %d: the tenants were not evicted and read again", st.Loads, st.Evictions)
	}
	// Every tenant loaded is held or was evicted.
	if st.Loads-st.Evictions != uint64(st.Tenants) || st.Oversized != 0 || st.BucketSearches != 0 {
		t.Fatalf("stats %+v", st)
	}
	if got := namespaces(t, s, "t7"); got != "docs/a docs/b" {
		t.Fatalf("namespaces of t7: %s", got)
	}
}

// A tenant evicted and read again answers what it answered before, scores
// included.
func TestIndexReloadsEvictedTenant(t *testing.T) {
	s, plain := openBudget(t, store.Config{Embedder: hashEmbedder{64}}, 40<<10)
	for _, tenant := range []string{"a", "f1", "f2", "f3", "f4"} {
		putItems(t, plain, tenant, 12)
	}
	ranked := store.SearchOptions{Query: "item 3 of tenant", Limit: 5}
	filtered := store.SearchOptions{Prefix: []string{"docs", "b"}, Filter: map[string]any{"kind": "odd"}, Limit: 3, Offset: 1}
	first, firstFiltered, firstNS := sameAsBucket(t, s, plain, "a", ranked), sameAsBucket(t, s, plain, "a", filtered), namespaces(t, s, "a")
	if !strings.Contains(first, "0.") || strings.Count(firstFiltered, "\n") != 3 {
		t.Fatalf("ranked\n%s\nfiltered\n%s", first, firstFiltered)
	}
	loads := s.IndexStats().Loads
	evict(t, s, "a", []string{"f1", "f2", "f3", "f4"})
	if again := sameAsBucket(t, s, plain, "a", ranked); again != first {
		t.Fatalf("after a reload\n%s\nbefore\n%s", again, first)
	}
	if again := sameAsBucket(t, s, plain, "a", filtered); again != firstFiltered {
		t.Fatalf("after a reload\n%s\nbefore\n%s", again, firstFiltered)
	}
	if ns := namespaces(t, s, "a"); ns != firstNS {
		t.Fatalf("namespaces after a reload %s, before %s", ns, firstNS)
	}
	if st := s.IndexStats(); st.Loads <= loads || !slices.Contains(store.LoadedTenants(s), "a") {
		t.Fatalf("a was not read again: %+v %v", st, store.LoadedTenants(s))
	}
}

// A search sees the writes made before it, on a tenant the index holds
// and on one it evicted: puts by this process and by another, this
// process's deletes and purges.
func TestIndexReadsOwnWritesLoadedAndEvicted(t *testing.T) {
	s, plain := openBudget(t, store.Config{}, 24<<10)
	fillers := []string{"f1", "f2", "f3", "f4"}
	for _, tenant := range append([]string{"a"}, fillers...) {
		putItems(t, plain, tenant, 8)
	}
	ctx := context.Background()
	prepare := func(state string) {
		t.Helper()
		if _, err := s.Search(ctx, "a", store.SearchOptions{Limit: 1}); err != nil {
			t.Fatal(err)
		}
		if state == "evicted" {
			evict(t, s, "a", fillers)
		} else if !slices.Contains(store.LoadedTenants(s), "a") {
			t.Fatalf("a is not held: %v", store.LoadedTenants(s))
		}
	}
	find := func(key string) string {
		t.Helper()
		res, err := s.Search(ctx, "a", all)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res {
			if r.Key == key {
				v, _ := json.Marshal(r.Value)
				return string(v)
			}
		}
		return ""
	}
	ns := []string{"notes"}
	for _, state := range []string{"held", "evicted"} {
		for i, w := range []*store.Store{s, plain} {
			key := fmt.Sprintf("%s-%d", state, i)
			prepare(state)
			if _, err := w.Put(ctx, "a", ns, key, map[string]any{"v": 1}, store.PutOptions{}); err != nil {
				t.Fatal(err)
			}
			if got := find(key); got != `{"v":1}` {
				t.Fatalf("%s, writer %d: a put is not seen: %q", state, i, got)
			}
			prepare(state)
			if _, err := w.Put(ctx, "a", ns, key, map[string]any{"v": 2}, store.PutOptions{}); err != nil {
				t.Fatal(err)
			}
			if got := find(key); got != `{"v":2}` {
				t.Fatalf("%s, writer %d: an overwrite is not seen: %q", state, i, got)
			}
		}
		key := state + "-0"
		prepare(state)
		if err := s.Delete(ctx, "a", ns, key); err != nil {
			t.Fatal(err)
		}
		if got := find(key); got != "" {
			t.Fatalf("%s: a deleted item was found: %s", state, got)
		}
		prepare(state)
		if err := s.PurgePrefix(ctx, "a", ns); err != nil {
			t.Fatal(err)
		}
		if got := find(state + "-1"); got != "" {
			t.Fatalf("%s: a purged item was found: %s", state, got)
		}
		if got := sameAsBucket(t, s, plain, "a", all); strings.Count(got, "\n") != 8 {
			t.Fatalf("%s: the purge took other items:\n%s", state, got)
		}
	}
	// Another process's delete reaches the index by its notice.
	prepare("held")
	if err := plain.Delete(ctx, "a", []string{"docs", "a"}, "k0"); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); find("k0") != ""; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("another process's delete never reached the index")
		}
	}
}

// A tenant larger than the whole budget is never held: its searches and
// listings read the bucket and answer the same; it is counted once, and
// it does not push out the tenants that fit. A held tenant that grows
// past the budget is dropped the same way.
func TestIndexTenantOverBudgetReadsBucket(t *testing.T) {
	const budget = 16 << 10
	s, plain := openBudget(t, store.Config{}, budget)
	putItems(t, plain, "big", 40)
	putItems(t, plain, "small", 4)
	ctx := context.Background()
	sameAsBucket(t, s, plain, "small", all)
	for _, opts := range []store.SearchOptions{all, {Prefix: []string{"docs", "a"}, Filter: map[string]any{"i": map[string]any{"$gte": 10.0}}, Limit: 5, Offset: 2}, {Query: "ITEM 39", Limit: 3}} {
		if got := sameAsBucket(t, s, plain, "big", opts); got == "" {
			t.Fatalf("no results for %+v", opts)
		}
	}
	if got := namespaces(t, s, "big"); got != "docs/a docs/b" {
		t.Fatalf("namespaces of big: %s", got)
	}
	// A write is seen at once: the search reads the bucket.
	if _, err := s.Put(ctx, "big", []string{"docs", "a"}, "new", map[string]any{"text": "fresh"}, store.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := sameAsBucket(t, s, plain, "big", store.SearchOptions{Query: "fresh", Limit: 10}); !strings.Contains(got, "docs/a:new") {
		t.Fatalf("the put is not seen: %s", got)
	}
	st := s.IndexStats()
	if st.Oversized != 1 || st.BucketSearches != 5 || st.Bytes > budget || st.Bytes == 0 {
		t.Fatalf("stats %+v", st)
	}
	if got := store.LoadedTenants(s); !slices.Equal(got, []string{"small"}) {
		t.Fatalf("held %v", got)
	}
	// "grow" fits, then another process's puts make it larger than the
	// budget: the watch drops it and its searches read the bucket.
	putItems(t, plain, "grow", 2)
	sameAsBucket(t, s, plain, "grow", all)
	if !slices.Contains(store.LoadedTenants(s), "grow") {
		t.Fatalf("grow is not held: %v", store.LoadedTenants(s))
	}
	putItems(t, plain, "grow", 40)
	if got := sameAsBucket(t, s, plain, "grow", all); strings.Count(got, "\n") != 40 {
		t.Fatalf("grow: %s", got)
	}
	st = s.IndexStats()
	if st.Oversized != 2 || st.Bytes > budget || slices.Contains(store.LoadedTenants(s), "grow") {
		t.Fatalf("after grow passed the budget: %+v %v", st, store.LoadedTenants(s))
	}
}

// A search of one tenant reads and holds only that tenant's keys, and
// another tenant's writes leave what it holds alone.
func TestIndexIsolatesTenants(t *testing.T) {
	const budget = 16 << 10
	s, plain := openBudget(t, store.Config{}, budget)
	ctx := context.Background()
	ns := []string{"users", "alice"}
	for _, tenant := range []string{"a", "b", "a-b", "ab"} {
		if _, err := plain.Put(ctx, tenant, ns, "k", map[string]any{"owner": tenant}, store.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Larger than the budget: a load that read it would not fit.
	putItems(t, plain, "b", 40)
	res, err := s.Search(ctx, "a", all)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 1 || res[0].Value["owner"] != "a" {
		t.Fatalf("a found %s", render(t, res))
	}
	if got := namespaces(t, s, "a"); got != "users/alice" {
		t.Fatalf("namespaces %s", got)
	}
	held := s.IndexStats().Bytes
	if got := store.LoadedTenants(s); !slices.Equal(got, []string{"a"}) || held > 2048 {
		t.Fatalf("a search of a loaded %v, %d bytes for one item", got, held)
	}
	for _, tenant := range []string{"b", "a-b", "ab"} {
		if _, err := plain.Put(ctx, tenant, ns, "k2", map[string]any{"owner": tenant}, store.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Search(ctx, "a", all); err != nil {
		t.Fatal(err)
	}
	if got := store.LoadedTenants(s); !slices.Equal(got, []string{"a"}) || s.IndexStats().Bytes != held {
		t.Fatalf("other tenants' writes reached the index: %v, %d bytes (was %d)", got, s.IndexStats().Bytes, held)
	}
	res, err = s.Search(ctx, "a-b", all)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 2 || res[0].Value["owner"] != "a-b" || res[1].Value["owner"] != "a-b" {
		t.Fatalf("a-b found %s", render(t, res))
	}
}

// A put still on its way through the watch when this process purged its
// key is not applied when it arrives.
func TestIndexDropsPutPurgedBeforeTheWatchDeliveredIt(t *testing.T) {
	s, plain := openBudget(t, store.Config{}, 1<<20)
	ctx := context.Background()
	putItems(t, plain, "p", 2)
	sameAsBucket(t, s, plain, "p", all)
	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	store.SetHook(s, func(stage, key string) {
		if stage == "apply" && strings.HasSuffix(key, ".late") {
			once.Do(func() {
				close(held)
				<-release
			})
		}
	})
	if _, err := plain.Put(ctx, "p", []string{"docs", "a"}, "late", map[string]any{"v": 1}, store.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	<-held // the watch holds the put
	if err := s.Delete(ctx, "p", []string{"docs", "a"}, "late"); err != nil {
		t.Fatal(err)
	}
	close(release)
	if got := sameAsBucket(t, s, plain, "p", all); strings.Contains(got, "late") {
		t.Fatalf("the purged put came back:\n%s", got)
	}
}

// Writes made while a tenant is read from the bucket (before the read, so
// the read holds them; after it, so only the watch and the notices do)
// are merged: none is missed, none deleted comes back.
func TestIndexLoadMergesWritesMadeDuringTheRead(t *testing.T) {
	s, plain := openBudget(t, store.Config{}, 1<<20)
	putItems(t, plain, "m", 6)
	ctx := context.Background()
	write := func(stage string) {
		// Through both processes: this one's deletes reach the index at
		// once, the other's puts through the watch.
		mustPut := func(w *store.Store, ns []string, key string, v any) {
			if _, err := w.Put(ctx, "m", ns, key, map[string]any{"v": v}, store.PutOptions{}); err != nil {
				t.Error(err)
			}
		}
		mustPut(plain, []string{"docs", "a"}, stage+"-new", 1)
		mustPut(plain, []string{"docs", "a"}, stage+"-ghost", 1)
		if err := s.Delete(ctx, "m", []string{"docs", "a"}, stage+"-ghost"); err != nil {
			t.Error(err)
		}
		mustPut(s, []string{"tmp", stage}, "x", 1)
		if err := s.PurgePrefix(ctx, "m", []string{"tmp", stage}); err != nil {
			t.Error(err)
		}
		mustPut(plain, []string{"tmp", stage}, "after", 1) // after the purge: it stays
		// Items the read holds: overwritten, deleted.
		k := map[string][2]string{"registered": {"k0", "k1"}, "read": {"k2", "k3"}}[stage]
		mustPut(plain, []string{"docs", "a"}, k[0], stage)
		if err := s.Delete(ctx, "m", []string{"docs", "b"}, k[1]); err != nil {
			t.Error(err)
		}
		// Wait until the watch delivered them: queued for the merge.
		if err := store.CatchUp(ctx, s); err != nil {
			t.Error(err)
		}
	}
	var once sync.Map
	store.SetHook(s, func(stage, tenant string) {
		if stage == "apply" {
			return
		}
		if _, done := once.LoadOrStore(stage, true); !done && tenant == "m" {
			write(stage)
		}
	})
	got := sameAsBucket(t, s, plain, "m", all)
	for _, want := range []string{"registered-new", "read-new", `docs/a:k0 {"v":"registered"}`, `docs/a:k2 {"v":"read"}`, "tmp/registered:after", "tmp/read:after"} {
		if !strings.Contains(got, want) {
			t.Errorf("no %s in\n%s", want, got)
		}
	}
	for _, gone := range []string{"ghost", ":x ", "docs/b:k1 ", "docs/b:k3 "} {
		if strings.Contains(got, gone) {
			t.Errorf("%s came back in\n%s", gone, got)
		}
	}
	if n := strings.Count(got, "\n"); n != 8 {
		t.Errorf("%d items:\n%s", n, got)
	}
}

// Writes from two processes race with searches that keep loading and
// evicting the tenant: once the writes stop, the index answers what the
// bucket holds (no item missed, none deleted back).
func TestIndexConvergesUnderWritesAndEvictions(t *testing.T) {
	s, plain := openBudget(t, store.Config{}, 20<<10)
	fillers := []string{"f1", "f2", "f3"}
	for _, f := range fillers {
		putItems(t, plain, f, 8)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			for _, tenant := range append([]string{"hot"}, fillers...) {
				if _, err := s.Search(ctx, tenant, store.SearchOptions{Limit: 1}); err != nil && ctx.Err() == nil {
					t.Error(err)
					return
				}
			}
		}
	})
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 300 {
		w := []*store.Store{s, plain}[rng.IntN(2)]
		key, ns := fmt.Sprint("k", rng.IntN(12)), []string{"docs", fmt.Sprint(rng.IntN(2))}
		var err error
		switch rng.IntN(5) {
		case 0:
			err = w.Delete(ctx, "hot", ns, key)
		case 1:
			if i%20 == 0 {
				err = w.PurgePrefix(ctx, "hot", ns)
			}
		default:
			_, err = w.Put(ctx, "hot", ns, key, map[string]any{"i": i}, store.PutOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	wg.Wait()
	if st := s.IndexStats(); st.Evictions == 0 {
		t.Fatalf("nothing was evicted: %+v", st)
	}
	// Another process's deletes arrive by notice, a little later.
	var got, want string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		g, err := s.Search(context.Background(), "hot", all)
		if err != nil {
			t.Fatal(err)
		}
		w, err := plain.Search(context.Background(), "hot", all)
		if err != nil {
			t.Fatal(err)
		}
		if got, want = render(t, g), render(t, w); got == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the index answers\n%s\nthe bucket\n%s", got, want)
		}
	}
}

// The bucket's last write, purged before the watch delivered it, never
// reaches the watch: searches still answer (they used to wait for it and
// fail with "the index is behind") and agree with the bucket.
func TestIndexSearchAfterPurgeOfUndeliveredLastWrite(t *testing.T) {
	s, plain := openBudget(t, store.Config{}, 1<<20)
	ctx := context.Background()
	putItems(t, plain, "w", 2)
	sameAsBucket(t, s, plain, "w", all)
	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	store.SetHook(s, func(stage, key string) {
		if stage == "apply" && key == "blk.x.block" {
			once.Do(func() {
				close(held)
				<-release
			})
		}
	})
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	if _, err := plain.Put(ctx, "blk", []string{"x"}, "block", map[string]any{"v": 1}, store.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	<-held // the watch is stopped
	// The watch's buffer (256 entries) fills, then the server's flow
	// control (2 MB unacknowledged) stops pushing: what follows stays on
	// the server.
	for i := range 300 {
		if _, err := plain.Put(ctx, "fill", []string{"small"}, fmt.Sprint("k", i), map[string]any{"i": i}, store.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	big := strings.Repeat("x", 100<<10)
	for i := range 50 {
		if _, err := plain.Put(ctx, "fill", []string{"big"}, fmt.Sprint("k", i), map[string]any{"text": big}, store.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := plain.Put(ctx, "w", []string{"docs"}, "late", map[string]any{"v": 1}, store.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "w", []string{"docs"}, "late"); err != nil {
		t.Fatal(err)
	}
	close(release)
	for range 3 {
		if got := sameAsBucket(t, s, plain, "w", all); strings.Contains(got, "late") || strings.Count(got, "\n") != 2 {
			t.Fatalf("after the purge:\n%s", got)
		}
	}
	// The next write is seen as before.
	if _, err := plain.Put(ctx, "w", []string{"docs"}, "next", map[string]any{"v": 2}, store.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := sameAsBucket(t, s, plain, "w", all); !strings.Contains(got, "docs:next") {
		t.Fatalf("the next write is not seen:\n%s", got)
	}
}

// A put that lands while this process deletes the same key, after the
// delete read the bucket's position, is newer than the delete: it stays
// in the bucket, and the index holds it too (it used to be taken for
// one the delete removed and stay hidden until the item was written
// again).
func TestIndexKeepsPutThatLandsDuringAPurge(t *testing.T) {
	s, plain := openBudget(t, store.Config{}, 1<<20)
	ctx := context.Background()
	putItems(t, plain, "q", 2)
	ns := []string{"docs", "a"}
	if _, err := plain.Put(ctx, "q", ns, "racy", map[string]any{"v": 1}, store.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	sameAsBucket(t, s, plain, "q", all)
	var once sync.Once
	store.SetHook(s, func(stage, filter string) {
		if stage == "purge" && strings.HasSuffix(filter, ".racy") {
			once.Do(func() {
				if _, err := plain.Put(ctx, "q", ns, "racy", map[string]any{"v": 2}, store.PutOptions{}); err != nil {
					t.Error(err)
				}
			})
		}
	})
	if err := s.Delete(ctx, "q", ns, "racy"); err != nil {
		t.Fatal(err)
	}
	got := sameAsBucket(t, s, plain, "q", all)
	if !strings.Contains(got, `docs/a:racy {"v":2}`) {
		t.Fatalf("the put made during the delete is not held:\n%s", got)
	}
	// Deleting it again removes it everywhere.
	if err := s.Delete(ctx, "q", ns, "racy"); err != nil {
		t.Fatal(err)
	}
	if got := sameAsBucket(t, s, plain, "q", all); strings.Contains(got, "racy") || strings.Count(got, "\n") != 2 {
		t.Fatalf("after the second delete:\n%s", got)
	}
}

// A removal notice whose filter is not one tenant's keys (every key, a
// wildcard tenant, a wildcard label) is refused: it cannot hide another
// tenant's writes from the index. A well-formed one still works.
func TestIndexRefusesRemovalNoticesOutsideOneTenant(t *testing.T) {
	plain, js := open(t, store.Config{})
	s, err := store.Open(context.Background(), js, store.Config{Names: bus.Settings{}.WithDefaults().Names})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := s.Index(ctx, store.IndexOptions{}); err != nil {
		t.Fatal(err)
	}
	putItems(t, plain, "v", 4)
	sameAsBucket(t, s, plain, "v", all)
	nc := js.Conn()
	subject := bus.Settings{}.WithDefaults().Names.Prefix + ".ctl.store.removed"
	for _, f := range []string{">", "*.>", "*.docs.>", "v.*.>", "v.docs.>.a", "v", "v..>", "bad tenant.>"} {
		data, _ := json.Marshal(map[string]any{"filter": f, "seq": uint64(math.MaxUint64)})
		if err := nc.Publish(subject, data); err != nil {
			t.Fatal(err)
		}
	}
	// Then a well-formed notice, after them on the same connection: once
	// it took k0 away, the others were taken or refused.
	data, _ := json.Marshal(map[string]any{"filter": "v.docs.a.k0", "seq": uint64(math.MaxUint64)})
	if err := nc.Publish(subject, data); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		res, err := s.Search(ctx, "v", all)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(render(t, res), "docs/a:k0 ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the well-formed notice never reached the index")
		}
	}
	// Writes after the refused notices are seen, in this tenant and in one
	// loaded afterwards.
	for _, tenant := range []string{"v", "u"} {
		if _, err := plain.Put(ctx, tenant, []string{"docs", "b"}, "after", map[string]any{"v": 1}, store.PutOptions{}); err != nil {
			t.Fatal(err)
		}
		if tenant == "u" {
			sameAsBucket(t, s, plain, tenant, all)
			if _, err := plain.Put(ctx, tenant, []string{"docs", "b"}, "after2", map[string]any{"v": 2}, store.PutOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		res, err := s.Search(ctx, tenant, all)
		if err != nil {
			t.Fatal(err)
		}
		if got := render(t, res); !strings.Contains(got, "docs/b:after ") || (tenant == "u" && !strings.Contains(got, "docs/b:after2 ")) {
			t.Fatalf("%s: a put after the refused notices is hidden:\n%s", tenant, got)
		}
	}
}

// A gateway that misses another process's removal notice (disconnected
// when it was sent, or dropping it as a slow consumer) does not keep the
// removed items: neither those of a tenant it holds, nor those of one it
// is reading from the bucket as the removal happens. Search and the
// namespace listing answer as the bucket does.
func TestIndexMissedRemovalNoticeLeavesNoStaleItems(t *testing.T) {
	s, plain := openBudget(t, store.Config{}, 1<<20)
	ctx := context.Background()
	putItems(t, plain, "p", 6)
	putItems(t, plain, "q", 6)
	sameAsBucket(t, s, plain, "p", all)
	store.MissNotices(t, s)

	// Held: a namespace purged, then one item deleted.
	if err := plain.PurgePrefix(ctx, "p", []string{"docs", "a"}); err != nil {
		t.Fatal(err)
	}
	if got := sameAsBucket(t, s, plain, "p", all); strings.Contains(got, "docs/a:") {
		t.Fatalf("purged items came back:\n%s", got)
	}
	if got := namespaces(t, s, "p"); got != "docs/b" {
		t.Fatalf("namespaces of p: %q, want docs/b", got)
	}
	if err := plain.Delete(ctx, "p", []string{"docs", "b"}, "k1"); err != nil {
		t.Fatal(err)
	}
	if got := sameAsBucket(t, s, plain, "p", all); strings.Contains(got, "docs/b:k1 ") {
		t.Fatalf("the deleted item came back:\n%s", got)
	}

	// Loading: the purge lands after the tenant's read of the bucket, and
	// its mark reaches the index before the read is merged.
	missed := make(chan struct{}, 1)
	var once sync.Once
	store.SetHook(s, func(stage, tenant string) {
		switch {
		case stage == "missed" && tenant == "q":
			missed <- struct{}{}
		case stage == "read" && tenant == "q":
			once.Do(func() {
				if err := plain.PurgePrefix(ctx, "q", nil); err != nil {
					t.Error(err)
				}
				natstest.Recv(t, missed, "the removal mark of q")
			})
		}
	})
	if got := sameAsBucket(t, s, plain, "q", all); got != "" {
		t.Fatalf("q's items came back after the purge of the whole tenant:\n%s", got)
	}
	if st := s.IndexStats(); st.MissedRemovals != 3 {
		t.Fatalf("%d missed removals counted, want 3 (two of p, one of q)", st.MissedRemovals)
	}
}

// A removal whose notice arrives before its mark (the usual order) is
// applied from the notice: the tenant stays held, nothing is read again.
func TestIndexHeardRemovalKeepsTheTenant(t *testing.T) {
	s, plain := openBudget(t, store.Config{}, 1<<20)
	ctx := context.Background()
	putItems(t, plain, "p", 6)
	sameAsBucket(t, s, plain, "p", all)
	heard := make(chan struct{}, 1)
	store.SetHook(s, func(stage, name string) {
		switch {
		case stage == "notice":
			heard <- struct{}{}
		case stage == "apply" && strings.HasSuffix(name, "/removed"):
			select { // the watch waits for the notice
			case <-heard:
			case <-time.After(natstest.Patience):
				t.Error("the removal notice never came")
			}
		}
	})
	loads := s.IndexStats().Loads
	if err := plain.PurgePrefix(ctx, "p", []string{"docs", "a"}); err != nil {
		t.Fatal(err)
	}
	if got := sameAsBucket(t, s, plain, "p", all); strings.Contains(got, "docs/a:") {
		t.Fatalf("purged items came back:\n%s", got)
	}
	if st := s.IndexStats(); st.MissedRemovals != 0 || st.Loads != loads {
		t.Fatalf("after a heard removal: %d missed, %d loads (want 0, %d)", st.MissedRemovals, st.Loads, loads)
	}
}
