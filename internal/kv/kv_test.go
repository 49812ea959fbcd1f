package kv

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
)

func openStores(t *testing.T) *Stores {
	t.Helper()
	srv := natstest.Start(t)
	nc := srv.Connect()
	natstest.Provision(t, nc, bus.Settings{})
	return storesOn(t, nc)
}

// storesOn opens the stores of a provisioned server on nc.
func storesOn(t *testing.T, nc *nats.Conn) *Stores {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(context.Background(), js, bus.DefaultNames())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestRunRecordsAreCompareAndSet(t *testing.T) {
	s := openStores(t)
	ctx := context.Background()
	r := &protocol.Run{RunID: "r1", ThreadID: "t1", Tenant: "default", Status: protocol.StatusPending, CreatedAt: time.Now()}
	rev, err := s.Runs.Create(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Runs.Create(ctx, r); !errors.Is(err, ErrExists) {
		t.Fatalf("second create: %v, want ErrExists", err)
	}
	r.Status = protocol.StatusRunning
	if _, err := s.Runs.Update(ctx, r, rev); err != nil {
		t.Fatal(err)
	}
	r.Status = protocol.StatusSuccess
	if _, err := s.Runs.Update(ctx, r, rev); !errors.Is(err, ErrConflict) {
		t.Fatalf("update at a stale revision: %v, want ErrConflict", err)
	}
	if _, _, err := s.Runs.Get(ctx, "default", "nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get missing: %v", err)
	}
}

// Concurrent Mutate calls never lose an update: each re-reads and
// re-applies on conflict.
func TestMutateUnderContention(t *testing.T) {
	s := openStores(t)
	ctx := context.Background()
	if _, err := s.Runs.Create(ctx, &protocol.Run{RunID: "r1", ThreadID: "t1", Tenant: "default"}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, _, err := s.Runs.Mutate(ctx, "default", "r1", func(r *protocol.Run) error { r.Attempt++; return nil }); err != nil {
				t.Error(err)
			}
		}()
	}
	natstest.Wait(t, &wg, "the concurrent mutations of r1")
	r, _, err := s.Runs.Get(ctx, "default", "r1")
	if err != nil || r.Attempt != 20 {
		t.Fatalf("attempt %d (%v), want 20", r.Attempt, err)
	}
	// A thread Mutate that returns an error writes nothing.
	boom := errors.New("no")
	if _, _, err := s.Threads.Mutate(ctx, "default", "t9", func(*protocol.Thread) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("mutate error %v", err)
	}
	if _, _, err := s.Threads.Get(ctx, "default", "t9"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("an aborted mutate created the thread: %v", err)
	}
}

func msg(id, content string) model.Message {
	return model.Message{ID: id, Role: model.RoleUser, Content: content}
}

// Load follows the chain from the head: deltas of a fenced-out worker or
// of a rolled-back run are never applied, and each delta holds only its
// step's changes.
func TestCheckpointChain(t *testing.T) {
	s := openStores(t)
	ctx := context.Background()
	put := func(d *Delta) int {
		t.Helper()
		n, err := s.Checkpoints.Put(ctx, "default", "t1", d)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	put(&Delta{ID: "e1-1", RunID: "a", Update: state.Update{Messages: []model.Message{msg("m1", "one")}}})
	small := put(&Delta{ID: "e1-2", Parent: "e1-1", RunID: "a", Update: state.Update{Messages: []model.Message{msg("m2", "two")}}})
	// A zombie of epoch 1 keeps writing after epoch 2 took over.
	put(&Delta{ID: "e1-3", Parent: "e1-2", RunID: "a", Update: state.Update{Messages: []model.Message{msg("zombie", "x")}}})
	put(&Delta{ID: "e2-1", Parent: "e1-2", RunID: "a", Update: state.Update{Messages: []model.Message{msg("m3", "three")}, Remove: []string{"m1"}}})

	st, chain, err := s.Checkpoints.Load(ctx, "default", "t1", "e2-1")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range st.Messages {
		ids = append(ids, m.ID)
	}
	if len(ids) != 2 || ids[0] != "m2" || ids[1] != "m3" {
		t.Fatalf("state %v, want [m2 m3]", ids)
	}
	if len(chain) != 3 || chain[0].ID != "e1-1" || chain[2].ID != "e2-1" {
		t.Fatalf("chain %+v", chain)
	}
	// Rolled back to e1-1: later deltas are ignored.
	st, _, err = s.Checkpoints.Load(ctx, "default", "t1", "e1-1")
	if err != nil || len(st.Messages) != 1 {
		t.Fatalf("rollback load: %v %+v", err, st)
	}
	if _, _, err := s.Checkpoints.Load(ctx, "default", "t1", "e9-9"); err == nil {
		t.Fatal("a missing head must be an error")
	}
	if small > 400 {
		t.Fatalf("a one-message delta took %d bytes: a checkpoint must hold only its step", small)
	}
}
