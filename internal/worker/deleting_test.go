package worker

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/protocol"
)

// A request published straight to the runs stream for a thread being
// deleted (internal/erase) is dropped: the worker writes no record and
// takes no lease, so nothing of the thread comes back; a run of another
// thread goes on.
func TestRequestOnDeletingThreadIsDropped(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	now := time.Now().UTC()
	th := &protocol.Thread{ThreadID: "gone", Tenant: protocol.DefaultTenant, CreatedAt: now, UpdatedAt: now, Status: protocol.ThreadDeleting, Epoch: 3}
	if _, err := h.stores.Threads.Put(ctx, th, 0); err != nil {
		t.Fatal(err)
	}
	h.startWorker(textModel("hello", 1, 0), nil)
	h.submit(request("gone", "late", "hi"))
	w := h.watch(protocol.DefaultTenant, "other", "later")
	h.submit(request("other", "later", "hi"))
	if fin := w.finished(t, 30*time.Second); fin.Status != protocol.StatusSuccess {
		t.Fatalf("the other thread's run ended %s", fin.Status)
	}
	runs, err := h.js.Stream(ctx, h.names.RunsStream())
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		info, err := runs.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the runs stream still holds %d requests", info.State.Msgs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, _, err := h.stores.Runs.Get(ctx, protocol.DefaultTenant, "late"); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("the dropped request has a record: %v", err)
	}
	got, _, err := h.stores.Threads.Get(ctx, protocol.DefaultTenant, "gone")
	if err != nil || got.Status != protocol.ThreadDeleting || got.Lease != nil || got.Epoch != 3 {
		t.Fatalf("thread after the dropped request: %+v %v", got, err)
	}
}
