// Package kv owns the typed stores natsagent keeps in JetStream KV: run
// records, thread records (with the lease and the checkpoint head), and
// checkpoint deltas. Every write that can race is a compare-and-set on the
// key's revision; nothing here reads and then blindly puts.
package kv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/protocol"
)

// Errors callers test with errors.Is.
var (
	ErrNotFound = errors.New("not found")
	ErrExists   = errors.New("already exists")
	// ErrConflict means the key changed since it was read (CAS failed).
	ErrConflict = errors.New("changed concurrently")
)

// Stores groups the typed stores of one deployment.
type Stores struct {
	Runs        *Runs
	Threads     *Threads
	Checkpoints *Checkpoints
	Usage       *Usage
}

// Open binds the stores to their buckets, which must exist (bus.Provision).
func Open(ctx context.Context, js jetstream.JetStream, names bus.Names) (*Stores, error) {
	runs, err := js.KeyValue(ctx, names.RunsBucket())
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", names.RunsBucket(), err)
	}
	threads, err := js.KeyValue(ctx, names.ThreadsBucket())
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", names.ThreadsBucket(), err)
	}
	cps, err := js.KeyValue(ctx, names.CheckpointsBucket())
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", names.CheckpointsBucket(), err)
	}
	return &Stores{
		Runs:        &Runs{kv: runs, js: js, bucket: names.RunsBucket()},
		Threads:     &Threads{kv: threads, js: js, bucket: names.ThreadsBucket()},
		Checkpoints: &Checkpoints{kv: cps, js: js, bucket: names.CheckpointsBucket()},
		Usage:       NewUsage(js, names),
	}, nil
}

// opTimeout bounds one request to a bucket. nats.go applies its own
// timeout only to a context without a deadline; under a run's context
// (deadline: the run timeout, an hour by default) a request lost with a
// node that went down, or sent during a leader election, would wait for
// an answer that never comes. Bounded, it fails, and the caller's retry
// or the redelivery of the run takes over.
const opTimeout = 5 * time.Second

// bound returns ctx limited to opTimeout.
func bound(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, opTimeout)
}

// get reads and decodes one key.
func get[T any](ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, key string) (*T, uint64, error) {
	data, rev, err := readKey(ctx, js, kv, key)
	if err != nil {
		return nil, 0, err
	}
	v := new(T)
	if err := decodeExact(data, v); err != nil {
		return nil, 0, fmt.Errorf("decode %s: %w", key, err)
	}
	return v, rev, nil
}

// getLatest reads and decodes one key through its bucket's stream leader.
// A direct get (what kv.Get does) may be answered by a follower that has
// not applied the latest write yet (bus.GetMsgFromLeader).
func getLatest[T any](ctx context.Context, js jetstream.JetStream, bucket, key string) (*T, uint64, error) {
	v, rev, err := readLatest[T](ctx, js, bucket, key)
	if err != nil {
		return nil, 0, err
	}
	return v, rev, nil
}

// readLatest is getLatest, but a delete or purge marker answers
// ErrNotFound with the marker's revision (0 when the key has no message).
func readLatest[T any](ctx context.Context, js jetstream.JetStream, bucket, key string) (*T, uint64, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	m, err := bus.GetMsgFromLeader(ctx, js, "KV_"+bucket, bus.MsgQuery{LastBySubject: "$KV." + bucket + "." + key})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, 0, ErrNotFound
	}
	if err != nil {
		return nil, 0, err
	}
	switch m.Header.Get("KV-Operation") {
	case "DEL", "PURGE":
		return nil, m.Sequence, ErrNotFound
	}
	v := new(T)
	if err := decodeExact(m.Data, v); err != nil {
		return nil, 0, fmt.Errorf("decode %s: %w", key, err)
	}
	return v, m.Sequence, nil
}

// settleWait bounds how long getAfter waits for the write that refused a
// create or compare-and-set to be stored. A variable for tests.
var settleWait = 2 * time.Second

// getAfter reads a key through its bucket's stream leader once the leader
// holds a revision above after: the read that follows a Create refused
// with ErrExists (after = 0) or an Update at revision after refused with
// ErrConflict. A replicated bucket refuses a write while another write of
// the same key is still being replicated, before the leader has stored it
// (error 10164), so reading at once could miss the very write that
// refused ours. If the leader holds nothing newer after settleWait (the
// other write failed), what it holds is returned. A delete or purge
// marker above after is newer: the key was removed since, and the read
// answers ErrNotFound at once.
//
// Only a refused write says a write is in flight: a plain read of a key
// that may be missing (a deleted run, a thread not created yet) asks the
// leader once (getLatest, the stores' GetFromLeader), or every such miss
// costs settleWait.
func getAfter[T any](ctx context.Context, js jetstream.JetStream, bucket, key string, after uint64) (*T, uint64, error) {
	deadline := time.Now().Add(settleWait)
	pause := 2 * time.Millisecond
	for {
		v, rev, err := readLatest[T](ctx, js, bucket, key)
		if rev > after || (err != nil && !errors.Is(err, ErrNotFound)) || time.Now().After(deadline) {
			if err != nil {
				return nil, 0, err // a marker's revision is no record's
			}
			return v, rev, nil
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, 0, ctx.Err()
		case <-t.C:
		}
		pause = min(2*pause, 100*time.Millisecond)
	}
}

// encode writes a record as JSON. Run and thread records, written
// several times a run, are encoded by hand into the same bytes
// encoding/json writes (protocol.AppendRunJSON); anything else by
// encoding/json. The buffer starts at the size the last record of its
// kind took, so a record costs one allocation instead of a guess and
// its growths (a thread's release, with last_run, is well over 1 KiB);
// the kinds are those whose sizes differ by far: a run record with or
// without its answer and usage, a thread record with or without last_run.
func encode(v any) ([]byte, error) {
	switch v := v.(type) {
	case *protocol.Run:
		hint := &pendingRunSize
		if v.Output != nil || v.Usage != nil {
			hint = &endedRunSize // a finished run's answer and usage
		}
		return encodeSized(hint, v, protocol.AppendRunJSON)
	case *protocol.Thread:
		hint := &threadSize
		if v.LastRun != nil {
			hint = &endedThreadSize // with the last run's summary
		}
		return encodeSized(hint, v, protocol.AppendThreadJSON)
	}
	return json.Marshal(v)
}

// recordSize remembers the size of the last record of one kind encoded.
type recordSize struct{ last atomic.Int64 }

var pendingRunSize, endedRunSize, threadSize, endedThreadSize recordSize

// Records of a kind vary by a few bytes from write to write (ids,
// times, counts): the slack keeps the next one within its buffer. A
// record over maxRecordHint (a large answer) is not taken as the next
// one's size.
const (
	minRecordHint = 512
	recordSlack   = 128
	maxRecordHint = 16 << 10
)

func encodeSized[T any](h *recordSize, v T, appendJSON func([]byte, T) ([]byte, error)) ([]byte, error) {
	b, err := appendJSON(make([]byte, 0, max(minRecordHint, int(h.last.Load())+recordSlack)), v)
	if err == nil && len(b) <= maxRecordHint {
		h.last.Store(int64(len(b)))
	}
	return b, err
}

// timeEntry encodes an index entry whose one field is a time ({"at":…}),
// head being its opening up to the colon, as encoding/json encodes the
// entry's struct: nil for a time encoding/json refuses.
func timeEntry(head string, t time.Time) []byte {
	b := append(make([]byte, 0, len(head)+len(`"2006-01-02T15:04:05.999999999-07:00"}`)), head...)
	b, ok := protocol.AppendTimeJSON(b, t)
	if !ok {
		return nil
	}
	return append(b, '}')
}

// put creates (rev 0) or compare-and-sets (rev > 0) one key.
func put(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, key string, v any, rev uint64) (uint64, error) {
	return putTTL(ctx, js, kv, key, v, rev, 0)
}

// List reads the values of a bucket whose keys match filter, decoded as T
// (a value that does not decode is skipped and reported to sk, nil
// reports nothing), and returns those keep accepts (nil keeps all): list
// for another package's bucket.
func List[T any](ctx context.Context, kv jetstream.KeyValue, filter string, keep func(*T) bool, sk *Skips) ([]*T, error) {
	return list(ctx, kv, filter, nil, keep, sk)
}

// list reads the values of a bucket whose keys match filter, decoded as T
// (decodeExact, then check unless nil; a value that does not decode or
// fails the check is skipped and reported to sk), and returns those keep
// accepts (nil keeps all). It reads them through a watch, so it serves
// listings and sweeps, not hot paths.
func list[T any](ctx context.Context, kv jetstream.KeyValue, filter string, check func(*T) error, keep func(*T) bool, sk *Skips) ([]*T, error) {
	w, err := kv.Watch(ctx, filter, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	var out []*T
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e := <-w.Updates():
			if e == nil {
				return out, nil
			}
			var v T
			err := decodeExact(e.Value(), &v)
			if err == nil && check != nil {
				err = check(&v)
			}
			if err != nil {
				sk.skip(e.Key(), err)
				continue
			}
			if keep == nil || keep(&v) {
				out = append(out, &v)
			}
		}
	}
}

// decodeExact decodes JSON keeping numbers in free-form fields (metadata)
// as json.Number, so a record rewritten by a worker keeps large integers
// exact.
func decodeExact(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	return dec.Decode(v)
}
