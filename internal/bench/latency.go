package bench

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// runLatency measures submit → finished of no-op runs one at a time
// (idle), then at a fixed rate (paced), next to the raw JetStream round
// trip (sync publish, fetch, ack) on the same server.
func runLatency(ctx context.Context, e *env, s *scenarioRun) error {
	cfg := e.cfg
	d, err := e.deploy(ctx, "latency")
	if err != nil {
		return err
	}
	defer d.close()
	m, err := d.model(fixed(streamingReply(cfg.ModelLatency, cfg.ModelPieces)))
	if err != nil {
		return err
	}
	c := slices.Max(cfg.Concurrency)
	if err := d.startWorkers(ctx, m, c, 1); err != nil {
		return err
	}

	e.progress.stage("latency: raw JetStream", 0)
	b, err := e.newBaseline(ctx, "latency")
	if err != nil {
		return err
	}
	bctx, cancel := shareOf(ctx, 0.1)
	rt, err := b.roundTrips(bctx, min(cfg.IdleRuns, 1000), request("t0", "r0", "hi", ""))
	cancel()
	b.close()
	if err != nil && err != errOutOfTime {
		return err
	}
	rt50, rt99 := ms(rt.percentile(0.5)), ms(rt.percentile(0.99))
	s.add(Row{Key: "latency.baseline.p50", Metric: fmt.Sprintf("raw JetStream round trip p50 (%d)", len(rt)), Value: rt50, Unit: unitMillis})
	s.add(Row{Key: "latency.baseline.p99", Metric: fmt.Sprintf("raw JetStream round trip p99 (%d)", len(rt)), Value: rt99, Unit: unitMillis})

	// The floor: natsagent's write set with no natsagent code, one run at
	// a time (ceiling.go).
	e.progress.stage("latency: raw floor of the write set", 0)
	fl50, fl99, err := idleFloor(ctx, e, s, min(cfg.IdleRuns, 1000))
	if err != nil {
		return err
	}

	// Warm-up runs (connections, caches, the first KV keys) are not
	// measured.
	e.progress.stage("latency: warm-up", 20)
	for i := range 20 {
		t, err := d.submit(fmt.Sprintf("w%d", i), fmt.Sprintf("w%d", i), request(fmt.Sprintf("w%d", i), fmt.Sprintf("w%d", i), "hi", ""))
		if err != nil {
			return err
		}
		if !waitOne(ctx, d, t) && ctx.Err() != nil {
			return errOutOfTime
		}
	}

	// Idle: one run at a time; it gets at most half of what is left.
	e.progress.stage("latency: idle", cfg.IdleRuns)
	ictx, cancel := shareOf(ctx, 0.5)
	meter, err := d.meter(ctx)
	if err != nil {
		cancel()
		return err
	}
	var idle []*track
	for i := range cfg.IdleRuns {
		if ictx.Err() != nil {
			break
		}
		id := fmt.Sprintf("i%d", i)
		t, err := d.submit(id, id, request(id, id, "hi", ""))
		if err != nil {
			cancel()
			return err
		}
		idle = append(idle, t)
		waitOne(ictx, d, t)
	}
	cancel()
	used := meter.finish(ctx, s)
	oc := d.obs.outcome(idle)
	idleOut := len(idle) < cfg.IdleRuns
	if idleOut {
		s.outOfTime = true
		s.note("idle: %d of %d runs measured before the time ran out", len(idle), cfg.IdleRuns)
	}
	checkStatuses(s, "idle", oc, "success")
	rows := runRows("latency.idle", "idle", oc, false, true)
	rows[0] = rows[0].withBaseline(rt50, unitMillis).atMost(0.5, "≤ 0.5 ms")
	rows[2] = rows[2].withBaseline(rt99, unitMillis).atMost(1.5, "≤ 1.5 ms")
	if fl50 > 0 {
		rows = append(rows,
			Row{Key: "latency.idle.p50_vs_floor", Metric: "idle p50 against the raw floor of its write set", Value: rows[0].Value, Unit: unitMillis}.withBaseline(fl50, unitMillis),
			Row{Key: "latency.idle.p99_vs_floor", Metric: "idle p99 against the raw floor of its write set", Value: rows[2].Value, Unit: unitMillis}.withBaseline(fl99, unitMillis))
		if fl50 > 0.5 {
			s.note("the raw floor of the write set alone took %.2f ms a run (p50), above the 0.5 ms target: no natsagent code meets that target on this machine with this write set", fl50)
		}
	}
	for _, r := range append(rows, used.rowsFor(s, oc, "latency.idle", "idle", "run", oc.finished)...) {
		s.add(r)
	}

	// Paced: an open loop at cfg.PacedRate runs a second, whether or not
	// earlier runs finished.
	e.progress.stage(fmt.Sprintf("latency: %d/s", cfg.PacedRate), cfg.PacedRuns)
	interval := time.Second / time.Duration(cfg.PacedRate)
	var paced []*track
	if meter, err = d.meter(ctx); err != nil {
		return err
	}
	start := time.Now()
	for i := range cfg.PacedRuns {
		if ctx.Err() != nil {
			break
		}
		if wait := time.Until(start.Add(time.Duration(i) * interval)); wait > 0 {
			time.Sleep(wait)
		}
		id := fmt.Sprintf("p%d", i)
		t, err := d.submit(id, id, request(id, id, "hi", ""))
		if err != nil {
			return err
		}
		paced = append(paced, t)
	}
	sent := time.Since(start)
	done := d.obs.waitAll(ctx, paced)
	used = meter.finish(ctx, s)
	oc = d.obs.outcome(paced)
	if !done || len(paced) < cfg.PacedRuns {
		s.outOfTime = true
	}
	checkStatuses(s, "paced", oc, "success")
	s.add(Row{Key: "latency.paced.rate", Metric: fmt.Sprintf("paced: submit rate achieved (%s runs)", group(float64(len(paced)))), Value: rate(len(paced), sent), Unit: unitRunsPerSec})
	label := fmt.Sprintf("%s/s", group(float64(cfg.PacedRate)))
	rows = runRows("latency.paced", label, oc, !done, true)
	rows[0] = rows[0].withBaseline(rt50, unitMillis)
	rows[2] = rows[2].withBaseline(rt99, unitMillis).atMost(3, "≤ 3 ms")
	if fl99, ok := pacedFloor(ctx, e, s, label, c, interval, cfg.PacedRuns); ok {
		rows = append(rows, Row{Key: "latency.paced.p99_vs_floor", Metric: "paced p99 against the raw floor of its write set, " + label, Value: rows[2].Value, Unit: unitMillis}.withBaseline(fl99, unitMillis))
		if fl99 > 3 {
			s.note("the raw floor of the write set alone took %.2f ms (p99) at %s, above the 3 ms target: no natsagent code meets that target on this machine with this write set", fl99, label)
		}
	}
	for _, r := range append(rows, used.rowsFor(s, oc, "latency.paced", label, "run", oc.finished)...) {
		s.add(r)
	}
	if n := d.publishErrors(); n > 0 {
		s.add(Row{Key: "latency.publish_errors", Metric: "failed publishes", Value: float64(n), Unit: unitCount}.atMost(0, "0"))
	}
	return nil
}

// waitOne waits for one run, at most 10s: a run that takes longer counts
// as lost, and the next one is measured.
func waitOne(ctx context.Context, d *deployment, t *track) bool {
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return d.obs.wait(wctx, t)
}

// idleFloor runs the raw ceiling's write set one run at a time (n runs
// after a warm-up) and adds its submit → finished percentiles; 0, 0 when
// the time ran out before any run.
func idleFloor(ctx context.Context, e *env, s *scenarioRun, n int) (p50, p99 float64, err error) {
	c, err := e.newCeiling(ctx, "floor")
	if err != nil {
		return 0, 0, err
	}
	defer c.close()
	fctx, cancel := shareOf(ctx, 0.1)
	defer cancel()
	oc, err := c.idle(fctx, 20, n)
	if err != nil {
		s.note("raw floor: %v", err)
	}
	if len(oc.latencies) == 0 {
		return 0, 0, nil
	}
	p50, p99 = ms(oc.latencies.percentile(0.5)), ms(oc.latencies.percentile(0.99))
	s.add(Row{Key: "latency.floor.p50", Metric: fmt.Sprintf("raw floor of natsagent's write set, one run at a time, p50 (%d)", len(oc.latencies)), Value: p50, Unit: unitMillis})
	s.add(Row{Key: "latency.floor.p99", Metric: fmt.Sprintf("raw floor of natsagent's write set, one run at a time, p99 (%d)", len(oc.latencies)), Value: p99, Unit: unitMillis})
	if oc.lost > 0 {
		s.note("raw floor: %d of %d runs lost", oc.lost, oc.submitted)
	}
	return p50, p99, nil
}

// pacedFloor runs the raw ceiling's write set at the paced rate (runs
// requests, slots at once) and adds its p99; false when no run finished
// in its share of the time.
func pacedFloor(ctx context.Context, e *env, s *scenarioRun, label string, slots int, interval time.Duration, runs int) (float64, bool) {
	e.progress.stage("latency: raw floor of the write set, "+label, 0)
	c, err := e.newCeiling(ctx, "pfloor")
	if err != nil {
		s.note("raw floor, %s: %v", label, err)
		return 0, false
	}
	defer c.close()
	fctx, cancel := shareOf(ctx, 0.5)
	defer cancel()
	oc, _, err := c.run(fctx, c.requests(runs), slots, interval)
	if err != nil {
		s.note("raw floor, %s: %v", label, err)
	}
	if len(oc.latencies) == 0 {
		return 0, false
	}
	p50, p99 := ms(oc.latencies.percentile(0.5)), ms(oc.latencies.percentile(0.99))
	s.add(Row{Key: "latency.paced_floor.p50", Metric: fmt.Sprintf("raw floor of natsagent's write set, %s, p50 (%d)", label, len(oc.latencies)), Value: p50, Unit: unitMillis})
	s.add(Row{Key: "latency.paced_floor.p99", Metric: fmt.Sprintf("raw floor of natsagent's write set, %s, p99 (%d)", label, len(oc.latencies)), Value: p99, Unit: unitMillis})
	return p99, true
}
