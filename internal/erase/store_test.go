package erase_test

import (
	"context"
	"errors"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/erase"
	"github.com/natsagent/natsagent/internal/store"
)

// Erasing a user removes their store namespaces (users/<user>,
// memories/<user>: their notes and facts) without a trace in the stream,
// and leaves other users' and shared namespaces.
func TestEraseUserRemovesStoreItems(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	items, err := store.Open(ctx, e.js, store.Config{Names: e.names})
	if err != nil {
		t.Fatal(err)
	}
	put := func(tenant string, ns []string, key string) {
		t.Helper()
		if _, err := items.Put(ctx, tenant, ns, key, map[string]any{"v": key}, store.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	put("acme", []string{"users", "alice", "prefs"}, "theme")
	put("acme", []string{"users", "alice"}, "profile")
	put("acme", []string{"users", "bob"}, "profile")
	put("acme", []string{"team"}, "shared")
	put("globex", []string{"users", "alice"}, "profile")
	if _, err := e.mem.AppendNote(ctx, "acme", "alice", "Lives in Lyon"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.eraser.EraseUser(ctx, "acme", "alice", erase.ThreadOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		tenant string
		ns     []string
		key    string
		kept   bool
	}{
		{"acme", []string{"users", "alice", "prefs"}, "theme", false},
		{"acme", []string{"users", "alice"}, "profile", false},
		{"acme", []string{"memories", "alice"}, "notes", false},
		{"acme", []string{"users", "bob"}, "profile", true},
		{"acme", []string{"team"}, "shared", true},
		{"globex", []string{"users", "alice"}, "profile", true},
	} {
		_, _, err := items.Get(ctx, c.tenant, c.ns, c.key)
		if c.kept && err != nil {
			t.Errorf("%s %v %s: %v, want kept", c.tenant, c.ns, c.key, err)
		}
		if !c.kept && !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s %v %s: %v, want erased", c.tenant, c.ns, c.key, err)
		}
	}
	st, err := e.js.Stream(ctx, "KV_"+e.names.StoreBucket())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range store.UserPrefixes {
		subj, _ := store.Subject(e.names, "acme", []string{p, "alice"})
		if m, err := st.GetLastMsgForSubject(ctx, subj); !errors.Is(err, jetstream.ErrMsgNotFound) {
			t.Errorf("a message (a marker?) is left on %s: %v %v", subj, m, err)
		}
	}
	// The same read finds what was kept, so its silence above means
	// something.
	bob, _ := store.Subject(e.names, "acme", []string{"users", "bob"})
	if _, err := st.GetLastMsgForSubject(ctx, bob); err != nil {
		t.Fatalf("bob's items through %s: %v", bob, err)
	}
	if notes, err := e.mem.Notes(ctx, "acme", "alice"); err != nil || notes != "" {
		t.Fatalf("alice's notes: %q %v", notes, err)
	}
}
