package store

import (
	"container/list"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/protocol"
)

// index is a process's bounded copy of the tenants' items it searches.
// A tenant is read from the bucket (its keys only) at its first search or
// namespace listing, kept current by one watch of the bucket from then on,
// and dropped, least recently used first, when the tenants held pass the
// memory budget. A tenant larger than the whole budget is not held: its
// searches read the bucket, as a store without an index does.
//
// One watch serves every tenant: it starts at the bucket's revision when
// the index starts and delivers every writer's puts and TTL expiries
// (purge markers); entries of tenants not held are dropped before they
// are decoded. Delete and PurgePrefix remove with a stream purge, which
// leaves nothing a watch would see, and say so on core NATS (the removal
// notice: which keys, up to which revision). Before answering, a search
// waits until the watch applied every write the bucket had when the
// search arrived, so a client reads its own writes.
//
// A core NATS message can be missed (the index's connection down when it
// was sent, a slow consumer's dropped messages, a route between servers
// down), so a removal is also written to the bucket, after the purge, as
// a removal mark: the key <tenant>./removed (no item's key: EncodeLabel
// never writes a '/'), its value the notice's id, not its filter (a
// user's erasure must not leave the user's name in the bucket). The watch
// delivers every mark in order; an index that holds or loads the tenant
// and did not receive the notice of that id drops the tenant, which its
// next search reads from the bucket again, after the purge. A notice
// usually arrives before its mark; when it does not, the tenant is
// dropped once for nothing. And a search that waits for the watch to
// reach the bucket's end waits for the mark of every removal before it,
// so a removal by another process is seen by the searches that follow
// it, as a write is.
//
// A tenant loaded while the watch runs: the load registers the tenant at
// the watch's revision W, then reads the bucket, which holds every write
// up to W and maybe some after. Until the read ends, the watch queues the
// tenant's changes (all after W) and the notices queue their purges; then
// the read is merged with them, a change applying only over an older
// revision of its key, a purge removing only what it was at or below.
// Vectors are held unpacked, four bytes a dimension.
type index struct {
	log    *zap.Logger
	stream jetstream.Stream
	st     *Store
	budget int64

	mu      sync.Mutex
	changed *sync.Cond
	tenants map[string]*tenantIndex // held or loading
	lru     list.List               // held tenants, most recently used first
	bytes   int64                   // the held tenants' sizes, summed
	seq     uint64                  // the last bucket revision applied
	// removed holds, for the key filters a notice removed, the bucket's
	// last revision at the notice: a put under one at or below it, still
	// on its way through the watch, is stale.
	removed []tombstone
	// oversized holds the tenants found larger than the budget, until
	// when they are searched from the bucket without trying to load them.
	oversized map[string]time.Time
	stats     IndexStats
	err       error
	// notices is the subscription to the removal notices.
	notices *nats.Subscription
	// noticed holds the ids of the notices received whose mark the
	// watch has not delivered yet, noticedOrder the same ids oldest first,
	// to bound them (a purger that stopped between its notice and its
	// mark leaves an id no mark will take).
	noticed      map[string]struct{}
	noticedOrder []string
	// hook, set by tests, is called as a tenant loads ("registered"
	// before its read of the bucket, "read" after it, before the merge,
	// with the tenant), as the watch delivers an entry ("apply", with
	// its key), as a notice arrives ("notice", with its filter) and as a
	// removal mark without its notice drops a tenant ("missed", with the
	// tenant, under ix.mu).
	hook atomic.Pointer[func(stage, name string)]
}

// tenantIndex is one tenant's items in the index.
type tenantIndex struct {
	name    string
	entries map[string]*entry // bucket key -> entry
	bytes   int64
	// pins counts the searches between loading (or finding) the tenant
	// and copying what they read: eviction passes over a pinned tenant.
	pins int
	elem *list.Element // in index.lru; nil while loading
	// load is set while the tenant is read from the bucket.
	load *loadState
	// dropped: evicted or found oversized; a pin holder reads the bucket.
	dropped bool
}

// loadState is what arrived for a tenant while it was read.
type loadState struct {
	changes []change
	purges  []tombstone
	// missed: the mark of a removal whose notice did not arrive came
	// while the tenant was read; the read may hold what it removed.
	missed bool
}

// change is a put (ent set) or a removal (ent nil) of a key at a
// revision, from the watch.
type change struct {
	key string
	rev uint64
	ent *entry
}

type entry struct {
	item *Item
	rev  uint64
	vecs [][]float32
	size int64
}

type tombstone struct {
	filter string // a bucket key or a key filter ending in ">"
	seq    uint64
}

// removal is the notice of a stream purge of the bucket. ID names its
// removal mark (empty from a version that writes none).
type removal struct {
	Filter string `json:"filter"`
	Seq    uint64 `json:"seq"`
	ID     string `json:"id,omitempty"`
}

// removedToken is the last token of a tenant's removal mark.
const removedToken = "/removed"

// maxNoticed bounds the notice ids an index remembers.
const maxNoticed = 4096

// removalMark returns the tenant whose removal mark key is.
func removalMark(key string) (tenant string, ok bool) {
	tenant, rest, _ := strings.Cut(key, ".")
	return tenant, rest == removedToken
}

// IndexStats describes the index for metrics.
type IndexStats struct {
	// Bytes estimates the memory the held tenants' items take (their
	// values decoded, their vectors unpacked); Budget bounds it.
	Bytes, Budget int64
	// Tenants are the tenants held.
	Tenants int
	// Loads counts tenants read into the index, Evictions tenants dropped
	// to stay within the budget, Oversized tenants found larger than the
	// whole budget, BucketSearches searches and listings of such tenants,
	// answered from the bucket.
	Loads, Evictions, Oversized, BucketSearches uint64
	// MissedRemovals counts tenants dropped (or read again) because a
	// removal's mark came without its notice.
	MissedRemovals uint64
}

// IndexOptions configure Index. Zero values take defaults.
type IndexOptions struct {
	Log *zap.Logger
	// MemoryBytes bounds the memory the index holds (default
	// DefaultIndexMemory), estimated from the items' sizes.
	MemoryBytes int64
}

// DefaultIndexMemory is the default memory budget of an index: 256 MiB,
// about 37,000 items with 1536-dimension vectors.
const DefaultIndexMemory = 256 << 20

// oversizedRetry is how long a tenant found larger than the budget is
// searched from the bucket before a search tries to load it again (it may
// have shrunk); maxOversized bounds how many such tenants are remembered.
const (
	oversizedRetry = 10 * time.Minute
	maxOversized   = 1024
)

// removedSubject is where a process says it purged keys of the bucket.
func (s *Store) removedSubject() string { return s.cfg.Names.Prefix + ".ctl.store.removed" }

// Index makes the store answer Search and ListNamespaces from memory
// instead of reading the bucket each time (the gateway does; a worker's
// memory store does not need it). It follows the bucket until ctx ends.
func (s *Store) Index(ctx context.Context, opts IndexOptions) error {
	if opts.Log == nil {
		opts.Log = zap.NewNop()
	}
	if opts.MemoryBytes <= 0 {
		opts.MemoryBytes = DefaultIndexMemory
	}
	infoCtx, cancel := context.WithTimeout(ctx, opTimeout)
	info, err := s.stream.Info(infoCtx)
	cancel()
	if err != nil {
		return err
	}
	// No tenant is held yet: the watch starts after what the bucket holds,
	// a load reads that.
	start := info.State.LastSeq
	ix := &index{log: opts.Log, stream: s.stream, st: s, budget: opts.MemoryBytes, seq: start,
		tenants: map[string]*tenantIndex{}, oversized: map[string]time.Time{}, noticed: map[string]struct{}{}}
	ix.stats.Budget = opts.MemoryBytes
	ix.changed = sync.NewCond(&ix.mu)
	nc := s.js.Conn()
	// Only the deployment's services can publish here: tenant accounts
	// neither export nor import <prefix>.ctl.store.removed (a tenant's
	// exports are <prefix>.ctl.<T>.*.*.cancel and .delete, of other
	// lengths), and the service account's users are the gateway and the
	// workers (deploy/nats/tenants.conf, internal/natsjwt). A notice is
	// still checked: its filter must name one tenant's keys, so a wrong
	// one can never hide another tenant's (or every tenant's) writes.
	sub, err := nc.Subscribe(s.removedSubject(), func(m *nats.Msg) {
		var r removal
		if json.Unmarshal(m.Data, &r) != nil || !validRemovalFilter(r.Filter) {
			opts.Log.Warn("store index: removal notice refused", zap.ByteString("notice", m.Data[:min(len(m.Data), 512)]))
			return
		}
		ix.remove(r)
	})
	if err != nil {
		return err
	}
	w, err := s.kv.WatchAll(ctx, jetstream.ResumeFromRevision(start+1))
	if err != nil {
		_ = sub.Unsubscribe()
		return err
	}
	go func() {
		ix.follow(w)
		_ = sub.Unsubscribe()
	}()
	ix.notices = sub
	s.ix = ix
	return nil
}

// IndexStats reports the index's figures; zero without an index.
func (s *Store) IndexStats() IndexStats {
	if s.ix == nil {
		return IndexStats{}
	}
	s.ix.mu.Lock()
	defer s.ix.mu.Unlock()
	st := s.ix.stats
	st.Bytes, st.Tenants = s.ix.bytes, s.ix.lru.Len()
	return st
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

// apply takes one entry of the watch: a put, or a removal (a delete or
// purge marker, a TTL expiry). Only the entries of tenants held or
// loading are decoded.
func (ix *index) apply(e jetstream.KeyValueEntry) {
	key, rev := e.Key(), e.Revision()
	ix.called("apply", key)
	put := e.Operation() == jetstream.KeyValuePut
	if tenant, ok := removalMark(key); ok {
		ix.mark(tenant, string(e.Value()), put, rev)
		return
	}
	tenant, _, _ := strings.Cut(key, ".")
	var ent *entry
	decoded := !put
	for {
		ix.mu.Lock()
		if ix.tenants[tenant] == nil || decoded {
			break
		}
		// Decoded outside the lock; a tenant that started loading
		// meanwhile is seen at the next look.
		ix.mu.Unlock()
		var err error
		if ent, err = newEntry(e.Value(), rev); err != nil {
			ix.log.Warn("store index: undecodable item", zap.String("key", key), zap.Error(err))
		}
		decoded = true
	}
	defer ix.mu.Unlock()
	if t := ix.tenants[tenant]; t != nil && !(put && ent != nil && ix.stale(key, rev)) {
		c := change{key: key, rev: rev, ent: ent}
		if t.load != nil {
			t.load.changes = append(t.load.changes, c)
		} else {
			ix.change(t, c)
			ix.fit(t)
		}
	}
	ix.passed(rev)
}

// passed moves the watch's position to rev, with ix.mu held.
func (ix *index) passed(rev uint64) {
	if rev > ix.seq {
		ix.seq = rev
		ix.removed = slices.DeleteFunc(ix.removed, func(t tombstone) bool { return t.seq <= rev })
	}
	ix.changed.Broadcast()
}

// mark takes a tenant's removal mark from the watch: the notice of id
// arrived, or the tenant, held or loading, may hold what the removal
// took, and is dropped (a load is read again).
func (ix *index) mark(tenant, id string, put bool, rev uint64) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	defer ix.passed(rev)
	if !put {
		return // the mark's own removal (a purge of the whole tenant)
	}
	if _, ok := ix.noticed[id]; ok {
		delete(ix.noticed, id)
		return
	}
	t := ix.tenants[tenant]
	if t == nil {
		return
	}
	ix.stats.MissedRemovals++
	ix.called("missed", tenant) // with ix.mu held
	ix.log.Info("store index: a removal's notice did not arrive; the tenant is read again from the bucket", zap.String("tenant", tenant))
	if t.load != nil {
		t.load.missed = true
		return
	}
	ix.drop(t)
}

// noticedID remembers the id of a notice received, with ix.mu held.
func (ix *index) noticedID(id string) {
	if _, ok := ix.noticed[id]; ok || id == "" {
		return
	}
	ix.noticed[id] = struct{}{}
	ix.noticedOrder = append(ix.noticedOrder, id)
	if len(ix.noticedOrder) > maxNoticed {
		delete(ix.noticed, ix.noticedOrder[0])
		ix.noticedOrder = slices.Delete(ix.noticedOrder, 0, 1)
	}
}

func (ix *index) called(stage, name string) {
	if fn := ix.hook.Load(); fn != nil {
		(*fn)(stage, name)
	}
}

// stale reports whether a put at rev under key was removed by a purge
// the watch has not passed yet.
func (ix *index) stale(key string, rev uint64) bool {
	for _, t := range ix.removed {
		if rev <= t.seq && keyMatches(key, t.filter) {
			return true
		}
	}
	return false
}

// change applies c to a held tenant, unless the tenant holds a newer
// revision of the key (read by its load after c was written).
func (ix *index) change(t *tenantIndex, c change) {
	cur := t.entries[c.key]
	if cur != nil {
		if cur.rev >= c.rev {
			return
		}
		delete(t.entries, c.key)
		t.bytes -= cur.size
		ix.bytes -= cur.size
	}
	if c.ent != nil {
		t.entries[c.key] = c.ent
		t.bytes += c.ent.size
		ix.bytes += c.ent.size
	}
}

// purgeHeld removes a held tenant's entries under a purged filter, those
// at or below the purge's revision (what came after it stays).
func (ix *index) purgeHeld(t *tenantIndex, p tombstone) {
	for k, e := range t.entries {
		if e.rev <= p.seq && keyMatches(k, p.filter) {
			delete(t.entries, k)
			t.bytes -= e.size
			ix.bytes -= e.size
		}
	}
}

// remove takes a removal notice.
func (ix *index) remove(r removal) {
	tenant, _, _ := strings.Cut(r.Filter, ".")
	p := tombstone{filter: r.Filter, seq: r.Seq}
	ix.called("notice", r.Filter)
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.noticedID(r.ID)
	if r.Seq > ix.seq {
		ix.removed = append(ix.removed, p)
	}
	if t := ix.tenants[tenant]; t != nil {
		if t.load != nil {
			t.load.purges = append(t.load.purges, p)
		} else {
			ix.purgeHeld(t, p)
		}
	}
	ix.changed.Broadcast()
}

// validRemovalFilter reports whether f is what purge sends: one
// tenant's key (<tenant>.<label>...<key>) or key filter (ending in ".>"),
// its tokens labels as EncodeLabel writes them, no other wildcard.
func validRemovalFilter(f string) bool {
	tokens := strings.Split(f, ".")
	if len(tokens) < 2 || len(tokens) > MaxDepth+2 || !protocol.ValidToken(tokens[0]) {
		return false
	}
	for i, t := range tokens[1:] {
		if t == ">" && i == len(tokens)-2 {
			continue
		}
		if _, err := DecodeLabel(t); err != nil {
			return false
		}
	}
	return true
}

// keyMatches reports whether a bucket key is filter or under it (a
// filter ending in ".>").
func keyMatches(key, filter string) bool {
	if head, ok := strings.CutSuffix(filter, ">"); ok {
		return strings.HasPrefix(key, head)
	}
	return key == filter
}

// fit keeps the index within its budget after t grew or was loaded: t
// alone over the budget is dropped (its searches read the bucket), else
// the least recently used tenants nobody is reading are evicted.
func (ix *index) fit(t *tenantIndex) {
	if t != nil && t.bytes > ix.budget {
		ix.drop(t)
		ix.markOversized(t.name, t.bytes)
	}
	for e := ix.lru.Back(); e != nil && ix.bytes > ix.budget; {
		prev := e.Prev()
		if v := e.Value.(*tenantIndex); v.pins == 0 {
			ix.drop(v)
			ix.stats.Evictions++
			ix.log.Debug("store index: tenant evicted", zap.String("tenant", v.name), zap.Int64("bytes", v.bytes))
		}
		e = prev
	}
}

// drop removes a held tenant from the index.
func (ix *index) drop(t *tenantIndex) {
	delete(ix.tenants, t.name)
	if t.elem != nil {
		ix.lru.Remove(t.elem)
		t.elem = nil
	}
	ix.bytes -= t.bytes
	t.dropped = true
}

// markOversized remembers that a tenant is larger than the budget, and
// says so once.
func (ix *index) markOversized(tenant string, bytes int64) {
	now := time.Now()
	if until, ok := ix.oversized[tenant]; ok && now.Before(until) {
		return
	}
	if len(ix.oversized) >= maxOversized {
		for k, until := range ix.oversized {
			if !now.Before(until) || len(ix.oversized) >= maxOversized {
				delete(ix.oversized, k)
			}
		}
	}
	ix.oversized[tenant] = now.Add(oversizedRetry)
	ix.stats.Oversized++
	ix.log.Warn("store index: a tenant's items are larger than the index's memory budget; its searches read the bucket (slower); raise store.index_memory_bytes to hold it",
		zap.String("tenant", tenant), zap.Int64("bytes_at_least", bytes), zap.Int64("budget", ix.budget))
}

// read returns tenant's entries under the key filter f (ok), after the
// index caught up with the bucket; not ok when the tenant is larger than
// the budget: the caller reads the bucket.
func (ix *index) read(ctx context.Context, tenant, f string) (out []keyed, ok bool, err error) {
	t, err := ix.acquire(ctx, tenant)
	if err != nil || t == nil {
		if err == nil {
			ix.mu.Lock()
			ix.stats.BucketSearches++
			ix.mu.Unlock()
		}
		return nil, false, err
	}
	err = ix.catchUp(ctx)
	ix.mu.Lock()
	defer ix.mu.Unlock()
	t.pins--
	defer ix.fit(nil)
	if err != nil {
		return nil, false, err
	}
	if t.dropped {
		// It grew past the budget while this search waited.
		ix.stats.BucketSearches++
		return nil, false, nil
	}
	// Copied so the search ranks and filters without holding the lock.
	out = make([]keyed, 0, len(t.entries))
	for k, e := range t.entries {
		if keyMatches(k, f) {
			out = append(out, keyed{key: k, entry: e})
		}
	}
	return out, true, nil
}

type keyed struct {
	key string
	*entry
}

// acquire returns tenant held and pinned, loading it first when it is
// not; nil when it is larger than the budget.
func (ix *index) acquire(ctx context.Context, tenant string) (*tenantIndex, error) {
	stop := context.AfterFunc(ctx, func() {
		ix.mu.Lock()
		ix.changed.Broadcast()
		ix.mu.Unlock()
	})
	defer stop()
	ix.mu.Lock()
	for {
		t := ix.tenants[tenant]
		switch {
		case ix.err != nil:
			ix.mu.Unlock()
			return nil, ix.err
		case ctx.Err() != nil:
			ix.mu.Unlock()
			return nil, ctx.Err()
		case t != nil && t.load != nil:
			ix.changed.Wait() // another search loads it
			continue
		case t != nil:
			t.pins++
			ix.lru.MoveToFront(t.elem)
			ix.mu.Unlock()
			return t, nil
		}
		if until, ok := ix.oversized[tenant]; ok {
			if time.Now().Before(until) {
				ix.mu.Unlock()
				return nil, nil
			}
			delete(ix.oversized, tenant)
		}
		t = &tenantIndex{name: tenant, load: &loadState{}}
		ix.tenants[tenant] = t
		ix.mu.Unlock()
		t, err := ix.load(ctx, t)
		if !errors.Is(err, errReadAgain) {
			return t, err
		}
		ix.mu.Lock()
	}
}

// errReadAgain is load's answer when a removal it did not hear of came
// while it read the bucket: the tenant is read again.
var errReadAgain = errors.New("store: a removal came while the tenant was read")

// load reads a registered tenant from the bucket and merges what the
// watch and the notices queued meanwhile.
func (ix *index) load(ctx context.Context, t *tenantIndex) (*tenantIndex, error) {
	ix.called("registered", t.name)
	entries, size, err := ix.st.readTenant(ctx, t.name, ix.budget)
	ix.called("read", t.name)
	ix.mu.Lock()
	defer ix.mu.Unlock()
	defer ix.changed.Broadcast()
	if err != nil || entries == nil || t.load.missed {
		delete(ix.tenants, t.name)
		switch {
		case err != nil:
			return nil, err
		case entries == nil:
			ix.markOversized(t.name, size)
			return nil, nil
		}
		return nil, errReadAgain
	}
	t.entries, t.bytes = entries, size
	ix.bytes += size
	for _, c := range t.load.changes {
		ix.change(t, c)
	}
	for _, p := range t.load.purges {
		ix.purgeHeld(t, p)
	}
	t.load = nil
	t.elem = ix.lru.PushFront(t)
	t.pins++
	ix.stats.Loads++
	ix.fit(t)
	if t.dropped {
		return nil, nil
	}
	return t, nil
}

// readTenant reads every item of tenant from the bucket; nil entries
// (and no error) when they take more than budget bytes, then size is
// what was read before it stopped.
func (s *Store) readTenant(ctx context.Context, tenant string, budget int64) (map[string]*entry, int64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	entries := map[string]*entry{}
	var size int64
	err := s.each(ctx, tenant+".>", func(e jetstream.KeyValueEntry) {
		if size > budget {
			return
		}
		ent, err := newEntry(e.Value(), e.Revision())
		if err != nil {
			return
		}
		entries[e.Key()] = ent
		if size += ent.size; size > budget {
			cancel()
		}
	})
	if size > budget {
		return nil, size, nil
	}
	if err != nil {
		return nil, 0, err
	}
	return entries, size, nil
}

// entryOverhead estimates what an entry takes beyond its JSON and its
// vectors: the decoded Item, its value's maps and strings, the map slot.
const entryOverhead = 512

// newEntry decodes an item as the index holds it, its vectors unpacked.
func newEntry(data []byte, rev uint64) (*entry, error) {
	it, err := decodeItem(data)
	if err != nil {
		return nil, err
	}
	ent := &entry{item: it, rev: rev}
	packed := 0
	for _, v := range it.Vectors {
		ent.vecs = append(ent.vecs, unpack(v.V))
		packed += len(v.V)
	}
	it.Vectors = nil
	// The JSON but its vectors (base64, 4 characters per 3 bytes), twice
	// over for the decoded maps, plus the unpacked vectors.
	rest := max(len(data)-(packed*4+2)/3, 0)
	ent.size = int64(entryOverhead + 2*rest + packed)
	return ent, nil
}

// catchUpWait bounds how long a search waits for the index; catchUpPoll
// is how long it waits for the watch before it asks the server whether
// what it waits for still exists.
const (
	catchUpWait = 3 * time.Second
	catchUpPoll = 100 * time.Millisecond
)

// errBehind is a search's answer when the index did not catch up in time.
var errBehind = errors.New("store: the index is behind the bucket; try again")

// catchUp waits until the index holds every write the bucket held now.
//
// The target is the bucket's last sequence, but the message there, and
// any between the watch's position and it, may be gone: purged (Delete,
// PurgePrefix, an erasure) or removed by a limit before the server pushed
// it to the watch. The watch never delivers such a message, so waiting
// for the target alone would wait until the next write. When the watch is
// not there within catchUpPoll, the search asks the stream's leader for
// the first message after the watch's position; none, or one past the
// target, means the index already holds everything the bucket had at the
// target. That is sound because the watch delivers the bucket in sequence
// order: every message at or below its position that existed when the
// server pushed it was applied, and a message above it that no longer
// exists is not one the search has to see (its purge is concurrent with
// the search, or before it; this process's purges reached the index
// before they returned, another's arrive by their notice, as always).
// The index's position is not moved: a purged put may still be in the
// watch's buffer, and the tombstones that drop it live until the watch
// passes them.
func (ix *index) catchUp(ctx context.Context) error {
	infoCtx, cancel := context.WithTimeout(ctx, opTimeout)
	info, err := ix.stream.Info(infoCtx)
	cancel()
	if err != nil {
		return err
	}
	target := info.State.LastSeq
	deadline := time.Now().Add(catchUpWait)
	for {
		until := time.Now().Add(catchUpPoll)
		if until.After(deadline) {
			until = deadline
		}
		seq, err := ix.waitSeq(ctx, target, until)
		switch {
		case err != nil:
			return err
		case seq >= target:
			return nil
		case !time.Now().Before(deadline):
			return errBehind
		}
		next, err := ix.st.nextSeq(ctx, seq+1)
		if err != nil {
			return err
		}
		if next == 0 || next > target {
			return nil
		}
	}
}

// waitSeq waits until the watch applied want, the index failed, ctx ended
// or until passed, and returns the watch's position.
func (ix *index) waitSeq(ctx context.Context, want uint64, until time.Time) (uint64, error) {
	wake := func() {
		ix.mu.Lock()
		ix.changed.Broadcast()
		ix.mu.Unlock()
	}
	stop := context.AfterFunc(ctx, wake)
	defer stop()
	timer := time.AfterFunc(time.Until(until), wake)
	defer timer.Stop()
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for ix.seq < want && ix.err == nil && ctx.Err() == nil && time.Now().Before(until) {
		ix.changed.Wait()
	}
	switch {
	case ix.err != nil:
		return 0, ix.err
	case ctx.Err() != nil:
		return 0, ctx.Err()
	}
	return ix.seq, nil
}

// nextSeq returns the sequence of the bucket's first message at or after
// seq, 0 when there is none. It asks the stream's leader (STREAM.MSG.GET):
// the direct get the jetstream package would use for a bucket may be
// answered by a replica that has not applied the latest writes yet, and
// a "none" from it would let a search miss a write.
func (s *Store) nextSeq(ctx context.Context, seq uint64) (uint64, error) {
	m, err := bus.GetMsgFromLeader(ctx, s.js, "KV_"+s.bucket, bus.MsgQuery{Seq: seq, NextBySubject: "$KV." + s.bucket + ".>"})
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("store: look for the bucket's next message: %w", err)
	}
	return m.Sequence, nil
}

// purge removes the keys under filter f with a stream purge, which
// leaves no marker, and says so to every index.
//
// The purge is bounded by the bucket's last sequence read just before
// it: it removes what f held up to that sequence and keeps a put that
// lands after the read (a write concurrent with the purge, ordered after
// it). So the notice's sequence says exactly which puts were removed: an
// index drops those at or below it and keeps those above. (Reading the
// sequence after an unbounded purge took a put landing in between for a
// removed one and hid it until the item was written again.)
func (s *Store) purge(ctx context.Context, f string) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	info, err := s.stream.Info(ctx)
	if err != nil {
		return err
	}
	last := info.State.LastSeq
	if s.ix != nil {
		s.ix.called("purge", f)
	}
	if err := s.stream.Purge(ctx, jetstream.WithPurgeSubject("$KV."+s.bucket+"."+f), jetstream.WithPurgeSequence(last+1)); err != nil {
		return err
	}
	r := removal{Filter: f, Seq: last, ID: nuid.Next()}
	if s.ix != nil {
		s.ix.remove(r)
	}
	data, _ := json.Marshal(r)
	if err := s.js.Conn().Publish(s.removedSubject(), data); err != nil {
		return err
	}
	// After the notice, so that it usually arrives first (see index).
	tenant, _, _ := strings.Cut(f, ".")
	_, err = s.kv.Put(ctx, tenant+"."+removedToken, []byte(r.ID))
	return bus.MarkStoreFull(s.bucket, err)
}
