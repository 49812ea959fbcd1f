package memory

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/store"
)

// Notes and facts are store items under ["memories", <user>]: what the
// store API shows and edits is what the middleware reads.
func TestMemoryIsStoreItems(t *testing.T) {
	e := newEnv(t, Config{})
	ctx := context.Background()
	items, err := store.Open(ctx, e.js, store.Config{Names: e.settings.Names})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.AppendNote(ctx, "acme", "alice", "Lives in Lyon"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.MergeFacts(ctx, "acme", "alice", []Fact{{Content: "Has a cat", Category: "personal", Confidence: 0.9}}, MergeOptions{}); err != nil {
		t.Fatal(err)
	}
	notes, _, err := items.Get(ctx, "acme", []string{"memories", "alice"}, "notes")
	if err != nil || notes.Value["content"] != "- Lives in Lyon" {
		t.Fatalf("notes item: %+v %v", notes, err)
	}
	facts, _, err := items.Get(ctx, "acme", []string{"memories", "alice"}, "facts")
	if err != nil || !strings.Contains(mustJSON(t, facts.Value), "Has a cat") {
		t.Fatalf("facts item: %+v %v", facts, err)
	}
	// An edit through the store is what the middleware reads next.
	if _, err := items.Put(ctx, "acme", []string{"memories", "alice"}, "notes", map[string]any{"content": "- Moved to Paris"}, store.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, err := e.store.Notes(ctx, "acme", "alice"); err != nil || got != "- Moved to Paris" {
		t.Fatalf("notes after an edit: %q %v", got, err)
	}
	if _, err := e.store.AppendNote(ctx, "acme", "alice", "Likes jazz"); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.store.Notes(ctx, "acme", "alice"); got != "- Moved to Paris\n- Likes jazz" {
		t.Fatalf("notes after an append: %q", got)
	}
}

// Notes and facts written before the store (memory bucket keys) are read
// until the first write moves them into the store and removes the key.
func TestLegacyMemoryIsReadThenMoved(t *testing.T) {
	e := newEnv(t, Config{})
	ctx := context.Background()
	memKV, err := e.js.KeyValue(ctx, e.settings.Names.MemoryBucket())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := memKV.Put(ctx, "acme.bob.notes", []byte("- Old note")); err != nil {
		t.Fatal(err)
	}
	if _, err := memKV.Put(ctx, "acme.bob.facts", []byte(`{"facts":[{"content":"Old fact","category":"personal","confidence":0.8}]}`)); err != nil {
		t.Fatal(err)
	}
	if got, err := e.store.Notes(ctx, "acme", "bob"); err != nil || got != "- Old note" {
		t.Fatalf("legacy notes: %q %v", got, err)
	}
	if got, err := e.store.Facts(ctx, "acme", "bob"); err != nil || len(got) != 1 || got[0].Content != "Old fact" {
		t.Fatalf("legacy facts: %v %v", got, err)
	}
	if _, err := e.store.AppendNote(ctx, "acme", "bob", "New note"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.MergeFacts(ctx, "acme", "bob", []Fact{{Content: "New fact", Category: "personal", Confidence: 0.9}}, MergeOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.store.Notes(ctx, "acme", "bob"); got != "- Old note\n- New note" {
		t.Fatalf("moved notes: %q", got)
	}
	if got, _ := e.store.Facts(ctx, "acme", "bob"); len(got) != 2 {
		t.Fatalf("moved facts: %v", got)
	}
	for _, k := range []string{"acme.bob.notes", "acme.bob.facts"} {
		if _, err := memKV.Get(ctx, k); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatalf("legacy key %s after the move: %v", k, err)
		}
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}
