package kv

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/protocol"
)

// The stores' own reads and writes (readKey, writeKey, createKey) keep the
// KeyValue API's meaning: a deleted or purged key is not found and may be
// created again, a create of a live key and a stale compare-and-set are
// refused, and an invalid key is refused before anything is sent.
func TestKeyReadsAndWritesKeepTheKeyValueMeaning(t *testing.T) {
	s := openStores(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	th := &protocol.Thread{Tenant: "default", ThreadID: "k1", Status: protocol.ThreadIdle, CreatedAt: time.Now().UTC()}
	key := bus.Key(th.Tenant, th.ThreadID)
	rev, err := put(ctx, s.Threads.js, s.Threads.kv, key, th, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := put(ctx, s.Threads.js, s.Threads.kv, key, th, 0); !errors.Is(err, ErrExists) {
		t.Fatalf("second create: %v, want ErrExists", err)
	}
	if _, err := put(ctx, s.Threads.js, s.Threads.kv, key, th, rev+5); !errors.Is(err, ErrConflict) {
		t.Fatalf("stale compare-and-set: %v, want ErrConflict", err)
	}
	got, gotRev, err := s.Threads.Get(ctx, th.Tenant, th.ThreadID)
	if err != nil || gotRev != rev || got.ThreadID != "k1" {
		t.Fatalf("read %+v at %d (%v), want k1 at %d", got, gotRev, err, rev)
	}
	e, err := s.Threads.kv.Get(ctx, key)
	if err != nil || e.Revision() != gotRev || string(e.Value()) != string(mustEncode(t, th)) {
		t.Fatalf("the KeyValue API reads %v (%v), readKey read revision %d", e, err, gotRev)
	}

	for _, remove := range []func() error{
		func() error { return s.Threads.kv.Delete(ctx, key) },
		func() error { return s.Threads.kv.Purge(ctx, key) },
	} {
		if err := remove(); err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.Threads.Get(ctx, th.Tenant, th.ThreadID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("removed key: %v, want ErrNotFound", err)
		}
		// createKey writes over the marker, as kv.Create does; the
		// one-trip create (CreateNew) refuses it.
		if _, err := writeKey(ctx, s.Threads.js, s.Threads.kv, key, []byte(`{}`), 0, 0); !errors.Is(err, jetstream.ErrKeyExists) {
			t.Fatalf("one-trip create over a marker: %v, want ErrKeyExists", err)
		}
		if _, err := put(ctx, s.Threads.js, s.Threads.kv, key, th, 0); err != nil {
			t.Fatalf("create over a marker: %v", err)
		}
	}
	if _, err := writeKey(ctx, s.Threads.js, s.Threads.kv, "default.*", []byte(`{}`), anyRevision, 0); !errors.Is(err, jetstream.ErrInvalidKey) {
		t.Fatalf("wildcard key: %v, want ErrInvalidKey", err)
	}
	if _, _, err := readKey(ctx, s.Threads.js, s.Threads.kv, "default.>"); !errors.Is(err, jetstream.ErrInvalidKey) {
		t.Fatalf("wildcard read: %v, want ErrInvalidKey", err)
	}
}

func mustEncode(t *testing.T, v any) []byte {
	t.Helper()
	b, err := encode(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
