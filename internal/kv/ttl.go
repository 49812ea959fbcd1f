package kv

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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

// putTTL is put with a TTL on the written revision (ttl 0: put). Only a
// create takes a TTL through the KV API; a compare-and-set with one is
// the same publish the API makes, with the Nats-TTL header added.
func putTTL(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, bucket, key string, v any, rev uint64, ttl time.Duration) (uint64, error) {
	if ttl <= 0 {
		return put(ctx, kv, key, v, rev)
	}
	data, err := encode(v)
	if err != nil {
		return 0, err
	}
	ctx, cancel := bound(ctx)
	defer cancel()
	if rev == 0 {
		n, err := kv.Create(ctx, key, data, jetstream.KeyTTL(ttl))
		if errors.Is(err, jetstream.ErrKeyExists) {
			return 0, ErrExists
		}
		return n, err
	}
	ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: "$KV." + bucket + "." + key, Data: data},
		jetstream.WithExpectLastSequencePerSubject(rev), jetstream.WithMsgTTL(ttl))
	if err != nil {
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == 10164) {
			return 0, ErrConflict
		}
		return 0, err
	}
	return ack.Sequence, nil
}
