package bench

import (
	"context"
	"fmt"
	"slices"

	"github.com/natsagent/natsagent/internal/protocol"
)

// runStream measures runs whose model streams cfg.StreamDeltas pieces, at
// once and one after the other, at the largest worker concurrency: what a
// run costs per token delta. Each delta is a message.delta event; the
// scenario reports how many events the events stream stored a second and
// the CPU time per delta, so a change in how deltas travel (stored or
// live) shows in both.
func runStream(ctx context.Context, e *env, s *scenarioRun) error {
	cfg := e.cfg
	c := slices.Max(cfg.Concurrency)
	d, err := e.deploy(ctx, "stream")
	if err != nil {
		return err
	}
	defer d.close()
	m, err := d.model(fixed(streamingReply(0, cfg.StreamDeltas)))
	if err != nil {
		return err
	}
	if err := d.startWorkers(ctx, m, c, 1); err != nil {
		return err
	}
	payloads := make([][]byte, cfg.StreamRuns)
	for i := range payloads {
		payloads[i] = request(fmt.Sprintf("t%d", i), fmt.Sprintf("r%d", i), "hi", "")
	}
	e.progress.stage(fmt.Sprintf("stream: %d deltas a run", cfg.StreamDeltas), cfg.StreamRuns)
	meter, err := d.meter(ctx)
	if err != nil {
		return err
	}
	tracks := make([]*track, 0, cfg.StreamRuns)
	for i := range cfg.StreamRuns {
		if ctx.Err() != nil {
			break
		}
		t, err := d.submit(fmt.Sprintf("t%d", i), fmt.Sprintf("r%d", i), payloads[i])
		tracks = append(tracks, t)
		if err != nil {
			return err
		}
	}
	done := d.obs.waitAll(ctx, tracks)
	used := meter.finish(ctx, s)
	oc := d.obs.outcome(tracks)
	if !done {
		s.outOfTime = true
	}
	checkStatuses(s, "stream", oc, protocol.StatusSuccess)
	label := fmt.Sprintf("%d deltas a run, c=%d", cfg.StreamDeltas, c)
	s.add(Row{Key: "stream.throughput", Metric: "throughput, " + label, Value: oc.throughput(), Unit: unitRunsPerSec})
	if rows := used.rowsFor(s, oc, "stream", label, "run", oc.finished); len(rows) > 0 {
		window := oc.last.Sub(oc.first)
		s.add(Row{Key: "stream.events_per_sec", Metric: "events stored a second, " + label, Value: rate(int(used.stored["events"]), window), Unit: unitMsgPerSec})
		if cpu, ok := used.perRun(oc.finished * cfg.StreamDeltas); ok {
			s.add(Row{Key: "stream.cpu_per_delta", Metric: "CPU per delta (whole process), " + label, Value: us(cpu), Unit: unitMicros})
		}
		for _, r := range rows {
			s.add(r)
		}
		if n := float64(used.stored["events"]) / float64(oc.finished); n < float64(cfg.StreamDeltas) {
			s.note("%.1f events stored a run for %d deltas: deltas are live (core NATS), not stored", n, cfg.StreamDeltas)
		}
	}
	for _, r := range runRows("stream", label, oc, !done, false) {
		s.add(r)
	}
	if n := d.publishErrors(); n > 0 {
		s.add(Row{Key: "stream.publish_errors", Metric: "failed publishes", Value: float64(n), Unit: unitCount}.atMost(0, "0"))
	}
	return nil
}
