package bench

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/natsagent/natsagent/internal/protocol"
)

// runBurst measures the raw JetStream baseline, then, at each worker
// concurrency, publishes cfg.Runs no-op runs (one thread each) as fast as
// it can and waits for every run.finished: runs/s from the first submit to
// the last run.finished, and each run's submit → finished latency.
func runBurst(ctx context.Context, e *env, s *scenarioRun) error {
	cfg := e.cfg
	payload := request("t0", "r0", "hi", "")

	e.progress.stage("burst: raw JetStream", 0)
	b, err := e.newBaseline(ctx, "burst")
	if err != nil {
		return err
	}
	// The baseline gets at most a fifth of the scenario's time.
	bctx, cancel := shareOf(ctx, 0.2)
	cpu0, cpuOK := processCPU()
	base, measured, err := b.throughput(bctx, cfg.Runs, payload)
	cpu1, _ := processCPU()
	cancel()
	b.close()
	if err != nil && err != errOutOfTime {
		return err
	}
	s.add(Row{Key: "burst.baseline", Metric: fmt.Sprintf("raw JetStream: sync publish + pull + ack, %s msgs of %d B", group(float64(measured)), len(payload)), Value: base, Unit: unitMsgPerSec})
	if cpuOK && measured > 0 {
		s.add(Row{Key: "burst.baseline.cpu_per_msg", Metric: "CPU per message (whole process), raw JetStream", Value: us((cpu1 - cpu0) / time.Duration(measured)), Unit: unitMicros})
	}
	if measured < cfg.Runs {
		s.note("the raw baseline ran out of its time after %d of %d messages", measured, cfg.Runs)
	}

	// Highest concurrency first: it is the fastest, so the slow levels get
	// what the fast ones leave of the budget.
	levels := slices.Clone(cfg.Concurrency)
	slices.Sort(levels)
	slices.Reverse(levels)
	top := levels[0]

	// The raw ceiling of natsagent's write set gets at most a fifth of
	// what is left.
	cctx, cancel := shareOf(ctx, 0.2)
	ceil, err := burstCeiling(cctx, e, s, top)
	cancel()
	if err != nil {
		return err
	}
	var results = map[int][]Row{}
	for i, c := range levels {
		if ctx.Err() != nil {
			s.outOfTime = true
			break
		}
		var weights float64
		for _, rest := range levels[i:] {
			weights += levelWeight(rest)
		}
		lctx, cancel := shareOf(ctx, levelWeight(c)/weights)
		rows, out, err := burstLevel(lctx, e, s, c, base, c == top)
		cancel()
		results[c] = rows
		if out {
			s.outOfTime = true
			s.note("concurrency %d ran out of its time", c)
		}
		if err != nil {
			return err
		}
	}
	for _, c := range cfg.Concurrency {
		for _, r := range results[c] {
			s.add(r)
		}
	}
	for _, r := range results[top] {
		label := fmt.Sprintf("c=%d", top)
		switch {
		case r.Key == fmt.Sprintf("burst.c%d.stored_per_run", top) && ceil.storedPerRun > 0 && math.Abs(r.Value-ceil.storedPerRun) >= 0.5:
			s.note("natsagent stored %.2f messages a run and the raw ceiling %.2f: the ceiling no longer does natsagent's write set; update internal/bench/ceiling.go", r.Value, ceil.storedPerRun)
		case r.Key == fmt.Sprintf("burst.c%d.throughput", top) && ceil.throughput > 0:
			s.add(Row{Key: fmt.Sprintf("burst.c%d.vs_ceiling", top), Metric: "throughput against the raw ceiling of its write set, " + label, Value: r.Value, Unit: unitRunsPerSec}.withBaseline(ceil.throughput, unitRunsPerSec))
		case r.Key == fmt.Sprintf("burst.c%d.cpu_per_run", top) && ceil.cpuPerRun > 0:
			s.add(Row{Key: fmt.Sprintf("burst.c%d.cpu_vs_ceiling", top), Metric: "CPU per run against the raw ceiling of its write set, " + label, Value: r.Value, Unit: unitMicros}.withBaseline(ceil.cpuPerRun, unitMicros))
			s.add(Row{Key: fmt.Sprintf("burst.c%d.cpu_over_ceiling", top), Metric: "CPU per run of natsagent's own code (burst − raw ceiling), " + label, Value: r.Value - ceil.cpuPerRun, Unit: unitMicros})
			if ceil.cpuPerRun > burstTargetCPU {
				s.note("the raw ceiling of the write set alone took %.0f µs of CPU a run, above the %.0f µs target: no natsagent code meets that target on this machine with this write set (the throughput half needs %s runs/s; the ceiling made %s)",
					ceil.cpuPerRun, float64(burstTargetCPU), group(burstTargetRate), group(ceil.throughput))
			}
		}
	}
	return nil
}

// ceilingResult is what the raw ceiling measured.
type ceilingResult struct {
	throughput   float64 // runs/s
	cpuPerRun    float64 // µs
	storedPerRun float64
}

// burstCeiling measures the raw ceiling of natsagent's write set (see
// ceiling) with cfg.Runs runs at concurrency c.
func burstCeiling(ctx context.Context, e *env, s *scenarioRun, c int) (ceilingResult, error) {
	cfg := e.cfg
	e.progress.stage(fmt.Sprintf("burst: raw ceiling c=%d", c), cfg.Runs)
	ceil, err := e.newCeiling(ctx, "ceiling")
	if err != nil {
		return ceilingResult{}, err
	}
	defer ceil.close()
	reqs := ceil.requests(cfg.Runs)
	meter, err := startMeter(ctx, e.js, ceil.names.Prefix)
	if err != nil {
		return ceilingResult{}, err
	}
	oc, done, err := ceil.run(ctx, reqs, c, 0)
	if err != nil {
		// A run the server failed (a timeout on a starved host) is the
		// ceiling's loss, not the burst's: it is reported, and measured.
		s.note("raw ceiling: %v", err)
	}
	used := meter.finish(ctx, s)
	if !done {
		s.note("the raw ceiling ran out of its time after %d of %d runs", oc.finished, oc.submitted)
	}
	label := fmt.Sprintf("c=%d", c)
	res := ceilingResult{throughput: oc.throughput()}
	s.note("raw ceiling: natsagent's write set with plain nats.go calls, stage by stage: %s", ceilingStages)
	s.add(Row{Key: "burst.ceiling.throughput", Metric: fmt.Sprintf("raw ceiling of natsagent's write set, %s runs, %s", group(float64(oc.finished)), label), Value: res.throughput, Unit: unitRunsPerSec})
	lat := runRows("burst.ceiling", "raw ceiling "+label, oc, !done, false)
	for _, r := range append(used.rowsFor(s, oc, "burst.ceiling", "raw ceiling "+label, "run", oc.finished), lat[0], lat[1]) {
		switch {
		case strings.HasSuffix(r.Key, ".cpu_per_run"):
			res.cpuPerRun = r.Value
		case strings.HasSuffix(r.Key, ".stored_per_run"):
			res.storedPerRun = r.Value
		}
		s.add(r)
	}
	return res, nil
}

// levelWeight is a level's share of the burst budget: a worker with one
// slot needs several times longer than one with 64.
func levelWeight(c int) float64 { return 1 / (1 + math.Log2(float64(c))) }

// shareOf returns a context ending after frac of ctx's remaining time.
func shareOf(ctx context.Context, frac float64) (context.Context, context.CancelFunc) {
	deadline, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, time.Duration(float64(time.Until(deadline))*frac))
}

func burstLevel(ctx context.Context, e *env, s *scenarioRun, c int, base float64, top bool) ([]Row, bool, error) {
	cfg := e.cfg
	d, err := e.deploy(ctx, fmt.Sprintf("burst%d", c))
	if err != nil {
		return nil, false, err
	}
	defer d.close()
	m, err := d.model(fixed(streamingReply(cfg.ModelLatency, cfg.ModelPieces)))
	if err != nil {
		return nil, false, err
	}
	if err := d.startWorkers(ctx, m, c, 1); err != nil {
		return nil, false, err
	}
	payloads := make([][]byte, cfg.Runs)
	for i := range payloads {
		payloads[i] = request(fmt.Sprintf("t%d", i), fmt.Sprintf("r%d", i), "hi", "")
	}
	e.progress.stage(fmt.Sprintf("burst c=%d", c), cfg.Runs)
	meter, err := d.meter(ctx)
	if err != nil {
		return nil, false, err
	}
	tracks := make([]*track, 0, cfg.Runs)
	for i := range cfg.Runs {
		if ctx.Err() != nil {
			break
		}
		t, err := d.submit(fmt.Sprintf("t%d", i), fmt.Sprintf("r%d", i), payloads[i])
		tracks = append(tracks, t)
		if err != nil {
			return nil, false, err
		}
	}
	done := d.obs.waitAll(ctx, tracks)
	used := meter.finish(ctx, s)
	oc := d.obs.outcome(tracks)
	checkStatuses(s, fmt.Sprintf("concurrency %d", c), oc, protocol.StatusSuccess)
	rows := runRows(fmt.Sprintf("burst.c%d", c), fmt.Sprintf("c=%d", c), oc, !done, true)
	thr := Row{Key: fmt.Sprintf("burst.c%d.throughput", c), Metric: fmt.Sprintf("throughput, concurrency %d", c), Value: oc.throughput(), Unit: unitRunsPerSec}.withBaseline(base, unitMsgPerSec)
	costRows := used.rowsFor(s, oc, fmt.Sprintf("burst.c%d", c), fmt.Sprintf("c=%d", c), "run", oc.finished)
	if top {
		thr = thr.atLeast(burstTargetRate, "≥ 7,500 runs/s")
		for _, r := range costRows {
			if r.Key == fmt.Sprintf("burst.c%d.cpu_per_run", c) {
				// Issue 16's target is either: the CPU figure is the one
				// a shared machine does not move.
				ok := r.Value <= burstTargetCPU || thr.Value >= burstTargetRate
				thr.OK, thr.Target = &ok, "≥ 7,500 runs/s or ≤ 267 µs CPU/run"
			}
		}
	}
	rows = append(append([]Row{thr}, costRows...), rows...)
	if n := d.publishErrors(); n > 0 {
		rows = append(rows, Row{Key: fmt.Sprintf("burst.c%d.publish_errors", c), Metric: "failed publishes, c=" + fmt.Sprint(c), Value: float64(n), Unit: unitCount}.atMost(0, "0"))
	}
	return rows, !done, nil
}

// Issue 16's burst target at the largest concurrency: either figure.
const (
	burstTargetRate = 7500 // runs/s
	burstTargetCPU  = 267  // µs of CPU per run, whole process
)

// runRows are the latency percentiles and the lost and duplicated counts
// of a set of runs. p90 is included when withP90 is set. When the time ran
// out, runs without run.finished are reported as unfinished, not lost.
func runRows(key, label string, oc outcome, outOfTime, withP90 bool) []Row {
	lat := oc.latencies
	rows := []Row{{Key: key + ".p50", Metric: "submit → finished p50, " + label, Value: ms(lat.percentile(0.50)), Unit: unitMillis}}
	if withP90 {
		rows = append(rows, Row{Key: key + ".p90", Metric: "submit → finished p90, " + label, Value: ms(lat.percentile(0.90)), Unit: unitMillis})
	}
	rows = append(rows, Row{Key: key + ".p99", Metric: "submit → finished p99, " + label, Value: ms(lat.percentile(0.99)), Unit: unitMillis})
	if outOfTime {
		rows = append(rows, Row{Key: key + ".unfinished", Metric: fmt.Sprintf("unfinished when time ran out (of %s), %s", group(float64(oc.submitted)), label), Value: float64(oc.lost), Unit: unitCount})
	} else {
		rows = append(rows, Row{Key: key + ".lost", Metric: fmt.Sprintf("lost runs (of %s), %s", group(float64(oc.submitted)), label), Value: float64(oc.lost), Unit: unitCount}.atMost(0, "0"))
	}
	rows = append(rows, Row{Key: key + ".duplicated", Metric: "runs with two run.finished, " + label, Value: float64(oc.duplicated), Unit: unitCount}.atMost(0, "0"))
	return rows
}

// checkStatuses notes runs that finished with another status than want.
func checkStatuses(s *scenarioRun, label string, oc outcome, want protocol.Status) int {
	var other []string
	n := 0
	for st, count := range oc.statuses {
		if st != want {
			other = append(other, fmt.Sprintf("%d %s", count, st))
			n += count
		}
	}
	if n > 0 {
		sort.Strings(other)
		s.note("%s: %d runs finished %s instead of %s", label, n, strings.Join(other, ", "), want)
	}
	return n
}
