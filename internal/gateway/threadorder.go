package gateway

import (
	"context"
	"net/http"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/protocol"
)

// Searches by thread_id or status, status filters and counts by status
// are served from subjects the NATS server keeps an index of, not from
// the records: the thread ids are the creation index's subjects
// (kv.Threads.IDs), interrupted and error threads the status index's
// (kv.Threads.WithStatus), busy threads those whose run request is
// still in the runs stream (a run's request is acknowledged after it
// released the thread) and whose record says busy; idle is every other
// thread. Scalar metadata filters use the metadata index
// (kv.Threads.WithMetadata, CountMetadata). The server lists the
// subjects without reading a message, and
// the gateway then reads only the records of the page it answers (or of
// the candidates of a busy, interrupted or error filter). Every listing
// is under the tenant's keys and, for a user who may see only their own
// threads, under their owner tokens: another owner's record is neither
// read nor counted.

// threadStatusIndex is what the indexes say of the threads a request
// may see.
type threadStatusIndex struct {
	// ids lists every thread the request may see; nil when not asked.
	ids []string
	// status holds the threads that are not idle: busy, interrupted or
	// error.
	status map[string]string
	// busy holds the records of the busy threads, read to confirm them.
	busy []*protocol.Thread
}

// statusOf is a thread's status by the index.
func (x *threadStatusIndex) statusOf(id string) string {
	if st, ok := x.status[id]; ok {
		return st
	}
	return protocol.ThreadIdle
}

// ensureStatusIndexed makes sure, once per process and tenant, that the
// tenant's status index is complete (kv.Threads.ReindexStatus adds the
// threads written before it existed, once per tenant).
func (s *Server) ensureStatusIndexed(ctx context.Context, tenant string) error {
	behind := func(ctx context.Context, tenant string) (bool, error) {
		done, err := s.stores.Threads.StatusIndexed(ctx, tenant)
		return !done, err
	}
	return s.onceIndexed(ctx, &s.statusIndexed, tenant, "thread status index built", behind, s.stores.Threads.ReindexStatus)
}

// statusIndex reads the indexes for the threads of tenant r may see;
// withIDs also lists every such thread.
func (s *Server) statusIndex(r *http.Request, tenant string, withIDs bool) (*threadStatusIndex, error) {
	ctx := r.Context()
	if err := s.ensureIndexed(ctx, tenant); err != nil {
		return nil, err
	}
	if err := s.ensureStatusIndexed(ctx, tenant); err != nil {
		return nil, err
	}
	_, owners := s.ownerFilter(r)
	x := &threadStatusIndex{status: map[string]string{}}
	var visible map[string]bool
	if withIDs || owners != nil {
		ids, err := s.stores.Threads.IDs(ctx, tenant, owners)
		if err != nil {
			return nil, err
		}
		x.ids = ids
		if owners != nil {
			visible = make(map[string]bool, len(ids))
			for _, id := range ids {
				visible[id] = true
			}
		}
	}
	for _, st := range []string{protocol.ThreadInterrupted, protocol.ThreadError} {
		ids, err := s.stores.Threads.WithStatus(ctx, tenant, st, owners)
		if err != nil {
			return nil, err
		}
		for _, id := range ids {
			x.status[id] = st
		}
	}
	queued, err := s.queuedThreads(ctx, tenant)
	if err != nil {
		return nil, err
	}
	if visible != nil {
		queued = slices.DeleteFunc(queued, func(id string) bool { return !visible[id] })
	}
	ths, err := s.threadsByKey(ctx, tenant, queued)
	if err != nil {
		return nil, err
	}
	for _, th := range ths {
		if th != nil && th.Status == protocol.ThreadBusy {
			trimThread(th)
			x.status[th.ThreadID] = protocol.ThreadBusy
			x.busy = append(x.busy, th)
		}
	}
	return x, nil
}

// queuedThreads lists the threads of tenant with a run request in the
// runs stream (pending, or running and not acknowledged yet), from the
// stream's subjects.
func (s *Server) queuedThreads(ctx context.Context, tenant string) ([]string, error) {
	if !protocol.ValidToken(tenant) {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.submitTimeout)
	defer cancel()
	prefix := s.names.RunSubject(tenant, "")
	info, err := s.runs.Info(ctx, jetstream.WithSubjectFilter(prefix+"*"))
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(info.State.Subjects))
	for subj, n := range info.State.Subjects {
		if id, ok := strings.CutPrefix(subj, prefix); ok && n > 0 && protocol.ValidToken(id) {
			out = append(out, id)
		}
	}
	return out, nil
}

// statusCandidates returns the records of the threads the index puts in
// status st (busy, interrupted or error) that match: the records of
// those candidates only, confirmed by their record.
func (s *Server) statusCandidates(r *http.Request, tenant, st string, match func(*protocol.Thread) bool) ([]protocol.Thread, error) {
	x, err := s.statusIndex(r, tenant, false)
	if err != nil {
		return nil, err
	}
	var out []protocol.Thread
	if st == protocol.ThreadBusy {
		for _, th := range x.busy {
			if match(th) {
				out = append(out, *th)
			}
		}
		return out, nil
	}
	var ids []string
	for id, have := range x.status {
		if have == st {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return s.matchingByKey(r.Context(), tenant, ids, match, out)
}

// orderedIDs returns the ids of the threads r may see in the order of a
// search by thread_id or by status (then id), ascending or not, keeping
// only those of status st when it is set.
func (s *Server) orderedIDs(r *http.Request, tenant, by string, desc bool, st string) ([]string, error) {
	x, err := s.statusIndex(r, tenant, true)
	if err != nil {
		return nil, err
	}
	ids := x.ids
	if st != "" {
		ids = slices.DeleteFunc(ids, func(id string) bool { return x.statusOf(id) != st })
	}
	if by == "status" {
		slices.SortFunc(ids, func(a, b string) int {
			if c := strings.Compare(x.statusOf(a), x.statusOf(b)); c != 0 {
				return c
			}
			return strings.Compare(a, b)
		})
	} else {
		slices.Sort(ids)
	}
	if desc {
		slices.Reverse(ids)
	}
	return ids, nil
}

// firstMatching reads the records of ids in their order, in batches
// starting at want and doubling, until it holds want that match. It returns them and
// how many match in all, or -1 when it did not read every record.
func (s *Server) firstMatching(ctx context.Context, tenant string, ids []string, want int, match func(*protocol.Thread) bool) ([]protocol.Thread, int, error) {
	var found []protocol.Thread
	n := max(want, 1)
	for i := 0; i < len(ids); {
		j := min(len(ids), i+n)
		var err error
		if found, err = s.matchingByKey(ctx, tenant, ids[i:j], match, found); err != nil {
			return nil, 0, err
		}
		i = j
		if len(found) >= want && i < len(ids) {
			return found[:want], -1, nil
		}
		n = min(2*n, 4096)
	}
	return found[:min(len(found), want)], len(found), nil
}

// countByStatus counts the threads r may see in status st from the
// indexes, reading no record but those of the threads with a run
// request in the runs stream.
func (s *Server) countByStatus(r *http.Request, tenant, st string) (int, error) {
	x, err := s.statusIndex(r, tenant, false)
	if err != nil {
		return 0, err
	}
	if st != protocol.ThreadIdle {
		n := 0
		for _, have := range x.status {
			if have == st {
				n++
			}
		}
		return n, nil
	}
	_, owners := s.ownerFilter(r)
	all, err := s.stores.Threads.Count(r.Context(), tenant, owners)
	if err != nil {
		return 0, err
	}
	return max(all-len(x.status), 0), nil
}

// maxMetadataCandidates bounds the threads a search with a metadata
// filter reads from the metadata index's candidates; with more, the
// search reads back from the newest writes (a filter that many threads
// match finds its page there soon).
const maxMetadataCandidates = 2048

// metadataCounts counts, from subject totals, the threads r may see
// that the metadata index names with each pair of want; ok is false
// when a pair is not indexed (a value that is not a scalar, or too
// long). It returns the smallest count.
func (s *Server) metadataCounts(r *http.Request, tenant string, want map[string]any) (least int, ok bool, err error) {
	ctx := r.Context()
	if err := s.ensureIndexed(ctx, tenant); err != nil {
		return 0, false, err
	}
	if err := s.ensureStatusIndexed(ctx, tenant); err != nil {
		return 0, false, err
	}
	_, owners := s.ownerFilter(r)
	least = -1
	for f, v := range want {
		n, indexed, err := s.stores.Threads.CountMetadata(ctx, tenant, f, v, owners)
		if err != nil || !indexed {
			return 0, false, err
		}
		if least < 0 || n < least {
			least = n
		}
	}
	return max(least, 0), true, nil
}

// metadataCandidates lists the threads r may see that the metadata index
// names with every pair of want; ok is false when a pair is not indexed
// (a value that is not a scalar, or too long).
func (s *Server) metadataCandidates(r *http.Request, tenant string, want map[string]any) (ids []string, ok bool, err error) {
	ctx := r.Context()
	if err := s.ensureIndexed(ctx, tenant); err != nil {
		return nil, false, err
	}
	if err := s.ensureStatusIndexed(ctx, tenant); err != nil {
		return nil, false, err
	}
	_, owners := s.ownerFilter(r)
	var have map[string]bool
	for f, v := range want {
		got, indexed, err := s.stores.Threads.WithMetadata(ctx, tenant, f, v, owners)
		if err != nil || !indexed {
			return nil, false, err
		}
		next := make(map[string]bool, len(got))
		for _, id := range got {
			if have == nil || have[id] {
				next[id] = true
			}
		}
		have = next
	}
	for id := range have {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids, true, nil
}

// countByMetadata counts the threads r may see with every pair of want
// and status st ("" any) from the indexes; ok is false when a pair is
// not indexed.
func (s *Server) countByMetadata(r *http.Request, tenant string, want map[string]any, st string) (int, bool, error) {
	if len(want) == 1 && st == "" {
		// One pair: the server's subject totals, no listing.
		return s.metadataCounts(r, tenant, want)
	}
	ids, ok, err := s.metadataCandidates(r, tenant, want)
	if err != nil || !ok {
		return 0, ok, err
	}
	if st == "" {
		return len(ids), true, nil
	}
	x, err := s.statusIndex(r, tenant, false)
	if err != nil {
		return 0, false, err
	}
	n := 0
	for _, id := range ids {
		if x.statusOf(id) == st {
			n++
		}
	}
	return n, true, nil
}
