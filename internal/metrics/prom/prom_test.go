package prom

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/natsagent/natsagent/internal/metrics"
)

func newTest(t *testing.T, o Options) *Recorder {
	t.Helper()
	o.Registry = prometheus.NewRegistry()
	r, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestCountersAndHistograms(t *testing.T) {
	r := newTest(t, Options{})
	r.RunFinished("acme", "chatbot", "success", 2*time.Second)
	r.RunFinished("acme", "chatbot", "success", 3*time.Second)
	r.RunFinished("acme", "chatbot", "rejected", -1)
	r.Tokens("acme", "gpt-4o", "main", 100, 20)
	r.Tokens("acme", "gpt-4o", "summary", 50, 0)
	r.JobProcessed(false)
	r.JobProcessed(true)
	r.JobProcessed(true)

	want := `
# HELP natsagent_runs_finished_total Runs that reached a terminal status, by agent and status.
# TYPE natsagent_runs_finished_total counter
natsagent_runs_finished_total{agent="chatbot",status="rejected"} 1
natsagent_runs_finished_total{agent="chatbot",status="success"} 2
# HELP natsagent_model_tokens_total Tokens of model calls, by model, purpose (main, summary) and direction (input, output).
# TYPE natsagent_model_tokens_total counter
natsagent_model_tokens_total{direction="input",model="gpt-4o",purpose="main"} 100
natsagent_model_tokens_total{direction="input",model="gpt-4o",purpose="summary"} 50
natsagent_model_tokens_total{direction="output",model="gpt-4o",purpose="main"} 20
natsagent_model_tokens_total{direction="output",model="gpt-4o",purpose="summary"} 0
# HELP natsagent_worker_jobs_processed_total Run requests a worker took to their end (finished, handed back or dropped), by delivery (first, redelivery).
# TYPE natsagent_worker_jobs_processed_total counter
natsagent_worker_jobs_processed_total{delivery="first"} 1
natsagent_worker_jobs_processed_total{delivery="redelivery"} 2
`
	if err := testutil.GatherAndCompare(r.Registry(), strings.NewReader(want),
		"natsagent_runs_finished_total", "natsagent_model_tokens_total", "natsagent_worker_jobs_processed_total"); err != nil {
		t.Fatal(err)
	}
	// A run that never started is counted, not timed.
	if n := testutil.CollectAndCount(r.Registry(), "natsagent_run_duration_seconds"); n != 1 {
		t.Fatalf("%d duration series, want 1 (success only)", n)
	}
}

// The tenant label exists only when configured.
func TestTenantLabel(t *testing.T) {
	r := newTest(t, Options{TenantLabel: true})
	r.RunFinished("acme", "chatbot", "success", time.Second)
	r.Tokens("globex", "m", "main", 1, 2)
	want := `
# HELP natsagent_runs_finished_total Runs that reached a terminal status, by agent and status.
# TYPE natsagent_runs_finished_total counter
natsagent_runs_finished_total{agent="chatbot",status="success",tenant="acme"} 1
# HELP natsagent_model_tokens_total Tokens of model calls, by model, purpose (main, summary) and direction (input, output).
# TYPE natsagent_model_tokens_total counter
natsagent_model_tokens_total{direction="input",model="m",purpose="main",tenant="globex"} 1
natsagent_model_tokens_total{direction="output",model="m",purpose="main",tenant="globex"} 2
`
	if err := testutil.GatherAndCompare(r.Registry(), strings.NewReader(want), "natsagent_runs_finished_total", "natsagent_model_tokens_total"); err != nil {
		t.Fatal(err)
	}
}

// Model names come from requests: past the cap they are "other", and the
// registry stops growing.
func TestModelLabelIsCapped(t *testing.T) {
	r := newTest(t, Options{MaxLabelValues: 3})
	for i := range 10 {
		r.ModelCall(fmt.Sprintf("model-%d", i), metrics.OutcomeOK, time.Millisecond)
	}
	r.ModelCall("model-1", metrics.OutcomeOK, time.Millisecond)
	if n := testutil.CollectAndCount(r.Registry(), "natsagent_model_call_duration_seconds"); n != 4 {
		t.Fatalf("%d series, want 3 models and %q", n, Other)
	}
	out := gather(t, r)
	if !strings.Contains(out, `natsagent_model_call_duration_seconds_count{model="other",outcome="ok"} 7`) ||
		!strings.Contains(out, `natsagent_model_call_duration_seconds_count{model="model-1",outcome="ok"} 2`) {
		t.Fatalf("capped series:\n%s", grep(out, "model_call_duration_seconds_count"))
	}
}

// The gauges add up every worker of the process and forget a worker that
// stopped.
func TestWorkerGauges(t *testing.T) {
	r := newTest(t, Options{})
	stop1 := r.TrackWorker(func() metrics.WorkerStats {
		return metrics.WorkerStats{Slots: 8, BusySlots: 3, ActiveLeases: 2, WaitingRuns: 1}
	})
	stop2 := r.TrackWorker(func() metrics.WorkerStats { return metrics.WorkerStats{Slots: 4, BusySlots: 1, ActiveLeases: 1} })
	check := func(slots, busy, leases, waiting float64) {
		t.Helper()
		want := fmt.Sprintf(`
# HELP natsagent_worker_active_leases Runs in progress on the process's workers, each holding its thread's lease.
# TYPE natsagent_worker_active_leases gauge
natsagent_worker_active_leases %v
# HELP natsagent_worker_slots Runs the process's workers may execute at once (their concurrency).
# TYPE natsagent_worker_slots gauge
natsagent_worker_slots %v
# HELP natsagent_worker_slots_busy Slots held by runs being decided or executed (runs waiting for their thread hold none).
# TYPE natsagent_worker_slots_busy gauge
natsagent_worker_slots_busy %v
# HELP natsagent_worker_waiting_runs Runs held by the process's workers while another run of their thread goes first.
# TYPE natsagent_worker_waiting_runs gauge
natsagent_worker_waiting_runs %v
`, leases, slots, busy, waiting)
		if err := testutil.GatherAndCompare(r.Registry(), strings.NewReader(want), "natsagent_worker_slots", "natsagent_worker_slots_busy", "natsagent_worker_active_leases", "natsagent_worker_waiting_runs"); err != nil {
			t.Fatal(err)
		}
	}
	check(12, 4, 3, 1)
	stop1()
	check(4, 1, 1, 0)
	stop2()
	check(0, 0, 0, 0)
}

// The store index's figures are read at collection time; a process with
// no gateway reports none.
func TestStoreIndexMetrics(t *testing.T) {
	r := newTest(t, Options{})
	names := []string{"natsagent_store_index_bytes", "natsagent_store_index_budget_bytes", "natsagent_store_index_tenants",
		"natsagent_store_index_loads_total", "natsagent_store_index_evictions_total", "natsagent_store_index_oversized_total",
		"natsagent_store_index_bucket_searches_total", "natsagent_store_index_missed_removals_total"}
	if n := testutil.CollectAndCount(r.Registry(), names...); n != 0 {
		t.Fatalf("%d store index series without an index", n)
	}
	stats := metrics.StoreIndexStats{Bytes: 1000, Budget: 4096, Tenants: 2, Loads: 5, Evictions: 3, Oversized: 1, BucketSearches: 7, MissedRemovals: 2}
	untrack := r.TrackStoreIndex(func() metrics.StoreIndexStats { return stats })
	want := `
# HELP natsagent_store_index_bucket_searches_total Store searches and namespace listings of tenants larger than the budget, answered by reading the bucket.
# TYPE natsagent_store_index_bucket_searches_total counter
natsagent_store_index_bucket_searches_total 7
# HELP natsagent_store_index_budget_bytes The store search index's memory budget (store.index_memory_bytes).
# TYPE natsagent_store_index_budget_bytes gauge
natsagent_store_index_budget_bytes 4096
# HELP natsagent_store_index_bytes Memory the store's search index holds (an estimate: values decoded, vectors unpacked).
# TYPE natsagent_store_index_bytes gauge
natsagent_store_index_bytes 1000
# HELP natsagent_store_index_evictions_total Tenants the search index dropped, least recently searched first, to stay within its budget.
# TYPE natsagent_store_index_evictions_total counter
natsagent_store_index_evictions_total 3
# HELP natsagent_store_index_loads_total Tenants read from the store bucket into the search index (a first search, or one after an eviction).
# TYPE natsagent_store_index_loads_total counter
natsagent_store_index_loads_total 5
# HELP natsagent_store_index_missed_removals_total Tenants the search index dropped, to read them from the bucket again, because another process's removal reached it only through the bucket (its core NATS notice was missed).
# TYPE natsagent_store_index_missed_removals_total counter
natsagent_store_index_missed_removals_total 2
# HELP natsagent_store_index_oversized_total Times a tenant was found larger than the whole index budget (its searches then read the bucket).
# TYPE natsagent_store_index_oversized_total counter
natsagent_store_index_oversized_total 1
# HELP natsagent_store_index_tenants Tenants whose store items the search index holds.
# TYPE natsagent_store_index_tenants gauge
natsagent_store_index_tenants 2
`
	if err := testutil.GatherAndCompare(r.Registry(), strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}
	stats.Bytes = 3000
	grown := `
# HELP natsagent_store_index_bytes Memory the store's search index holds (an estimate: values decoded, vectors unpacked).
# TYPE natsagent_store_index_bytes gauge
natsagent_store_index_bytes 3000
`
	if err := testutil.GatherAndCompare(r.Registry(), strings.NewReader(grown), "natsagent_store_index_bytes"); err != nil {
		t.Fatal(err)
	}
	untrack()
	if n := testutil.CollectAndCount(r.Registry(), names...); n != 0 {
		t.Fatalf("%d store index series after untrack", n)
	}
}

// The consumer's lag is read from the server at most once per refresh
// interval, however many workers track it and however often Prometheus
// scrapes; a failed read keeps the last figure.
func TestConsumerLagIsReadOncePerInterval(t *testing.T) {
	r := newTest(t, Options{LagRefresh: time.Hour})
	var reads atomic.Int32
	lag := func(context.Context) (uint64, error) { reads.Add(1); return 42, nil }
	stopA := r.TrackConsumer("AGENT_RUNS/workers", lag)
	stopB := r.TrackConsumer("AGENT_RUNS/workers", lag)
	for range 5 {
		if out := gather(t, r); !strings.Contains(out, `natsagent_consumer_lag{consumer="AGENT_RUNS/workers"} 42`) {
			t.Fatalf("lag:\n%s", grep(out, "consumer_lag"))
		}
	}
	if n := reads.Load(); n != 1 {
		t.Fatalf("%d reads of the consumer for 5 scrapes by 2 workers, want 1", n)
	}
	stopA()
	stopB()
	if out := gather(t, r); strings.Contains(out, "natsagent_consumer_lag{") {
		t.Fatalf("lag still reported with no worker tracking it:\n%s", out)
	}

	// Read at every scrape; a failing read keeps the last figure, and a
	// consumer never read reports nothing.
	r = newTest(t, Options{LagRefresh: -1})
	fail := false
	r.TrackConsumer("c", func(context.Context) (uint64, error) {
		if fail {
			return 0, errors.New("no responders")
		}
		return 7, nil
	})
	r.TrackConsumer("never", func(context.Context) (uint64, error) { return 0, errors.New("no responders") })
	gather(t, r)
	fail = true
	out := gather(t, r)
	if !strings.Contains(out, `natsagent_consumer_lag{consumer="c"} 7`) || strings.Contains(out, `consumer="never"`) {
		t.Fatalf("lag:\n%s", grep(out, "consumer_lag"))
	}
}

// The run path allocates nothing once a series exists.
func TestRecordingDoesNotAllocate(t *testing.T) {
	r := newTest(t, Options{})
	calls := map[string]func(){
		"RunStarted":   func() { r.RunStarted("chatbot", "enqueue", time.Millisecond) },
		"RunFinished":  func() { r.RunFinished("t", "chatbot", "success", time.Second) },
		"ModelCall":    func() { r.ModelCall("gpt-4o", metrics.OutcomeOK, time.Second) },
		"Tokens":       func() { r.Tokens("t", "gpt-4o", "main", 10, 5) },
		"ModelRetry":   func() { r.ModelRetry("network") },
		"JobProcessed": func() { r.JobProcessed(false) },
		"RunSubmitted": func() { r.RunSubmitted("enqueue") },
	}
	for name, f := range calls {
		f()
		if n := testing.AllocsPerRun(100, f); n != 0 {
			t.Errorf("%s allocates %v times per call", name, n)
		}
	}
}

func BenchmarkRecorder(b *testing.B) {
	r, err := New(Options{Registry: prometheus.NewRegistry()})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("per model call", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				r.ModelCall("gpt-4o", metrics.OutcomeOK, time.Second)
				r.Tokens("default", "gpt-4o", "main", 100, 10)
			}
		})
	})
	b.Run("per run", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				r.RunStarted("chatbot", "enqueue", time.Millisecond)
				r.RunFinished("default", "chatbot", "success", time.Second)
				r.JobProcessed(false)
			}
		})
	})
}

func gather(t *testing.T, r *Recorder) string {
	t.Helper()
	rr := httptest.NewRecorder()
	r.Handler().ServeHTTP(rr, httptest.NewRequest("GET", "/metrics", nil))
	return rr.Body.String()
}

func grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// Two recorders on one registry (a gateway --dev and its in-process
// workers) count into the same series and sum their workers' gauges; a
// recorder whose labels differ from the registry's is refused.
func TestRecordersShareARegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	a, err := New(Options{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(Options{Registry: reg})
	if err != nil {
		t.Fatalf("a second recorder on the registry: %v", err)
	}
	a.RunFinished("default", "chatbot", "success", time.Second)
	b.RunFinished("default", "chatbot", "success", time.Second)
	b.FencePause()
	untrackA := a.TrackWorker(func() metrics.WorkerStats { return metrics.WorkerStats{Slots: 8} })
	defer untrackA()
	untrackB := b.TrackWorker(func() metrics.WorkerStats { return metrics.WorkerStats{Slots: 4} })
	defer untrackB()
	want := `
# HELP natsagent_lease_fence_pauses_total Runs paused because the renewal of their thread lease was not confirmed in time.
# TYPE natsagent_lease_fence_pauses_total counter
natsagent_lease_fence_pauses_total 1
# HELP natsagent_runs_finished_total Runs that reached a terminal status, by agent and status.
# TYPE natsagent_runs_finished_total counter
natsagent_runs_finished_total{agent="chatbot",status="success"} 2
# HELP natsagent_worker_slots Runs the process's workers may execute at once (their concurrency).
# TYPE natsagent_worker_slots gauge
natsagent_worker_slots 12
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "natsagent_runs_finished_total", "natsagent_lease_fence_pauses_total", "natsagent_worker_slots"); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Options{Registry: reg, TenantLabel: true}); err == nil {
		t.Fatal("a recorder with a tenant label was added to a registry without one")
	}
}
