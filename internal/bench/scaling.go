package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// runScaling starts 1, 2, 4... worker processes (each with
// cfg.ScalingConcurrency slots and a model taking cfg.ScalingLatency, so
// the model dominates), submits enough runs to keep them busy for about
// cfg.ScalingBusy, and reports runs/s and the ratio to one process.
func runScaling(ctx context.Context, e *env, s *scenarioRun) error {
	cfg := e.cfg
	if len(cfg.WorkerCommand) == 0 {
		s.note("skipped: no worker command to start worker processes with")
		return nil
	}
	procs := slices.Clone(cfg.ScalingProcs)
	slices.Sort(procs)
	procs = slices.Compact(procs)
	var base float64
	for i, n := range procs {
		if ctx.Err() != nil {
			s.outOfTime = true
			break
		}
		lctx, cancel := shareOf(ctx, 1/float64(len(procs)-i))
		thr, rows, out, err := scalingStep(lctx, e, s, n)
		cancel()
		if err != nil {
			return err
		}
		if out {
			s.outOfTime = true
		}
		row := Row{Key: fmt.Sprintf("scaling.p%d.throughput", n), Metric: fmt.Sprintf("throughput, %s × %d slots (model-bound: %s/s)", plural(n, "process", "processes"), cfg.ScalingConcurrency, group(float64(n*cfg.ScalingConcurrency)/cfg.ScalingLatency.Seconds())), Value: thr, Unit: unitRunsPerSec}
		if i == 0 {
			base = thr
		}
		if base > 0 {
			row = row.withBaseline(base, unitRunsPerSec)
		}
		s.add(row)
		if i > 0 && base > 0 {
			r := Row{Key: fmt.Sprintf("scaling.p%d.speedup", n), Metric: fmt.Sprintf("speed-up, %d processes vs %d", n, procs[0]), Value: thr / base, Unit: unitTimes}
			if n == 4 && procs[0] == 1 {
				r = r.atLeast(3.5, "≥ 3.5×")
			}
			s.add(r)
		}
		for _, r := range rows {
			s.add(r)
		}
	}
	return nil
}

func scalingStep(ctx context.Context, e *env, s *scenarioRun, n int) (float64, []Row, bool, error) {
	cfg := e.cfg
	d, err := e.deploy(ctx, fmt.Sprintf("scale%d", n))
	if err != nil {
		return 0, nil, false, err
	}
	defer d.close()
	url, err := d.modelURL(fixed(streamingReply(cfg.ScalingLatency, 1)))
	if err != nil {
		return 0, nil, false, err
	}
	e.progress.stage(fmt.Sprintf("scaling: %d proc start", n), 0)
	errs := make([]error, n)
	children := make([]*child, n)
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			children[i], errs[i] = d.startChildLocked(ctx, &mu, childSpec{id: fmt.Sprintf("scale%d-%d", n, i), concurrency: cfg.ScalingConcurrency, latency: cfg.ScalingLatency, modelURL: url})
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return 0, nil, false, err
		}
	}
	if err := d.waitPulling(ctx, n); err != nil {
		return 0, nil, false, err
	}
	runs := n * cfg.ScalingConcurrency * max(int(cfg.ScalingBusy/cfg.ScalingLatency), 1)
	payloads := make([][]byte, runs)
	for i := range payloads {
		payloads[i] = request(fmt.Sprintf("t%d", i), fmt.Sprintf("r%d", i), "hi", "")
	}
	e.progress.stage(fmt.Sprintf("scaling: %d proc", n), runs)
	meter, err := d.meter(ctx)
	if err != nil {
		return 0, nil, false, err
	}
	childCPU0, childErr := childrenCPU(children)
	var tracks []*track
	for i := range runs {
		if ctx.Err() != nil {
			break
		}
		t, err := d.submit(fmt.Sprintf("t%d", i), fmt.Sprintf("r%d", i), payloads[i])
		tracks = append(tracks, t)
		if err != nil {
			return 0, nil, false, err
		}
	}
	done := d.obs.waitAll(ctx, tracks)
	used := meter.finish(ctx, s)
	childCPU1, err := childrenCPU(children)
	if childErr == nil && err == nil {
		// The workers run in their own processes: their CPU time counts.
		used.cpu += childCPU1 - childCPU0
	} else {
		used.cpuOK = false
		s.note("no CPU figure for %d processes: %v", n, errors.Join(childErr, err))
	}
	oc := d.obs.outcome(tracks)
	checkStatuses(s, fmt.Sprintf("%d processes", n), oc, "success")
	rows := runRows(fmt.Sprintf("scaling.p%d", n), fmt.Sprintf("%d proc", n), oc, !done, false)
	rows = append(rows[2:], used.rowsFor(s, oc, fmt.Sprintf("scaling.p%d", n), fmt.Sprintf("%d proc (bench and worker processes)", n), "run", oc.finished)...)
	return oc.throughput(), rows, !done, nil
}

// childrenCPU is the CPU time the worker processes used so far.
func childrenCPU(children []*child) (time.Duration, error) {
	var sum time.Duration
	for _, c := range children {
		d, err := procCPU(c.pid())
		if err != nil {
			return 0, err
		}
		sum += d
	}
	return sum, nil
}

// startChildLocked starts a worker process; mu guards the deployment's
// closers when processes start concurrently.
func (d *deployment) startChildLocked(ctx context.Context, mu *sync.Mutex, spec childSpec) (*child, error) {
	// startChild appends to d.closers; serialize that part only by
	// starting under the lock and waiting for readiness outside it.
	mu.Lock()
	c, err := d.startChildAsync(spec)
	mu.Unlock()
	if err != nil {
		return nil, err
	}
	return c, c.ready(ctx, spec.id)
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
