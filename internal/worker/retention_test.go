package worker

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/protocol"
)

// A worker with the tenants' key TTLs writes a finished run's record (its
// usage with it: protocol v2 writes no usage bucket key) so that the
// server removes it at its age; the thread's state stays.
func TestFinishedRunExpiresByItsTenantsTTL(t *testing.T) {
	h := newHarness(t)
	ttl := func(string) time.Duration { return 2 * time.Second }
	h.startWorker(textModel("done", 2, 0), func(c *Config) { c.KeyTTLs = kv.TTLs{Runs: ttl, Usage: ttl} })
	w := h.watch("default", "t1", "r1")
	h.submit(request("t1", "r1", "hello"))
	if fin := w.finished(t, 30*time.Second); fin.Status != protocol.StatusSuccess {
		t.Fatalf("status %s (%s)", fin.Status, fin.Error)
	}
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, _, runErr := h.stores.Runs.Get(ctx, "default", "r1")
		if errors.Is(runErr, kv.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("30s after a run finished with a 2s TTL: record %v", runErr)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if msgs := h.threadState("default", "t1"); len(msgs) != 2 {
		t.Fatalf("the thread's state after its run expired: %d messages", len(msgs))
	}
}
