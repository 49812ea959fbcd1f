package gateway

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/langgraph"
	"github.com/natsagent/natsagent/internal/protocol"
)

// searchThreadsBody is LangGraph's threads.search (and count) body.
type searchThreadsBody struct {
	Metadata  map[string]any `json:"metadata"`
	Values    map[string]any `json:"values"`
	Ids       []string       `json:"ids"`
	Status    string         `json:"status"`
	Limit     *int           `json:"limit"`
	Offset    *int           `json:"offset"`
	SortBy    string         `json:"sort_by"`
	SortOrder string         `json:"sort_order"`
	Select    []string       `json:"select"`
	Extract   map[string]any `json:"extract"`
}

var threadStatuses = map[string]bool{protocol.ThreadIdle: true, protocol.ThreadBusy: true,
	protocol.ThreadInterrupted: true, protocol.ThreadError: true}

var threadFields = map[string]bool{"thread_id": true, "created_at": true, "updated_at": true, "metadata": true,
	"status": true, "title": true, "checkpoint_id": true, "active_run_id": true, "last_run_id": true, "owner": true,
	"values": true}

// check refuses what the search does not serve, naming it.
func (b *searchThreadsBody) check() error {
	if len(b.Values) > 0 {
		return errInvalid("values", "values: a filter on thread values is not supported (values live in checkpoints, not in the index); filter on metadata")
	}
	if len(b.Extract) > 0 {
		return errInvalid("extract", "extract is not supported; read a thread's values with GET /threads/{thread_id}/state")
	}
	if b.Status != "" && !threadStatuses[b.Status] {
		return errInvalid("status", fmt.Sprintf("status %q is not one of idle, busy, interrupted, error", clip(b.Status)))
	}
	if err := checkMetadataFields(len(b.Metadata)); err != nil {
		return err
	}
	if len(b.Ids) > maxLimit {
		return errInvalid("ids", fmt.Sprintf("ids names more than %d threads", maxLimit))
	}
	for _, f := range b.Select {
		if !threadFields[f] {
			return errInvalid("select", fmt.Sprintf("select: %q is not a field of a thread", clip(f)))
		}
	}
	return nil
}

// threadMatcher returns the filter of b; ids are matched by the caller.
func (s *Server) threadMatcher(r *http.Request, b *searchThreadsBody) func(*protocol.Thread) bool {
	return func(th *protocol.Thread) bool {
		st := th.Status
		if st == "" {
			st = protocol.ThreadIdle
		}
		return (b.Status == "" || st == b.Status) && matchMetadata(th.Metadata, b.Metadata) && s.mayUse(r, th)
	}
}

// threadsByID returns the tenant's threads named in ids that match,
// each once, read by key.
func (s *Server) threadsByID(r *http.Request, tenant string, ids []string, match func(*protocol.Thread) bool) ([]protocol.Thread, error) {
	var out []protocol.Thread
	seen := map[string]bool{}
	for _, id := range ids {
		if seen[id] || !protocol.ValidToken(id) {
			continue
		}
		seen[id] = true
		th, _, err := s.stores.Threads.Get(r.Context(), tenant, id)
		if errors.Is(err, kv.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, errUnavailable("the threads bucket is not available", err)
		}
		trimThread(th)
		if match(th) {
			out = append(out, *th)
		}
	}
	return out, nil
}

// matchingThreads returns every thread of the tenant matching b.
func (s *Server) matchingThreads(r *http.Request, tenant string, b *searchThreadsBody) ([]protocol.Thread, error) {
	match := s.threadMatcher(r, b)
	if len(b.Ids) > 0 {
		return s.threadsByID(r, tenant, b.Ids, match)
	}
	all, err := s.allThreads(r.Context(), tenant, match)
	if err != nil {
		return nil, errUnavailable("the threads bucket is not available", err)
	}
	return all, nil
}

// threadOrder is the order a threads search sorts by.
func threadOrder(by, order string) (func(a, b *protocol.Thread) int, error) {
	return listOrder(by, order, "updated_at", map[string]func(a, b *protocol.Thread) int{
		"updated_at": func(a, b *protocol.Thread) int { return a.UpdatedAt.Compare(b.UpdatedAt) },
		"created_at": func(a, b *protocol.Thread) int { return a.CreatedAt.Compare(b.CreatedAt) },
		"thread_id":  func(a, b *protocol.Thread) int { return 0 },
		"status":     func(a, b *protocol.Thread) int { return strings.Compare(a.Status, b.Status) },
	}, func(a *protocol.Thread) string { return a.ThreadID })
}

// listOrder is the comparison of a LangGraph search: by the key sort_by
// names (def when it is empty), ties broken by id (a key that returns 0
// sorts by id alone), descending unless sort_order is asc. An unknown key
// or order is a 400 naming the field.
func listOrder[T any](by, order, def string, keys map[string]func(a, b T) int, id func(T) string) (func(a, b T) int, error) {
	desc := true
	switch order {
	case "", "desc":
	case "asc":
		desc = false
	default:
		return nil, errInvalid("sort_order", fmt.Sprintf("sort_order %q is not one of asc, desc", clip(order)))
	}
	if by == "" {
		by = def
	}
	key, ok := keys[by]
	if !ok {
		return nil, errInvalid("sort_by", fmt.Sprintf("sort_by %q is not one of %s", clip(by), strings.Join(slices.Sorted(maps.Keys(keys)), ", ")))
	}
	return func(a, b T) int {
		c := key(a, b)
		if c == 0 {
			c = strings.Compare(id(a), id(b))
		}
		if desc {
			return -c
		}
		return c
	}, nil
}

// searchThreads: POST /threads/search.
func (s *Server) searchThreads(w http.ResponseWriter, r *http.Request, tenant string) error {
	var b searchThreadsBody
	if err := decodeBody(r, &b); err != nil {
		return err
	}
	if err := b.check(); err != nil {
		return err
	}
	p, err := bodyPage(b.Limit, b.Offset, 10)
	if err != nil {
		return err
	}
	cmp, err := threadOrder(b.SortBy, b.SortOrder)
	if err != nil {
		return err
	}
	var top []protocol.Thread
	var total int
	var byMetadata []string // the metadata index's candidates, when few
	useMetadata := false
	if len(b.Ids) == 0 && len(b.Metadata) > 0 && (b.Status == "" || b.Status == protocol.ThreadIdle) {
		// Counted first (subject totals): listing many candidates costs
		// more than the newest writes' page.
		least, ok, err := s.metadataCounts(r, tenant, b.Metadata)
		if err != nil {
			return errUnavailable("the threads bucket is not available", err)
		}
		if ok && least <= maxMetadataCandidates {
			ids, ok, err := s.metadataCandidates(r, tenant, b.Metadata)
			if err != nil {
				return errUnavailable("the threads bucket is not available", err)
			}
			if ok && len(ids) <= maxMetadataCandidates {
				byMetadata, useMetadata = ids, true
			}
		}
	}
	ownFirst := false
	_, owners := s.ownerFilter(r)
	byTime := b.SortBy == "" || b.SortBy == "updated_at" || b.SortBy == "created_at"
	if len(b.Ids) == 0 && !useMetadata && (b.Status == "" || b.Status == protocol.ThreadIdle) && byTime {
		if ownFirst, err = s.ownThreadsFirst(r.Context(), tenant, b.SortBy, owners); err != nil {
			return errUnavailable("the threads bucket is not available", err)
		}
	}
	switch {
	case useMetadata:
		// Few threads have the metadata: their records, confirmed.
		found, err := s.matchingByKey(r.Context(), tenant, byMetadata, s.threadMatcher(r, &b), nil)
		if err != nil {
			return errUnavailable("the threads bucket is not available", err)
		}
		top, total = topK(found, p.offset+p.limit, cmp), len(found)
	case len(b.Ids) == 0 && b.Status != "" && b.Status != protocol.ThreadIdle:
		// Busy, interrupted or error: the index's candidates, confirmed
		// by their records (threadorder.go).
		found, err := s.statusCandidates(r, tenant, b.Status, s.threadMatcher(r, &b))
		if err != nil {
			return errUnavailable("the threads bucket is not available", err)
		}
		top, total = topK(found, p.offset+p.limit, cmp), len(found)
	case ownFirst:
		// A user who may see a bounded set of owners' threads: those
		// records, sorted here; no other owner's is read (threadscan.go).
		top, total, err = s.ownThreads(r.Context(), tenant, owners, b.SortBy, b.SortOrder != "asc", p.offset+p.limit, s.threadMatcher(r, &b))
		if err != nil {
			return errUnavailable("the threads bucket is not available", err)
		}
	case len(b.Ids) == 0 && (b.SortBy == "" || b.SortBy == "updated_at"):
		// By last write: read the stream from the end the order starts
		// at, only as far as the page needs (threadscan.go).
		top, total, err = s.updatedThreads(r.Context(), tenant, b.SortOrder != "asc", p.offset+p.limit, s.threadMatcher(r, &b))
		if err != nil {
			return errUnavailable("the threads bucket is not available", err)
		}
	case len(b.Ids) == 0 && b.SortBy == "created_at":
		// By creation: read the creation index from the end the order
		// starts at, only as far as the page needs.
		owner, _ := s.ownerFilter(r)
		top, total, err = s.createdThreads(r.Context(), tenant, b.SortOrder != "asc", p.offset+p.limit, owner, s.threadMatcher(r, &b))
		if err != nil {
			return errUnavailable("the threads bucket is not available", err)
		}
	case len(b.Ids) == 0 && (b.SortBy == "thread_id" || b.SortBy == "status"):
		// In id or status order: the ids from the index's subjects, the
		// records of the page only (threadorder.go).
		ids, err := s.orderedIDs(r, tenant, b.SortBy, b.SortOrder != "asc", b.Status)
		if err != nil {
			return errUnavailable("the threads bucket is not available", err)
		}
		top, total, err = s.firstMatching(r.Context(), tenant, ids, p.offset+p.limit, s.threadMatcher(r, &b))
		if err != nil {
			return errUnavailable("the threads bucket is not available", err)
		}
	default:
		found, err := s.matchingThreads(r, tenant, &b)
		if err != nil {
			return err
		}
		top, total = topK(found, p.offset+p.limit, cmp), len(found)
	}
	shown := paginate(p, top)
	views := make([]searchedThread, len(shown))
	for i := range shown {
		views[i].threadView = viewThread(&shown[i])
	}
	if len(b.Select) == 0 || slices.Contains(b.Select, "values") {
		if err := s.loadValues(r.Context(), shown, views); err != nil {
			return err
		}
	}
	writePage(w, p.offset, views, total, b.Select)
	return nil
}

// searchedThread is a thread as a search shows it: with its current
// values, as LangGraph's search does (Agent Chat UI titles its history
// with the first message).
type searchedThread struct {
	threadView
	Values map[string]any `json:"values,omitempty"`
}

// valuesLoaders bounds the threads whose checkpoints one search reads at
// a time.
const valuesLoaders = 8

// loadValues sets the values of each view: the state at its thread's
// head, as GET /threads/{id}/state shows them.
func (s *Server) loadValues(ctx context.Context, threads []protocol.Thread, views []searchedThread) error {
	errs := make([]error, len(threads))
	sem := make(chan struct{}, valuesLoaders)
	var wg sync.WaitGroup
	for i := range threads {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			th := &threads[i]
			st, _, err := s.stores.Checkpoints.Load(ctx, th.Tenant, th.ThreadID, th.Head)
			if err != nil {
				errs[i] = err
				return
			}
			views[i].Values = langgraph.Values(st, protocol.InterruptValue)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return errUnavailable("the checkpoints bucket is not available", err)
	}
	return nil
}

// topK returns the first k of items in cmp's order, sorting only them.
func topK(items []protocol.Thread, k int, cmp func(a, b *protocol.Thread) int) []protocol.Thread {
	c := func(a, b protocol.Thread) int { return cmp(&a, &b) }
	if k >= len(items) {
		slices.SortFunc(items, c)
		return items
	}
	// Quickselect would do in linear time; a bounded insertion keeps the
	// k best in one pass, enough for pages of at most maxLimit.
	best := make([]protocol.Thread, 0, k)
	for _, it := range items {
		if len(best) == k && cmp(&it, &best[k-1]) >= 0 {
			continue
		}
		i, _ := slices.BinarySearchFunc(best, it, c)
		if len(best) < k {
			best = append(best, protocol.Thread{})
		}
		copy(best[i+1:], best[i:len(best)-1])
		best[i] = it
	}
	return best
}

// countThreads: POST /threads/count.
func (s *Server) countThreads(w http.ResponseWriter, r *http.Request, tenant string) error {
	var b searchThreadsBody
	if err := decodeBody(r, &b); err != nil {
		return err
	}
	if err := b.check(); err != nil {
		return err
	}
	if len(b.Ids) == 0 && len(b.Metadata) == 0 && b.Status == "" {
		// Every thread the request may see: counted by subject, from the
		// records or the creation index, reading none (threadindex.go).
		_, owners := s.ownerFilter(r)
		if owners != nil {
			if err := s.ensureIndexed(r.Context(), tenant); err != nil {
				return errUnavailable("the threads bucket is not available", err)
			}
		}
		n, err := s.stores.Threads.Count(r.Context(), tenant, owners)
		if err != nil {
			return errUnavailable("the threads bucket is not available", err)
		}
		writeJSON(w, http.StatusOK, n)
		return nil
	}
	if len(b.Ids) == 0 && len(b.Metadata) == 0 {
		// By status: from the indexes (threadorder.go).
		n, err := s.countByStatus(r, tenant, b.Status)
		if err != nil {
			return errUnavailable("the threads bucket is not available", err)
		}
		writeJSON(w, http.StatusOK, n)
		return nil
	}
	if len(b.Ids) == 0 {
		// By scalar metadata (and status): from the indexes.
		n, ok, err := s.countByMetadata(r, tenant, b.Metadata, b.Status)
		if err != nil {
			return errUnavailable("the threads bucket is not available", err)
		}
		if ok {
			writeJSON(w, http.StatusOK, n)
			return nil
		}
	}
	if len(b.Ids) == 0 && b.Status != "" && b.Status != protocol.ThreadIdle {
		// Busy, interrupted or error with a metadata filter: the index's
		// candidates, confirmed and filtered by their records.
		found, err := s.statusCandidates(r, tenant, b.Status, s.threadMatcher(r, &b))
		if err != nil {
			return errUnavailable("the threads bucket is not available", err)
		}
		writeJSON(w, http.StatusOK, len(found))
		return nil
	}
	all, err := s.matchingThreads(r, tenant, &b)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, len(all))
	return nil
}
