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

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
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
		Checkpoints: &Checkpoints{kv: cps},
		Usage:       NewUsage(js, names),
	}, nil
}

// get reads and decodes one key.
func get[T any](ctx context.Context, kv jetstream.KeyValue, key string) (*T, uint64, error) {
	e, err := kv.Get(ctx, key)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, 0, ErrNotFound
		}
		return nil, 0, err
	}
	v := new(T)
	if err := decodeExact(e.Value(), v); err != nil {
		return nil, 0, fmt.Errorf("decode %s: %w", key, err)
	}
	return v, e.Revision(), nil
}

// put creates (rev 0) or compare-and-sets (rev > 0) one key.
func put(ctx context.Context, kv jetstream.KeyValue, key string, v any, rev uint64) (uint64, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return 0, err
	}
	if rev == 0 {
		n, err := kv.Create(ctx, key, data)
		if errors.Is(err, jetstream.ErrKeyExists) {
			return 0, ErrExists
		}
		return n, err
	}
	n, err := kv.Update(ctx, key, data, rev)
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return 0, ErrConflict
	}
	return n, err
}

// decodeExact decodes JSON keeping numbers in free-form fields (metadata)
// as json.Number, so a record rewritten by a worker keeps large integers
// exact.
func decodeExact(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	return dec.Decode(v)
}
