package kv

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
)

// anyRevision writes a key whatever revision it is at (a plain put).
const anyRevision = ^uint64(0)

// writeKey stores one revision of key in bucket with the same publish the
// KeyValue API makes ("$KV.<bucket>.<key>", Nats-Expected-Last-Subject-
// Sequence, Nats-TTL), through bus.RequestAck, which spares each write a
// context, a timer and a JSON-decoded ack. rev 0 creates (refused with
// ErrKeyExists when the key has any entry, a delete marker included: see
// createKey), rev > 0 compare-and-sets (refused with
// ErrKeyRevisionMismatch), anyRevision puts. ttl > 0 gives the revision a
// TTL.
//
// A JetStream context with its own API prefix (a JetStream imported from
// another account) writes through the KeyValue API, which knows its
// subjects.
func writeKey(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, key string, data []byte, rev uint64, ttl time.Duration) (uint64, error) {
	if !validKey(key) {
		return 0, jetstream.ErrInvalidKey
	}
	if p := js.Options().APIPrefix; p != "" && p != jetstream.DefaultAPIPrefix {
		return writeKeyAPI(ctx, js, kv, key, data, rev, ttl)
	}
	m := &nats.Msg{Subject: "$KV." + kv.Bucket() + "." + key, Data: data}
	if rev != anyRevision || ttl > 0 {
		m.Header = make(nats.Header, 2)
	}
	if rev != anyRevision {
		m.Header[jetstream.ExpectedLastSubjSeqHeader] = []string{strconv.FormatUint(rev, 10)}
	}
	if ttl > 0 {
		m.Header[jetstream.MsgTTLHeader] = []string{ttl.String()}
	}
	ack, err := bus.RequestAck(ctx, js.Conn(), m)
	if err == nil {
		return ack.Sequence, nil
	}
	if wrongLastSeq(err) {
		// As kv.Create and kv.Update say it.
		if rev == 0 {
			return 0, fmt.Errorf("%w: %w", err, jetstream.ErrKeyExists)
		}
		return 0, fmt.Errorf("%w: %w", err, jetstream.ErrKeyRevisionMismatch)
	}
	return 0, err
}

// createKey creates key as kv.Create does: a key whose last entry is a
// delete or purge marker is written over. The write is tried first
// (writeKey); only a refused one asks the KeyValue API, which reads the
// key to see why.
func createKey(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, key string, data []byte, ttl time.Duration) (uint64, error) {
	n, err := writeKey(ctx, js, kv, key, data, 0, ttl)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return writeKeyAPI(ctx, js, kv, key, data, 0, ttl)
	}
	return n, err
}

// writeKeyAPI is writeKey through the KeyValue API, bounded by opTimeout.
func writeKeyAPI(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, key string, data []byte, rev uint64, ttl time.Duration) (uint64, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	switch {
	case rev == anyRevision && ttl <= 0:
		return kv.Put(ctx, key, data)
	case rev == 0 && ttl <= 0:
		return kv.Create(ctx, key, data)
	case rev == 0:
		return kv.Create(ctx, key, data, jetstream.KeyTTL(ttl))
	case ttl <= 0:
		return kv.Update(ctx, key, data, rev)
	}
	// A compare-and-set or a put with a TTL, which the KeyValue API has
	// not: the same publish with the header added.
	opts := []jetstream.PublishOpt{jetstream.WithMsgTTL(ttl)}
	if rev != anyRevision {
		opts = append(opts, jetstream.WithExpectLastSequencePerSubject(rev))
	}
	ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: "$KV." + kv.Bucket() + "." + key, Data: data}, opts...)
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// readKey reads the value and revision of key as kv.Get does (a direct
// get of the key's last message; a delete or purge marker is not found),
// through bus.DirectGetLast, which spares each read a context, a timer and
// a request body. A bucket that does not answer direct gets is read
// through the KeyValue API.
func readKey(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, key string) ([]byte, uint64, error) {
	if !validKey(key) {
		return nil, 0, jetstream.ErrInvalidKey
	}
	bucket := kv.Bucket()
	m, err := bus.DirectGetLast(ctx, js, "KV_"+bucket, "$KV."+bucket+"."+key)
	switch {
	case errors.Is(err, bus.ErrNoDirectGet):
		return readKeyAPI(ctx, kv, key)
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return nil, 0, ErrNotFound
	case err != nil:
		return nil, 0, err
	}
	if op := m.Header.Get("KV-Operation"); op == "DEL" || op == "PURGE" {
		return nil, 0, ErrNotFound
	}
	if op := m.Header.Get(jetstream.MarkerReasonHeader); op == "MaxAge" || op == "Purge" || op == "Remove" {
		return nil, 0, ErrNotFound
	}
	return m.Data, m.Sequence, nil
}

// readKeyAPI is readKey through the KeyValue API, bounded by opTimeout.
func readKeyAPI(ctx context.Context, kv jetstream.KeyValue, key string) ([]byte, uint64, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, ErrNotFound
	}
	if err != nil {
		return nil, 0, err
	}
	return e.Value(), e.Revision(), nil
}

// wrongLastSeq reports a refused create or compare-and-set: the key is not
// at the revision the write expected (10071; 10164 on a replicated
// stream).
func wrongLastSeq(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// validKey is the KeyValue API's key check: letters, digits and -/_=.,
// no empty token.
func validKey(key string) bool {
	if key == "" || key[0] == '.' || key[len(key)-1] == '.' || strings.Contains(key, "..") {
		return false
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '/' || c == '_' || c == '=' || c == '.') {
			return false
		}
	}
	return true
}
