package bench

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsagent/natsagent/internal/protocol"
)

// observer follows runs through the public path only: one core
// subscription on the lifecycle events of every run of a deployment. Core
// subscriptions see every publish, so a second run.finished for a run is
// seen even when the events stream deduplicated it.
type observer struct {
	sub    *nats.Subscription
	onDone func()

	mu      sync.Mutex
	runs    map[string]*track
	started int
	dups    int
}

// track is what the observer knows of one run.
type track struct {
	id       string
	submit   time.Time
	started  time.Time
	finish   time.Time
	status   protocol.Status
	finishes int
	done     chan struct{}
}

func newObserver(nc *nats.Conn, subject string, onDone func()) (*observer, error) {
	o := &observer{runs: make(map[string]*track), onDone: onDone}
	sub, err := nc.Subscribe(subject, o.handle)
	if err != nil {
		return nil, err
	}
	// A burst produces events faster than a default subscription buffers:
	// never drop one.
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		return nil, err
	}
	o.sub = sub
	return o, nc.Flush()
}

func (o *observer) close() { _ = o.sub.Unsubscribe() }

func (o *observer) handle(m *nats.Msg) {
	now := time.Now()
	var ev struct {
		Type  string `json:"type"`
		RunID string `json:"run_id"`
		Data  struct {
			Status protocol.Status `json:"status"`
		} `json:"data"`
	}
	if json.Unmarshal(m.Data, &ev) != nil {
		return
	}
	o.mu.Lock()
	t := o.runs[ev.RunID]
	if t == nil {
		o.mu.Unlock()
		return
	}
	finished := false
	switch ev.Type {
	case protocol.EventRunStarted:
		if t.started.IsZero() {
			t.started = now
			o.started++
		}
	case protocol.EventRunFinished:
		t.finishes++
		if t.finishes == 1 {
			t.finish, t.status = now, ev.Data.Status
			finished = true
		} else {
			o.dups++
		}
	}
	o.mu.Unlock()
	if finished {
		close(t.done)
		if o.onDone != nil {
			o.onDone()
		}
	}
}

// expect registers a run about to be submitted and stamps its submit time.
func (o *observer) expect(runID string) *track {
	t := &track{id: runID, done: make(chan struct{})}
	o.mu.Lock()
	o.runs[runID] = t
	t.submit = time.Now()
	o.mu.Unlock()
	return t
}

// wait blocks until t finished or ctx ends.
func (o *observer) wait(ctx context.Context, t *track) bool {
	select {
	case <-t.done:
		return true
	case <-ctx.Done():
		return false
	}
}

// waitAll waits for every run of ts, or until ctx ends.
func (o *observer) waitAll(ctx context.Context, ts []*track) bool {
	for _, t := range ts {
		if !o.wait(ctx, t) {
			return false
		}
	}
	return true
}

// waitStarted waits until n registered runs have started.
func (o *observer) waitStarted(ctx context.Context, n int) bool {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		o.mu.Lock()
		s := o.started
		o.mu.Unlock()
		if s >= n {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
	}
}

// outcome summarizes a set of runs: how many finished, were lost (no
// run.finished yet) or finished twice, and the submit → finished latencies.
type outcome struct {
	submitted, finished, lost, duplicated int
	first, last                           time.Time // first submit, last finish
	latencies                             durations
	statuses                              map[protocol.Status]int
}

func (o *observer) outcome(ts []*track) outcome {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := outcome{submitted: len(ts), statuses: make(map[protocol.Status]int)}
	for _, t := range ts {
		if out.first.IsZero() || t.submit.Before(out.first) {
			out.first = t.submit
		}
		if t.finishes == 0 {
			out.lost++
			continue
		}
		out.finished++
		if t.finishes > 1 {
			out.duplicated++
		}
		out.statuses[t.status]++
		if t.finish.After(out.last) {
			out.last = t.finish
		}
		out.latencies = append(out.latencies, t.finish.Sub(t.submit))
	}
	return out
}

// throughput is finished runs per second from the first submit to the
// last run.finished.
func (oc outcome) throughput() float64 {
	if oc.finished == 0 {
		return 0
	}
	return rate(oc.finished, oc.last.Sub(oc.first))
}

// status returns the status of a finished run ("" before).
func (o *observer) status(t *track) protocol.Status {
	o.mu.Lock()
	defer o.mu.Unlock()
	return t.status
}

// finishTime returns when the first run.finished of t arrived.
func (o *observer) finishTime(t *track) time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	return t.finish
}

// startedCount is how many registered runs have started.
func (o *observer) startedCount() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.started
}
