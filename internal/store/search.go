package store

import (
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// vectors embeds the fields index names (nil: Config.IndexFields) of
// value; none without an embedder.
func (s *Store) vectors(ctx context.Context, value map[string]any, index []string) ([]Vector, error) {
	if s.cfg.Embedder == nil {
		return nil, nil
	}
	if index == nil {
		index = s.cfg.IndexFields
	}
	var fields, texts []string
	for _, f := range index {
		if t, ok := fieldText(value, f); ok {
			fields, texts = append(fields, f), append(texts, t)
		}
	}
	if len(texts) == 0 {
		return nil, nil
	}
	vs, err := s.cfg.Embedder.Embed(ctx, texts)
	if err != nil {
		return nil, fmt.Errorf("store: embed the item: %w", err)
	}
	out := make([]Vector, len(vs))
	for i, v := range vs {
		out[i] = Vector{Field: fields[i], V: packUnit(v)}
	}
	return out, nil
}

// fieldText is the text embedded for a field path of value: "$" is the
// whole value, "a.b" the field b of the object a; a string as it is,
// anything else as JSON.
func fieldText(value map[string]any, path string) (string, bool) {
	var v any = value
	if path != "$" {
		for _, p := range strings.Split(path, ".") {
			m, ok := v.(map[string]any)
			if !ok {
				return "", false
			}
			if v, ok = m[p]; !ok {
				return "", false
			}
		}
	}
	if s, ok := v.(string); ok {
		return s, s != ""
	}
	b, err := json.Marshal(v)
	return string(b), err == nil && v != nil
}

// packUnit scales v to unit length, so a cosine is a dot product, and
// packs it as little-endian float32s.
func packUnit(v []float32) []byte {
	var n float64
	for _, x := range v {
		n += float64(x) * float64(x)
	}
	n = math.Sqrt(n)
	if n == 0 {
		n = 1
	}
	out := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(float32(float64(x)/n)))
	}
	return out
}

// dot is the dot product of two unit vectors, their cosine (0 when
// their sizes differ: the embeddings model changed).
func dot(v, q []float32) float64 {
	if len(v) != len(q) {
		return 0
	}
	var s float32
	for i, x := range q {
		s += v[i] * x
	}
	return float64(s)
}

// SearchOptions are the options of Search (LangGraph's search body).
type SearchOptions struct {
	Prefix []string
	// Filter keeps items whose value has every field equal to the
	// filter's, or satisfying its operators ($eq, $ne, $gt, $gte, $lt,
	// $lte).
	Filter map[string]any
	Limit  int
	Offset int
	// Query ranks items by meaning with an embedder; without one it keeps
	// items with a string (a value or a field name) that contains it,
	// ignoring case.
	Query string
	// Refresh renews the TTLs of the items returned.
	Refresh bool
	// Allow, when set, keeps only the namespaces it accepts (the gateway
	// leaves out other users' namespaces).
	Allow func(namespace []string) bool
}

// Result is one item a search found; Score is set when a query was
// ranked by meaning and the item has vectors.
type Result struct {
	*Item
	Score *float64
}

var filterOps = map[string]bool{"$eq": true, "$ne": true, "$gt": true, "$gte": true, "$lt": true, "$lte": true}

// CheckFilter refuses a filter operator Search does not know.
func CheckFilter(filter map[string]any) error {
	for k, v := range filter {
		if m, ok := v.(map[string]any); ok && isOps(m) {
			for op := range m {
				if !filterOps[op] {
					return fmt.Errorf("%w: filter %s: operator %q is not one of $eq, $ne, $gt, $gte, $lt, $lte", ErrInvalid, clip(k), clip(op))
				}
			}
		}
	}
	return nil
}

func isOps(m map[string]any) bool {
	for k := range m {
		if strings.HasPrefix(k, "$") {
			return true
		}
	}
	return false
}

// Search returns the items of tenant under opts.Prefix that match, a page
// of them (Offset, Limit) in order: by score with a ranked query, else
// the latest updated first. It reads every item under the prefix (from
// the index, else a watch of the bucket), so its cost grows with them.
func (s *Store) Search(ctx context.Context, tenant string, opts SearchOptions) ([]Result, error) {
	if err := CheckFilter(opts.Filter); err != nil {
		return nil, err
	}
	f, err := prefixFilter(tenant, opts.Prefix)
	if err != nil {
		return nil, err
	}
	var q []float32
	if opts.Query != "" && s.cfg.Embedder != nil {
		vs, err := s.cfg.Embedder.Embed(ctx, []string{opts.Query})
		if err != nil {
			return nil, fmt.Errorf("store: embed the query: %w", err)
		}
		q = unpack(packUnit(vs[0]))
	}
	needle := strings.ToLower(opts.Query)
	filter, _ := normalize(opts.Filter).(map[string]any)
	now := time.Now()
	type hit struct {
		Result
		rev uint64
	}
	var hits []hit
	err = s.scan(ctx, tenant, f, func(c candidate) {
		if c.item.expired(now) || (opts.Allow != nil && !opts.Allow(c.item.Namespace)) || !matches(c.item.Value, filter) {
			return
		}
		it := *c.item
		it.Vectors = nil
		h := hit{Result: Result{Item: &it}, rev: c.rev}
		switch {
		case q != nil:
			if len(c.vecs) > 0 {
				best := math.Inf(-1)
				for _, v := range c.vecs {
					best = max(best, dot(v, q))
				}
				h.Score = &best
			}
		case needle != "" && !containsText(it.Value, needle):
			return
		}
		hits = append(hits, h)
	})
	if err != nil {
		return nil, err
	}
	order := func(a, b hit) int {
		if a.Score != nil || b.Score != nil {
			switch {
			case b.Score == nil:
				return -1
			case a.Score == nil:
				return 1
			case *a.Score != *b.Score:
				return cmp.Compare(*b.Score, *a.Score)
			}
		}
		if c := b.UpdatedAt.Compare(a.UpdatedAt); c != 0 {
			return c
		}
		if c := slices.Compare(a.Namespace, b.Namespace); c != 0 {
			return c
		}
		return strings.Compare(a.Key, b.Key)
	}
	slices.SortFunc(hits, order)
	lo := min(opts.Offset, len(hits))
	hi := min(lo+opts.Limit, len(hits))
	out := make([]Result, 0, hi-lo)
	for _, h := range hits[lo:hi] {
		if opts.Refresh && h.TTL > 0 {
			// The hit has no vectors; the refresh writes the whole item.
			if full, rev, err := s.Get(ctx, tenant, h.Namespace, h.Key); err == nil && rev == h.rev {
				s.refresh(ctx, tenant, full, rev)
				h.ExpiresAt = full.ExpiresAt
			}
		}
		out = append(out, h.Result)
	}
	return out, nil
}

func unpack(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

// candidate is an item a search considers, with its vectors unpacked.
type candidate struct {
	item *Item
	rev  uint64
	vecs [][]float32
}

// scan calls fn with every item of tenant under the key filter f: from
// the index once it caught up, else read from the bucket. fn must not
// change the item.
func (s *Store) scan(ctx context.Context, tenant, f string, fn func(candidate)) error {
	if s.ix != nil {
		held, ok, err := s.ix.read(ctx, tenant, f)
		if err != nil {
			return err
		}
		if ok {
			for _, e := range held {
				fn(candidate{item: e.item, rev: e.rev, vecs: e.vecs})
			}
			return nil
		}
	}
	return s.each(ctx, f, func(e jetstream.KeyValueEntry) {
		it, err := decodeItem(e.Value())
		if err != nil {
			return
		}
		c := candidate{item: it, rev: e.Revision()}
		for _, v := range it.Vectors {
			c.vecs = append(c.vecs, unpack(v.V))
		}
		fn(c)
	})
}

// each calls fn with every item under the key filter f (with opts, only
// what they ask for: jetstream.MetaOnly for keys); removal marks are no
// items.
func (s *Store) each(ctx context.Context, f string, fn func(jetstream.KeyValueEntry), opts ...jetstream.WatchOpt) error {
	w, err := s.kv.Watch(ctx, f, append([]jetstream.WatchOpt{jetstream.IgnoreDeletes()}, opts...)...)
	if err != nil {
		return err
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("store: the watch of the bucket stopped")
			}
			if e == nil {
				return nil
			}
			if _, mark := removalMark(e.Key()); !mark {
				fn(e)
			}
		}
	}
}

// normalize turns every number of a decoded JSON value into a float64,
// so values decoded with UseNumber and without compare equal.
func normalize(v any) any {
	switch v := v.(type) {
	case json.Number:
		f, err := v.Float64()
		if err != nil {
			return v.String()
		}
		return f
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, x := range v {
			out[k] = normalize(x)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = normalize(x)
		}
		return out
	case nil:
		return nil
	case float64, string, bool:
		return v
	}
	b, err := json.Marshal(v)
	if err != nil {
		return v
	}
	var out any
	_ = json.Unmarshal(b, &out)
	return out
}

// matches reports whether value satisfies a normalized filter: each
// top-level field equal, or satisfying the field's operators.
func matches(value map[string]any, filter map[string]any) bool {
	for k, want := range filter {
		got := normalize(value[k])
		if ops, ok := want.(map[string]any); ok && isOps(ops) {
			for op, arg := range ops {
				if !compareOp(op, got, arg) {
					return false
				}
			}
			continue
		}
		if !reflect.DeepEqual(got, want) {
			return false
		}
	}
	return true
}

func compareOp(op string, got, arg any) bool {
	switch op {
	case "$eq":
		return reflect.DeepEqual(got, arg)
	case "$ne":
		return !reflect.DeepEqual(got, arg)
	}
	var c int
	switch g := got.(type) {
	case float64:
		a, ok := arg.(float64)
		if !ok {
			return false
		}
		c = cmp.Compare(g, a)
	case string:
		a, ok := arg.(string)
		if !ok {
			return false
		}
		c = strings.Compare(g, a)
	default:
		return false
	}
	switch op {
	case "$gt":
		return c > 0
	case "$gte":
		return c >= 0
	case "$lt":
		return c < 0
	case "$lte":
		return c <= 0
	}
	return false
}

// containsText reports whether a string of v (a value or a field name)
// contains needle, which is lower case.
func containsText(v any, needle string) bool {
	switch v := v.(type) {
	case string:
		return strings.Contains(strings.ToLower(v), needle)
	case map[string]any:
		for k, x := range v {
			if strings.Contains(strings.ToLower(k), needle) || containsText(x, needle) {
				return true
			}
		}
	case []any:
		for _, x := range v {
			if containsText(x, needle) {
				return true
			}
		}
	}
	return false
}

// NamespaceOptions are the options of ListNamespaces (LangGraph's body).
type NamespaceOptions struct {
	Prefix, Suffix []string
	// MaxDepth truncates longer namespaces to their first MaxDepth labels
	// (0: no limit).
	MaxDepth int
	Limit    int
	Offset   int
	Allow    func(namespace []string) bool
}

// ListNamespaces returns the distinct namespaces of tenant's items that
// start with Prefix and end with Suffix, truncated to MaxDepth, sorted, a
// page of them. It reads the keys under the prefix, not the values.
func (s *Store) ListNamespaces(ctx context.Context, tenant string, opts NamespaceOptions) ([][]string, error) {
	if err := CheckNamespace(opts.Suffix); err != nil {
		return nil, err
	}
	f, err := prefixFilter(tenant, opts.Prefix)
	if err != nil {
		return nil, err
	}
	seen := map[string][]string{}
	keys := s.eachKey
	if s.ix != nil {
		keys = func(ctx context.Context, f string, fn func(string)) error {
			held, ok, err := s.ix.read(ctx, tenant, f)
			if err != nil || !ok {
				if err == nil {
					err = s.eachKey(ctx, f, fn)
				}
				return err
			}
			for _, e := range held {
				fn(e.key)
			}
			return nil
		}
	}
	err = keys(ctx, f, func(k string) {
		ns, _, err := parseKey(k)
		if err != nil || len(ns) == 0 || len(ns) < len(opts.Suffix) || !slices.Equal(ns[len(ns)-len(opts.Suffix):], opts.Suffix) {
			return
		}
		if opts.Allow != nil && !opts.Allow(ns) {
			return
		}
		if opts.MaxDepth > 0 && len(ns) > opts.MaxDepth {
			ns = ns[:opts.MaxDepth]
		}
		seen[strings.Join(ns, ".")] = ns
	})
	if err != nil {
		return nil, err
	}
	all := make([][]string, 0, len(seen))
	for _, ns := range seen {
		all = append(all, ns)
	}
	slices.SortFunc(all, slices.Compare)
	lo := min(opts.Offset, len(all))
	hi := min(lo+opts.Limit, len(all))
	return all[lo:hi], nil
}

// eachKey calls fn with every key under the key filter f.
func (s *Store) eachKey(ctx context.Context, f string, fn func(string)) error {
	return s.each(ctx, f, func(e jetstream.KeyValueEntry) { fn(e.Key()) }, jetstream.MetaOnly())
}
