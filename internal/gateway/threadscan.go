package gateway

import (
	"cmp"
	"context"
	"net/http"
	"slices"
	"sync"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/protocol"
)

// Thread searches read the threads bucket's stream, which holds each
// thread's record once, at the sequence of its last write
// (kv.Threads.Updated): the newest threads of a tenant are at its end,
// the least recently written at its start. A search by updated_at (newest
// first is LangGraph's default, and what Agent Chat UI's history asks
// for) reads from the end its order starts at until it holds a page, and
// orders it by the write's place in the stream, the order the NATS server
// stored the writes in (updated_at is the writer's clock, set just before
// it wrote: the same order but for writes a few milliseconds apart from
// different hosts). A user who may see only some owners' threads is
// searched by updated_at or created_at from those threads' records alone
// (ownThreads). The thread_id and status orders, status filters and
// counts by status or scalar metadata list index subjects
// (threadorder.go); what neither serves reads the tenant's records in
// full (kv.Threads.Scan). The gateway keeps no index: it starts without
// reading the bucket, and a write, deletion or erasure shows in the next
// search because the record is the index.

// updatedThreads returns the first want threads of tenant that match, by
// last write, newest first when desc, and how many match in all, or -1
// when it did not read far enough to know.
func (s *Server) updatedThreads(ctx context.Context, tenant string, desc bool, want int, match func(*protocol.Thread) bool) ([]protocol.Thread, int, error) {
	var found []written
	at := map[string]int{} // thread id -> index in found
	complete, err := s.stores.Threads.Updated(ctx, tenant, desc, want, func(th *protocol.Thread, seq uint64) {
		trimThread(th)
		if !match(th) {
			return
		}
		// Oldest first, a record rewritten during the read is met again
		// at its new place: keep that one.
		if i, ok := at[th.ThreadID]; ok {
			if seq > found[i].seq {
				found[i] = written{*th, seq}
			}
			return
		}
		at[th.ThreadID] = len(found)
		found = append(found, written{*th, seq})
	}, func() bool { return len(found) >= want })
	if err != nil {
		return nil, 0, err
	}
	out := byWrite(found, desc, want)
	if complete {
		return out, len(found), nil
	}
	return out, -1, nil
}

// written is a thread record and the stream sequence of its last write.
type written struct {
	th  protocol.Thread
	seq uint64
}

// byWrite returns the first want of found by last write, newest first
// when desc.
func byWrite(found []written, desc bool, want int) []protocol.Thread {
	slices.SortFunc(found, func(a, b written) int {
		if desc {
			return cmp.Compare(b.seq, a.seq)
		}
		return cmp.Compare(a.seq, b.seq)
	})
	out := make([]protocol.Thread, 0, min(len(found), want))
	for _, w := range found[:min(len(found), want)] {
		out = append(out, w.th)
	}
	return out
}

// maxOwnThreads bounds the threads a search of a user who may see only
// some owners' threads reads in full to sort them itself (ownThreads).
var maxOwnThreads = 4096

// ownThreadsFirst reports whether a search by updated_at or created_at
// of r, whose owner filter is owners (nil: every owner), reads the
// threads r may see and sorts them itself rather than read the tenant's
// stream from one end. It does when r may see only some owners' threads
// and those are few (at most maxOwnThreads): they are read, and no other
// owner's record. A user who may see more reads the stream from one end
// (a search by updated_at would read every record of theirs otherwise),
// passing over other owners' records without returning or counting
// them; by updated_at it does so only when the user may see at least a
// quarter of the tenant's threads (so the records it reads are the
// user's, about one in four or more, as they are spread), else it reads
// theirs in full too. By created_at the stream read is the creation
// index, whose keys name their owner: it reads no other owner's record.
func (s *Server) ownThreadsFirst(ctx context.Context, tenant, by string, owners []string) (bool, error) {
	if owners == nil {
		return false, nil
	}
	if err := s.ensureIndexed(ctx, tenant); err != nil {
		return false, err
	}
	mine, err := s.stores.Threads.Count(ctx, tenant, owners)
	if err != nil || mine <= maxOwnThreads || by == "created_at" {
		return mine <= maxOwnThreads, err
	}
	all, err := s.stores.Threads.Count(ctx, tenant, nil)
	if err != nil {
		return false, err
	}
	return 4*mine < all, nil
}

// ownThreads returns the first want threads of tenant owned by one of
// owners that match, in the order of a search by updated_at (their last
// write's place in the stream, as updatedThreads orders them) or
// created_at, newest first when desc, and how many match. It lists
// their ids from the creation index's subjects and reads their records,
// and no other thread's.
func (s *Server) ownThreads(ctx context.Context, tenant string, owners []string, by string, desc bool, want int, match func(*protocol.Thread) bool) ([]protocol.Thread, int, error) {
	if err := s.ensureIndexed(ctx, tenant); err != nil {
		return nil, 0, err
	}
	ids, err := s.stores.Threads.IDs(ctx, tenant, owners)
	if err != nil {
		return nil, 0, err
	}
	var found []written
	err = s.stores.Threads.Records(ctx, tenant, ids, func(th *protocol.Thread, seq uint64) {
		trimThread(th)
		if match(th) {
			found = append(found, written{*th, seq})
		}
	})
	if err != nil {
		return nil, 0, err
	}
	if by != "created_at" {
		return byWrite(found, desc, want), len(found), nil
	}
	order, _ := threadOrder(by, map[bool]string{true: "desc", false: "asc"}[desc])
	ths := make([]protocol.Thread, len(found))
	for i := range found {
		ths[i] = found[i].th
	}
	return topK(ths, want, order), len(found), nil
}

// allThreads returns every thread of tenant that matches.
func (s *Server) allThreads(ctx context.Context, tenant string, match func(*protocol.Thread) bool) ([]protocol.Thread, error) {
	var out []protocol.Thread
	err := s.stores.Threads.Scan(ctx, tenant, func(th *protocol.Thread) {
		trimThread(th)
		if match(th) {
			out = append(out, *th)
		}
	})
	return out, err
}

// trimThread keeps what a listing shows of a record: the run holding the
// thread, not the lease's fencing and renewal.
func trimThread(th *protocol.Thread) {
	if th.Lease != nil {
		th.Lease = &protocol.Lease{RunID: th.Lease.RunID}
	}
	th.Preempt, th.RecentRuns = nil, nil
}

// ownerFilter returns which creation index owner tokens the request may
// see threads of: nil for all (an open gateway, a role that reads all
// threads), else the threads without an owner and the user's own. The
// matcher still decides each thread; this only skips the reads of
// threads it would refuse.
func (s *Server) ownerFilter(r *http.Request) (func(string) bool, []string) {
	p, ok := principalOf(r)
	if !ok || s.cfg.Policy.ReadAllThreads(&p.p) {
		return nil, nil
	}
	mine, none := kv.OwnerToken(p.p.User), kv.OwnerToken("")
	return func(tok string) bool { return tok == mine || tok == none }, []string{"", p.p.User}
}

// ensureIndexed checks, once per process and tenant, that the tenant's
// creation index is not behind its records, and repairs it if it is
// (threads written before the index existed).
func (s *Server) ensureIndexed(ctx context.Context, tenant string) error {
	return s.onceIndexed(ctx, &s.indexed, tenant, "thread index repaired", s.stores.Threads.IndexBehind, s.stores.Threads.Reindex)
}

// onceIndexed runs, once per process and tenant (seen remembers the
// tenants done), the check of one of the threads bucket's indexes and,
// when it says the index is behind the records, its rebuild, logged as
// done.
func (s *Server) onceIndexed(ctx context.Context, seen *sync.Map, tenant, done string,
	behind func(context.Context, string) (bool, error), rebuild func(context.Context, string) (added, removed int, err error)) error {
	if _, ok := seen.Load(tenant); ok {
		return nil
	}
	stale, err := behind(ctx, tenant)
	if err != nil {
		return err
	}
	if stale {
		added, removed, err := rebuild(ctx, tenant)
		if err != nil {
			return err
		}
		s.log.Info(done, zap.String("tenant", tenant), zap.Int("added", added), zap.Int("removed", removed))
	}
	seen.Store(tenant, true)
	return nil
}

// createdThreads returns the first want threads of tenant that match, by
// creation (the creation index's order), newest first when desc, and how
// many match in all, or -1 when it did not read far enough to know.
func (s *Server) createdThreads(ctx context.Context, tenant string, desc bool, want int, owner func(string) bool, match func(*protocol.Thread) bool) ([]protocol.Thread, int, error) {
	if err := s.ensureIndexed(ctx, tenant); err != nil {
		return nil, 0, err
	}
	var found []protocol.Thread
	var pending []string
	seen := map[string]bool{}
	var readErr error
	skipped := false // ids listed whose records were not read: the page was full
	resolve := func() {
		// A window may list far more ids than the page needs (the first
		// one holding any when the tenant's newest keys are far from the
		// stream's end): read their records a few at a time.
		for readErr == nil && len(pending) > 0 && len(found) < want {
			n := min(len(pending), max(4*(want-len(found)), 64))
			found, readErr = s.matchingByKey(ctx, tenant, pending[:n], match, found)
			pending = pending[n:]
		}
		if len(pending) > 0 && readErr == nil {
			skipped = true
		}
		pending = pending[:0]
	}
	complete, err := s.stores.Threads.Created(ctx, tenant, desc, want, owner, func(thread string, _ uint64) {
		if !seen[thread] {
			seen[thread] = true
			pending = append(pending, thread)
		}
	}, func() bool {
		resolve()
		return readErr != nil || len(found) >= want
	})
	if err != nil {
		return nil, 0, err
	}
	resolve()
	if readErr != nil {
		return nil, 0, readErr
	}
	out := found[:min(len(found), want)]
	if complete && !skipped {
		return out, len(found), nil
	}
	return out, -1, nil
}

// matchingByKey appends to found the records of threads (read by key,
// trimmed) that match; a thread without a record is skipped.
func (s *Server) matchingByKey(ctx context.Context, tenant string, threads []string, match func(*protocol.Thread) bool, found []protocol.Thread) ([]protocol.Thread, error) {
	ths, err := s.threadsByKey(ctx, tenant, threads)
	if err != nil {
		return found, err
	}
	for _, th := range ths {
		if th == nil {
			continue
		}
		trimThread(th)
		if match(th) {
			found = append(found, *th)
		}
	}
	return found, nil
}

// threadsByKey reads the records of threads of tenant, in their order, a
// batch of them per request (kv.Threads.Records); a thread without a
// record (deleted since it was listed) is nil, and a thread named twice
// is read once and shown at its first place only.
func (s *Server) threadsByKey(ctx context.Context, tenant string, threads []string) ([]*protocol.Thread, error) {
	out := make([]*protocol.Thread, len(threads))
	at := make(map[string]int, len(threads))
	ids := make([]string, 0, len(threads))
	for i, id := range threads {
		if _, ok := at[id]; !ok {
			at[id] = i
			ids = append(ids, id)
		}
	}
	err := s.stores.Threads.Records(ctx, tenant, ids, func(th *protocol.Thread, _ uint64) {
		if i, ok := at[th.ThreadID]; ok {
			out[i] = th
		}
	})
	return out, err
}
