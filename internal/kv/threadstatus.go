package kv

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/protocol"
)

// The status index: a thread whose record says interrupted or error has
// one more key in the threads bucket,
// "<tenant>.<thread>.status.<status>.<owner>" (<owner> as in the creation
// index). It is written before the record's write that moves the thread
// into that status, and purged after the write that moves it out (the
// next run taking the lease), so it costs a write only for the runs that
// end that way and for the run after them, never one per run. Between
// the two writes, or after a writer that died there, the index names a
// thread its record no longer puts in that status: readers take it as a
// candidate and check the record. The converse never happens (a thread
// in the status without its key) but for threads written before the
// index existed, which ReindexStatus adds once per tenant.
//
// busy is not indexed: a busy thread holds a lease, so its run request is
// still in the runs stream (acknowledged once the run released the
// thread), and the stream's subjects list those threads. idle is every
// other thread.

// statusToken is the key token of the status index.
const statusToken = "status"

// IndexedStatus reports whether threads of status st are in the status
// index.
func IndexedStatus(st string) bool {
	return st == protocol.ThreadInterrupted || st == protocol.ThreadError
}

// StatusKey is the status index key of a thread in status st.
func StatusKey(tenant, thread, st, owner string) string {
	return bus.Key(tenant, thread, statusToken, st, OwnerToken(owner))
}

// statusMarkerKey is the key saying tenant's status and metadata indexes
// are complete.
// "=" is no character of a thread id, so the key is no thread's, and it
// has three tokens: no filter of records or index keys matches it.
func statusMarkerKey(tenant string) string {
	return bus.Key(tenant, "=index", statusToken)
}

// statusEntry is the value of a status index key (written by hand with
// timeEntry).
type statusEntry struct {
	At time.Time `json:"at"`
}

// markStatus writes t's status index key when t's status is indexed and
// prev (the record t replaces, nil for none) was not in that status under
// that owner.
func (s *Threads) markStatus(ctx context.Context, prev, t *protocol.Thread) error {
	if !IndexedStatus(t.Status) || (prev != nil && prev.Status == t.Status && prev.Owner == t.Owner) {
		return nil
	}
	data := timeEntry(`{"at":`, time.Now().UTC()) // as json.Marshal(statusEntry{...})
	ctx, cancel := bound(ctx)
	defer cancel()
	if _, err := s.kv.Put(ctx, StatusKey(t.Tenant, t.ThreadID, t.Status, t.Owner), data); err != nil {
		return fmt.Errorf("index thread %s status: %w", t.ThreadID, bus.MarkStoreFull(s.bucket, err))
	}
	return nil
}

// unmarkStatus purges prev's status index key after a write moved the
// thread out of that status (t, the record written). A purge that fails
// leaves a key readers check against the record.
func (s *Threads) unmarkStatus(ctx context.Context, prev, t *protocol.Thread) {
	if prev == nil || !IndexedStatus(prev.Status) || (prev.Status == t.Status && prev.Owner == t.Owner) {
		return
	}
	_ = s.purgeKey(ctx, StatusKey(prev.Tenant, prev.ThreadID, prev.Status, prev.Owner))
}

// subjectTokens lists, from the server's subject index of stream (no
// message read), the distinct token at position pos of the subjects
// matching filter.
func subjectTokens(ctx context.Context, st jetstream.Stream, filter string, pos int) ([]string, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(info.State.Subjects))
	for subj, n := range info.State.Subjects {
		if n == 0 {
			continue
		}
		toks := strings.Split(subj, ".")
		if pos < len(toks) {
			out = append(out, toks[pos])
		}
	}
	return out, nil
}

// bucketStream is the threads bucket's stream.
func (s *Threads) bucketStream(ctx context.Context) (jetstream.Stream, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	return s.js.Stream(ctx, "KV_"+s.bucket)
}

// ownerTokens is the owner token filter of owners: "*" for nil (every
// owner), else each owner's token.
func ownerTokens(owners []string) []string {
	if owners == nil {
		return []string{"*"}
	}
	seen := map[string]bool{}
	var out []string
	for _, o := range owners {
		if tok := OwnerToken(o); !seen[tok] {
			seen[tok] = true
			out = append(out, tok)
		}
	}
	return out
}

// listIndex lists the thread ids of tenant's index keys "<tenant>.*.<kind...>.<owner>"
// for each owner token, each once.
func (s *Threads) listIndex(ctx context.Context, tenant string, kind []string, owners []string) ([]string, error) {
	if !protocol.ValidToken(tenant) {
		return nil, nil
	}
	st, err := s.bucketStream(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	seen := map[string]bool{}
	for _, tok := range ownerTokens(owners) {
		parts := append(append([]string{"$KV", s.bucket, tenant, "*"}, kind...), tok)
		ids, err := subjectTokens(ctx, st, strings.Join(parts, "."), 3)
		if err != nil {
			return nil, fmt.Errorf("list threads: %w", err)
		}
		for _, id := range ids {
			if !seen[id] {
				seen[id] = true
				out = append(out, id)
			}
		}
	}
	return out, nil
}

// IDs lists the ids of tenant's threads whose owner is one of owners (nil:
// every thread), from the creation index's subjects: no record is read.
// The caller makes sure the index is not behind (IndexBehind, Reindex).
func (s *Threads) IDs(ctx context.Context, tenant string, owners []string) ([]string, error) {
	return s.listIndex(ctx, tenant, []string{createdToken}, owners)
}

// WithStatus lists the ids of tenant's threads the status index names in
// status st (interrupted or error) whose owner is one of owners (nil:
// every owner): a superset of those whose record says so.
func (s *Threads) WithStatus(ctx context.Context, tenant, st string, owners []string) ([]string, error) {
	if !IndexedStatus(st) {
		return nil, fmt.Errorf("status %q is not indexed", st)
	}
	return s.listIndex(ctx, tenant, []string{statusToken, st}, owners)
}

// StatusIndexed reports whether tenant's status and metadata indexes are
// complete (its marker written by ReindexStatus).
func (s *Threads) StatusIndexed(ctx context.Context, tenant string) (bool, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	_, err := s.kv.Get(ctx, statusMarkerKey(tenant))
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return false, nil
	default:
		return false, err
	}
}

// ReindexStatus makes tenant's status and metadata indexes complete: it
// adds the status key of each thread whose record is interrupted or
// error and the metadata keys of its scalar metadata, those it has not,
// removes the keys, older than a minute, that their record does not
// confirm, and then writes the tenant's marker. It reads every record of the tenant,
// once per tenant (threads written before the index existed), not per
// request. Running it twice, or on two gateways at once, is harmless.
func (s *Threads) ReindexStatus(ctx context.Context, tenant string) (added, removed int, err error) {
	if !protocol.ValidToken(tenant) {
		return 0, 0, nil
	}
	records, err := s.List(ctx, tenant)
	if err != nil {
		return 0, 0, err
	}
	keys, err := s.keySet(ctx, bus.Key(tenant, "*", statusToken, "*", "*"), bus.Key(tenant, "*", metaToken, "*", "*"))
	if err != nil {
		return 0, 0, err
	}
	want := map[string]bool{}
	var acks []jetstream.PubAckFuture
	// The missing keys go out as async publishes, a window at a time: a
	// tenant of 100,000 threads is one key or more each.
	settle := func() error {
		for _, a := range acks {
			select {
			case <-a.Ok():
			case err := <-a.Err():
				return fmt.Errorf("index threads: %w", err)
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		acks = acks[:0]
		return nil
	}
	add := func(k string) error {
		data := timeEntry(`{"at":`, time.Now().UTC()) // as json.Marshal(statusEntry{...})
		a, err := s.js.PublishAsync("$KV."+s.bucket+"."+k, data)
		if err != nil {
			return err
		}
		acks = append(acks, a)
		added++
		if len(acks) >= 1000 {
			return settle()
		}
		return nil
	}
	for _, t := range records {
		if t.ThreadID == "" || t.Tenant != tenant {
			continue
		}
		for k := range metadataKeys(t) {
			want[k] = true
			if !keys[k] {
				if err := add(k); err != nil {
					return added, removed, err
				}
			}
		}
		if !IndexedStatus(t.Status) {
			continue
		}
		k := StatusKey(tenant, t.ThreadID, t.Status, t.Owner)
		want[k] = true
		if !keys[k] {
			if err := add(k); err != nil {
				return added, removed, err
			}
		}
	}
	if err := settle(); err != nil {
		return added, removed, err
	}
	// Read again: the record may have moved into the status since.
	removed, err = s.purgeOrphans(ctx, tenant, keys, want, func(t *protocol.Thread, thread, k string) bool {
		return StatusKey(tenant, thread, t.Status, t.Owner) == k || metadataKeys(t)[k]
	})
	if err != nil {
		return added, removed, err
	}
	data := timeEntry(`{"at":`, time.Now().UTC()) // as json.Marshal(statusEntry{...})
	pctx, cancel := bound(ctx)
	defer cancel()
	if _, err := s.kv.Put(pctx, statusMarkerKey(tenant), data); err != nil {
		return added, removed, err
	}
	return added, removed, nil
}
