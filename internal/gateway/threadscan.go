package gateway

import (
	"cmp"
	"context"
	"slices"

	"github.com/natsagent/natsagent/internal/protocol"
)

// Thread searches read the threads bucket's stream, which holds each
// thread's record once, at the sequence of its last write
// (kv.Threads.Recent): the newest threads of a tenant are at its end. A
// search by updated_at, newest first (LangGraph's default, and what
// Agent Chat UI's history asks for), reads back from the end until it
// holds a page, and orders it by the write's place in the stream, the
// order the NATS server stored the writes in (updated_at is the writer's
// clock, set just before it wrote: the same order but for writes a few
// milliseconds apart from different hosts). Other orders and counts read
// the tenant's records in full (kv.Threads.Scan). The gateway keeps no
// index: it starts without reading the bucket, and a write, deletion or
// erasure shows in the next search because the record is the index.

// newestThreads returns the first want threads of tenant that match, by
// last write, newest first, and how many match in all, or -1 when it did
// not read far enough to know.
func (s *Server) newestThreads(ctx context.Context, tenant string, want int, match func(*protocol.Thread) bool) ([]protocol.Thread, int, error) {
	type written struct {
		th  protocol.Thread
		seq uint64
	}
	var found []written
	complete, err := s.stores.Threads.Recent(ctx, tenant, want, func(th *protocol.Thread, seq uint64) {
		trimThread(th)
		if match(th) {
			found = append(found, written{*th, seq})
		}
	}, func() bool { return len(found) >= want })
	if err != nil {
		return nil, 0, err
	}
	slices.SortFunc(found, func(a, b written) int { return cmp.Compare(b.seq, a.seq) })
	out := make([]protocol.Thread, 0, min(len(found), want))
	for _, w := range found[:min(len(found), want)] {
		out = append(out, w.th)
	}
	if complete {
		return out, len(found), nil
	}
	return out, -1, nil
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
