package bus_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
)

// startSmall runs a server whose JetStream file store holds maxStore bytes.
func startSmall(t testing.TB, maxStore int64) jetstream.JetStream {
	t.Helper()
	s, err := server.NewServer(&server.Options{JetStream: true, StoreDir: t.TempDir(), JetStreamMaxStore: maxStore,
		Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	t.Cleanup(s.Shutdown)
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// fill publishes to stream's subject until the server refuses, and returns
// the refusal.
func fill(t *testing.T, ctx context.Context, js jetstream.JetStream, subject string) error {
	t.Helper()
	payload := make([]byte, 32<<10)
	for range 10000 {
		if _, err := js.Publish(ctx, subject, payload); err != nil {
			return err
		}
	}
	t.Fatal("the store never filled")
	return nil
}

// A server whose file store is full refuses every stream and bucket with
// 10023 (insufficient resources); once a stream is purged it takes writes
// again.
func TestIsStoreFullServerLimit(t *testing.T) {
	js := startSmall(t, 2<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	filler, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "FILL", Subjects: []string{"fill"}})
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "b"})
	if err != nil {
		t.Fatal(err)
	}
	err = fill(t, ctx, js, "fill")
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != 10023 {
		t.Fatalf("full server answered %v, want API error 10023", err)
	}
	if store, ok := bus.IsStoreFull(err); !ok || store != "" {
		t.Fatalf("IsStoreFull(%v) = %q, %v; want \"\", true", err, store, ok)
	}
	_, err = kv.Put(ctx, "k", []byte("v"))
	marked := bus.MarkStoreFull(kv.Bucket(), err)
	if store, ok := bus.IsStoreFull(marked); !ok || store != "b" || !errors.Is(marked, bus.ErrStoreFull) {
		t.Fatalf("a KV put on the full server: %v (store %q, full %v)", marked, store, ok)
	}
	if err := filler.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := kv.Put(ctx, "k", []byte("v"))
		if err == nil {
			break
		}
		if _, ok := bus.IsStoreFull(err); !ok || time.Now().After(deadline) {
			t.Fatalf("put after the purge: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A stream or bucket with discard new at its max bytes refuses with 10077
// "maximum bytes exceeded"; other refusals (a message over the stream's
// max message size, a compare-and-set that lost) are not a full store.
func TestIsStoreFullStreamLimit(t *testing.T) {
	js := startSmall(t, 64<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s"}, MaxBytes: 256 << 10,
		Discard: jetstream.DiscardNew, MaxMsgSize: 40 << 10}); err != nil {
		t.Fatal(err)
	}
	err := fill(t, ctx, js, "s")
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != 10077 {
		t.Fatalf("full stream answered %v, want API error 10077", err)
	}
	if _, ok := bus.IsStoreFull(err); !ok {
		t.Fatalf("IsStoreFull(%v) = false", err)
	}
	_, err = js.Publish(ctx, "s", make([]byte, 50<<10))
	if err == nil {
		t.Fatal("a message over max_msg_size was stored")
	}
	if _, ok := bus.IsStoreFull(err); ok {
		t.Fatalf("a message over the size limit counted as a full store: %v", err)
	}

	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "small", MaxBytes: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	rev, err := kv.Put(ctx, "a", []byte("1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Update(ctx, "a", []byte("2"), rev+10); err == nil || bus.MarkStoreFull("small", err) != err {
		t.Fatalf("a lost compare-and-set: %v, marked as a full store", err)
	}
	var full error
	for i := range 1000 {
		if _, err := kv.Put(ctx, "k"+string(rune('a'+i%26))+string(rune('a'+i/26)), make([]byte, 4<<10)); err != nil {
			full = err
			break
		}
	}
	if store, ok := bus.IsStoreFull(bus.MarkStoreFull("small", full)); !ok || store != "small" {
		t.Fatalf("a full bucket answered %v (store %q, full %v)", full, store, ok)
	}
}
