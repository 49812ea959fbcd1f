package store_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"math"
	"testing"

	"github.com/natsagent/natsagent/internal/store"
)

// hashEmbedder is an in-process embedder of dims dimensions (words
// hashed), so the benchmark measures the store, not an HTTP server.
type hashEmbedder struct{ dims int }

func (h hashEmbedder) Embed(_ context.Context, texts []string) ([][]float32, error) {
	out := make([][]float32, len(texts))
	for i, t := range texts {
		v := make([]float32, h.dims)
		f := fnv.New64a()
		f.Write([]byte(t))
		x := f.Sum64()
		for j := range v {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			v[j] = float32(math.Sin(float64(x % 1000)))
		}
		out[i] = v
	}
	return out, nil
}

// BenchmarkSearch searches 10,000 items of one tenant: a filter with no
// query read from the bucket and from the index (what the gateway
// uses), and a query ranked by meaning over 1536-dimension vectors (the
// size of text-embedding-3-small) from the index. The cold cases are a
// tenant's first search, which reads it into the index (evicted before
// each).
func BenchmarkSearch(b *testing.B) {
	const n = 10_000
	for _, c := range []struct {
		name    string
		emb     store.Config
		query   string
		indexed bool
		cold    bool
	}{
		{"filter-bucket", store.Config{}, "", false, false},
		{"filter-index", store.Config{}, "", true, false},
		{"filter-index-cold", store.Config{}, "", true, true},
		{"semantic-1536-index", store.Config{Embedder: hashEmbedder{1536}}, "what does the user like", true, false},
		{"semantic-1536-index-cold", store.Config{Embedder: hashEmbedder{1536}}, "what does the user like", true, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			s, _ := open(b, c.emb, c.indexed)
			ctx := context.Background()
			for i := range n {
				if _, err := s.Put(ctx, "t", []string{"users", fmt.Sprint("u", i%50), "facts"}, fmt.Sprint("k", i),
					map[string]any{"text": fmt.Sprintf("fact %d about the user", i), "kind": fmt.Sprint(i % 10)}, store.PutOptions{}); err != nil {
					b.Fatal(err)
				}
			}
			opts := store.SearchOptions{Prefix: []string{"users"}, Limit: 10, Query: c.query}
			if c.query == "" {
				opts.Filter = map[string]any{"kind": "3"}
			}
			// A warm tenant was searched before: it is held.
			if _, err := s.Search(ctx, "t", opts); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if c.cold {
					b.StopTimer()
					store.Evict(s, "t")
					b.StartTimer()
				}
				res, err := s.Search(ctx, "t", opts)
				if err != nil || len(res) != 10 {
					b.Fatalf("%d results, %v", len(res), err)
				}
			}
		})
	}
}
