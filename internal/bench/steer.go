package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
)

func runSteer(ctx context.Context, e *env, s *scenarioRun) error {
	return preempt(ctx, e, s, false)
}

func runCancel(ctx context.Context, e *env, s *scenarioRun) error {
	return preempt(ctx, e, s, true)
}

// preempt measures how fast a run that is streaming a model answer stops.
// Each sample starts a run on a fresh thread, waits for its first
// message.delta, then either publishes a steer run on the same thread or
// sends the NATS cancel request, and times until the first run's
// run.finished (steered or cancelled). Samples run cfg.SteerParallel at a
// time.
func preempt(ctx context.Context, e *env, s *scenarioRun, cancel bool) error {
	cfg := e.cfg
	name, want := "steer", protocol.StatusSteered
	if cancel {
		name, want = "cancel", protocol.StatusCancelled
	}
	d, err := e.deploy(ctx, name)
	if err != nil {
		return err
	}
	defer d.close()
	// "stream" answers slowly, anything else (the steer run) at once.
	words := strings.TrimSpace(strings.Repeat("token ", cfg.SteerPieces))
	slow := model.Reply{Text: words, Pieces: cfg.SteerPieces, Delay: cfg.SteerPieceDelay, PieceDelay: cfg.SteerPieceDelay}
	m, err := d.model(func(req *model.Request) model.Reply {
		if req.LastUserContent() == "stream" {
			return slow
		}
		return streamingReply(0, 1)
	})
	if err != nil {
		return err
	}
	// Each sample holds up to two slots (the streaming run and the steer run).
	if err := d.startWorkers(ctx, m, max(slices.Max(cfg.Concurrency), 2*cfg.SteerParallel), 1); err != nil {
		return err
	}

	perSample := 2 // the streaming run and the steer run
	if cancel {
		perSample = 1
	}
	e.progress.stage(name, perSample*cfg.SteerRuns)
	var (
		mu       sync.Mutex
		lat      durations
		active   []*track
		all      []*track
		wrong    int
		failures []string
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(failures) < 5 {
			failures = append(failures, fmt.Sprintf(format, args...))
		}
	}
	meter, err := d.meter(ctx)
	if err != nil {
		return err
	}
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range max(cfg.SteerParallel, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				a, b, l, err := sample(ctx, d, i, cancel)
				mu.Lock()
				if a != nil {
					active = append(active, a)
					all = append(all, a)
				}
				if b != nil {
					all = append(all, b)
				}
				if err == nil {
					lat = append(lat, l)
					if st := d.obs.status(a); st != want {
						wrong++
					}
				}
				mu.Unlock()
				if err != nil && ctx.Err() == nil {
					fail("sample %d: %v", i, err)
				}
			}
		}()
	}
feed:
	for i := range cfg.SteerRuns {
		select {
		case jobs <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(jobs)
	wg.Wait()

	// Everything submitted must end, the steer runs included.
	done := d.obs.waitAll(ctx, all)
	used := meter.finish(ctx, s)
	oc := d.obs.outcome(all)
	if ctx.Err() != nil {
		s.outOfTime = true
		s.note("%d of %d samples measured before the time ran out", len(lat), cfg.SteerRuns)
	}
	for _, f := range failures {
		s.note("%s", f)
	}
	what := "steer published → steered run.finished"
	if cancel {
		what = "cancel request → cancelled run.finished"
	}
	s.add(Row{Key: name + ".p50", Metric: fmt.Sprintf("%s p50 (%d)", what, len(lat)), Value: ms(lat.percentile(0.50)), Unit: unitMillis})
	s.add(Row{Key: name + ".p90", Metric: what + " p90", Value: ms(lat.percentile(0.90)), Unit: unitMillis})
	s.add(Row{Key: name + ".p99", Metric: what + " p99", Value: ms(lat.percentile(0.99)), Unit: unitMillis}.atMost(50, "≤ 50 ms"))
	s.add(Row{Key: name + ".wrong_status", Metric: fmt.Sprintf("streaming runs not ended %s", want), Value: float64(wrong), Unit: unitCount}.atMost(0, "0"))
	rows := runRows(name+".runs", "all runs", oc, !done, false)
	for _, r := range rows[2:] {
		s.add(r)
	}
	// Per sample: the streaming run (cut short) and, for steer, the steer run.
	for _, r := range used.rowsFor(s, oc, name, fmt.Sprintf("%s of a streaming run", name), "sample", len(active)) {
		s.add(r)
	}
	if len(lat) < len(active) {
		s.note("%d samples failed before their measurement", len(active)-len(lat))
	}
	return nil
}

// sample runs one steer or cancel measurement. It returns the streaming
// run, the steer run (nil for cancel) and the time from the steer publish
// or cancel request to the streaming run's run.finished.
func sample(ctx context.Context, d *deployment, i int, cancel bool) (*track, *track, time.Duration, error) {
	thread, active, steer := fmt.Sprintf("h%d", i), fmt.Sprintf("a%d", i), fmt.Sprintf("s%d", i)
	tenant := protocol.DefaultTenant
	sctx, stop := context.WithTimeout(ctx, 20*time.Second)
	defer stop()

	// Token deltas are live (core NATS, not stored).
	deltas, err := d.obsNC.SubscribeSync(d.names.LiveSubject(tenant, thread, active, protocol.KindMessages))
	if err != nil {
		return nil, nil, 0, err
	}
	defer func() { _ = deltas.Unsubscribe() }()
	if err := d.obsNC.Flush(); err != nil {
		return nil, nil, 0, err
	}
	a, err := d.submit(thread, active, request(thread, active, "stream", ""))
	if err != nil {
		return a, nil, 0, err
	}
	if _, err := deltas.NextMsgWithContext(sctx); err != nil {
		return a, nil, 0, fmt.Errorf("no message.delta from the streaming run: %w", err)
	}
	var b *track
	t0 := time.Now()
	if cancel {
		reply, err := d.pubNC.RequestWithContext(sctx, d.names.CancelSubject(tenant, thread, active), nil)
		if err != nil {
			return a, nil, 0, fmt.Errorf("cancel request: %w", err)
		}
		var cr protocol.CancelReply
		if code := reply.Header.Get("Nats-Service-Error-Code"); code != "" {
			return a, nil, 0, fmt.Errorf("cancel refused (%s): %s", code, reply.Header.Get("Nats-Service-Error"))
		}
		if err := json.Unmarshal(reply.Data, &cr); err != nil {
			return a, nil, 0, fmt.Errorf("cancel reply: %w", err)
		}
	} else {
		b, err = d.submit(thread, steer, request(thread, steer, "steer", protocol.StrategySteer))
		if err != nil {
			return a, b, 0, err
		}
	}
	if !d.obs.wait(sctx, a) {
		return a, b, 0, fmt.Errorf("the streaming run did not finish within 20s")
	}
	return a, b, d.obs.finishTime(a).Sub(t0), nil
}
