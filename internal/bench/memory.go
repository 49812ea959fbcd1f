package bench

import (
	"context"
	"fmt"
	"runtime"
	"time"
)

// runMemory starts one worker process with cfg.MemoryRuns slots and a
// model that takes cfg.MemoryLatency, reads its resident set size idle,
// submits cfg.MemoryRuns runs, waits until every one has started (so all
// are in flight, waiting for the model), and reads it again.
func runMemory(ctx context.Context, e *env, s *scenarioRun) error {
	cfg := e.cfg
	if len(cfg.WorkerCommand) == 0 {
		s.note("skipped: no worker command to start a worker process with")
		return nil
	}
	if runtime.GOOS != "linux" {
		s.note("resident set size is read from /proc: only the Go heap figures are available on %s", runtime.GOOS)
	}
	d, err := e.deploy(ctx, "memory")
	if err != nil {
		return err
	}
	defer d.close()
	url, err := d.modelURL(fixed(streamingReply(cfg.MemoryLatency, 1)))
	if err != nil {
		return err
	}
	e.progress.stage("memory: start", 0)
	c, err := d.startChild(ctx, childSpec{id: "memory", concurrency: cfg.MemoryRuns, latency: cfg.MemoryLatency, modelURL: url})
	if err != nil {
		return err
	}
	if err := d.waitPulling(ctx, 1); err != nil {
		return err
	}
	settle(ctx, 300*time.Millisecond)
	idleRSS, rssErr := rssKiB(c.pid())
	idle, err := c.stats(ctx)
	if err != nil {
		return fmt.Errorf("worker process stats: %w", err)
	}

	e.progress.stage("memory: in flight", cfg.MemoryRuns)
	var tracks []*track
	for i := range cfg.MemoryRuns {
		id := fmt.Sprintf("m%d", i)
		t, err := d.submit(id, id, request(id, id, "hi", ""))
		if err != nil {
			return err
		}
		tracks = append(tracks, t)
	}
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
				e.progress.set(d.obs.startedCount())
			}
		}
	}()
	started := d.obs.waitStarted(ctx, cfg.MemoryRuns)
	close(stop)
	n := d.obs.startedCount()
	e.progress.set(n)
	if !started {
		s.outOfTime = true
		s.note("%d of %d runs had started when the time ran out; the figures are per started run", n, cfg.MemoryRuns)
	}
	if n == 0 {
		return errOutOfTime
	}
	// Let every run reach its model call.
	settle(ctx, 500*time.Millisecond)
	loadedRSS, rssErr2 := rssKiB(c.pid())
	loaded, err := c.stats(ctx)
	if err != nil {
		return fmt.Errorf("worker process stats: %w", err)
	}
	if oc := d.obs.outcome(tracks); oc.finished > 0 {
		s.note("%d runs finished before the measurement: raise --memory-latency so runs stay in flight", oc.finished)
	}
	per := float64(n)
	if rssErr == nil && rssErr2 == nil {
		s.add(Row{Key: "memory.rss_idle", Metric: "worker process RSS, idle", Value: idleRSS, Unit: unitKiB})
		s.add(Row{Key: "memory.rss_loaded", Metric: fmt.Sprintf("worker process RSS, %s runs in flight", group(float64(n))), Value: loadedRSS, Unit: unitKiB})
		s.add(Row{Key: "memory.rss_per_run", Metric: "RSS per in-flight run", Value: (loadedRSS - idleRSS) / per, Unit: unitKiB}.atMost(32, "≤ 32 KiB"))
	} else {
		s.note("RSS not available: %v", firstErr(rssErr, rssErr2))
	}
	s.add(Row{Key: "memory.heap_per_run", Metric: "Go heap live per in-flight run (after GC)", Value: (float64(loaded.HeapAlloc) - float64(idle.HeapAlloc)) / per / 1024, Unit: unitKiB})
	s.add(Row{Key: "memory.stack_per_run", Metric: "goroutine stacks per in-flight run", Value: (float64(loaded.StackInuse) - float64(idle.StackInuse)) / per / 1024, Unit: unitKiB})
	s.add(Row{Key: "memory.goroutines_per_run", Metric: "goroutines per in-flight run", Value: float64(loaded.Goroutines-idle.Goroutines) / per, Unit: "goroutines/run"})
	return nil
}

func settle(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
