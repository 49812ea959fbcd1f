package retention

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/protocol"
)

// purgeBefore removes the messages of filter stored before cutoff from a
// stream shared by every tenant: it finds the first message of filter
// stored at or after cutoff, and purges filter up to it. It reads the
// stream's last sequence first, so a message stored while it works is
// never purged.
func purgeBefore(ctx context.Context, js jetstream.JetStream, stream, filter string, cutoff time.Time) (uint64, error) {
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return 0, fmt.Errorf("open stream %s: %w", stream, err)
	}
	last := st.CachedInfo().State.LastSeq
	upTo := last + 1
	m, err := bus.GetMsgFromLeader(ctx, js, stream, bus.MsgQuery{StartTime: cutoff.UTC(), NextBySubject: filter})
	switch {
	case err == nil:
		// Everything of filter before it is older than it; were it older
		// than cutoff itself, purging below it still removes nothing
		// younger.
		upTo = m.Sequence
	case errors.Is(err, jetstream.ErrMsgNotFound):
		// Nothing of filter at or after cutoff up to now: everything of
		// filter up to last is older.
	default:
		return 0, err
	}
	return purge(ctx, js, stream, filter, upTo)
}

// purge removes the messages of filter below sequence upTo.
func purge(ctx context.Context, js jetstream.JetStream, stream, filter string, upTo uint64) (uint64, error) {
	body, _ := json.Marshal(struct {
		Filter string `json:"filter"`
		Seq    uint64 `json:"seq"`
	}{filter, upTo})
	prefix := js.Options().APIPrefix
	if prefix == "" {
		prefix = jetstream.DefaultAPIPrefix
	}
	if !strings.HasSuffix(prefix, ".") {
		prefix += "."
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	reply, err := js.Conn().RequestWithContext(ctx, prefix+"STREAM.PURGE."+stream, body)
	if err != nil {
		return 0, fmt.Errorf("purge %s of stream %s: %w", filter, stream, err)
	}
	var resp struct {
		Error   *jetstream.APIError `json:"error,omitempty"`
		Success bool                `json:"success"`
		Purged  uint64              `json:"purged"`
	}
	if err := json.Unmarshal(reply.Data, &resp); err != nil {
		return 0, fmt.Errorf("purge %s of stream %s: undecodable answer: %w", filter, stream, err)
	}
	if resp.Error != nil {
		return 0, fmt.Errorf("purge %s of stream %s: %w", filter, stream, resp.Error)
	}
	return resp.Purged, nil
}

// collect reads the current entries of a bucket's keys matching filter
// and keeps what pick makes of those it picks, so a tenant's whole bucket
// is never held in memory.
func collect[T any](ctx context.Context, js jetstream.JetStream, bucket, filter string, pick func(jetstream.KeyValueEntry) (T, bool), opts ...jetstream.WatchOpt) ([]T, error) {
	store, err := js.KeyValue(ctx, bucket)
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", bucket, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	w, err := store.Watch(ctx, filter, append(opts, jetstream.IgnoreDeletes())...)
	if err != nil {
		return nil, fmt.Errorf("read %s of bucket %s: %w", filter, bucket, err)
	}
	defer func() { _ = w.Stop() }()
	var out []T
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return nil, fmt.Errorf("read %s of bucket %s: the watch ended early", filter, bucket)
			}
			if e == nil {
				return out, nil
			}
			if v, ok := pick(e); ok {
				out = append(out, v)
			}
		}
	}
}

// entry is a key at the revision it was read.
type entry struct {
	key string
	rev uint64
}

// remove purges one key at the revision it was read at, leaving a marker
// that expires after MarkerTTL. It reports false when the key changed or
// was removed meanwhile (by its writer, or by a sweep running at once):
// then there is nothing to do.
func remove(ctx context.Context, js jetstream.JetStream, bucket, key string, rev uint64) (bool, error) {
	store, err := js.KeyValue(ctx, bucket)
	if err != nil {
		return false, err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	opts := []jetstream.KVDeleteOpt{jetstream.PurgeTTL(MarkerTTL)}
	if rev > 0 {
		opts = append(opts, jetstream.LastRevision(rev))
	}
	err = store.Purge(ctx, key, opts...)
	if wrongLastSeq(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("remove %s from bucket %s: %w", key, bucket, err)
	}
	return true, nil
}

// wrongLastSeq reports a compare-and-set refused: 10071, or 10164 on a
// replicated stream.
func wrongLastSeq(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == 10164)
}

func splitSubject(s string) []string { return strings.Split(s, ".") }

// sweepRuns removes the records of runs that finished before cutoff, and
// their entries in their thread's run index.
func (s *Sweeper) sweepRuns(ctx context.Context, tenant string, cutoff time.Time) (int, error) {
	n := s.cfg.Names
	type finished struct {
		entry
		thread, run string
	}
	old, err := collect(ctx, s.cfg.JS, n.RunsBucket(), tenant+".*", func(e jetstream.KeyValueEntry) (finished, bool) {
		var r struct {
			RunID      string          `json:"run_id"`
			ThreadID   string          `json:"thread_id"`
			Status     protocol.Status `json:"status"`
			FinishedAt *time.Time      `json:"finished_at"`
		}
		if json.Unmarshal(e.Value(), &r) != nil || !r.Status.Terminal() {
			return finished{}, false
		}
		ended := e.Created()
		if r.FinishedAt != nil && !r.FinishedAt.IsZero() {
			ended = *r.FinishedAt
		}
		return finished{entry{e.Key(), e.Revision()}, r.ThreadID, r.RunID}, ended.Before(cutoff)
	})
	if err != nil {
		return 0, err
	}
	removed := 0
	var errs []error
	for _, r := range old {
		ok, err := remove(ctx, s.cfg.JS, n.RunsBucket(), r.key, r.rev)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if ok {
			removed++
		}
		if protocol.ValidToken(r.thread) && protocol.ValidToken(r.run) {
			if _, err := remove(ctx, s.cfg.JS, n.ThreadsBucket(), bus.Key(tenant, r.thread, "run", r.run), 0); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := s.sweepRunIndex(ctx, tenant, cutoff); err != nil {
		errs = append(errs, err)
	}
	return removed, errors.Join(errs...)
}

// sweepRunIndex removes the threads' run-list entries, written before
// cutoff, of runs whose record is gone: the server removed it at its TTL,
// which leaves the entry behind. A run's record is written when its entry
// is, so an entry that old without a record has none to wait for.
func (s *Sweeper) sweepRunIndex(ctx context.Context, tenant string, cutoff time.Time) error {
	n := s.cfg.Names
	old, err := collect(ctx, s.cfg.JS, n.ThreadsBucket(), tenant+".*.run.*", func(e jetstream.KeyValueEntry) (entry, bool) {
		return entry{e.Key(), e.Revision()}, e.Created().Before(cutoff)
	})
	if err != nil || len(old) == 0 {
		return err
	}
	live, err := collect(ctx, s.cfg.JS, n.RunsBucket(), tenant+".*", func(e jetstream.KeyValueEntry) (string, bool) {
		return e.Key(), true
	}, jetstream.MetaOnly())
	if err != nil {
		return err
	}
	runs := make(map[string]bool, len(live))
	for _, k := range live {
		runs[k] = true
	}
	var errs []error
	for _, e := range old {
		t := splitSubject(e.key)
		if len(t) != 4 || runs[bus.Key(tenant, t[3])] {
			continue
		}
		if _, err := remove(ctx, s.cfg.JS, n.ThreadsBucket(), e.key, e.rev); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// sweepUsage removes usage totals (of runs and of threads) last updated
// before cutoff.
func (s *Sweeper) sweepUsage(ctx context.Context, tenant string, cutoff time.Time) (int, error) {
	bucket := s.cfg.Names.UsageBucket()
	old, err := collect(ctx, s.cfg.JS, bucket, tenant+".>", func(e jetstream.KeyValueEntry) (entry, bool) {
		var u struct {
			UpdatedAt time.Time `json:"updated_at"`
		}
		if json.Unmarshal(e.Value(), &u) != nil {
			return entry{}, false
		}
		updated := u.UpdatedAt
		if updated.IsZero() {
			updated = e.Created()
		}
		return entry{e.Key(), e.Revision()}, updated.Before(cutoff)
	})
	if err != nil {
		return 0, err
	}
	removed := 0
	var errs []error
	for _, e := range old {
		ok, err := remove(ctx, s.cfg.JS, bucket, e.key, e.rev)
		if err != nil {
			errs = append(errs, err)
		} else if ok {
			removed++
		}
	}
	return removed, errors.Join(errs...)
}

// threadRecord is what a sweep needs of a thread record.
type threadRecord struct {
	id string
	// idle is when the thread last changed: its record's last write.
	idle time.Time
	// busy: a lease or a pending steer or rollback.
	busy bool
}

// threadRecords reads the tenant's thread records.
func (s *Sweeper) threadRecords(ctx context.Context, tenant string) ([]threadRecord, error) {
	return collect(ctx, s.cfg.JS, s.cfg.Names.ThreadsBucket(), tenant+".*", func(e jetstream.KeyValueEntry) (threadRecord, bool) {
		_, thread, _ := strings.Cut(e.Key(), ".")
		var th protocol.Thread
		if !protocol.ValidToken(thread) || json.Unmarshal(e.Value(), &th) != nil {
			return threadRecord{}, false
		}
		r := threadRecord{id: thread, idle: e.Created(), busy: th.Lease != nil || len(th.Preempt) > 0}
		if th.UpdatedAt.After(r.idle) {
			r.idle = th.UpdatedAt
		}
		return r, true
	})
}

// sweepFiles removes the workdir files of the tenant's threads last
// written before cutoff, through the workdirs (so a quota counts the
// bytes given back).
func (s *Sweeper) sweepFiles(ctx context.Context, tenant string, cutoff time.Time) (int, error) {
	threads, err := s.threadRecords(ctx, tenant)
	if err != nil {
		return 0, err
	}
	removed := 0
	var errs []error
	for _, th := range threads {
		thread := th.id
		w := s.cfg.Workdirs(tenant, thread)
		var old []string
		err := w.Walk(ctx, "/", func(i files.Info) error {
			if !i.IsDir && i.ModTime.Before(cutoff) {
				old = append(old, i.Path)
			}
			return nil
		})
		if err != nil && !errors.Is(err, files.ErrNotFound) {
			errs = append(errs, fmt.Errorf("thread %s: %w", thread, err))
			continue
		}
		for _, p := range old {
			err := w.Remove(ctx, p)
			switch {
			case err == nil:
				removed++
			case errors.Is(err, files.ErrNotFound):
			default:
				errs = append(errs, fmt.Errorf("thread %s: %w", thread, err))
			}
		}
	}
	return removed, errors.Join(errs...)
}

// ContentGrace is how old workdir content must be before a sweep may
// collect it: far longer than a write takes between storing content and
// indexing it.
var ContentGrace = time.Hour

// sweepContent collects the workdir content of the tenant's threads that
// no file of the workdir (its index) and no checkpoint names, stored
// before cutoff. A thread a run holds or waits for keeps all of its
// content: a run records what it changed at its checkpoints. Content
// stored again after the listing is never deleted (files.Collect).
func (s *Sweeper) sweepContent(ctx context.Context, tenant string, cutoff time.Time) (int, error) {
	if _, err := s.cfg.JS.ObjectStore(ctx, s.cfg.Names.FilesBucket()); errors.Is(err, jetstream.ErrBucketNotFound) {
		return 0, nil // workdirs are not in the object store
	}
	threads, err := s.threadRecords(ctx, tenant)
	if err != nil {
		return 0, err
	}
	busy := map[string]bool{}
	for _, th := range threads {
		if th.busy {
			busy[th.id] = true
		}
	}
	named := map[string]map[string]bool{}
	name := func(thread, hash string) {
		if named[thread] == nil {
			named[thread] = map[string]bool{}
		}
		named[thread][hash] = true
	}
	type ref struct{ thread, hash string }
	indexed, err := collect(ctx, s.cfg.JS, s.cfg.Names.ThreadsBucket(), tenant+".*.file.*", func(e jetstream.KeyValueEntry) (ref, bool) {
		var i files.Info
		if json.Unmarshal(e.Value(), &i) != nil || i.Hash == "" {
			return ref{}, false
		}
		return ref{splitSubject(e.Key())[1], i.Hash}, true
	})
	if err != nil {
		return 0, err
	}
	for _, r := range indexed {
		name(r.thread, r.hash)
	}
	undecoded := map[string]bool{}
	checkpointed, err := collect(ctx, s.cfg.JS, s.cfg.Names.CheckpointsBucket(), tenant+".*.*", func(e jetstream.KeyValueEntry) ([]ref, bool) {
		thread := splitSubject(e.Key())[1]
		var d struct {
			Files []files.Change `json:"files"`
		}
		if json.Unmarshal(e.Value(), &d) != nil {
			undecoded[thread] = true
			return nil, false
		}
		out := make([]ref, 0, len(d.Files))
		for _, c := range d.Files {
			if c.Hash != "" {
				out = append(out, ref{thread, c.Hash})
			}
		}
		return out, len(out) > 0
	})
	if err != nil {
		return 0, err
	}
	for _, refs := range checkpointed {
		for _, r := range refs {
			name(r.thread, r.hash)
		}
	}
	return files.Collect(ctx, s.cfg.JS, s.cfg.Names.FilesBucket(), tenant, func(thread, hash string) bool {
		return busy[thread] || undecoded[thread] || named[thread][hash]
	}, cutoff)
}

// sweepCheckpoints removes, from each thread with more than keep
// checkpoints, the older ones that are not on the thread's history and
// were written before cutoff. The history is the chain from the head and
// the branches time travel left behind (reached through a delta's
// replaced), which a client reads as LangGraph's history. The chain itself is never cut:
// each delta holds only what its step changed, so the state at the head
// needs every one of them (there is no snapshot to fold them into).
func (s *Sweeper) sweepCheckpoints(ctx context.Context, tenant string, keep int, cutoff time.Time) (int, error) {
	all, err := collect(ctx, s.cfg.JS, s.cfg.Names.CheckpointsBucket(), tenant+".*.*", func(e jetstream.KeyValueEntry) (checkpoint, bool) {
		t := splitSubject(e.Key())
		if len(t) != 3 {
			return checkpoint{}, false
		}
		c := checkpoint{entry: entry{e.Key(), e.Revision()}, thread: t[1], created: e.Created()}
		var d struct {
			ID       string `json:"id"`
			Parent   string `json:"parent"`
			Replaced string `json:"replaced"`
		}
		if json.Unmarshal(e.Value(), &d) == nil && d.ID != "" {
			c.id, c.parent, c.replaced = d.ID, d.Parent, d.Replaced
		}
		return c, true
	})
	if err != nil {
		return 0, err
	}
	byThread := map[string][]checkpoint{}
	for _, c := range all {
		byThread[c.thread] = append(byThread[c.thread], c)
	}
	removed := 0
	var errs []error
	for _, thread := range slices.Sorted(maps.Keys(byThread)) {
		deltas := byThread[thread]
		if len(deltas) <= keep {
			continue
		}
		c, err := s.threadCheckpoints(ctx, tenant, thread, deltas, keep, cutoff)
		removed += c
		if err != nil {
			errs = append(errs, fmt.Errorf("thread %s: %w", thread, err))
		}
	}
	return removed, errors.Join(errs...)
}

// checkpoint is what a sweep needs of a checkpoint delta; id is empty
// when it does not decode.
type checkpoint struct {
	entry
	thread, id, parent string
	// replaced is the head a time-travel checkpoint replaced.
	replaced string
	created  time.Time
}

func (s *Sweeper) threadCheckpoints(ctx context.Context, tenant, thread string, deltas []checkpoint, keep int, cutoff time.Time) (int, error) {
	// Any replica's copy will do: a head it has not seen yet was moved
	// to deltas written since, which are younger than the grace.
	threads := s.cfg.Stores.Threads
	th, rev, err := threads.Get(ctx, tenant, thread)
	head := ""
	switch {
	case err == nil:
		if th.Lease != nil {
			return 0, nil // a run may be writing; next sweep
		}
		head = th.Head
	case errors.Is(err, kv.ErrNotFound):
	default:
		return 0, err
	}
	parent := make(map[string]string, len(deltas))
	replaced := map[string]string{}
	for _, c := range deltas {
		if c.id == "" {
			s.log.Warn("a checkpoint does not decode; its thread's checkpoints are kept", zap.String("tenant", tenant), zap.String("thread_id", thread), zap.String("key", c.key))
			return 0, nil
		}
		parent[c.id] = c.parent
		if c.replaced != "" {
			replaced[c.id] = c.replaced
		}
	}
	chain := map[string]bool{}
	for id := head; id != ""; id = parent[id] {
		if _, ok := parent[id]; !ok || chain[id] {
			// The listing missed a delta of the chain (or it loops): what
			// is on the chain is not known, so nothing is removed.
			return 0, nil
		}
		chain[id] = true
	}
	// The branches time travel left behind are history too; a branch
	// whose checkpoints are gone is kept as far as it goes.
	var branches []string
	for id := range chain {
		if r := replaced[id]; r != "" {
			branches = append(branches, r)
		}
	}
	for len(branches) > 0 {
		id := branches[len(branches)-1]
		branches = branches[:len(branches)-1]
		for ; id != "" && !chain[id]; id = parent[id] {
			if _, ok := parent[id]; !ok {
				break
			}
			chain[id] = true
			if r := replaced[id]; r != "" {
				branches = append(branches, r)
			}
		}
	}
	slices.SortFunc(deltas, func(a, b checkpoint) int { return cmp.Compare(b.rev, a.rev) })
	var old []checkpoint
	for _, c := range deltas[keep:] {
		if !chain[c.id] && !chain[splitSubject(c.key)[2]] && c.created.Before(cutoff) {
			old = append(old, c)
		}
	}
	if len(old) == 0 {
		return 0, nil
	}
	// Nothing moved the head or took the lease since it was read: every
	// delta listed was written before, and none of those off the chain
	// can become part of it.
	if _, now, err := threads.Get(ctx, tenant, thread); (err == nil && now != rev) || (err != nil && !errors.Is(err, kv.ErrNotFound)) {
		return 0, err
	}
	removed := 0
	var errs []error
	for _, c := range old {
		ok, err := remove(ctx, s.cfg.JS, s.cfg.Names.CheckpointsBucket(), c.key, c.rev)
		if err != nil {
			errs = append(errs, err)
		} else if ok {
			removed++
		}
	}
	return removed, errors.Join(errs...)
}

// sweepThreads deletes the threads without a run since cutoff: no lease,
// nothing preempting, no run request queued, and the record last written
// before cutoff (every run takes and gives back the lease in it). The
// eraser checks again as it marks each thread deleting.
func (s *Sweeper) sweepThreads(ctx context.Context, tenant string, cutoff time.Time) (int, error) {
	threads, err := s.threadRecords(ctx, tenant)
	if err != nil {
		return 0, err
	}
	n := s.cfg.Names
	var idle []string
	var errs []error
	for _, th := range threads {
		if th.busy || !th.idle.Before(cutoff) {
			continue
		}
		if len(idle) == MaxThreadsPerSweep {
			s.log.Info("idle threads left for the next sweep", zap.String("tenant", tenant), zap.Int("deleting", len(idle)))
			break
		}
		_, err := bus.GetMsgFromLeader(ctx, s.cfg.JS, n.RunsStream(), bus.MsgQuery{LastBySubject: n.RunSubject(tenant, th.id)})
		switch {
		case err == nil:
			// A run is queued.
		case errors.Is(err, jetstream.ErrMsgNotFound):
			idle = append(idle, th.id)
		default:
			errs = append(errs, err)
		}
	}
	removed := 0
	for len(idle) > 0 {
		deleted, err := s.cfg.Eraser.DeleteThreads(ctx, tenant, idle)
		removed += len(deleted)
		for _, thread := range deleted {
			s.log.Info("idle thread deleted", zap.String("tenant", tenant), zap.String("thread_id", thread))
		}
		var busy *BusyError
		if !errors.As(err, &busy) || !slices.Contains(idle, busy.Thread) {
			if err != nil {
				errs = append(errs, fmt.Errorf("delete idle threads: %w", err))
			}
			break
		}
		// A run took it since it was read: the others again, without it.
		idle = slices.DeleteFunc(idle, func(t string) bool { return t == busy.Thread || slices.Contains(deleted, t) })
	}
	return removed, errors.Join(errs...)
}
