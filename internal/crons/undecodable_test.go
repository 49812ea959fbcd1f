package crons

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/metrics"
	"github.com/natsagent/natsagent/internal/testdeploy"
)

// A cron record that does not decode is left out of the tenant's
// listing, which still answers with the others, and counted in
// records_undecodable_total with the crons bucket, as runs and threads
// are.
func TestUndecodableCronsAreCounted(t *testing.T) {
	d := testdeploy.Start(t, bus.Settings{})
	ctx := context.Background()
	s, err := Open(ctx, d.JS, d.Settings.Names)
	if err != nil {
		t.Fatal(err)
	}
	rec := &undecodables{n: map[string]int{}}
	s.Observe(zaptest.NewLogger(t), rec)
	putCron(t, s, "default", "c1", "")
	putCron(t, s, "default", "c2", "")
	if _, err := s.kv.PutString(ctx, "default.bad", `{"cron_id":12}`); err != nil {
		t.Fatal(err)
	}
	for round := 1; round <= 2; round++ {
		list, err := s.List(ctx, "default")
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, r := range list {
			ids = append(ids, r.CronID)
		}
		slices.Sort(ids)
		if strings.Join(ids, " ") != "c1 c2" {
			t.Fatalf("List answered %v, want c1 c2", ids)
		}
		if got := rec.count(d.Settings.Names.CronsBucket()); got != round {
			t.Fatalf("after listing %d times: %v records counted undecodable, want %d", round, got, round)
		}
	}
}

// undecodables counts RecordUndecodable by bucket.
type undecodables struct {
	metrics.Nop
	mu sync.Mutex
	n  map[string]int
}

func (u *undecodables) RecordUndecodable(bucket string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.n[bucket]++
}

func (u *undecodables) count(bucket string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.n[bucket]
}
