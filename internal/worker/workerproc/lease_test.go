package workerproc

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/testdeploy"
)

// noStaleEvents checks, in stream order, that no event of an older
// attempt was stored after a newer attempt's run.started, and that no
// seq was stored twice. pausedAt, when set, is when the older attempt's
// process was paused: an event it had written to its connection before
// (published before pausedAt) reaches the server only when it resumes,
// and may be stored late; readers drop it by its attempt (such events
// are logged and left out of the seq check, which is the reader's view).
// One published after pausedAt fails the check.
func (d *deployment) noStaleEvents(run string, pausedAt time.Time) {
	d.t.Helper()
	newest := 0
	seen := map[uint64]string{}
	for i, ev := range d.runEvents(run) {
		stale := ev.Type != protocol.EventRunStarted && ev.Type != protocol.EventRunFinished && ev.Type != protocol.EventRunQueued && ev.Attempt < newest
		if stale {
			if pausedAt.IsZero() || !ev.Time.Before(pausedAt) {
				d.t.Fatalf("run %s: event %d (%s, seq %d, published %s) of attempt %d stored after attempt %d's run.started", run, i, ev.Type, ev.Seq, ev.Time, ev.Attempt, newest)
			}
			d.t.Logf("run %s: %s (seq %d) of attempt %d, written to the connection before the pause, stored after attempt %d's run.started; readers drop it",
				run, ev.Type, ev.Seq, ev.Attempt, newest)
			continue
		}
		if prev, dup := seen[ev.Seq]; dup {
			d.t.Fatalf("run %s: seq %d stored twice (%s, then %s of attempt %d)", run, ev.Seq, prev, ev.Type, ev.Attempt)
		}
		seen[ev.Seq] = ev.Type
		if ev.Type == protocol.EventRunStarted {
			if ev.Attempt < newest {
				d.t.Fatalf("run %s: run.started of attempt %d stored after attempt %d's", run, ev.Attempt, newest)
			}
			newest = ev.Attempt
		}
	}
}

// readerView is a run's events as stored, without those a reader drops:
// the events of an attempt older than the newest run.started before them.
func (d *deployment) readerView(run string) []protocol.Event {
	var out []protocol.Event
	newest := 0
	for _, ev := range d.runEvents(run) {
		switch {
		case ev.Type == protocol.EventRunStarted:
			newest = max(newest, ev.Attempt)
		case ev.Type == protocol.EventRunFinished || ev.Type == protocol.EventRunQueued:
		case ev.Attempt < newest:
			continue
		}
		out = append(out, ev)
	}
	return out
}

// checkEventsBySeq checks a finished run's events the way a reader that
// drops superseded attempts' events and sorts the rest by seq sees them
// (an event whose publish a server restart swallowed is sent again after
// later ones): seq from 1 without gaps or repeats, and one run.finished,
// the highest seq and the last stored, with status success.
func (d *deployment) checkEventsBySeq(run string) {
	d.t.Helper()
	evs := d.readerView(run)
	if len(evs) == 0 || evs[len(evs)-1].Type != protocol.EventRunFinished {
		d.t.Fatalf("run %s: run.finished missing or not stored last", run)
	}
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].Seq < evs[j].Seq })
	for i, ev := range evs {
		if ev.Seq != uint64(i+1) {
			d.t.Fatalf("run %s: by seq, event %d (%s) has seq %d: a gap or a repeat", run, i, ev.Type, ev.Seq)
		}
		if ev.Type == protocol.EventRunFinished && i != len(evs)-1 {
			d.t.Fatalf("run %s: run.finished has seq %d, not the highest", run, ev.Seq)
		}
	}
	var fin protocol.FinishedData
	if err := json.Unmarshal(evs[len(evs)-1].Data, &fin); err != nil || fin.Status != protocol.StatusSuccess {
		d.t.Fatalf("run %s ended %+v (%v)", run, fin, err)
	}
}

// overlaps returns, for each run, the model calls of two worker
// processes that ran at the same time (the processes run one attempt of
// a run each).
func overlaps(ivs []interval) []string {
	byRun := map[string][]interval{}
	for _, iv := range ivs {
		if iv.Kind == "model" {
			byRun[iv.Run] = append(byRun[iv.Run], iv)
		}
	}
	var out []string
	for run, calls := range byRun {
		sort.Slice(calls, func(i, j int) bool { return calls[i].start.Before(calls[j].start) })
		for i := range calls {
			for j := i + 1; j < len(calls) && calls[j].start.Before(calls[i].end); j++ {
				if calls[j].Worker != calls[i].Worker {
					out = append(out, fmt.Sprintf("%s: step %d on %s [%s] and step %d on %s [%s]", run,
						calls[i].Step, calls[i].Worker, calls[i].end.Sub(calls[i].start).Round(time.Millisecond),
						calls[j].Step, calls[j].Worker, calls[j].end.Sub(calls[j].start).Round(time.Millisecond)))
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

// logCount counts the lines of a worker process's log holding text.
func logCount(p *proc, text string) int {
	data, err := os.ReadFile(p.errLog)
	if err != nil {
		return 0
	}
	return strings.Count(string(data), text)
}

// Issue 15 (the lease decides): a worker process paused with SIGSTOP in
// the middle of a streaming model call, past its ack wait, loses the run
// to another worker; resumed with SIGCONT while the other worker runs
// it, it stops without publishing anything more of its attempt (its
// model call had deltas to go, and a tool call to ask for), calls the
// model no more, and seq stays unique.
func TestSIGSTOPPastTheLease(t *testing.T) {
	const ackWait = 2 * time.Second
	d := newDeployment(t, ackWait, 10)
	d.warm = true
	procs := map[string]*proc{"a": d.start("a", 2, 5*time.Second), "b": d.start("b", 2, 5*time.Second)}
	d.submit("t1", "r1", "run=r1 steps=3 model=1600 tool=100")

	var holder *proc
	testdeploy.WaitFor(t, 30*time.Second, "the run's second model call to stream", func() bool {
		for _, e := range readLog(t, d.logPath) {
			if e.Run == "r1" && e.Kind == "model" && e.Step == 2 && e.Ev == "start" && time.Since(time.Unix(0, e.T)) > 500*time.Millisecond {
				holder = procs[e.Worker]
				return true
			}
		}
		return false
	})
	paused := holder.pause()
	t.Logf("paused worker %s mid-stream", holder.id)
	testdeploy.WaitFor(t, 30*ackWait, "another worker to take the run over", func() bool { return len(d.started("r1")) >= 2 })
	takeover := d.started("r1")[1]
	if takeover.Worker == holder.id || takeover.Attempt != 2 {
		t.Fatalf("run.started %+v after pausing %s", takeover.StartedData, holder.id)
	}
	// Resume the paused worker while the new attempt runs: its model
	// call's timers, its heartbeat and its fence all come due at once.
	testdeploy.WaitFor(t, 30*time.Second, "the new attempt's model call", func() bool {
		return d.logHas(func(e execution) bool {
			return e.Run == "r1" && e.Kind == "model" && e.Worker == takeover.Worker && e.Ev == "start"
		})
	})
	resumed := holder.resume()
	d.waitFinished([]string{"r1"}, 60*time.Second)
	// The paused call's pieces were all due when the worker resumed: it
	// ends at once, or is stopped first.
	testdeploy.WaitFor(t, 10*time.Second, "the resumed worker's model call to end", func() bool {
		return d.logHas(func(e execution) bool {
			return e.Run == "r1" && e.Worker == holder.id && e.Kind == "model" && e.Step == 2 && (e.Ev == "abort" || e.Ev == "end")
		})
	})
	// Whatever the resumed worker would still publish has had time to be
	// stored by now.
	time.Sleep(time.Second)

	d.noStaleEvents("r1", paused)
	d.checkEventsBySeq("r1")
	for _, e := range readLog(t, d.logPath) {
		if e.Worker == holder.id && e.Ev == "start" && time.Unix(0, e.T).After(paused) {
			t.Fatalf("the paused worker started a %s call (step %d) %s after it was resumed", e.Kind, e.Step, time.Unix(0, e.T).Sub(resumed))
		}
	}
	if n := len(d.started("r1")); n != 2 {
		t.Fatalf("%d attempts, want 2", n)
	}
	t.Logf("takeover %s after the pause; the paused worker's log: %d dropped-events warnings, %d fence stops, %d lease-lost stops",
		takeover.at.Sub(paused).Round(time.Millisecond), logCount(holder, "its events are dropped"),
		logCount(holder, "lease not renewed in time"), logCount(holder, "another worker owns it now"))
}

// Issue 15: a NATS server killed with SIGKILL under running runs and
// started again on its file store hands the requests that have been
// running longer than the ack wait to workers again at once (it keeps no
// record of their in-progress signals). The lease decides: a second
// delivery waits while the first attempt keeps renewing its lease, so no
// two attempts of a run call the model at the same time, and every run
// finishes once with its events in order.
func TestServerKilledUnderRunningRuns(t *testing.T) {
	const ackWait = 6 * time.Second
	srv := startServerProc(t)
	d := newDeploymentOn(t, srv.URL(), ackWait, 20)
	d.warm = true
	a := d.start("a", 4, 5*time.Second)
	b := d.start("b", 4, 5*time.Second)
	var runs []string
	for i := range 8 {
		r := fmt.Sprintf("r%d", i)
		runs = append(runs, r)
		d.submit("t-"+r, r, fmt.Sprintf("run=%s steps=10 model=500-900 tool=100-300", r))
	}
	testdeploy.WaitFor(t, 60*time.Second, "every run to call the model", func() bool {
		started := map[string]bool{}
		for _, e := range readLog(t, d.logPath) {
			if e.Kind == "model" && e.Ev == "start" {
				started[e.Run] = true
			}
		}
		return len(started) == len(runs)
	})
	// Past the ack wait since every delivery: the restarted server
	// redelivers them all at once.
	time.Sleep(ackWait + time.Second)
	killed := time.Now()
	srv.kill()
	time.Sleep(300 * time.Millisecond)
	srv.start()
	t.Logf("server killed and back in %s", time.Since(killed).Round(time.Millisecond))

	d.waitFinished(runs, 3*time.Minute)
	time.Sleep(time.Second) // anything late is stored by now
	ivs := intervals(t, readLog(t, d.logPath), nil)
	if o := overlaps(ivs); len(o) > 0 {
		t.Fatalf("two attempts of a run called the model at the same time:\n%s", strings.Join(o, "\n"))
	}
	retaken := 0
	for _, r := range runs {
		d.noStaleEvents(r, time.Time{})
		d.checkEventsBySeq(r)
		if len(d.started(r)) > 1 {
			retaken++
		}
	}
	t.Logf("%d of %d runs had a second attempt; deliveries that waited for a lease to lapse: %d on a, %d on b",
		retaken, len(runs), logCount(a, "still holds the thread's lease"), logCount(b, "still holds the thread's lease"))
}

// Issue 15: the server hands a request to a worker again while the
// worker running it is alive and renewing its lease (as after a server
// restart, or when a consumer's leader moves with a lost node): here the
// test does it by answering each run's first in-progress signal with a
// Nak, so the server delivers the request again at once. The new
// delivery waits, its request kept in progress, while the lease is
// renewed; the first attempt finishes the run; no two deliveries call
// the model at the same time, and no run is started twice.
func TestEarlyRedeliveryWaitsForTheLease(t *testing.T) {
	const ackWait = 3 * time.Second
	d := newDeployment(t, ackWait, 20)
	d.warm = true
	a := d.start("a", 4, 5*time.Second)
	b := d.start("b", 4, 5*time.Second)

	// The in-progress signals go to $JS.ACK.<stream>.<consumer>.<...>;
	// a Nak on the same subject redelivers the request.
	var mu sync.Mutex
	nakked := map[string]bool{}
	sub, err := d.nc.Subscribe("$JS.ACK."+d.settings.Names.RunsStream()+"."+bus.RunsConsumer+".>", func(m *nats.Msg) {
		if string(m.Data) != "+WPI" {
			return
		}
		// <delivered>.<stream seq>.<...>: one Nak per request.
		tokens := strings.Split(strings.TrimPrefix(m.Subject, "$JS.ACK."+d.settings.Names.RunsStream()+"."+bus.RunsConsumer+"."), ".")
		if len(tokens) < 2 {
			return
		}
		mu.Lock()
		first := !nakked[tokens[1]]
		nakked[tokens[1]] = true
		mu.Unlock()
		if first {
			_ = d.nc.Publish(m.Subject, []byte("-NAK"))
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()

	var runs []string
	for i := range 4 {
		r := fmt.Sprintf("r%d", i)
		runs = append(runs, r)
		d.submit("t-"+r, r, fmt.Sprintf("run=%s steps=4 model=500-800 tool=100-200", r))
	}
	d.waitFinished(runs, 2*time.Minute)
	time.Sleep(time.Second) // anything late is stored by now
	mu.Lock()
	if len(nakked) != len(runs) {
		t.Fatalf("%d requests were delivered again early, want %d", len(nakked), len(runs))
	}
	mu.Unlock()
	ivs := intervals(t, readLog(t, d.logPath), nil)
	if o := overlaps(ivs); len(o) > 0 {
		t.Fatalf("two deliveries of a run called the model at the same time:\n%s", strings.Join(o, "\n"))
	}
	for _, r := range runs {
		d.noStaleEvents(r, time.Time{})
		d.checkEventsBySeq(r)
		if st := d.started(r); len(st) != 1 {
			t.Fatalf("%s started %d times (%+v): the early delivery did not wait for the lease", r, len(st), st)
		}
	}
	waited := logCount(a, "still holds the thread's lease") + logCount(b, "still holds the thread's lease")
	if waited == 0 {
		t.Fatal("no delivery waited for a lease: the requests were not delivered again while they ran")
	}
	t.Logf("deliveries that waited for a lease to lapse: %d", waited)
	d.checkQueuesEmpty()
}
