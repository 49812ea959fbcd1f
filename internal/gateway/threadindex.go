package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/protocol"
)

// threadIndex is the gateway's index of thread records for search and
// count, fed by a watch of the threads bucket: every writer (the
// gateway, workers, deletion, erasure, retention) changes it by changing
// the bucket, so it needs no second write to keep consistent. A search
// reads the records of its tenant from memory, not from the bucket.
// Before answering, it waits until the index holds every write the
// bucket had when the request arrived, so a client reads its own writes.
type threadIndex struct {
	log    *zap.Logger
	stream jetstream.Stream

	mu       sync.Mutex
	changed  *sync.Cond
	byTenant map[string]map[string]*protocol.Thread
	seq      uint64 // the last bucket revision applied
	// erased holds, for a thread erased by a stream purge, the bucket's
	// last revision at the notice: a put of the thread at or below it,
	// still on its way through the watch, is stale.
	erased map[string]uint64
	err    error // the watch failed: searches answer 503
}

func newThreadIndex(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, kv jetstream.KeyValue, names bus.Names, log *zap.Logger) (*threadIndex, error) {
	bucket := names.ThreadsBucket()
	st, err := js.Stream(ctx, "KV_"+bucket)
	if err != nil {
		return nil, err
	}
	ix := &threadIndex{log: log, stream: st, byTenant: map[string]map[string]*protocol.Thread{}, erased: map[string]uint64{}}
	ix.changed = sync.NewCond(&ix.mu)
	// Erasure removes a record with a stream purge, which a watch does not
	// see; the eraser says so on core NATS (bus.Names.ThreadErasedSubject).
	prefix := names.Prefix + ".ctl."
	if _, err := nc.Subscribe(names.ThreadErasedSubjects(), func(m *nats.Msg) {
		tenant, thread, ok := strings.Cut(strings.TrimSuffix(strings.TrimPrefix(m.Subject, prefix), ".erased"), ".")
		if ok {
			ix.erase(tenant, thread)
		}
	}); err != nil {
		return nil, err
	}
	// Every key: the run index keys too, so the revision followed is the
	// bucket's last (what catchUp waits for).
	w, err := kv.WatchAll(context.Background())
	if err != nil {
		return nil, err
	}
	go ix.follow(w)
	return ix, nil
}

func (ix *threadIndex) follow(w jetstream.KeyWatcher) {
	for e := range w.Updates() {
		if e == nil {
			continue // the end of the initial values
		}
		ix.apply(e)
	}
	ix.mu.Lock()
	ix.err = errors.New("the thread index stopped following the threads bucket")
	ix.changed.Broadcast()
	ix.mu.Unlock()
}

func (ix *threadIndex) apply(e jetstream.KeyValueEntry) {
	key := e.Key()
	tenant, thread, ok := strings.Cut(key, ".")
	isRecord := ok && !strings.Contains(thread, ".")
	var th *protocol.Thread
	if isRecord && e.Operation() == jetstream.KeyValuePut {
		var t protocol.Thread
		if err := decodeRecord(e.Value(), &t); err != nil {
			ix.log.Warn("thread index: undecodable record", zap.String("key", key), zap.Error(err))
		} else {
			t.Lease, t.Preempt, t.RecentRuns = trimLease(t.Lease), nil, nil
			th = &t
		}
	}
	ix.mu.Lock()
	if at, ok := ix.erased[key]; ok {
		if e.Revision() <= at {
			th = nil // stale: the thread was erased after this write
		} else {
			delete(ix.erased, key)
		}
	}
	if isRecord {
		m := ix.byTenant[tenant]
		switch {
		case th != nil:
			if m == nil {
				m = map[string]*protocol.Thread{}
				ix.byTenant[tenant] = m
			}
			m[thread] = th
		case m != nil:
			delete(m, thread)
			if len(m) == 0 {
				delete(ix.byTenant, tenant)
			}
		}
	}
	if r := e.Revision(); r > ix.seq {
		ix.seq = r
	}
	ix.changed.Broadcast()
	ix.mu.Unlock()
}

// erase drops a thread erased by a stream purge.
func (ix *threadIndex) erase(tenant, thread string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	info, err := ix.stream.Info(ctx)
	cancel()
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if err == nil && info.State.LastSeq > ix.seq {
		ix.erased[bus.Key(tenant, thread)] = info.State.LastSeq
	}
	if m := ix.byTenant[tenant]; m != nil {
		delete(m, thread)
		if len(m) == 0 {
			delete(ix.byTenant, tenant)
		}
	}
	ix.changed.Broadcast()
}

// trimLease keeps what the view shows of a lease: the run holding the
// thread.
func trimLease(l *protocol.Lease) *protocol.Lease {
	if l == nil {
		return nil
	}
	return &protocol.Lease{RunID: l.RunID}
}

// catchUpWait bounds how long a search waits for the index to hold the
// bucket's writes; after it, the search answers from what it holds.
const catchUpWait = 3 * time.Second

// catchUp waits until the index holds every write the bucket held when
// it was called.
func (ix *threadIndex) catchUp(ctx context.Context) error {
	info, err := ix.stream.Info(ctx)
	if err != nil {
		return err
	}
	last := info.State.LastSeq
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
	for ix.seq < last && ix.err == nil && ctx.Err() == nil && time.Now().Before(deadline) {
		ix.changed.Wait()
	}
	if ix.err != nil {
		return ix.err
	}
	return ctx.Err()
}

// each calls fn with every thread record of tenant, under the index's
// lock: fn must not block, and must not keep the record.
func (ix *threadIndex) each(tenant string, fn func(*protocol.Thread)) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for _, th := range ix.byTenant[tenant] {
		fn(th)
	}
}

// get returns a tenant's thread by id from the index.
func (ix *threadIndex) get(tenant, id string) *protocol.Thread {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return ix.byTenant[tenant][id]
}

// decodeRecord decodes a record keeping numbers in metadata exact.
func decodeRecord(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	return dec.Decode(v)
}
