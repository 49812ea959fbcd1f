package kv

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/protocol"
)

// Usage reads (and, for runs that ended before protocol v2, wrote) token
// usage aggregates in the usage bucket. Since v2 a run's totals live in its
// terminal record and a thread's in its thread record (RunOf, ThreadOf
// read both); nothing writes the bucket in a run's path any more, and
// what it holds stays readable until retention or its TTL removes it.
//
// Layout: a run's totals
// under "<tenant>.run.<run>" and a thread's under
// "<tenant>.thread.<thread>".
//
// Nothing is ever incremented blindly. A run's totals are a pure function
// of its checkpointed messages, so writing them replaces what was there. A
// thread's record keeps, per run, the totals last applied: applying a run
// again replaces its entry, so a run finished twice (a replay, a
// redelivery after a crash) counts once. Both writes are compare-and-set,
// retried on conflict. To bound the thread record, entries beyond the
// last protocol.DefaultThreadUsageRuns applied are folded into one sum; a
// folded run applied again would count twice, which cannot happen to a
// run whose request was acked 256 runs ago.
type Usage struct {
	js     jetstream.JetStream
	bucket string
	// Keep bounds the run entries of a thread record (0: the default).
	Keep int
	// ttl is the key TTL of a tenant's totals (SetTTLs).
	ttl func(tenant string) time.Duration

	once sync.Once
	kv   jetstream.KeyValue
	err  error

	// mu guards the thread records this process wrote last.
	mu       sync.Mutex
	cur, old map[string]cachedThread
}

// NewUsage returns the usage store of a deployment. The bucket is bound
// on first use, so a process that never reads or writes usage does not
// need it.
func NewUsage(js jetstream.JetStream, names bus.Names) *Usage {
	return &Usage{js: js, bucket: names.UsageBucket()}
}

func (s *Usage) store(ctx context.Context) (jetstream.KeyValue, error) {
	s.once.Do(func() {
		s.kv, s.err = s.js.KeyValue(ctx, s.bucket)
		if s.err != nil {
			s.err = fmt.Errorf("open bucket %s: %w", s.bucket, s.err)
		}
	})
	return s.kv, s.err
}

func usageKey(tenant, kind, id string) (string, error) {
	if !protocol.ValidToken(tenant) {
		return "", fmt.Errorf("usage: tenant %q is not a valid id", tenant)
	}
	if !protocol.ValidToken(id) {
		return "", fmt.Errorf("usage: %s id %q is not a valid id", kind, id)
	}
	return bus.Key(tenant, kind, id), nil
}

// Run reads a run's totals; ErrNotFound before the run ended.
func (s *Usage) Run(ctx context.Context, tenant, run string) (*protocol.RunUsage, uint64, error) {
	key, err := usageKey(tenant, "run", run)
	if err != nil {
		return nil, 0, err
	}
	kv, err := s.store(ctx)
	if err != nil {
		return nil, 0, err
	}
	return get[protocol.RunUsage](ctx, s.js, kv, key)
}

// Thread reads a thread's totals; ErrNotFound before its first run ended.
func (s *Usage) Thread(ctx context.Context, tenant, thread string) (*protocol.ThreadUsage, uint64, error) {
	key, err := usageKey(tenant, "thread", thread)
	if err != nil {
		return nil, 0, err
	}
	kv, err := s.store(ctx)
	if err != nil {
		return nil, 0, err
	}
	return get[protocol.ThreadUsage](ctx, s.js, kv, key)
}

// Record writes a run's totals (replacing any earlier version) and applies
// them to its thread's totals, the two writes at once. Call it when the
// run ends, with totals derived from its final state; calling it again
// with the same totals changes nothing.
func (s *Usage) Record(ctx context.Context, u *protocol.RunUsage) error {
	threadErr := make(chan error, 1)
	go func() { threadErr <- s.ApplyToThread(ctx, u) }()
	return errors.Join(s.PutRun(ctx, u), <-threadErr)
}

// PutRun replaces a run's totals with CAS.
func (s *Usage) PutRun(ctx context.Context, u *protocol.RunUsage) error {
	key, err := usageKey(u.Tenant, "run", u.RunID)
	if err != nil {
		return err
	}
	if !protocol.ValidToken(u.ThreadID) {
		return fmt.Errorf("usage: thread id %q is not a valid id", u.ThreadID)
	}
	kv, err := s.store(ctx)
	if err != nil {
		return err
	}
	next := u.Clone()
	next.Recompute()
	next.UpdatedAt = time.Now().UTC()
	// A run's totals are written once, at its end: try the create first.
	ttl := ttlOf(s.ttl, u.Tenant)
	_, err = putTTL(ctx, s.js, kv, key, next, 0, ttl)
	if !errors.Is(err, ErrExists) {
		return err
	}
	cur, rev, err := get[protocol.RunUsage](ctx, s.js, kv, key)
	for attempt := 0; ; attempt++ {
		switch {
		case errors.Is(err, ErrNotFound):
			rev = 0
		case err != nil:
			return err
		case cur.ThreadID != next.ThreadID:
			return fmt.Errorf("usage: run %s belongs to thread %s, not %s", u.RunID, cur.ThreadID, u.ThreadID)
		}
		_, err = putTTL(ctx, s.js, kv, key, next, rev, ttl)
		if err == nil {
			return nil
		}
		if (!errors.Is(err, ErrConflict) && !errors.Is(err, ErrExists)) || attempt >= maxCASAttempts {
			return fmt.Errorf("write usage of run %s: %w", u.RunID, err)
		}
		cur, rev, err = get[protocol.RunUsage](ctx, s.js, kv, key)
	}
}

// ApplyToThread sets a run's total in its thread's totals with CAS,
// retrying on conflict; a run applied again with the same total writes
// nothing. It starts from the record this process wrote last for the
// thread (or a new one), so the common cases, a thread's first run and
// the next run of a thread this worker served, cost one write; a stale
// copy costs a failed write and a read.
func (s *Usage) ApplyToThread(ctx context.Context, u *protocol.RunUsage) error {
	key, err := usageKey(u.Tenant, "thread", u.ThreadID)
	if err != nil {
		return err
	}
	if !protocol.ValidToken(u.RunID) {
		return fmt.Errorf("usage: run id %q is not a valid id", u.RunID)
	}
	kv, err := s.store(ctx)
	if err != nil {
		return err
	}
	run := u.Clone()
	run.Recompute()
	cur, rev := s.recall(key)
	if cur == nil {
		cur = &protocol.ThreadUsage{ThreadID: u.ThreadID, Tenant: u.Tenant}
	}
	for attempt := 0; ; attempt++ {
		next := cur.Clone()
		if !next.Apply(u.RunID, run.Total, s.Keep) {
			// The run's entry already holds these totals (entries are
			// only ever replaced by the same derived figures).
			return nil
		}
		next.UpdatedAt = time.Now().UTC()
		newRev, err := putTTL(ctx, s.js, kv, key, next, rev, ttlOf(s.ttl, u.Tenant))
		if err == nil {
			s.remember(key, next, newRev)
			return nil
		}
		if (!errors.Is(err, ErrConflict) && !errors.Is(err, ErrExists)) || attempt >= maxCASAttempts {
			s.forget(key)
			return fmt.Errorf("write usage of thread %s: %w", u.ThreadID, err)
		}
		cur, rev, err = get[protocol.ThreadUsage](ctx, s.js, kv, key)
		if errors.Is(err, ErrNotFound) {
			cur, rev = &protocol.ThreadUsage{ThreadID: u.ThreadID, Tenant: u.Tenant}, 0
		} else if err != nil {
			s.forget(key)
			return err
		}
	}
}

// threadCacheSize bounds the thread records a process remembers (two
// generations of half each).
const threadCacheSize = 512

type cachedThread struct {
	doc *protocol.ThreadUsage
	rev uint64
}

// recall returns the thread record this process wrote last, or nil.
func (s *Usage) recall(key string) (*protocol.ThreadUsage, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.cur[key]
	if !ok {
		c, ok = s.old[key]
	}
	if !ok {
		return nil, 0
	}
	return c.doc, c.rev
}

func (s *Usage) remember(key string, doc *protocol.ThreadUsage, rev uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, there := s.cur[key]; !there && len(s.cur) >= threadCacheSize/2 {
		s.old, s.cur = s.cur, nil
	}
	if s.cur == nil {
		s.cur = make(map[string]cachedThread)
	}
	s.cur[key] = cachedThread{doc: doc, rev: rev}
	delete(s.old, key)
}

func (s *Usage) forget(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.cur, key)
	delete(s.old, key)
}

// RunOf is a run's usage as readers see it (protocol v2): the figures its
// terminal record holds; for a run that ended before v2 without them, its
// usage bucket entry; else zero totals, final once the run ended.
func (s *Usage) RunOf(ctx context.Context, rec *protocol.Run) (*protocol.RunUsage, error) {
	if rec.Usage != nil {
		return rec.Usage, nil
	}
	if rec.Status.Terminal() {
		u, _, err := s.Run(ctx, rec.Tenant, rec.RunID)
		if err == nil {
			return u, nil
		}
		if !errors.Is(err, ErrNotFound) {
			return nil, err
		}
	}
	return &protocol.RunUsage{RunID: rec.RunID, ThreadID: rec.ThreadID, Tenant: rec.Tenant, Final: rec.Status.Terminal()}, nil
}

// ThreadOf is a thread's usage as readers see it (protocol v2): the
// totals its record keeps, plus what the usage bucket holds for its runs
// that ended before v2 (none for a thread created since).
func (s *Usage) ThreadOf(ctx context.Context, th *protocol.Thread) (*protocol.ThreadUsage, error) {
	legacy, _, err := s.Thread(ctx, th.Tenant, th.ThreadID)
	if errors.Is(err, ErrNotFound) {
		legacy, err = nil, nil
	}
	if err != nil {
		return nil, err
	}
	if u := legacy.Merge(th.Usage); u != nil {
		return u, nil
	}
	return &protocol.ThreadUsage{ThreadID: th.ThreadID, Tenant: th.Tenant}, nil
}
