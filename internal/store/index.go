package store

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
)

// index is a process's copy of the store bucket for search and namespace
// listing, fed by a watch of the bucket (every writer's puts, TTL
// expiries as purge markers) and by the removal notices Delete and
// PurgePrefix publish on core NATS (a stream purge leaves nothing a watch
// would see). Before answering, a search waits until the index holds
// every write the bucket had when it arrived, so a client reads its own
// writes. Vectors are held unpacked, four bytes a dimension.
type index struct {
	log    *zap.Logger
	stream jetstream.Stream

	mu      sync.Mutex
	changed *sync.Cond
	tenants map[string]map[string]*entry // tenant -> bucket key -> entry
	seq     uint64                       // the last bucket revision applied
	// removed holds, for the key filters a notice removed, the bucket's
	// last revision at the notice: a put under one at or below it, still
	// on its way through the watch, is stale.
	removed []tombstone
	err     error
}

type entry struct {
	item *Item
	rev  uint64
	vecs [][]float32
}

type tombstone struct {
	filter string // a bucket key or a key filter ending in ">"
	seq    uint64
}

// removal is the notice of a stream purge of the bucket.
type removal struct {
	Filter string `json:"filter"`
	Seq    uint64 `json:"seq"`
}

// removedSubject is where a process says it purged keys of the bucket.
func (s *Store) removedSubject() string { return s.cfg.Names.Prefix + ".ctl.store.removed" }

// Index makes the store answer Search and ListNamespaces from memory
// instead of reading the bucket each time (the gateway does; a worker's
// memory store does not need it). It follows the bucket until ctx ends.
func (s *Store) Index(ctx context.Context, log *zap.Logger) error {
	if log == nil {
		log = zap.NewNop()
	}
	ix := &index{log: log, stream: s.stream, tenants: map[string]map[string]*entry{}}
	ix.changed = sync.NewCond(&ix.mu)
	nc := s.js.Conn()
	sub, err := nc.Subscribe(s.removedSubject(), func(m *nats.Msg) {
		var r removal
		if json.Unmarshal(m.Data, &r) == nil && r.Filter != "" {
			ix.remove(r)
		}
	})
	if err != nil {
		return err
	}
	w, err := s.kv.WatchAll(ctx)
	if err != nil {
		_ = sub.Unsubscribe()
		return err
	}
	go func() {
		ix.follow(w)
		_ = sub.Unsubscribe()
	}()
	s.ix = ix
	return nil
}

func (ix *index) follow(w jetstream.KeyWatcher) {
	for e := range w.Updates() {
		if e != nil {
			ix.apply(e)
		}
	}
	ix.mu.Lock()
	ix.err = errors.New("store: the index stopped following the store bucket")
	ix.changed.Broadcast()
	ix.mu.Unlock()
}

func (ix *index) apply(e jetstream.KeyValueEntry) {
	key := e.Key()
	tenant, _, _ := strings.Cut(key, ".")
	var ent *entry
	if e.Operation() == jetstream.KeyValuePut {
		it, err := decodeItem(e.Value())
		if err != nil {
			ix.log.Warn("store index: undecodable item", zap.String("key", key), zap.Error(err))
		} else {
			ent = &entry{item: it, rev: e.Revision()}
			for _, v := range it.Vectors {
				ent.vecs = append(ent.vecs, unpack(v.V))
			}
			it.Vectors = nil
		}
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if ent != nil {
		for _, t := range ix.removed {
			if ent.rev <= t.seq && keyMatches(key, t.filter) {
				ent = nil
				break
			}
		}
	}
	m := ix.tenants[tenant]
	switch {
	case ent != nil:
		if m == nil {
			m = map[string]*entry{}
			ix.tenants[tenant] = m
		}
		m[key] = ent
	case m != nil:
		delete(m, key)
	}
	if r := e.Revision(); r > ix.seq {
		ix.seq = r
		ix.removed = slices.DeleteFunc(ix.removed, func(t tombstone) bool { return t.seq <= r })
	}
	ix.changed.Broadcast()
}

// remove drops the entries under a purged filter.
func (ix *index) remove(r removal) {
	tenant, _, _ := strings.Cut(r.Filter, ".")
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if r.Seq > ix.seq {
		ix.removed = append(ix.removed, tombstone{filter: r.Filter, seq: r.Seq})
	}
	for k := range ix.tenants[tenant] {
		if keyMatches(k, r.Filter) {
			delete(ix.tenants[tenant], k)
		}
	}
	ix.changed.Broadcast()
}

// keyMatches reports whether a bucket key is filter or under it (a
// filter ending in ".>").
func keyMatches(key, filter string) bool {
	if head, ok := strings.CutSuffix(filter, ">"); ok {
		return strings.HasPrefix(key, head)
	}
	return key == filter
}

// catchUpWait bounds how long a search waits for the index.
const catchUpWait = 3 * time.Second

// catchUp waits until the index holds every write the bucket held now.
func (ix *index) catchUp(ctx context.Context) error {
	infoCtx, cancel := context.WithTimeout(ctx, opTimeout)
	info, err := ix.stream.Info(infoCtx)
	cancel()
	if err != nil {
		return err
	}
	target := info.State.LastSeq
	deadline := time.Now().Add(catchUpWait)
	stop := context.AfterFunc(ctx, func() {
		ix.mu.Lock()
		ix.changed.Broadcast()
		ix.mu.Unlock()
	})
	defer stop()
	timer := time.AfterFunc(catchUpWait, func() {
		ix.mu.Lock()
		ix.changed.Broadcast()
		ix.mu.Unlock()
	})
	defer timer.Stop()
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for ix.seq < target && ix.err == nil && ctx.Err() == nil && time.Now().Before(deadline) {
		ix.changed.Wait()
	}
	switch {
	case ix.err != nil:
		return ix.err
	case ctx.Err() != nil:
		return ctx.Err()
	case ix.seq < target:
		return errors.New("store: the index is behind the bucket; try again")
	}
	return nil
}

// each calls fn, under the index's lock, with every entry of tenant
// under the key filter f.
func (ix *index) each(tenant, f string, fn func(key string, e *entry)) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for k, e := range ix.tenants[tenant] {
		if keyMatches(k, f) {
			fn(k, e)
		}
	}
}

// purge removes the keys under filter f with a stream purge, which
// leaves no marker, and says so to every index.
func (s *Store) purge(ctx context.Context, f string) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if err := s.stream.Purge(ctx, jetstream.WithPurgeSubject("$KV."+s.bucket+"."+f)); err != nil {
		return err
	}
	info, err := s.stream.Info(ctx)
	if err != nil {
		return err
	}
	r := removal{Filter: f, Seq: info.State.LastSeq}
	if s.ix != nil {
		s.ix.remove(r)
	}
	data, _ := json.Marshal(r)
	return s.js.Conn().Publish(s.removedSubject(), data)
}
