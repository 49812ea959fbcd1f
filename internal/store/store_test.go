package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/model/openaitest"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/store"
)

// open provisions a deployment on an embedded server and opens its
// store, with an index when indexed.
func open(t testing.TB, cfg store.Config, indexed ...bool) (*store.Store, jetstream.JetStream) {
	t.Helper()
	srv := natstest.Start(t)
	nc := srv.Connect()
	settings := bus.Settings{}.WithDefaults()
	natstest.Provision(t, nc, settings)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Names = settings.Names
	s, err := store.Open(context.Background(), js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(indexed) > 0 && indexed[0] {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		if err := s.Index(ctx, store.IndexOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return s, js
}

func TestEncodeLabel(t *testing.T) {
	for _, l := range []string{"users", "alice", "a b", "ü", "=x", "x.y", "a/b", strings.Repeat("z", 129), "-", "_"} {
		enc := store.EncodeLabel(l)
		if strings.ContainsAny(enc, ". *>") {
			t.Fatalf("%q encodes as %q, not one token", l, enc)
		}
		back, err := store.DecodeLabel(enc)
		if err != nil || back != l {
			t.Fatalf("%q -> %q -> %q, %v", l, enc, back, err)
		}
	}
	if store.EncodeLabel("alice") != "alice" {
		t.Fatal("a plain label was encoded")
	}
	if store.EncodeLabel("=YQ") == "=YQ" {
		t.Fatal("a label starting with = was kept as is: it would read as the encoding of \"a\"")
	}
}

func TestPutGetDelete(t *testing.T) {
	s, _ := open(t, store.Config{})
	ctx := context.Background()
	ns := []string{"users", "alice", "prefs"}
	if _, _, err := s.Get(ctx, "t1", ns, "theme"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("missing item: %v", err)
	}
	first, err := s.Put(ctx, "t1", ns, "theme", map[string]any{"color": "blue", "n": json.Number("12345678901234567890")}, store.PutOptions{})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	if _, err := s.Put(ctx, "t1", ns, "theme", map[string]any{"color": "green", "n": json.Number("12345678901234567890")}, store.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	got, _, err := s.Get(ctx, "t1", ns, "theme")
	if err != nil {
		t.Fatal(err)
	}
	if got.Value["color"] != "green" || got.Value["n"] != json.Number("12345678901234567890") {
		t.Fatalf("value %v", got.Value)
	}
	if !got.CreatedAt.Equal(first.CreatedAt) || !got.UpdatedAt.After(got.CreatedAt) {
		t.Fatalf("created %s updated %s (first created %s)", got.CreatedAt, got.UpdatedAt, first.CreatedAt)
	}
	if !slices.Equal(got.Namespace, ns) || got.Key != "theme" {
		t.Fatalf("item %v %q", got.Namespace, got.Key)
	}
	// Another tenant has its own store.
	if _, _, err := s.Get(ctx, "t2", ns, "theme"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("another tenant read the item: %v", err)
	}
	// Odd labels and keys round-trip.
	odd := []string{"a b", "ü", "=x"}
	if _, err := s.Put(ctx, "t1", odd, "k.with.dots", map[string]any{"x": true}, store.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if it, _, err := s.Get(ctx, "t1", odd, "k.with.dots"); err != nil || it.Value["x"] != true {
		t.Fatalf("odd labels: %v %v", it, err)
	}
	if err := s.Delete(ctx, "t1", ns, "theme"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Get(ctx, "t1", ns, "theme"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("deleted item: %v", err)
	}
	for _, bad := range [][]string{{""}, {"a.b"}, slices.Repeat([]string{"x"}, store.MaxDepth+1)} {
		if _, err := s.Put(ctx, "t1", bad, "k", nil, store.PutOptions{}); !errors.Is(err, store.ErrInvalid) {
			t.Fatalf("namespace %q: %v", bad, err)
		}
	}
	if _, err := s.Put(ctx, "t1", ns, "", nil, store.PutOptions{}); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("empty key: %v", err)
	}
	if _, err := s.Put(ctx, "bad.tenant", ns, "k", nil, store.PutOptions{}); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("bad tenant: %v", err)
	}
}

func TestPutAtIsACompareAndSet(t *testing.T) {
	s, _ := open(t, store.Config{})
	ctx := context.Background()
	ns := []string{"memories", "bob"}
	if _, err := s.PutAt(ctx, "t", ns, "notes", map[string]any{"content": "a"}, 0, store.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutAt(ctx, "t", ns, "notes", map[string]any{"content": "b"}, 0, store.PutOptions{}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("second create: %v", err)
	}
	_, rev, _ := s.Get(ctx, "t", ns, "notes")
	if _, err := s.PutAt(ctx, "t", ns, "notes", map[string]any{"content": "c"}, rev+7, store.PutOptions{}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("stale revision: %v", err)
	}
	if _, err := s.PutAt(ctx, "t", ns, "notes", map[string]any{"content": "d"}, rev, store.PutOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestTTLExpiresAndRefreshes(t *testing.T) { bothModes(t, testTTLExpiresAndRefreshes) }

func testTTLExpiresAndRefreshes(t *testing.T, indexed bool) {
	s, _ := open(t, store.Config{}, indexed)
	ctx := context.Background()
	ns := []string{"cache"}
	if _, err := s.Put(ctx, "t", ns, "short", map[string]any{"v": 1}, store.PutOptions{TTL: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, "t", ns, "kept", map[string]any{"v": 2}, store.PutOptions{TTL: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	// Refresh "kept" every half second: it outlives "short".
	deadline := time.Now().Add(60 * time.Second)
	for {
		if it, err := s.GetRefresh(ctx, "t", ns, "kept", true); err != nil {
			t.Fatalf("the refreshed item expired: %v", err)
		} else if it.ExpiresAt == nil || time.Until(*it.ExpiresAt) < time.Second {
			t.Fatalf("refresh did not renew the expiry: %v", it.ExpiresAt)
		}
		if _, _, err := s.Get(ctx, "t", ns, "short"); errors.Is(err, store.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the item with a TTL never expired")
		}
		time.Sleep(500 * time.Millisecond)
	}
	res, err := s.Search(ctx, "t", store.SearchOptions{Prefix: ns, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 1 || res[0].Key != "kept" {
		t.Fatalf("search after expiry: %v", keys(res))
	}
	// An expired key (a marker left in its place) takes a new item.
	if _, err := s.Put(ctx, "t", ns, "short", map[string]any{"v": 3}, store.PutOptions{}); err != nil {
		t.Fatalf("put over an expired item: %v", err)
	}
	if it, _, err := s.Get(ctx, "t", ns, "short"); err != nil || it.Value["v"] != json.Number("3") {
		t.Fatalf("the item put over an expired one: %+v %v", it, err)
	}
	big := map[string]any{"text": strings.Repeat("x", 1<<20)}
	if _, err := s.Put(ctx, "t", ns, "big", big, store.PutOptions{}); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("an item over the NATS payload: %v", err)
	}
	if _, err := s.Put(ctx, "t", ns, "x", nil, store.PutOptions{TTL: time.Millisecond}); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("a TTL under a second: %v", err)
	}
}

// bothModes runs a test on a store reading the bucket and on one with an
// index.
func bothModes(t *testing.T, test func(*testing.T, bool)) {
	t.Run("bucket", func(t *testing.T) { test(t, false) })
	t.Run("index", func(t *testing.T) { test(t, true) })
}

func keys(res []store.Result) []string {
	var out []string
	for _, r := range res {
		out = append(out, strings.Join(r.Namespace, "/")+":"+r.Key)
	}
	return out
}

func TestSearchFiltersAndPages(t *testing.T) { bothModes(t, testSearchFiltersAndPages) }

func testSearchFiltersAndPages(t *testing.T, indexed bool) {
	s, _ := open(t, store.Config{}, indexed)
	ctx := context.Background()
	for i := range 6 {
		ns := []string{"docs", []string{"a", "b"}[i%2]}
		if _, err := s.Put(ctx, "t", ns, fmt.Sprint("k", i), map[string]any{"i": i, "kind": []string{"even", "odd"}[i%2], "text": fmt.Sprintf("Item number %d", i)}, store.PutOptions{}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond)
	}
	if _, err := s.Put(ctx, "t", []string{"other"}, "k", map[string]any{"kind": "even"}, store.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, "u", []string{"docs", "a"}, "k0", map[string]any{"kind": "even"}, store.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		opts store.SearchOptions
		want []string
	}{
		{"prefix, latest first", store.SearchOptions{Prefix: []string{"docs"}, Limit: 3}, []string{"docs/b:k5", "docs/a:k4", "docs/b:k3"}},
		{"offset", store.SearchOptions{Prefix: []string{"docs"}, Limit: 2, Offset: 4}, []string{"docs/b:k1", "docs/a:k0"}},
		{"deeper prefix", store.SearchOptions{Prefix: []string{"docs", "a"}, Limit: 10}, []string{"docs/a:k4", "docs/a:k2", "docs/a:k0"}},
		{"equality filter", store.SearchOptions{Prefix: []string{"docs"}, Filter: map[string]any{"kind": "odd"}, Limit: 10}, []string{"docs/b:k5", "docs/b:k3", "docs/b:k1"}},
		{"operator filter", store.SearchOptions{Filter: map[string]any{"i": map[string]any{"$gte": 2.0, "$lt": json.Number("4")}}, Limit: 10}, []string{"docs/b:k3", "docs/a:k2"}},
		{"number filter", store.SearchOptions{Filter: map[string]any{"i": 1.0}, Limit: 10}, []string{"docs/b:k1"}},
		{"substring query", store.SearchOptions{Query: "NUMBER 4", Limit: 10}, []string{"docs/a:k4"}},
		{"whole tenant", store.SearchOptions{Filter: map[string]any{"kind": "even"}, Limit: 10}, []string{"other:k", "docs/a:k4", "docs/a:k2", "docs/a:k0"}},
		{"allow", store.SearchOptions{Prefix: []string{"docs"}, Limit: 10, Allow: func(ns []string) bool { return ns[1] == "b" }}, []string{"docs/b:k5", "docs/b:k3", "docs/b:k1"}},
	}
	for _, c := range cases {
		res, err := s.Search(ctx, "t", c.opts)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := keys(res); !slices.Equal(got, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
		}
		for _, r := range res {
			if r.Score != nil || r.Vectors != nil {
				t.Errorf("%s: a plain search scored or returned vectors", c.name)
			}
		}
	}
	if _, err := s.Search(ctx, "t", store.SearchOptions{Filter: map[string]any{"i": map[string]any{"$regex": "x"}}, Limit: 1}); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("unknown operator: %v", err)
	}
}

func TestListNamespaces(t *testing.T) { bothModes(t, testListNamespaces) }

func testListNamespaces(t *testing.T, indexed bool) {
	s, _ := open(t, store.Config{}, indexed)
	ctx := context.Background()
	for _, ns := range [][]string{{"a", "x", "prefs"}, {"a", "y", "prefs"}, {"a", "y", "notes"}, {"b"}, {"a", "x", "prefs"}} {
		if _, err := s.Put(ctx, "t", ns, "k", nil, store.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Put(ctx, "t", []string{"a", "x", "prefs"}, "k2", nil, store.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, "other", []string{"c"}, "k", nil, store.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		opts store.NamespaceOptions
		want string
	}{
		{"all", store.NamespaceOptions{Limit: 100}, "a/x/prefs a/y/notes a/y/prefs b"},
		{"prefix", store.NamespaceOptions{Prefix: []string{"a", "y"}, Limit: 100}, "a/y/notes a/y/prefs"},
		{"suffix", store.NamespaceOptions{Suffix: []string{"prefs"}, Limit: 100}, "a/x/prefs a/y/prefs"},
		{"max depth", store.NamespaceOptions{MaxDepth: 2, Limit: 100}, "a/x a/y b"},
		{"page", store.NamespaceOptions{Limit: 2, Offset: 1}, "a/y/notes a/y/prefs"},
		{"allow", store.NamespaceOptions{Limit: 100, Allow: func(ns []string) bool { return ns[0] == "b" }}, "b"},
	}
	for _, c := range cases {
		got, err := s.ListNamespaces(ctx, "t", c.opts)
		if err != nil {
			t.Fatal(err)
		}
		var parts []string
		for _, ns := range got {
			parts = append(parts, strings.Join(ns, "/"))
		}
		if strings.Join(parts, " ") != c.want {
			t.Errorf("%s: got %v, want %s", c.name, parts, c.want)
		}
	}
}

func TestSemanticSearch(t *testing.T) { bothModes(t, testSemanticSearch) }

func testSemanticSearch(t *testing.T, indexed bool) {
	srv := openaitest.NewServer(t, nil)
	emb, err := model.NewOpenAIEmbeddings(model.EmbeddingsConfig{BaseURL: srv.URL(), Model: "embed"})
	if err != nil {
		t.Fatal(err)
	}
	s, _ := open(t, store.Config{Embedder: emb, IndexFields: []string{"text"}}, indexed)
	ctx := context.Background()
	ns := []string{"facts"}
	for k, text := range map[string]string{
		"pets":    "the user has two cats and a dog",
		"food":    "the user likes spicy food and pizza",
		"work":    "the user works as a nurse at night",
		"noindex": "cats cats cats",
	} {
		opts := store.PutOptions{}
		if k == "noindex" {
			opts.Index = []string{}
		}
		if _, err := s.Put(ctx, "t", ns, k, map[string]any{"text": text, "meta": "cats"}, opts); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Put(ctx, "t", ns, "other-field", map[string]any{"body": "cats and dogs"}, store.PutOptions{Index: []string{"body"}}); err != nil {
		t.Fatal(err)
	}
	res, err := s.Search(ctx, "t", store.SearchOptions{Prefix: ns, Query: "which pets, cats or dog?", Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	got := keys(res)
	if len(got) != 5 || got[0] != "facts:pets" && got[0] != "facts:other-field" {
		t.Fatalf("ranking %v", got)
	}
	if got[4] != "facts:noindex" || res[4].Score != nil {
		t.Fatalf("the item without vectors is not last and unscored: %v", got)
	}
	for i := range 3 {
		if res[i].Score == nil || *res[i].Score < *res[i+1].Score {
			t.Fatalf("scores out of order at %d: %v", i, got)
		}
	}
	food, _ := s.Search(ctx, "t", store.SearchOptions{Prefix: ns, Query: "pizza food", Limit: 1})
	if len(food) != 1 || food[0].Key != "food" || *food[0].Score <= 0.3 {
		t.Fatalf("pizza: %v", keys(food))
	}
	// A search that refreshes an item's TTL keeps its vectors.
	if _, err := s.Put(ctx, "t", []string{"ttl"}, "k", map[string]any{"text": "pizza"}, store.PutOptions{TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		res, err := s.Search(ctx, "t", store.SearchOptions{Prefix: []string{"ttl"}, Query: "pizza", Limit: 1, Refresh: true})
		if err != nil || len(res) != 1 || res[0].Score == nil || *res[0].Score < 0.99 {
			t.Fatalf("refreshed item: %v %v", keys(res), err)
		}
	}
}

// Another process's index learns of puts through the watch and of
// deletions (stream purges) through the removal notice.
func TestIndexSeesOtherWritersAndRemovals(t *testing.T) {
	a, js := open(t, store.Config{})
	b, err := store.Open(context.Background(), js, store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := b.Index(ctx, store.IndexOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"k1", "k2"} {
		if _, err := a.Put(ctx, "t", []string{"users", "alice", "x"}, k, map[string]any{"v": k}, store.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.Put(ctx, "t", []string{"users", "bob"}, "k", nil, store.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	found := func() []string {
		res, err := b.Search(ctx, "t", store.SearchOptions{Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		got := keys(res)
		slices.Sort(got)
		return got
	}
	if got := found(); !slices.Equal(got, []string{"users/alice/x:k1", "users/alice/x:k2", "users/bob:k"}) {
		t.Fatalf("b's index: %v", got)
	}
	if err := a.Delete(ctx, "t", []string{"users", "alice", "x"}, "k1"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !slices.Equal(found(), []string{"users/alice/x:k2", "users/bob:k"}) {
		if time.Now().After(deadline) {
			t.Fatalf("b's index after a delete: %v", found())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := a.PurgePrefix(ctx, "t", []string{"users", "alice"}); err != nil {
		t.Fatal(err)
	}
	for !slices.Equal(found(), []string{"users/bob:k"}) {
		if time.Now().After(deadline) {
			t.Fatalf("b's index after a purge: %v", found())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, _, err := a.Get(ctx, "t", []string{"users", "alice", "x"}, "k2"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("purged item: %v", err)
	}
}
