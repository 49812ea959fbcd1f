package prom

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/natsagent/natsagent/internal/doctest"
	"github.com/natsagent/natsagent/internal/metrics"
)

// docs/operations.md's metrics table names every metric New registers,
// with its type and labels, and nothing else.
func TestOperationsDocListsEveryMetric(t *testing.T) {
	section := doctest.Section(t, "docs/operations.md", "### Metrics")
	// A row: | `name` (or `a` / `b`) | type | labels ([tenant,] when optional) | what |
	type row struct{ kind, labels string }
	documented := map[string]row{}
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 5 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue
		}
		labels := strings.NewReplacer("[", "", "]", "", " ", "").Replace(cells[3])
		for _, name := range strings.Split(cells[1], "/") {
			documented[Namespace+"_"+strings.Trim(name, " `")] = row{strings.TrimSpace(cells[2]), labels}
		}
	}

	reg := prometheus.NewRegistry()
	r, err := New(Options{Registry: reg, TenantLabel: true})
	if err != nil {
		t.Fatal(err)
	}
	// One call of every method, so that every metric has a series to
	// gather.
	calls := 0
	call := func(f func()) { f(); calls++ }
	call(func() { r.RunStarted("chatbot", "enqueue", time.Second) })
	call(func() { r.RunFinished("acme", "chatbot", "success", time.Second) })
	call(func() { r.ModelCall("m", metrics.OutcomeOK, time.Second) })
	call(func() { r.Tokens("acme", "m", "main", 1, 1) })
	call(func() { r.ModelRetry("network") })
	call(func() { r.CancelRequest("ok") })
	call(func() { r.DeadLettered(metrics.DLQInvalid) })
	call(func() { r.StoreFull("agent_runs") })
	call(func() { r.RecordUndecodable("agent_runs") })
	call(func() { r.JobProcessed(false) })
	call(func() { r.ToolCall("current_time", "success", time.Second) })
	call(func() { r.FencePause() })
	call(func() { r.FenceStop("lease_taken") })
	call(func() { t.Cleanup(r.TrackWorker(func() metrics.WorkerStats { return metrics.WorkerStats{} })) })
	call(func() {
		t.Cleanup(r.TrackConsumer("AGENT_RUNS/workers", func(context.Context) (uint64, error) { return 0, nil }))
	})
	call(func() {
		t.Cleanup(r.TrackStoreIndex(func() metrics.StoreIndexStats { return metrics.StoreIndexStats{} }))
	})
	call(func() { r.HTTPRequest("GET /healthz", 200, time.Millisecond) })
	call(func() { r.RunSubmitted("enqueue") })
	if n := reflect.TypeFor[metrics.Recorder]().NumMethod(); calls != n {
		t.Fatalf("%d of metrics.Recorder's %d methods called: call the new one above", calls, n)
	}

	descs := make(chan *prometheus.Desc, 100)
	reg.Describe(descs)
	close(descs)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(families) != len(descs) {
		t.Fatalf("%d metrics registered, %d gathered: a metric has no series after the calls above", len(descs), len(families))
	}
	for _, f := range families {
		var labels []string
		for _, l := range f.GetMetric()[0].GetLabel() {
			labels = append(labels, l.GetName())
		}
		kind := strings.ToLower(f.GetType().String())
		d, ok := documented[f.GetName()]
		if !ok {
			t.Errorf("%s (%s; labels %v) is registered but not in docs/operations.md's metrics table", f.GetName(), kind, labels)
			continue
		}
		delete(documented, f.GetName())
		want := strings.Split(d.labels, ",")
		if d.labels == "" {
			want = nil
		}
		slices.Sort(want)
		if d.kind != kind || !slices.Equal(labels, want) {
			t.Errorf("%s is a %s with labels %v; docs/operations.md says %s with %v", f.GetName(), kind, labels, d.kind, want)
		}
	}
	for name := range documented {
		t.Errorf("docs/operations.md lists %s, which is not registered", name)
	}
}
