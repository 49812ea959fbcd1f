package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/memory"
	"github.com/natsagent/natsagent/internal/protocol"
)

// sub runs a subcommand (threads delete) with the environment's server
// and prefix after the subcommand's name.
func (e *cliEnv) sub(cmd, sub string, args ...string) result {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return invoke(ctx, append([]string{cmd, sub, "--server", e.srv.URL(), "--prefix", testPrefix}, args...)...)
}

// threads delete, runs delete and users erase do what they say; what they
// deleted is gone from the listings.
func TestDeleteCommands(t *testing.T) {
	e := newCLIEnv(t, scriptModel())
	ctx := context.Background()
	e.cli("run", "--thread", "ta", "--run-id", "ra1", "one").must(t, 0)
	e.cli("run", "--thread", "ta", "--run-id", "ra2", "two").must(t, 0)
	e.cli("run", "--thread", "tb", "--run-id", "rb1", "three").must(t, 0)

	e.sub("runs", "delete", "--thread", "ta", "--run", "ra1").must(t, 0).has(t, "run ra1 deleted")
	r := e.cli("runs", "--thread", "ta").must(t, 0)
	if strings.Contains(r.out, "ra1") || !strings.Contains(r.out, "ra2") {
		t.Fatalf("runs after deleting ra1:\n%s", r.out)
	}
	e.sub("runs", "delete", "--thread", "ta", "--run", "ra1").must(t, 1).says(t, "not found")
	e.sub("runs", "delete", "--thread", "ta", "--run", "r.1").must(t, 1)

	e.sub("threads", "delete", "ta", "--json").must(t, 0).has(t, `"deleted": true`)
	r = e.cli("threads").must(t, 0)
	if strings.Contains(r.out, "ta") || !strings.Contains(r.out, "tb") {
		t.Fatalf("threads after deleting ta:\n%s", r.out)
	}
	e.sub("threads", "delete", "ta").must(t, 1).says(t, "not found")
	e.sub("threads", "delete", "*").must(t, 1)
	e.sub("threads", "delete").must(t, 2)

	// A user's threads and memory: the thread tb has no owner (submitted
	// by a trusted client), so give two threads owners by hand.
	for _, th := range []*protocol.Thread{{ThreadID: "u1", Tenant: protocol.DefaultTenant, Owner: "alice", Status: protocol.ThreadIdle},
		{ThreadID: "u2", Tenant: protocol.DefaultTenant, Owner: "bob", Status: protocol.ThreadIdle}} {
		if _, err := e.stores.Threads.Put(ctx, th, 0); err != nil {
			t.Fatal(err)
		}
	}
	js, err := jetstream.New(e.srv.Connect())
	if err != nil {
		t.Fatal(err)
	}
	mem, err := memory.Open(ctx, js, memory.Config{Names: e.settings.Names})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mem.AppendNote(ctx, protocol.DefaultTenant, "alice", "likes tea"); err != nil {
		t.Fatal(err)
	}
	e.sub("users", "erase", "--user", "alice").must(t, 0).has(t, "user alice of tenant default erased: 1 threads deleted")
	if _, _, err := e.stores.Threads.Get(ctx, protocol.DefaultTenant, "u1"); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("alice's thread: %v", err)
	}
	if notes, err := mem.Notes(ctx, protocol.DefaultTenant, "alice"); err != nil || notes != "" {
		t.Fatalf("alice's notes: %q %v", notes, err)
	}
	for _, th := range []string{"u2", "tb"} {
		if _, _, err := e.stores.Threads.Get(ctx, protocol.DefaultTenant, th); err != nil {
			t.Fatalf("thread %s: %v", th, err)
		}
	}
	e.sub("users", "erase").must(t, 2)
	e.cli("users").must(t, 2)
}
