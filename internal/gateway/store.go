package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/natsagent/natsagent/internal/metrics"
	"github.com/natsagent/natsagent/internal/store"
)

// The LangGraph store (/store/items, /store/namespaces), per tenant in the
// store bucket (internal/store). A tenant's items are shared by its
// principals, as in LangGraph, except the namespaces store.UserScoped
// names: ["users", <user>, ...] and ["memories", <user>, ...] belong to
// that user alone, the principal's user, never one a body names.

// itemView is an item in LangGraph's shape; Score only in searches.
type itemView struct {
	Namespace []string       `json:"namespace"`
	Key       string         `json:"key"`
	Value     map[string]any `json:"value"`
	CreatedAt time.Time      `json:"created_at"`
	UpdatedAt time.Time      `json:"updated_at"`
}

type searchItemView struct {
	itemView
	Score *float64 `json:"score"`
}

func viewItem(it *store.Item) itemView {
	return itemView{Namespace: it.Namespace, Key: it.Key, Value: it.Value, CreatedAt: it.CreatedAt, UpdatedAt: it.UpdatedAt}
}

// openStore binds the store routes to the store bucket, searched from an
// index the gateway keeps; without the bucket they answer 503.
func (s *Server) openStore(ctx context.Context) error {
	s.items = nil
	st, err := store.Open(ctx, s.js, store.Config{Names: s.names, Embedder: s.cfg.Embedder, IndexFields: s.cfg.StoreIndexFields})
	if err != nil {
		return err
	}
	// The index follows the bucket for the gateway's life, as the thread
	// index does, holding the tenants searched lately within its budget.
	if err := st.Index(context.WithoutCancel(ctx), store.IndexOptions{Log: s.log, MemoryBytes: s.cfg.StoreIndexMemory}); err != nil {
		return err
	}
	s.cfg.Metrics.TrackStoreIndex(func() metrics.StoreIndexStats {
		x := st.IndexStats()
		return metrics.StoreIndexStats{Bytes: x.Bytes, Budget: x.Budget, Tenants: x.Tenants, Loads: x.Loads,
			Evictions: x.Evictions, Oversized: x.Oversized, BucketSearches: x.BucketSearches, MissedRemovals: x.MissedRemovals}
	})
	s.items = st
	return nil
}

func (s *Server) needStore() error {
	if s.items == nil {
		return errUnavailable("this deployment has no store bucket: provision it with this version", nil)
	}
	return nil
}

// storeAllow is the namespace rule of the request: nil (everything of
// the tenant) on an open gateway, else every namespace but other users'.
func storeAllow(r *http.Request) func([]string) bool {
	p, ok := principalOf(r)
	if !ok {
		return nil
	}
	return func(ns []string) bool {
		u, scoped := store.UserScoped(ns)
		return !scoped || u == p.p.User
	}
}

// checkNamespace refuses a namespace the request may not name: one that
// is invalid, or (as a namespace or a prefix) another user's.
func checkNamespace(r *http.Request, field string, ns []string) error {
	if err := store.CheckNamespace(ns); err != nil {
		return errInvalid(field, strings.TrimPrefix(err.Error(), store.ErrInvalid.Error()+": "))
	}
	if allow := storeAllow(r); allow != nil && !allow(ns) {
		u, _ := store.UserScoped(ns)
		return &apiError{status: http.StatusForbidden, code: CodeForbidden,
			msg: fmt.Sprintf("namespace %q belongs to user %s: only that user may read or write it", ns, u)}
	}
	return nil
}

// storeError maps the store's errors to the API's.
func storeError(field string, err error) error {
	if errors.Is(err, store.ErrInvalid) {
		return errInvalid(field, strings.TrimPrefix(err.Error(), store.ErrInvalid.Error()+": "))
	}
	return err
}

type putItemBody struct {
	Namespace []string        `json:"namespace"`
	Key       string          `json:"key"`
	Value     map[string]any  `json:"value"`
	Index     json.RawMessage `json:"index"`
	TTL       *float64        `json:"ttl"`
}

// indexFields reads LangGraph's index: null or absent (the deployment's
// fields: nil), false (none), or a list of field paths.
func indexFields(raw json.RawMessage) ([]string, error) {
	if isNull(raw) {
		return nil, nil
	}
	var b bool
	if json.Unmarshal(raw, &b) == nil {
		if b {
			return nil, errInvalid("index", "index must be false, null or a list of field paths")
		}
		return []string{}, nil
	}
	var fields []string
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, errInvalid("index", "index must be false, null or a list of field paths")
	}
	if fields == nil {
		fields = []string{}
	}
	for _, f := range fields {
		if f == "" || len(f) > store.MaxKeyBytes {
			return nil, errInvalid("index", fmt.Sprintf("index: %q is not a field path", clip(f)))
		}
	}
	return fields, nil
}

// ttlMinutes turns LangGraph's ttl (minutes, null for none) into a
// duration.
func ttlMinutes(m *float64) (time.Duration, error) {
	if m == nil {
		return 0, nil
	}
	if math.IsNaN(*m) || *m <= 0 || *m > store.MaxTTL.Minutes() {
		return 0, errInvalid("ttl", fmt.Sprintf("ttl must be a number of minutes above 0 and at most %.0f, or null", store.MaxTTL.Minutes()))
	}
	return max(time.Duration(*m*float64(time.Minute)), time.Second), nil
}

// putItem: PUT /store/items. 204.
func (s *Server) putItem(w http.ResponseWriter, r *http.Request, tenant string) error {
	if err := s.needStore(); err != nil {
		return err
	}
	var b putItemBody
	if err := decodeBody(r, &b); err != nil {
		return err
	}
	if len(b.Namespace) == 0 {
		return errInvalid("namespace", "namespace is required and cannot be empty")
	}
	if err := checkNamespace(r, "namespace", b.Namespace); err != nil {
		return err
	}
	if b.Value == nil {
		return errInvalid("value", "value is required and must be an object")
	}
	index, err := indexFields(b.Index)
	if err != nil {
		return err
	}
	ttl, err := ttlMinutes(b.TTL)
	if err != nil {
		return err
	}
	if _, err := s.items.Put(r.Context(), tenant, b.Namespace, b.Key, b.Value, store.PutOptions{TTL: ttl, Index: index}); err != nil {
		return storeError("key", err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// refreshParam reads refresh_ttl (default true: LangGraph's TTL config
// refreshes on read unless told otherwise).
func refreshParam(v *bool) bool { return v == nil || *v }

// getItem: GET /store/items?namespace=a.b&key=k[&refresh_ttl=]. 200 with
// the item, or null when there is none, as LangGraph answers.
func (s *Server) getItem(w http.ResponseWriter, r *http.Request, tenant string) error {
	if err := s.needStore(); err != nil {
		return err
	}
	q := r.URL.Query()
	ns := strings.Split(q.Get("namespace"), ".")
	if err := checkNamespace(r, "namespace", ns); err != nil {
		return err
	}
	key := q.Get("key")
	if key == "" {
		return errInvalid("key", "key is required")
	}
	var refresh *bool
	if q.Has("refresh_ttl") {
		v, err := boolQuery(r, "refresh_ttl")
		if err != nil {
			return err
		}
		refresh = &v
	}
	it, err := s.items.GetRefresh(r.Context(), tenant, ns, key, refreshParam(refresh))
	if errors.Is(err, store.ErrNotFound) {
		writeJSON(w, http.StatusOK, nil)
		return nil
	}
	if err != nil {
		return storeError("key", err)
	}
	writeJSON(w, http.StatusOK, viewItem(it))
	return nil
}

type deleteItemBody struct {
	Namespace []string `json:"namespace"`
	Key       string   `json:"key"`
}

// deleteItem: DELETE /store/items. 204, also when there was no item.
func (s *Server) deleteItem(w http.ResponseWriter, r *http.Request, tenant string) error {
	if err := s.needStore(); err != nil {
		return err
	}
	var b deleteItemBody
	if err := decodeBody(r, &b); err != nil {
		return err
	}
	if len(b.Namespace) == 0 {
		return errInvalid("namespace", "namespace is required and cannot be empty")
	}
	if err := checkNamespace(r, "namespace", b.Namespace); err != nil {
		return err
	}
	if err := s.items.Delete(r.Context(), tenant, b.Namespace, b.Key); err != nil {
		return storeError("key", err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

type searchItemsBody struct {
	NamespacePrefix []string       `json:"namespace_prefix"`
	Filter          map[string]any `json:"filter"`
	Limit           *int           `json:"limit"`
	Offset          *int           `json:"offset"`
	Query           *string        `json:"query"`
	RefreshTTL      *bool          `json:"refresh_ttl"`
}

// searchItems: POST /store/items/search. 200 {"items": [...]}.
func (s *Server) searchItems(w http.ResponseWriter, r *http.Request, tenant string) error {
	if err := s.needStore(); err != nil {
		return err
	}
	var b searchItemsBody
	if err := decodeBody(r, &b); err != nil {
		return err
	}
	if err := checkNamespace(r, "namespace_prefix", b.NamespacePrefix); err != nil {
		return err
	}
	p, err := bodyPage(b.Limit, b.Offset, 10)
	if err != nil {
		return err
	}
	opts := store.SearchOptions{Prefix: b.NamespacePrefix, Filter: b.Filter, Limit: p.limit, Offset: p.offset,
		Refresh: refreshParam(b.RefreshTTL), Allow: storeAllow(r)}
	if b.Query != nil {
		if len(*b.Query) > 4096 {
			return errInvalid("query", "query is longer than 4096 bytes")
		}
		opts.Query = *b.Query
	}
	res, err := s.items.Search(r.Context(), tenant, opts)
	if err != nil {
		return storeError("filter", err)
	}
	items := make([]searchItemView, 0, len(res))
	for _, it := range res {
		items = append(items, searchItemView{itemView: viewItem(it.Item), Score: it.Score})
	}
	writeJSON(w, http.StatusOK, map[string]any{"items": items})
	return nil
}

type listNamespacesBody struct {
	Prefix   []string `json:"prefix"`
	Suffix   []string `json:"suffix"`
	MaxDepth *int     `json:"max_depth"`
	Limit    *int     `json:"limit"`
	Offset   *int     `json:"offset"`
}

// listNamespaces: POST /store/namespaces. 200 {"namespaces": [[...]]}.
func (s *Server) listNamespaces(w http.ResponseWriter, r *http.Request, tenant string) error {
	if err := s.needStore(); err != nil {
		return err
	}
	var b listNamespacesBody
	if err := decodeBody(r, &b); err != nil {
		return err
	}
	if err := checkNamespace(r, "prefix", b.Prefix); err != nil {
		return err
	}
	if err := store.CheckNamespace(b.Suffix); err != nil {
		return storeError("suffix", err)
	}
	p, err := bodyPage(b.Limit, b.Offset, 100)
	if err != nil {
		return err
	}
	depth := 0
	if b.MaxDepth != nil {
		if *b.MaxDepth < 1 || *b.MaxDepth > store.MaxDepth {
			return errInvalid("max_depth", fmt.Sprintf("max_depth must be a number from 1 to %d", store.MaxDepth))
		}
		depth = *b.MaxDepth
	}
	list, err := s.items.ListNamespaces(r.Context(), tenant, store.NamespaceOptions{Prefix: b.Prefix, Suffix: b.Suffix,
		MaxDepth: depth, Limit: p.limit, Offset: p.offset, Allow: storeAllow(r)})
	if err != nil {
		return storeError("prefix", err)
	}
	writeJSON(w, http.StatusOK, map[string]any{"namespaces": list})
	return nil
}
