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
		if m.Time.Before(cutoff) {
			return 0, fmt.Errorf("stream %s answered message %d of %s for time %s", stream, m.Sequence, m.Time, cutoff)
		}
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

// entries reads the current entries of a bucket's keys matching filter.
func entries(ctx context.Context, js jetstream.JetStream, bucket, filter string) ([]jetstream.KeyValueEntry, error) {
	store, err := js.KeyValue(ctx, bucket)
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", bucket, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	w, err := store.Watch(ctx, filter, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("read %s of bucket %s: %w", filter, bucket, err)
	}
	defer func() { _ = w.Stop() }()
	var out []jetstream.KeyValueEntry
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
			out = append(out, e)
		}
	}
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
	all, err := entries(ctx, s.cfg.JS, n.RunsBucket(), tenant+".*")
	if err != nil {
		return 0, err
	}
	removed := 0
	var errs []error
	for _, e := range all {
		var r struct {
			RunID      string          `json:"run_id"`
			ThreadID   string          `json:"thread_id"`
			Status     protocol.Status `json:"status"`
			FinishedAt *time.Time      `json:"finished_at"`
		}
		if json.Unmarshal(e.Value(), &r) != nil || !r.Status.Terminal() {
			continue
		}
		ended := e.Created()
		if r.FinishedAt != nil && !r.FinishedAt.IsZero() {
			ended = *r.FinishedAt
		}
		if !ended.Before(cutoff) {
			continue
		}
		ok, err := remove(ctx, s.cfg.JS, n.RunsBucket(), e.Key(), e.Revision())
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if ok {
			removed++
		}
		if protocol.ValidToken(r.ThreadID) && protocol.ValidToken(r.RunID) {
			if _, err := remove(ctx, s.cfg.JS, n.ThreadsBucket(), bus.Key(tenant, r.ThreadID, "run", r.RunID), 0); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return removed, errors.Join(errs...)
}

// sweepUsage removes usage totals (of runs and of threads) last updated
// before cutoff.
func (s *Sweeper) sweepUsage(ctx context.Context, tenant string, cutoff time.Time) (int, error) {
	bucket := s.cfg.Names.UsageBucket()
	all, err := entries(ctx, s.cfg.JS, bucket, tenant+".>")
	if err != nil {
		return 0, err
	}
	removed := 0
	var errs []error
	for _, e := range all {
		var u struct {
			UpdatedAt time.Time `json:"updated_at"`
		}
		if json.Unmarshal(e.Value(), &u) != nil {
			continue
		}
		updated := u.UpdatedAt
		if updated.IsZero() {
			updated = e.Created()
		}
		if !updated.Before(cutoff) {
			continue
		}
		ok, err := remove(ctx, s.cfg.JS, bucket, e.Key(), e.Revision())
		if err != nil {
			errs = append(errs, err)
		} else if ok {
			removed++
		}
	}
	return removed, errors.Join(errs...)
}

// threadRecords reads the tenant's thread records with their entries.
func (s *Sweeper) threadRecords(ctx context.Context, tenant string) (map[string]jetstream.KeyValueEntry, error) {
	all, err := entries(ctx, s.cfg.JS, s.cfg.Names.ThreadsBucket(), tenant+".*")
	if err != nil {
		return nil, err
	}
	out := make(map[string]jetstream.KeyValueEntry, len(all))
	for _, e := range all {
		if _, thread, ok := strings.Cut(e.Key(), "."); ok && protocol.ValidToken(thread) {
			out[thread] = e
		}
	}
	return out, nil
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
	for _, thread := range slices.Sorted(maps.Keys(threads)) {
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

// sweepCheckpoints removes, from each thread with more than keep
// checkpoints, the older ones that are not on the chain from the thread's
// head and were written before cutoff. The chain itself is never cut:
// each delta holds only what its step changed, so the state at the head
// needs every one of them (there is no snapshot to fold them into).
func (s *Sweeper) sweepCheckpoints(ctx context.Context, tenant string, keep int, cutoff time.Time) (int, error) {
	n := s.cfg.Names
	all, err := entries(ctx, s.cfg.JS, n.CheckpointsBucket(), tenant+".*.*")
	if err != nil {
		return 0, err
	}
	byThread := map[string][]jetstream.KeyValueEntry{}
	for _, e := range all {
		if t := splitSubject(e.Key()); len(t) == 3 {
			byThread[t[1]] = append(byThread[t[1]], e)
		}
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

func (s *Sweeper) threadCheckpoints(ctx context.Context, tenant, thread string, deltas []jetstream.KeyValueEntry, keep int, cutoff time.Time) (int, error) {
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
	idOf := make(map[string]string, len(deltas)) // by key
	for _, e := range deltas {
		var d struct {
			ID     string `json:"id"`
			Parent string `json:"parent"`
		}
		if json.Unmarshal(e.Value(), &d) != nil || d.ID == "" {
			s.log.Warn("a checkpoint does not decode; its thread's checkpoints are kept", zap.String("tenant", tenant), zap.String("thread_id", thread), zap.String("key", e.Key()))
			return 0, nil
		}
		parent[d.ID], idOf[e.Key()] = d.Parent, d.ID
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
	slices.SortFunc(deltas, func(a, b jetstream.KeyValueEntry) int { return cmp.Compare(b.Revision(), a.Revision()) })
	var old []jetstream.KeyValueEntry
	for _, e := range deltas[keep:] {
		if !chain[idOf[e.Key()]] && !chain[splitSubject(e.Key())[2]] && e.Created().Before(cutoff) {
			old = append(old, e)
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
	for _, e := range old {
		ok, err := remove(ctx, s.cfg.JS, s.cfg.Names.CheckpointsBucket(), e.Key(), e.Revision())
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
// before cutoff (every run takes and gives back the lease in it).
func (s *Sweeper) sweepThreads(ctx context.Context, tenant string, cutoff time.Time) (int, error) {
	threads, err := s.threadRecords(ctx, tenant)
	if err != nil {
		return 0, err
	}
	n := s.cfg.Names
	removed := 0
	var errs []error
	for _, thread := range slices.Sorted(maps.Keys(threads)) {
		e := threads[thread]
		var th protocol.Thread
		if json.Unmarshal(e.Value(), &th) != nil || th.Lease != nil || len(th.Preempt) > 0 {
			continue
		}
		last := e.Created()
		if th.UpdatedAt.After(last) {
			last = th.UpdatedAt
		}
		if !last.Before(cutoff) {
			continue
		}
		_, err := bus.GetMsgFromLeader(ctx, s.cfg.JS, n.RunsStream(), bus.MsgQuery{LastBySubject: n.RunSubject(tenant, thread)})
		if err == nil {
			continue // a run is queued
		}
		if !errors.Is(err, jetstream.ErrMsgNotFound) {
			errs = append(errs, err)
			continue
		}
		if removed >= MaxThreadsPerSweep {
			s.log.Info("idle threads left for the next sweep", zap.String("tenant", tenant), zap.Int("deleted", removed))
			break
		}
		err = s.cfg.Eraser.DeleteThread(ctx, tenant, thread)
		switch {
		case errors.Is(err, ErrThreadBusy), errors.Is(err, ErrThreadGone):
			continue
		case err != nil:
			errs = append(errs, fmt.Errorf("delete idle thread %s: %w", thread, err))
			continue
		}
		removed++
		s.log.Info("idle thread deleted", zap.String("tenant", tenant), zap.String("thread_id", thread), zap.Time("last_run", last))
	}
	return removed, errors.Join(errs...)
}
