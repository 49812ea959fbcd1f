package kv

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/protocol"
)

// The metadata index: for each top-level metadata field of a thread whose
// value is a scalar (a string of at most MaxIndexedMetadataBytes, a
// number, a boolean), one more key in the threads bucket,
// "<tenant>.<thread>.meta.<pair>.<owner>", <pair> the first 16 bytes of
// the SHA-256 of the field and the value's JSON in hex (a bounded key
// whatever the field and value; <owner> as in the creation index). Only
// a thread's creation and a metadata patch change metadata, never a run:
// the keys are written with the record that sets the pair, before it,
// and purged after the record that drops or changes it (or after a write
// of it that was refused: unmarkRefused), so, as for the
// status index, the index may name a thread its record no longer has the
// pair on (readers confirm with the record) but never misses one, but
// for threads written before the index existed (ReindexStatus adds them
// once per tenant).

// metaToken is the key token of the metadata index.
const metaToken = "meta"

// MaxIndexedMetadataBytes bounds the string values and field names the
// metadata index holds; a filter on a longer one reads the records.
const MaxIndexedMetadataBytes = 256

// MetadataPair returns the index token of field = value, and false when
// the pair is not indexed (a value that is not a scalar, or too long).
func MetadataPair(field string, value any) (string, bool) {
	if len(field) > MaxIndexedMetadataBytes {
		return "", false
	}
	switch v := value.(type) {
	case string:
		if len(v) > MaxIndexedMetadataBytes {
			return "", false
		}
	case bool, float64, float32, int, int64, int32, uint, uint64, uint32, json.Number:
	default:
		return "", false
	}
	data, err := json.Marshal(value)
	if err != nil {
		return "", false
	}
	// Numbers as JSON reads them back (2 and 2.0 are one value).
	var canon any
	if json.Unmarshal(data, &canon) != nil {
		return "", false
	}
	data, _ = json.Marshal(canon)
	sum := sha256.Sum256(append(append([]byte(field), 0), data...))
	return hex.EncodeToString(sum[:16]), true
}

// MetadataKey is the metadata index key of a thread's pair token.
func MetadataKey(tenant, thread, pair, owner string) string {
	return bus.Key(tenant, thread, metaToken, pair, OwnerToken(owner))
}

// metadataKeys returns the metadata index keys of t.
func metadataKeys(t *protocol.Thread) map[string]bool {
	out := map[string]bool{}
	for f, v := range t.Metadata {
		if pair, ok := MetadataPair(f, v); ok {
			out[MetadataKey(t.Tenant, t.ThreadID, pair, t.Owner)] = true
		}
	}
	return out
}

// sameIndexedMetadata reports, cheaply (most writes are a run's, which
// leave metadata as it was), whether prev and t have the same owner and
// the same scalar metadata.
func sameIndexedMetadata(prev, t *protocol.Thread) bool {
	if prev.Owner != t.Owner || len(prev.Metadata) != len(t.Metadata) {
		return false
	}
	for f, v := range t.Metadata {
		pv, ok := prev.Metadata[f]
		if !ok {
			return false
		}
		if _, indexed := MetadataPair(f, v); !indexed {
			if _, was := MetadataPair(f, pv); was {
				return false
			}
			continue
		}
		if pv != v {
			return false
		}
	}
	return true
}

// markMetadata writes the metadata index keys t has and prev (nil: none)
// had not.
func (s *Threads) markMetadata(ctx context.Context, prev, t *protocol.Thread) error {
	if len(t.Metadata) == 0 || (prev != nil && sameIndexedMetadata(prev, t)) {
		return nil
	}
	had := map[string]bool{}
	if prev != nil {
		had = metadataKeys(prev)
	}
	// All keys at once, then every ack: one round trip however many
	// fields.
	var acks []jetstream.PubAckFuture
	for k := range metadataKeys(t) {
		if had[k] {
			continue
		}
		a, err := s.js.PublishAsync("$KV."+s.bucket+"."+k, []byte(`{}`))
		if err != nil {
			return fmt.Errorf("index thread %s metadata: %w", t.ThreadID, err)
		}
		acks = append(acks, a)
	}
	bctx, cancel := bound(ctx)
	defer cancel()
	for _, a := range acks {
		select {
		case <-a.Ok():
		case err := <-a.Err():
			return fmt.Errorf("index thread %s metadata: %w", t.ThreadID, bus.MarkStoreFull(s.bucket, err))
		case <-bctx.Done():
			return fmt.Errorf("index thread %s metadata: %w", t.ThreadID, bctx.Err())
		}
	}
	return nil
}

// unmarkMetadata purges the metadata index keys prev had and t (the
// record written after it) has not.
func (s *Threads) unmarkMetadata(ctx context.Context, prev, t *protocol.Thread) {
	if prev == nil || len(prev.Metadata) == 0 || sameIndexedMetadata(prev, t) {
		return
	}
	has := metadataKeys(t)
	for k := range metadataKeys(prev) {
		if !has[k] {
			_ = s.purgeKey(ctx, k)
		}
	}
}

// WithMetadata lists the ids of tenant's threads the metadata index names
// with field = value whose owner is one of owners (nil: every owner): a
// superset of those whose record has it. It reports false when the pair
// is not indexed.
func (s *Threads) WithMetadata(ctx context.Context, tenant, field string, value any, owners []string) ([]string, bool, error) {
	pair, ok := MetadataPair(field, value)
	if !ok {
		return nil, false, nil
	}
	ids, err := s.listIndex(ctx, tenant, []string{metaToken, pair}, owners)
	return ids, true, err
}

// CountMetadata counts, from the server's subject totals (no listing,
// no record), the metadata index keys of field = value of tenant's
// threads whose owner is one of owners (nil: every owner). It reports
// false when the pair is not indexed.
func (s *Threads) CountMetadata(ctx context.Context, tenant, field string, value any, owners []string) (int, bool, error) {
	pair, ok := MetadataPair(field, value)
	if !ok || !protocol.ValidToken(tenant) {
		return 0, ok, nil
	}
	total := 0
	for _, tok := range ownerTokens(owners) {
		n, err := s.countSubjects(ctx, "$KV."+s.bucket+"."+bus.Key(tenant, "*", metaToken, pair, tok))
		if err != nil {
			return 0, false, err
		}
		total += n
	}
	return total, true, nil
}
