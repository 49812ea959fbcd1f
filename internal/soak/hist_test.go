package soak

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/kv"
)

// finishHist logs when the runs finished, relative to at (the node loss):
// the figures docs/operations.md quotes.
func finishHist(t *testing.T, js jetstream.JetStream, names bus.Names, refs []RunRef, at time.Time) {
	t.Helper()
	stores, err := kv.Open(context.Background(), js, names)
	if err != nil {
		t.Logf("finish times: %v", err)
		return
	}
	var ds []time.Duration
	for _, ref := range refs {
		rec, _, err := stores.Runs.Get(context.Background(), ref.Tenant, ref.Run)
		if err == nil && rec.FinishedAt != nil {
			ds = append(ds, rec.FinishedAt.Sub(at).Round(100*time.Millisecond))
		}
	}
	if len(ds) == 0 {
		return
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	n := len(ds)
	t.Logf("finished after the loss: p10 %s p50 %s p90 %s p99 %s max %s", ds[n/10], ds[n/2], ds[n*9/10], ds[n*99/100], ds[n-1])
}
