package kv

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/protocol"
)

// The creation index: each thread has one more key in the threads bucket,
// "<tenant>.<thread>.created.<owner>", written once, just before the
// thread's record is created, and never rewritten. With History 1 the
// bucket's stream holds it at the sequence it was written, so the
// stream's order of these keys is the threads' order of creation (the
// order the server stored them in), and the server's subject index counts
// them: a count or a created_at search reads no record it does not show.
// <owner> is OwnerToken of the thread's owner, so the threads one user
// may see are counted by subject too.
//
// The key sits below the thread: deleting or erasing a thread (a purge of
// "<tenant>.<thread>.>" and of the record) removes it, so the index never
// holds more than the threads that exist. Reindex repairs a tenant whose
// threads were written before the index existed, or by a writer that
// died between the two writes.

// createdToken is the key token of the creation index.
const createdToken = "created"

// OwnerToken is the key token naming a thread's owner in the creation
// index: "_" for a thread without one, otherwise the first 16 bytes of
// the owner's SHA-256 in hex (a user id may hold characters a key may
// not).
func OwnerToken(owner string) string {
	if owner == "" {
		return "_"
	}
	sum := sha256.Sum256([]byte(owner))
	return hex.EncodeToString(sum[:16])
}

// CreatedKey is the creation index key of a thread.
func CreatedKey(tenant, thread, owner string) string {
	return bus.Key(tenant, thread, createdToken, OwnerToken(owner))
}

// CreatedEntry is the value of a creation index key.
type CreatedEntry struct {
	CreatedAt time.Time `json:"created_at"`
}

// createdFilter is the subject filter of a tenant's creation index keys
// (owner "*" for every owner).
func (s *Threads) createdFilter(tenant, owner string) string {
	return "$KV." + s.bucket + "." + bus.Key(tenant, "*", createdToken, owner)
}

// indexCreated writes the creation index key of t before its record is
// created. It reports whether it wrote it (false: it was there).
func (s *Threads) indexCreated(ctx context.Context, t *protocol.Thread) (bool, error) {
	return s.writeCreated(ctx, t, false)
}

// writeCreated writes t's creation index key unless it exists. With
// oneTrip it is refused, in one round trip, also when the key's last
// entry is a delete (kv.Create reads the key again to see that).
func (s *Threads) writeCreated(ctx context.Context, t *protocol.Thread, oneTrip bool) (bool, error) {
	data := timeEntry(`{"created_at":`, t.CreatedAt) // as json.Marshal(CreatedEntry{...})
	key := CreatedKey(t.Tenant, t.ThreadID, t.Owner)
	var err error
	if oneTrip {
		_, err = writeKey(ctx, s.js, s.kv, key, data, 0, 0)
	} else {
		_, err = createKey(ctx, s.js, s.kv, key, data, 0)
	}
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, jetstream.ErrKeyExists), errors.Is(err, jetstream.ErrKeyRevisionMismatch):
		return false, nil
	default:
		return false, fmt.Errorf("index thread %s: %w", t.ThreadID, bus.MarkStoreFull(s.bucket, err))
	}
}

// unindexCreated removes a creation index key this writer wrote for a
// record it then failed to create, unless the record another writer
// created is the same owner's (then the key is that record's).
func (s *Threads) unindexCreated(ctx context.Context, t *protocol.Thread, recordErr error) {
	if errors.Is(recordErr, ErrExists) {
		other, _, err := getAfter[protocol.Thread](ctx, s.js, s.bucket, bus.Key(t.Tenant, t.ThreadID), 0)
		if err == nil && other.Owner == t.Owner {
			return
		}
	}
	_ = s.purgeKey(ctx, CreatedKey(t.Tenant, t.ThreadID, t.Owner))
}

// purgeKey removes every message of key from the bucket's stream, leaving
// no marker (a marker would still be counted by subject).
func (s *Threads) purgeKey(ctx context.Context, key string) error {
	ctx, cancel := bound(ctx)
	defer cancel()
	st, err := s.js.Stream(ctx, "KV_"+s.bucket)
	if err != nil {
		return err
	}
	return st.Purge(ctx, jetstream.WithPurgeSubject("$KV."+s.bucket+"."+key))
}

// countSubjects counts the messages of the bucket's stream on filter, as
// the server's subject index holds them: an ephemeral consumer's pending
// count from the stream's start, which the server computes from its
// per-subject totals without reading a message.
func (s *Threads) countSubjects(ctx context.Context, filter string) (int, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	c, err := s.js.CreateConsumer(ctx, "KV_"+s.bucket, jetstream.ConsumerConfig{
		FilterSubject: filter, DeliverPolicy: jetstream.DeliverAllPolicy, AckPolicy: jetstream.AckNonePolicy,
		MemoryStorage: true, Replicas: 1, InactiveThreshold: 10 * time.Second,
	})
	if err != nil {
		return 0, fmt.Errorf("count threads: %w", err)
	}
	n := int(c.CachedInfo().NumPending)
	// The consumer goes by itself when inactive; deleting it now keeps a
	// burst of counts from piling up consumers.
	_ = s.js.DeleteConsumer(ctx, "KV_"+s.bucket, c.CachedInfo().Name)
	return n, nil
}

// Count returns how many threads tenant has: all of them (owners nil), or
// those whose owner is one of owners ("" names the threads without one).
// All threads are counted by their records, owners by the creation index.
func (s *Threads) Count(ctx context.Context, tenant string, owners []string) (int, error) {
	if !protocol.ValidToken(tenant) {
		return 0, nil
	}
	if owners == nil {
		return s.countSubjects(ctx, s.recordFilter(tenant))
	}
	total := 0
	for _, o := range slices.Compact(slices.Sorted(slices.Values(owners))) {
		n, err := s.countSubjects(ctx, s.createdFilter(tenant, OwnerToken(o)))
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}

// IndexBehind reports whether tenant has fewer creation index keys than
// thread records: threads written before the index, or by a writer that
// died between its two writes (a deletion between its two purges shows
// the same for a moment).
func (s *Threads) IndexBehind(ctx context.Context, tenant string) (bool, error) {
	if !protocol.ValidToken(tenant) {
		return false, nil
	}
	records, err := s.countSubjects(ctx, s.recordFilter(tenant))
	if err != nil {
		return false, err
	}
	indexed, err := s.countSubjects(ctx, s.createdFilter(tenant, "*"))
	if err != nil {
		return false, err
	}
	return indexed < records, nil
}

// orphanGrace is how old a creation index key without a record must be
// before Reindex removes it: a creation writes the key first and its
// record just after.
var orphanGrace = time.Minute

// Reindex repairs tenant's creation index: it adds the key of each thread
// that has none, oldest created first (so the index orders them by
// creation among themselves; they come after the threads indexed
// already), and removes the keys, older than a minute, of threads whose
// record is gone or belongs to another owner. It reads every record of
// the tenant: it serves a repair, not a request. Running it twice, or on
// two gateways at once, writes each key once.
func (s *Threads) Reindex(ctx context.Context, tenant string) (added, removed int, err error) {
	if !protocol.ValidToken(tenant) {
		return 0, 0, nil
	}
	records, err := s.List(ctx, tenant)
	if err != nil {
		return 0, 0, err
	}
	keys, err := s.keySet(ctx, bus.Key(tenant, "*", createdToken, "*"))
	if err != nil {
		return 0, 0, err
	}
	want := map[string]bool{}
	var missing []*protocol.Thread
	for _, t := range records {
		if t.ThreadID == "" || t.Tenant != tenant {
			continue
		}
		k := CreatedKey(tenant, t.ThreadID, t.Owner)
		want[k] = true
		if !keys[k] && t.Status != protocol.ThreadDeleting {
			missing = append(missing, t)
		}
	}
	slices.SortFunc(missing, func(a, b *protocol.Thread) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ThreadID, b.ThreadID)
	})
	for _, t := range missing {
		wrote, err := s.indexCreated(ctx, t)
		if err != nil {
			return added, removed, err
		}
		if wrote {
			added++
		}
	}
	// Read again: the record may have been created since the list.
	removed, err = s.purgeOrphans(ctx, tenant, keys, want, func(t *protocol.Thread, thread, k string) bool {
		return CreatedKey(tenant, thread, t.Owner) == k
	})
	return added, removed, err
}

// purgeOrphans purges the index keys of tenant in keys that want lacks,
// once they are older than orphanGrace and their thread's record, read
// again, still does not want them (wanted, given the thread id the key
// names; a missing record wants none):
// a writer may have created or changed the record since the list. It
// returns how many it purged.
func (s *Threads) purgeOrphans(ctx context.Context, tenant string, keys, want map[string]bool, wanted func(t *protocol.Thread, thread, key string) bool) (int, error) {
	removed := 0
	for k := range keys {
		if want[k] {
			continue
		}
		e, err := s.kv.Get(ctx, k)
		if err != nil || time.Since(e.Created()) < orphanGrace {
			continue
		}
		thread := strings.Split(k, ".")[1]
		if t, _, err := s.GetLatest(ctx, tenant, thread); err == nil && wanted(t, thread, k) {
			continue
		} else if err != nil && !errors.Is(err, ErrNotFound) {
			return removed, err
		}
		if err := s.purgeKey(ctx, k); err != nil {
			return removed, err
		}
		removed++
	}
	return removed, nil
}

// Created calls visit with tenant's creation index entries whose owner
// token owner accepts (nil: every one), newest first by windows of the
// stream from its end (desc), or oldest first by batches from its start
// (walk), and after each window or batch asks enough whether to stop. It
// reports whether it visited every entry.
func (s *Threads) Created(ctx context.Context, tenant string, desc bool, want int, owner func(string) bool, visit func(thread string, seq uint64), enough func() bool) (bool, error) {
	if !protocol.ValidToken(tenant) {
		return true, nil
	}
	return s.walk(ctx, s.createdFilter(tenant, "*"), desc, want, func(msgs []scannedMsg) {
		if desc {
			slices.Reverse(msgs)
		}
		for _, m := range msgs {
			toks := strings.Split(m.subject, ".")
			if !m.deleted && len(toks) == 6 && (owner == nil || owner(toks[5])) {
				visit(toks[3], m.seq)
			}
		}
	}, enough)
}

// readRaw calls visit with the messages of filter stored at sequences lo
// to hi-1, in order.
func (s *Threads) readRaw(ctx context.Context, filter string, lo, hi uint64, visit func(scannedMsg)) error {
	for seq := lo; seq < hi; {
		msgs, more, err := s.directBatch(ctx, filter, seq)
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.seq >= hi {
				return nil
			}
			seq = m.seq + 1
			visit(m)
		}
		if !more || len(msgs) == 0 {
			return nil
		}
	}
	return nil
}

// keySet is every key of the bucket matching one of filters (none: an
// empty set), as the reindexers compare them with what the records want.
func (s *Threads) keySet(ctx context.Context, filters ...string) (map[string]bool, error) {
	lister, err := s.kv.ListKeysFiltered(ctx, filters...)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return map[string]bool{}, nil
	}
	if err != nil {
		return nil, err
	}
	keys := map[string]bool{}
	for k := range lister.Keys() {
		keys[k] = true
	}
	return keys, nil
}
