package erase_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/erase"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/protocol"
)

// TestEraseUserTakesTheirAssistants: erasing a user removes every version
// of the assistants they created, leaving no message of them; others'
// stay.
func TestEraseUserTakesTheirAssistants(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	store, err := kv.OpenAssistants(ctx, e.js, e.names)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	mk := func(tenant, id, owner string) {
		a := &protocol.Assistant{AssistantID: id, GraphID: "chatbot", Name: "SECRET-" + id, Tenant: tenant, Owner: owner, CreatedAt: now, UpdatedAt: now}
		if err := store.Create(ctx, a); err != nil {
			t.Fatal(err)
		}
		cur, rev, err := store.Get(ctx, tenant, id)
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Update(ctx, cur, rev); err != nil {
			t.Fatal(err)
		}
	}
	mk("acme", "a1", "alice")
	mk("acme", "b1", "bob")
	mk("globex", "a2", "alice")
	if _, err := e.eraser.EraseUser(ctx, "acme", "alice", erase.ThreadOptions{}); err != nil {
		t.Fatal(err)
	}
	st, err := e.js.Stream(ctx, "KV_"+e.names.AssistantsBucket())
	if err != nil {
		t.Fatal(err)
	}
	var subjects []string
	for seq := uint64(1); ; {
		m, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(">"))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		seq = m.Sequence + 1
		subjects = append(subjects, strings.TrimPrefix(m.Subject, "$KV."+e.names.AssistantsBucket()+"."))
	}
	// bob's and globex's assistants: versions 1 and 2 and the current
	// record (history 1 keeps the last write of each key).
	if got := strings.Join(subjects, ","); got != "acme.b1.v.1,acme.b1.v.2,acme.b1,globex.a2.v.1,globex.a2.v.2,globex.a2" {
		t.Fatalf("left in the bucket: %s", got)
	}
	if _, _, err := store.Get(ctx, "acme", "a1"); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("alice's assistant: %v", err)
	}
}
