package crons

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/metrics/prom"
	"github.com/natsagent/natsagent/internal/testdeploy"
)

// A cron record that does not decode is left out of the tenant's
// listing, which still answers with the others, and counted in
// natsagent_records_undecodable_total with the crons bucket, as runs and
// threads are.
func TestUndecodableCronsAreCounted(t *testing.T) {
	d := testdeploy.Start(t, bus.Settings{})
	ctx := context.Background()
	s, err := Open(ctx, d.JS, d.Settings.Names)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	rec, err := prom.New(prom.Options{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
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
		if got := undecodableCount(t, reg, d.Settings.Names.CronsBucket()); got != float64(round) {
			t.Fatalf("after listing %d times: %v records counted undecodable, want %d", round, got, round)
		}
	}
}

// undecodableCount reads natsagent_records_undecodable_total{bucket}.
func undecodableCount(t *testing.T, reg *prometheus.Registry, bucket string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "natsagent_records_undecodable_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "bucket" && l.GetValue() == bucket {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
