package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The test binary doubles as the bench's worker process: started with
// NATSAGENT_BENCH_WORKER=1 it runs WorkerMain instead of the tests.
func TestMain(m *testing.M) {
	if os.Getenv("NATSAGENT_BENCH_WORKER") == "1" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err := WorkerMain(ctx, os.Args[1:], os.Stdin, os.Stdout)
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench worker:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// tiny is a configuration of every scenario small enough for a test.
func tiny() Config {
	return Config{
		Runs:               60,
		Concurrency:        []int{1, 4},
		StreamRuns:         20,
		StreamDeltas:       50,
		IdleRuns:           20,
		PacedRate:          200,
		PacedRuns:          40,
		SteerRuns:          6,
		SteerParallel:      3,
		SteerPieces:        100,
		SteerPieceDelay:    5 * time.Millisecond,
		ThreadSizes:        []int{10, 40},
		ThreadSamples:      20,
		ScalingProcs:       []int{1, 2},
		ScalingConcurrency: 4,
		ScalingLatency:     20 * time.Millisecond,
		ScalingBusy:        200 * time.Millisecond,
		MemoryRuns:         20,
		MemoryLatency:      10 * time.Second,
		// A bound, not a target: the scenarios are small and end in
		// about a minute here; on a starved CI host (raw JetStream at
		// 165 msg/s under stress-ng) burst c=4 ran out of a 90 s total.
		Timeout:       5 * time.Minute,
		WorkerCommand: []string{os.Args[0]},
		WorkerEnv:     []string{"NATSAGENT_BENCH_WORKER=1"},
	}
}

func TestEveryScenario(t *testing.T) {
	rep, err := Run(context.Background(), tiny())
	if err != nil {
		t.Fatal(err)
	}
	checkReport(t, rep, AllScenarios())

	want := []string{
		"burst.baseline", "burst.c1.throughput", "burst.c4.throughput", "burst.c4.p50",
		"latency.baseline.p50", "latency.floor.p50", "latency.idle.p50_vs_floor", "latency.paced_floor.p99", "latency.paced.p99_vs_floor", "latency.idle.p50", "latency.paced.p99", "latency.paced.rate",
		"steer.p50", "steer.p99", "cancel.p50", "cancel.p99",
		"thread.h10.checkpoint_bytes", "thread.h40.checkpoint_bytes", "thread.h10.prepare_first", "thread.h40.prepare_next",
		"scaling.p1.throughput", "scaling.p2.throughput", "scaling.p2.speedup",
		"memory.heap_per_run", "memory.goroutines_per_run",
		"burst.c1.stored_per_run", "burst.c4.stored_per_run", "burst.ceiling.throughput", "burst.ceiling.stored_per_run", "burst.c4.vs_ceiling",
		"latency.idle.stored_per_run", "latency.paced.stored_per_run", "stream.throughput", "stream.events_per_sec", "stream.stored_per_run",
		"stream.stored.throughput", "stream.stored.stored_per_run",
		"steer.stored_per_sample", "cancel.stored_per_sample", "scaling.p1.stored_per_run", "scaling.p2.stored_per_run",
	}
	if runtime.GOOS == "linux" {
		want = append(want, "memory.rss_per_run", "scaling.p1.cpu_per_run", "scaling.p2.cpu_per_run")
	}
	if _, ok := processCPU(); ok {
		want = append(want, "burst.baseline.cpu_per_msg", "burst.c1.cpu_per_run", "burst.c4.cpu_per_run", "burst.ceiling.cpu_per_run", "burst.c4.cpu_vs_ceiling",
			"latency.idle.cpu_per_run", "latency.paced.cpu_per_run", "stream.cpu_per_delta", "stream.cpu_per_run", "stream.stored.cpu_per_run", "stream.live_vs_stored", "steer.cpu_per_sample", "cancel.cpu_per_sample")
	}
	rows := byKey(rep)
	for _, k := range want {
		r, ok := rows[k]
		if !ok {
			t.Errorf("no row %s", k)
			continue
		}
		if r.Value <= 0 && !strings.HasSuffix(k, "_per_run") {
			t.Errorf("%s = %v, want > 0", k, r.Value)
		}
	}
	for _, k := range []string{"steer.wrong_status", "cancel.wrong_status"} {
		if r := rows[k]; r.Value != 0 {
			t.Errorf("%s = %v: a streaming run did not end as asked", k, r.Value)
		}
	}
	// A stored figure is the sum of its parts; the ceiling does exactly
	// its documented write set, and natsagent's matches it.
	for k, r := range rows {
		if !strings.Contains(k, ".stored_per_") {
			continue
		}
		var sum float64
		for _, v := range r.Breakdown {
			sum += v
		}
		if math.Abs(sum-r.Value) > 1e-9 || r.Breakdown["events"] <= 0 {
			t.Errorf("%s = %v, breakdown %v", k, r.Value, r.Breakdown)
		}
	}
	if r := rows["burst.ceiling.stored_per_run"]; r.Value != ceilingWrites {
		t.Errorf("the raw ceiling stored %v messages a run, want its %d: %v", r.Value, ceilingWrites, r.Breakdown)
	}
	if a, b := rows["burst.c4.stored_per_run"], rows["burst.ceiling.stored_per_run"]; math.Abs(a.Value-b.Value) >= 0.5 {
		t.Errorf("natsagent stores %v a run (%v), the raw ceiling %v (%v): update internal/bench/ceiling.go", a.Value, a.Breakdown, b.Value, b.Breakdown)
	}
	// Deltas are live (issue 16): a streaming run stores what a no-op
	// run does.
	if r := rows["stream.stored_per_run"]; r.Breakdown["events"] > 6 {
		t.Errorf("stream: %v events stored a run for 50 deltas, want the few stored ones", r.Breakdown["events"])
	}
	// The comparison pass stores every delta (stream_resumable), so the
	// live pass's CPU is set against what a v1 run cost.
	if r := rows["stream.stored.stored_per_run"]; r.Breakdown["events"] < 50 {
		t.Errorf("stream_resumable: %v events stored a run for 50 deltas, want every delta stored", r.Breakdown["events"])
	}
	if r, ok := rows["stream.live_vs_stored"]; ok && (r.Baseline == nil || *r.Baseline <= 0 || r.OK == nil) {
		t.Errorf("live against stored deltas without its baseline or target: %+v", r)
	}
	// The burst's throughput sits next to the raw baseline.
	if r := rows["burst.c4.throughput"]; r.Baseline == nil || r.Ratio == nil || *r.Baseline <= 0 {
		t.Errorf("burst throughput without its baseline: %+v", r)
	}
	// Checkpoint growth is compared with the step's new content.
	if r := rows["thread.h40.checkpoint_bytes"]; r.Baseline == nil || *r.Baseline <= 0 || r.OK == nil {
		t.Errorf("checkpoint row without new content or target: %+v", r)
	}
}

func TestHTTPModel(t *testing.T) {
	cfg := tiny()
	cfg.Model = ModelHTTP
	cfg.Scenarios = []string{ScenarioBurst, ScenarioSteer, ScenarioCancel, ScenarioScaling}
	cfg.Concurrency = []int{4}
	cfg.ScalingProcs = []int{1}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkReport(t, rep, cfg.Scenarios)
	if !strings.Contains(rep.Model, "HTTP") {
		t.Errorf("model %q", rep.Model)
	}
}

func TestConfigErrors(t *testing.T) {
	for name, c := range map[string]Config{
		"unknown scenario": {Scenarios: []string{"nope"}},
		"model":            {Model: "grpc"},
		"prefix":           {Prefix: "has.dot"},
		"long prefix":      {Prefix: strings.Repeat("p", 21)},
		"conn":             {NATSURL: "nats://127.0.0.1:4222", InProcessConn: true},
		"thread size":      {ThreadSizes: []int{2}},
	} {
		if _, err := Run(context.Background(), c); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestPercentileAndFormat(t *testing.T) {
	var d durations
	for i := 100; i >= 1; i-- {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	if p := d.percentile(0.5); p != 50*time.Millisecond {
		t.Errorf("p50 = %v", p)
	}
	if p := d.percentile(0.99); p != 99*time.Millisecond {
		t.Errorf("p99 = %v", p)
	}
	if p := (durations{}).percentile(0.5); p != 0 {
		t.Errorf("empty p50 = %v", p)
	}
	for v, want := range map[float64]string{1234567: "1,234,567", 999: "999", 0: "0", -1500: "-1,500"} {
		if got := group(v); got != want {
			t.Errorf("group(%v) = %q, want %q", v, got, want)
		}
	}
	if got := splitWords("a b c d e", 2); len(got) != 2 || strings.Join(got, "") != "a b c d e" {
		t.Errorf("splitWords = %q", got)
	}
}

// checkReport asserts what every report must show: each scenario ran
// without error and within its time, nothing was lost or finished twice,
// percentiles are ordered, and the table and JSON render.
func checkReport(t *testing.T, rep *Report, scenarios []string) {
	t.Helper()
	if len(rep.Scenarios) != len(scenarios) {
		t.Fatalf("%d scenario results, want %d: %+v", len(rep.Scenarios), len(scenarios), rep.Scenarios)
	}
	for i, s := range rep.Scenarios {
		if s.Name != scenarios[i] || s.Error != "" || s.OutOfTime {
			t.Errorf("scenario %+v", s)
		}
	}
	rows := byKey(rep)
	for k, r := range rows {
		switch {
		case strings.HasSuffix(k, ".lost"), strings.HasSuffix(k, ".duplicated"), strings.HasSuffix(k, ".unfinished"), strings.HasSuffix(k, "publish_errors"):
			if r.Value != 0 {
				t.Errorf("%s = %v, want 0", k, r.Value)
			}
		case strings.HasSuffix(k, ".p50"):
			base := strings.TrimSuffix(k, ".p50")
			p50, p90, p99 := r.Value, rows[base+".p90"].Value, rows[base+".p99"].Value
			if _, ok := rows[base+".p90"]; !ok {
				p90 = p50
			}
			if !(p50 > 0 && p50 <= p90 && p90 <= p99) {
				t.Errorf("%s: p50 %v, p90 %v, p99 %v are not ordered", base, p50, p90, p99)
			}
		}
	}
	var table bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, s := range append([]string{"scenario", "metric", "baseline", "ratio", "target"}, scenarios...) {
		if !strings.Contains(table.String(), s) {
			t.Errorf("table has no %q:\n%s", s, table.String())
		}
	}
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Rows) != len(rep.Rows) || len(back.Scenarios) != len(rep.Scenarios) {
		t.Errorf("JSON round trip: %d rows, %d scenarios", len(back.Rows), len(back.Scenarios))
	}
	if t.Failed() {
		t.Log("\n" + table.String())
	}
}

func byKey(rep *Report) map[string]Row {
	m := make(map[string]Row, len(rep.Rows))
	for _, r := range rep.Rows {
		m[r.Key] = r
	}
	return m
}
