package bench

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// A throughput on a shared, noisy machine moves with whatever else runs
// there; the CPU a run costs and the messages it stores do not. So every
// measured window is also metered: the whole process's CPU time (server,
// workers and clients are all in it) and what each stream of the
// deployment stored, counted by its last sequence, which grows by one
// per stored message whatever the retention later removes (a work-queue
// ack, a KV key's older revision).

// meter measures one window of a scenario.
type meter struct {
	js     jetstream.JetStream
	prefix string
	cpu0   time.Duration
	cpuOK  bool
	seqs0  map[string]uint64
}

// cost is what one window used.
type cost struct {
	// counted is false when the streams could not be read.
	counted bool
	cpu     time.Duration
	cpuOK   bool
	// stored is the messages stored per asset (see assetOf) during the
	// window.
	stored map[string]uint64
}

// startMeter reads the streams of the deployment named prefix, once the
// writes of what ran before have landed, and the process's CPU time.
func startMeter(ctx context.Context, js jetstream.JetStream, prefix string) (*meter, error) {
	seqs, err := settledSeqs(ctx, js, prefix)
	if err != nil {
		return nil, err
	}
	m := &meter{js: js, prefix: prefix, seqs0: seqs}
	m.cpu0, m.cpuOK = processCPU()
	return m, nil
}

// settleFor bounds how long a reading waits for the writes already
// started (a run's usage is written after its run.finished) to land.
const settleFor = 3 * time.Second

// stop returns the CPU time and the stored messages since startMeter,
// once the deployment's streams stop growing.
func (m *meter) stop(ctx context.Context) (cost, error) {
	seqs, err := settledSeqs(ctx, m.js, m.prefix)
	if err != nil {
		return cost{}, err
	}
	c := cost{counted: true, stored: storedSince(m.seqs0, seqs, m.prefix)}
	if cpu, ok := processCPU(); ok && m.cpuOK {
		c.cpu, c.cpuOK = cpu-m.cpu0, true
	}
	return c, nil
}

// settledSeqs reads lastSeqs until two readings settlePoll apart agree,
// at most settleFor.
func settledSeqs(ctx context.Context, js jetstream.JetStream, prefix string) (map[string]uint64, error) {
	const settlePoll = 100 * time.Millisecond
	deadline := time.Now().Add(settleFor)
	seqs, err := lastSeqs(ctx, js, prefix)
	for err == nil && time.Now().Before(deadline) && sleepCtx(ctx, settlePoll) {
		var next map[string]uint64
		if next, err = lastSeqs(ctx, js, prefix); err == nil && maps.Equal(next, seqs) {
			break
		}
		seqs = next
	}
	return seqs, err
}

// finish is stop for the end of a scenario's window: it reads the
// streams even when ctx ran out (the window's time is what ran out, not
// the server's), and notes a failure on s instead of failing the
// scenario.
func (m *meter) finish(ctx context.Context, s *scenarioRun) cost {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleFor+10*time.Second)
	defer cancel()
	c, err := m.stop(sctx)
	if err != nil {
		s.note("could not count the stored messages: %v", err)
	}
	return c
}

// lastSeqs returns the last sequence of every stream of the deployment
// named prefix: its streams, and the KV_ and OBJ_ streams of its buckets.
func lastSeqs(ctx context.Context, js jetstream.JetStream, prefix string) (map[string]uint64, error) {
	out := map[string]uint64{}
	lister := js.ListStreams(ctx)
	for info := range lister.Info() {
		if assetOf(prefix, info.Config.Name) != "" {
			out[info.Config.Name] = info.State.LastSeq
		}
	}
	if err := lister.Err(); err != nil {
		return nil, fmt.Errorf("list streams: %w", err)
	}
	return out, nil
}

// storedSince is the messages each asset stored between two readings of
// lastSeqs. A stream created meanwhile counts from zero.
func storedSince(before, after map[string]uint64, prefix string) map[string]uint64 {
	out := map[string]uint64{}
	for stream, last := range after {
		if first := before[stream]; last > first {
			out[assetOf(prefix, stream)] += last - first
		}
	}
	return out
}

// assetOf names a stream of the deployment named prefix by what it holds:
// "runs_stream" (run requests), "events", "dlq", "jobs", "kv_<bucket>"
// for a KV bucket (kv_runs, kv_threads, kv_checkpoints, kv_usage, ...),
// "obj_<bucket>" for an object store; "" for another deployment's stream.
func assetOf(prefix, stream string) string {
	p, s := strings.ToLower(prefix)+"_", strings.ToLower(stream)
	switch {
	case strings.HasPrefix(s, "kv_"+p):
		return "kv_" + strings.TrimPrefix(s, "kv_"+p)
	case strings.HasPrefix(s, "obj_"+p):
		return "obj_" + strings.TrimPrefix(s, "obj_"+p)
	case s == p+"runs":
		return "runs_stream"
	case strings.HasPrefix(s, p):
		return strings.TrimPrefix(s, p)
	}
	return ""
}

// total is every message stored.
func (c cost) total() uint64 {
	var n uint64
	for _, v := range c.stored {
		n += v
	}
	return n
}

// perRun is the CPU time per unit of work (a run, a delta).
func (c cost) perRun(n int) (time.Duration, bool) {
	if !c.cpuOK || n <= 0 {
		return 0, false
	}
	return c.cpu / time.Duration(n), true
}

// rowsFor are rows for the runs of oc, n units of work; none when a run
// did not finish (its writes and CPU time would count against the
// finished ones), which s notes.
func (c cost) rowsFor(s *scenarioRun, oc outcome, key, label, unit string, n int) []Row {
	if !c.counted {
		return nil
	}
	if oc.lost > 0 {
		s.note("%s: no CPU or stored figures: %d of %d runs did not finish", label, oc.lost, oc.submitted)
		return nil
	}
	return c.rows(key, label, unit, n)
}

// rows are the CPU time and the stored messages per unit of work (what is
// one "run"), keyed key.cpu_per_<unit> and key.stored_per_<unit>; the
// stored row breaks the figure down by asset.
func (c cost) rows(key, label, unit string, n int) []Row {
	if n <= 0 {
		return nil
	}
	var rows []Row
	if cpu, ok := c.perRun(n); ok {
		rows = append(rows, Row{Key: key + ".cpu_per_" + unit, Metric: fmt.Sprintf("CPU per %s (whole process), %s", unit, label), Value: us(cpu), Unit: unitMicros})
	}
	breakdown := map[string]float64{}
	var parts []string
	for _, asset := range slices.Sorted(maps.Keys(c.stored)) {
		v := float64(c.stored[asset]) / float64(n)
		breakdown[asset] = v
		parts = append(parts, fmt.Sprintf("%s %s", asset, formatPerRun(v)))
	}
	rows = append(rows, Row{
		Key:       key + ".stored_per_" + unit,
		Metric:    fmt.Sprintf("stored msgs per %s, %s (%s)", unit, label, strings.Join(parts, ", ")),
		Value:     float64(c.total()) / float64(n),
		Unit:      unitMsgs,
		Breakdown: breakdown,
	})
	return rows
}
