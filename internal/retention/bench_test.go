package retention

import (
	"fmt"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/protocol"
)

// BenchmarkSweepRuns measures a sweep removing 1,000 finished runs (and
// their run-list entries) of one tenant, among 1,000 of another.
func BenchmarkSweepRuns(b *testing.B) {
	for range b.N {
		b.StopTimer()
		e := newEnvB(b)
		old := time.Now().Add(-2 * time.Hour)
		for i := range 1000 {
			for _, tenant := range []string{"acme", "globex"} {
				r := finishedRun(tenant, "h1", fmt.Sprintf("r%d", i), protocol.StatusSuccess, old)
				if _, err := e.stores.Runs.Create(e.ctx, r); err != nil {
					b.Fatal(err)
				}
			}
		}
		s := New(Config{JS: e.js, Names: e.names, Stores: e.stores, Policy: Policy{Tenants: map[string]Rules{"acme": {Runs: time.Hour}}}})
		b.StartTimer()
		rep, err := s.Sweep(e.ctx, "acme")
		if err != nil || rep.Runs != 1000 {
			b.Fatalf("%+v %v", rep, err)
		}
	}
}
