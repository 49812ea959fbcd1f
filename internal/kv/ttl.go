package kv

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
)

// TTLs are the key TTLs of a tenant's records that expire by themselves
// (the configuration's retention): a finished run's record, written with
// its final status, and usage totals, on every write. Zero keeps the key.
// The buckets must allow key TTLs (bus.Provision does).
type TTLs struct {
	Runs  func(tenant string) time.Duration
	Usage func(tenant string) time.Duration
}

// SetTTLs makes the stores write keys with t's TTLs from now on.
func (s *Stores) SetTTLs(t TTLs) {
	s.Runs.ttl = t.Runs
	s.Usage.ttl = t.Usage
}

func ttlOf(f func(string) time.Duration, tenant string) time.Duration {
	if f == nil {
		return 0
	}
	return f(tenant)
}

// putTTL is put with a TTL on the written revision (ttl 0: none).
func putTTL(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, key string, v any, rev uint64, ttl time.Duration) (uint64, error) {
	data, err := encode(v)
	if err != nil {
		return 0, err
	}
	var n uint64
	if rev == 0 {
		n, err = createKey(ctx, js, kv, key, data, ttl)
	} else {
		n, err = writeKey(ctx, js, kv, key, data, rev, ttl)
	}
	switch {
	case err == nil:
		return n, nil
	case rev == 0 && errors.Is(err, jetstream.ErrKeyExists):
		return 0, ErrExists
	case rev > 0 && errors.Is(err, jetstream.ErrKeyRevisionMismatch):
		return 0, ErrConflict
	}
	return 0, bus.MarkStoreFull(kv.Bucket(), err)
}
