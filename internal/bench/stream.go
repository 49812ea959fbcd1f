package bench

import (
	"context"
	"encoding/json"
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
//
// The same runs go twice, each pass on a deployment of its own: first
// asking for resumable deltas (stream_resumable: true, which stores every
// delta in the events stream, as protocol v1 did for every run), then as
// a run does by default (deltas live, on core NATS). The CPU per run of
// the second against the first is issue 16's streaming target (≥ 40 %
// less), measured in one invocation.
func runStream(ctx context.Context, e *env, s *scenarioRun) error {
	stored, err := streamPass(ctx, e, s, true)
	if err != nil {
		return err
	}
	live, err := streamPass(ctx, e, s, false)
	if err != nil {
		return err
	}
	if stored > 0 && live > 0 {
		label := fmt.Sprintf("%d deltas a run, c=%d", e.cfg.StreamDeltas, slices.Max(e.cfg.Concurrency))
		s.add(Row{Key: "stream.live_vs_stored", Metric: "CPU per run, live deltas against stored ones (stream_resumable), " + label, Value: live, Unit: unitMicros}.
			withBaseline(stored, unitMicros).ratioAtMost(0.6, "≤ 0.60× (40 % less)"))
	}
	return nil
}

// streamPass runs the streaming runs once, with their deltas stored
// (resumable) or live, and returns the CPU per run in µs (0 when it could
// not be read). The live pass's rows are keyed stream.*, the stored
// pass's stream.stored.*.
func streamPass(ctx context.Context, e *env, s *scenarioRun, resumable bool) (float64, error) {
	cfg := e.cfg
	c := slices.Max(cfg.Concurrency)
	key, name, how := "stream", "stream", "live deltas"
	if resumable {
		key, name, how = "stream.stored", "stream-stored", "stored deltas (stream_resumable)"
	}
	d, err := e.deploy(ctx, name)
	if err != nil {
		return 0, err
	}
	defer d.close()
	m, err := d.model(fixed(streamingReply(0, cfg.StreamDeltas)))
	if err != nil {
		return 0, err
	}
	if err := d.startWorkers(ctx, m, c, 1); err != nil {
		return 0, err
	}
	payloads := make([][]byte, cfg.StreamRuns)
	for i := range payloads {
		payloads[i] = streamRequest(fmt.Sprintf("t%d", i), fmt.Sprintf("r%d", i), resumable)
	}
	e.progress.stage(fmt.Sprintf("stream: %d deltas a run, %s", cfg.StreamDeltas, how), cfg.StreamRuns)
	meter, err := d.meter(ctx)
	if err != nil {
		return 0, err
	}
	tracks := make([]*track, 0, cfg.StreamRuns)
	for i := range cfg.StreamRuns {
		if ctx.Err() != nil {
			break
		}
		t, err := d.submit(fmt.Sprintf("t%d", i), fmt.Sprintf("r%d", i), payloads[i])
		tracks = append(tracks, t)
		if err != nil {
			return 0, err
		}
	}
	done := d.obs.waitAll(ctx, tracks)
	used := meter.finish(ctx, s)
	oc := d.obs.outcome(tracks)
	if !done {
		s.outOfTime = true
	}
	checkStatuses(s, key, oc, protocol.StatusSuccess)
	label := fmt.Sprintf("%d deltas a run, %s, c=%d", cfg.StreamDeltas, how, c)
	s.add(Row{Key: key + ".throughput", Metric: "throughput, " + label, Value: oc.throughput(), Unit: unitRunsPerSec})
	var perRun float64
	if rows := used.rowsFor(s, oc, key, label, "run", oc.finished); len(rows) > 0 {
		window := oc.last.Sub(oc.first)
		s.add(Row{Key: key + ".events_per_sec", Metric: "events stored a second, " + label, Value: rate(int(used.stored["events"]), window), Unit: unitMsgPerSec})
		if cpu, ok := used.perRun(oc.finished * cfg.StreamDeltas); ok {
			s.add(Row{Key: key + ".cpu_per_delta", Metric: "CPU per delta (whole process), " + label, Value: us(cpu), Unit: unitMicros})
		}
		if cpu, ok := used.perRun(oc.finished); ok {
			perRun = us(cpu)
		}
		for _, r := range rows {
			s.add(r)
		}
		if n := float64(used.stored["events"]) / float64(oc.finished); !resumable && n < float64(cfg.StreamDeltas) {
			s.note("%.1f events stored a run for %d deltas: deltas are live (core NATS), not stored", n, cfg.StreamDeltas)
		}
	}
	for _, r := range runRows(key, label, oc, !done, false) {
		s.add(r)
	}
	if n := d.publishErrors(); n > 0 {
		s.add(Row{Key: key + ".publish_errors", Metric: "failed publishes, " + how, Value: float64(n), Unit: unitCount}.atMost(0, "0"))
	}
	return perRun, nil
}

// streamRequest is a streaming run's request, asking for resumable
// (stored) deltas or not.
func streamRequest(thread, run string, resumable bool) []byte {
	req := newRequest(thread, run, "hi", "")
	req.StreamResumable = resumable
	data, _ := json.Marshal(req)
	return data
}
