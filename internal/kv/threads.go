package kv

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/protocol"
)

// Threads stores thread records under "<tenant>.<thread>" and an index of
// each thread's runs under "<tenant>.<thread>.run.<run>".
type Threads struct {
	kv     jetstream.KeyValue
	js     jetstream.JetStream
	bucket string
	// read counts the thread records this store read (RecordsRead).
	read atomic.Uint64
	// skips reports the records that do not decode (Stores.Observe).
	skips *Skips
}

// RecordsRead returns how many thread records this store has read: by
// key, by a read of the stream's windows or batches, or in a listing. It
// is how tests and benchmarks see what a search reads.
func (s *Threads) RecordsRead() uint64 { return s.read.Load() }

// Get reads a thread record.
func (s *Threads) Get(ctx context.Context, tenant, thread string) (*protocol.Thread, uint64, error) {
	s.read.Add(1)
	return get[protocol.Thread](ctx, s.js, s.kv, bus.Key(tenant, thread))
}

// GetLatest reads a thread record through the bucket's leader, for the
// read after a create refused with ErrExists (see Runs.GetLatest).
func (s *Threads) GetLatest(ctx context.Context, tenant, thread string) (*protocol.Thread, uint64, error) {
	return getAfter[protocol.Thread](ctx, s.js, s.bucket, bus.Key(tenant, thread), 0)
}

// GetFromLeader reads a thread record through the bucket's leader, at
// once (see Runs.GetFromLeader): a missing thread answers ErrNotFound in
// one round trip.
func (s *Threads) GetFromLeader(ctx context.Context, tenant, thread string) (*protocol.Thread, uint64, error) {
	return getLatest[protocol.Thread](ctx, s.js, s.bucket, bus.Key(tenant, thread))
}

// Put creates (rev 0) or compare-and-sets (rev > 0) a thread record. A
// creation writes the thread's creation index key first (threadindex.go),
// so a record never exists unindexed but for a writer that died between
// the two.
func (s *Threads) Put(ctx context.Context, t *protocol.Thread, rev uint64) (uint64, error) {
	if rev > 0 {
		return put(ctx, s.js, s.kv, bus.Key(t.Tenant, t.ThreadID), t, rev)
	}
	if err := s.markStatus(ctx, nil, t); err != nil {
		return 0, err
	}
	if err := s.markMetadata(ctx, nil, t); err != nil {
		s.unmarkRefused(ctx, t, err) // the keys written before the failure
		return 0, err
	}
	indexed, err := s.indexCreated(ctx, t)
	if err != nil {
		s.unmarkRefused(ctx, t, err)
		return 0, err
	}
	n, err := put(ctx, s.js, s.kv, bus.Key(t.Tenant, t.ThreadID), t, 0)
	if err != nil {
		if indexed {
			s.unindexCreated(ctx, t, err)
		}
		s.unmarkRefused(ctx, t, err)
	}
	return n, err
}

// unmarkAll is unmarkRefused of every record in marked: the keys written
// for records of attempts none of which was stored.
func (s *Threads) unmarkAll(ctx context.Context, marked []*protocol.Thread, err error) {
	for _, m := range marked {
		s.unmarkRefused(ctx, m, err)
	}
}

// unmarkRefused purges the status and metadata index keys written for t,
// whose record was refused (recordErr), unless the thread's record, read
// from the leader, is in that status or has that pair under that owner.
// Counts read those keys alone, so a create of an existing thread with
// other metadata (a do_nothing create, another user's) must not leave its
// own; and a thread never created has no record whose deletion would
// purge them. As in unindexCreated, a concurrent creator of the same id
// whose record is not stored yet may lose a key it shares; the status
// repair (ReindexStatus) adds it again.
func (s *Threads) unmarkRefused(ctx context.Context, t *protocol.Thread, recordErr error) {
	if !IndexedStatus(t.Status) && len(t.Metadata) == 0 {
		return
	}
	key := bus.Key(t.Tenant, t.ThreadID)
	var cur *protocol.Thread
	var err error
	if errors.Is(recordErr, ErrExists) || errors.Is(recordErr, ErrConflict) {
		cur, _, err = getAfter[protocol.Thread](ctx, s.js, s.bucket, key, 0)
	} else {
		cur, _, err = getLatest[protocol.Thread](ctx, s.js, s.bucket, key)
	}
	switch {
	case errors.Is(err, ErrNotFound):
		cur = &protocol.Thread{Tenant: t.Tenant, ThreadID: t.ThreadID}
	case err != nil:
		return // unknown: the keys stay for the readers to check
	}
	s.unmarkStatus(ctx, t, cur)
	s.unmarkMetadata(ctx, t, cur)
}

// CreateNew creates the record of a thread whose key was never written
// (or is gone with its history), in one round trip: unlike Put with rev
// 0 it does not read the key again when it is refused, to see whether its
// last entry was a delete, and its creation index key is written at the
// same time as the record, not before it. Refused with ErrExists when the
// key has an entry, a delete included; an index key it wrote for a
// thread that turns out to be another owner's is removed again.
func (s *Threads) CreateNew(ctx context.Context, t *protocol.Thread) (uint64, error) {
	data, err := encode(t)
	if err != nil {
		return 0, err
	}
	type indexed struct {
		ok  bool
		err error
	}
	ix := make(chan indexed, 1)
	go func() {
		ok, err := s.writeCreated(ctx, t, true)
		ix <- indexed{ok, err}
	}()
	n, err := writeKey(ctx, s.js, s.kv, bus.Key(t.Tenant, t.ThreadID), data, 0, 0)
	if errors.Is(err, jetstream.ErrKeyExists) {
		err = ErrExists
	}
	// An index write that failed leaves the record unindexed, as a writer
	// that died between the two would: the repair (threadindex.go) adds
	// the key.
	if r := <-ix; r.ok && err != nil {
		s.unindexCreated(ctx, t, err)
	}
	if err != nil {
		if errors.Is(err, ErrExists) {
			return 0, err
		}
		return 0, bus.MarkStoreFull(s.bucket, err)
	}
	return n, nil
}

// Mutate applies fn to the current record (a new one if the thread does
// not exist yet) and writes it with CAS, retrying on conflict. If fn
// returns an error nothing is written and the error is returned unchanged.
func (s *Threads) Mutate(ctx context.Context, tenant, thread string, fn func(*protocol.Thread) error) (*protocol.Thread, uint64, error) {
	t, rev, err := s.Get(ctx, tenant, thread)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return nil, 0, err
	}
	return s.MutateFrom(ctx, tenant, thread, t, rev, fn)
}

// MutateFrom is Mutate starting from a record the caller already holds at
// revision rev (nil and 0 for "does not exist"), saving the read when the
// cached copy is current. A write that moves the thread into or out of
// an indexed status, or changes its metadata, keeps the status and
// metadata indexes (threadstatus.go, threadmeta.go).
func (s *Threads) MutateFrom(ctx context.Context, tenant, thread string, t *protocol.Thread, rev uint64, fn func(*protocol.Thread) error) (*protocol.Thread, uint64, error) {
	var marked []*protocol.Thread // status keys written for attempts
	for attempt := 0; ; attempt++ {
		var next protocol.Thread
		if t != nil {
			next = cloneThread(t)
		} else {
			now := time.Now().UTC()
			next = protocol.Thread{ThreadID: thread, Tenant: tenant, CreatedAt: now, Status: protocol.ThreadIdle}
		}
		if err := fn(&next); err != nil {
			return t, rev, err
		}
		if t != nil && t.Status == protocol.ThreadDeleting {
			// Only the deletion ends this status (by removing the record):
			// a run releasing the thread meanwhile must not reopen it.
			next.Status = protocol.ThreadDeleting
		}
		next.UpdatedAt = time.Now().UTC()
		if rev > 0 && (IndexedStatus(next.Status) || len(next.Metadata) > 0) {
			marked = append(marked, &next)
			err := s.markStatus(ctx, t, &next)
			if err == nil {
				err = s.markMetadata(ctx, t, &next)
			}
			if err != nil {
				s.unmarkAll(ctx, marked, err)
				return nil, 0, err
			}
		}
		newRev, err := s.Put(ctx, &next, rev)
		if err == nil {
			s.unmarkStatus(ctx, t, &next)
			s.unmarkMetadata(ctx, t, &next)
			for _, m := range marked {
				// Keys an attempt refused by a conflict wrote.
				s.unmarkStatus(ctx, m, &next)
				s.unmarkMetadata(ctx, m, &next)
			}
			return &next, newRev, nil
		}
		if (!errors.Is(err, ErrConflict) && !errors.Is(err, ErrExists)) || attempt >= maxCASAttempts {
			s.unmarkAll(ctx, marked, err)
			return nil, 0, fmt.Errorf("update thread %s: %w", thread, err)
		}
		// Refused because the record changed: read what changed it from
		// the leader, once stored (a replica may not have it yet).
		t, rev, err = getAfter[protocol.Thread](ctx, s.js, s.bucket, bus.Key(tenant, thread), rev)
		if err != nil && !errors.Is(err, ErrNotFound) {
			return nil, 0, err
		}
	}
}

// cloneThread copies the parts of a thread that fn may edit in place.
func cloneThread(t *protocol.Thread) protocol.Thread {
	c := *t
	if t.Lease != nil {
		l := *t.Lease
		c.Lease = &l
	}
	c.Preempt = append([]protocol.Preemption(nil), t.Preempt...)
	// A patch edits metadata in place; the metadata index compares the
	// record before and after it.
	c.Metadata = maps.Clone(t.Metadata)
	return c
}

// runIndexEntry is the value of a run index key (IndexRun writes it by
// hand with timeEntry; readers decode it).
type runIndexEntry struct {
	CreatedAt time.Time `json:"created_at"`
}

// IndexRun records that run belongs to thread, without waiting for the
// server: the index only serves listings, and a lost entry is rewritten by
// the next writer of the run.
func (s *Threads) IndexRun(ctx context.Context, tenant, thread, run string, created time.Time) error {
	data := timeEntry(`{"created_at":`, created) // as json.Marshal(runIndexEntry{...})
	_, err := s.js.PublishAsync("$KV."+s.bucket+"."+bus.Key(tenant, thread, "run", run), data)
	return err
}

// RunIDs lists a thread's runs: those indexed under it and (protocol v2)
// those its record keeps as recent, each once. A run may be listed whose
// record is gone (expired, deleted): readers skip it.
func (s *Threads) RunIDs(ctx context.Context, tenant, thread string) ([]string, error) {
	var th *protocol.Thread
	var thErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		th, _, thErr = s.Get(ctx, tenant, thread)
	}()
	lister, err := s.kv.ListKeysFiltered(ctx, bus.Key(tenant, thread, "run", "*"))
	if err != nil {
		<-done
		return nil, err
	}
	var ids []string
	seen := map[string]bool{}
	for k := range lister.Keys() {
		id := k[strings.LastIndexByte(k, '.')+1:]
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	<-done
	if thErr != nil && !errors.Is(thErr, ErrNotFound) {
		return nil, thErr
	}
	if th != nil {
		for _, id := range th.RecentRuns {
			if !seen[id] {
				seen[id] = true
				ids = append(ids, id)
			}
		}
	}
	return ids, nil
}

// List returns a tenant's thread records.
func (s *Threads) List(ctx context.Context, tenant string) ([]*protocol.Thread, error) {
	all, err := list(ctx, s.kv, tenant+".*", threadRecord, nil, s.skips)
	s.read.Add(uint64(len(all)))
	return all, err
}

// StaleLeases returns the thread records, of every tenant, holding a lease
// last renewed before cutoff. It reads every thread record (not the run
// index), so it serves a periodic sweep, not a hot path.
func (s *Threads) StaleLeases(ctx context.Context, cutoff time.Time) ([]*protocol.Thread, error) {
	return list(ctx, s.kv, "*.*", threadRecord, func(t *protocol.Thread) bool { return t.Lease != nil && t.Lease.RenewedAt.Before(cutoff) }, s.skips)
}
