package workerproc

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/testdeploy"
)

// logHas reports whether the execution log has a line matching match.
func (d *deployment) logHas(match func(execution) bool) bool {
	for _, e := range readLog(d.t, d.logPath) {
		if match(e) {
			return true
		}
	}
	return false
}

func (d *deployment) count(match func(execution) bool) int {
	n := 0
	for _, e := range readLog(d.t, d.logPath) {
		if match(e) {
			n++
		}
	}
	return n
}

// SIGTERM to a worker with runs in flight: it stops pulling at once (runs
// submitted once it is stopping never start on it), its runs stop at the
// next safe boundary (a streaming model call is aborted: nothing was
// executed), are checkpointed and handed back, and the process exits well
// within its grace. Another worker continues them at once, not after the
// ack wait, and does not run again the tools they completed.
func TestSIGTERMHandsRunsBack(t *testing.T) {
	// An ack wait far beyond the test's bounds: a request that was not
	// handed back would come back only after it.
	const ackWait = 20 * time.Second
	d := newDeployment(t, ackWait, 10)
	d.warm = true
	a := d.start("a", 2, 5*time.Second)
	for _, r := range []string{"r1", "r2"} {
		d.submit("t-"+r, r, fmt.Sprintf("run=%s steps=2 model=1500 tool=100", r))
	}
	inStep2 := func(run string) func(execution) bool {
		return func(e execution) bool { return e.Run == run && e.Kind == "model" && e.Step == 2 && e.Ev == "start" }
	}
	testdeploy.WaitFor(t, 20*time.Second, "both runs in their second model call", func() bool {
		return d.logHas(inStep2("r1")) && d.logHas(inStep2("r2"))
	})

	term := a.term()
	aborted := func(run string) func(execution) bool {
		return func(e execution) bool { return e.Run == run && e.Kind == "model" && e.Ev == "abort" && e.Worker == "a" }
	}
	testdeploy.WaitFor(t, 5*time.Second, "the streaming model calls to be aborted", func() bool {
		return d.logHas(aborted("r1")) && d.logHas(aborted("r2"))
	})
	// The worker is visibly stopping: what is submitted now must not
	// start on it.
	later := []string{"r3", "r4", "r5", "r6"}
	for _, r := range later {
		d.submit("t-"+r, r, fmt.Sprintf("run=%s steps=1 model=50 tool=50", r))
	}
	if err := a.wait(t, 5*time.Second); err != nil {
		t.Fatalf("worker exited with %v after SIGTERM", err)
	}
	if took := a.exitAt.Sub(term); took > 3*time.Second {
		t.Fatalf("worker took %s to stop with nothing long in flight", took)
	}
	// Handed back at a safe boundary: the completed first step is in
	// the thread, and the thread is still the run's, for the next
	// delivery to take over.
	for _, r := range []string{"r1", "r2"} {
		results, _ := toolResults(d.chain("t-" + r))
		if len(results) != 1 {
			t.Fatalf("%s: %d tool results checkpointed at hand-back, want 1", r, len(results))
		}
		th, _, err := d.stores.Threads.Get(t.Context(), protocol.DefaultTenant, "t-"+r)
		if err != nil || th.Lease == nil || th.Lease.RunID != r {
			t.Fatalf("%s: thread lease after hand-back %+v (%v)", r, th.Lease, err)
		}
	}

	b := d.start("b", 4, 5*time.Second)
	all := append([]string{"r1", "r2"}, later...)
	d.waitFinished(all, 15*time.Second)
	for _, r := range all {
		d.checkEvents(r)
		for _, s := range d.started(r) {
			if s.Worker == "a" && !s.at.Before(term) {
				t.Fatalf("%s started on the stopping worker at %s, after SIGTERM at %s", r, s.at, term)
			}
		}
	}
	for _, r := range []string{"r1", "r2"} {
		st := d.started(r)
		if len(st) != 2 || st[0].Worker != "a" || st[1].Worker != "b" || st[1].Attempt != 2 {
			t.Fatalf("%s started %+v, want on a then on b (attempt 2)", r, st)
		}
		if wait := st[1].at.Sub(b.ready); wait > 3*time.Second {
			t.Fatalf("%s continued %s after the next worker started: it was not handed back (ack wait %s)", r, wait, ackWait)
		}
		step1 := func(e execution) bool { return e.Run == r && e.Kind == "tool" && e.Step == 1 && e.Ev == "start" }
		if n := d.count(step1); n != 1 {
			t.Fatalf("%s: the checkpointed first tool call ran %d times", r, n)
		}
	}
	d.checkQueuesEmpty()
}

// A run whose tool outlives the grace is cancelled at the deadline and
// still handed back: the process exits just after its grace, and the next
// worker finishes the run at once. The tool call cut short is answered
// with an error result (the run was stopped) and is not run again.
func TestSIGTERMGraceExpires(t *testing.T) {
	const ackWait = 20 * time.Second
	d := newDeployment(t, ackWait, 10)
	d.warm = true
	const grace = time.Second
	a := d.start("a", 2, grace)
	d.submit("t1", "r1", "run=r1 steps=2 model=50 tool=50 hang=1")
	toolStarted := func(e execution) bool { return e.Run == "r1" && e.Kind == "tool" && e.Step == 1 && e.Ev == "start" }
	testdeploy.WaitFor(t, 10*time.Second, "the long tool to start", func() bool { return d.logHas(toolStarted) })

	term := a.term()
	if err := a.wait(t, grace+5*time.Second); err != nil {
		t.Fatalf("worker exited with %v after SIGTERM", err)
	}
	if took := a.exitAt.Sub(term); took < grace || took > grace+3*time.Second {
		t.Fatalf("worker stopped %s after SIGTERM, want just after its %s grace", took, grace)
	}
	cut := func(e execution) bool { return e.Run == "r1" && e.Kind == "tool" && e.Step == 1 && e.Ev == "abort" }
	if !d.logHas(cut) {
		t.Fatal("the tool was not cancelled at the grace deadline")
	}

	b := d.start("b", 2, 5*time.Second)
	d.waitFinished([]string{"r1"}, 10*time.Second)
	fin := d.checkEvents("r1")
	if fin.Output == nil || fin.Output.Content != "done r1 after 2 steps" {
		t.Fatalf("r1 answered %+v", fin.Output)
	}
	st := d.started("r1")
	if len(st) != 2 || st[1].Worker != "b" || st[1].at.Sub(b.ready) > 3*time.Second {
		t.Fatalf("r1 started %+v; b was ready at %s: not handed back", st, b.ready)
	}
	if n := d.count(toolStarted); n != 1 {
		t.Fatalf("the cancelled tool call ran %d times", n)
	}
	results, _ := toolResults(d.chain("t1"))
	var stopped int
	for _, rs := range results {
		if m := rs[0].msg; m.Status == model.ToolStatusError && strings.Contains(m.Content, "was not completed") {
			stopped++
		}
	}
	if stopped != 1 {
		t.Fatalf("%d tool results record the cut call, want 1: %+v", stopped, results)
	}
	d.checkQueuesEmpty()
}

// A hand-back is not lost with the connection that carried it: the
// stopping worker's connection drops as it is told to stop, so its Nak
// waits in the client for the next connection (a process that exited
// then took it along). The worker exits once the server confirmed the
// hand-back, and the run goes to the next worker at once, not after the
// ack wait.
func TestSIGTERMHandBackSurvivesDroppedConnection(t *testing.T) {
	const ackWait = 60 * time.Second
	d := newDeployment(t, ackWait, 10)
	d.warm = true
	workers := map[string]*proc{"a": d.start("a", 1, 5*time.Second), "c": d.start("c", 1, 5*time.Second)}
	// r1 holds thread t1 on one worker; r2, of the same thread, is held
	// by the other, waiting for the thread: handing it back writes
	// nothing but the Nak.
	d.submit("t1", "r1", "run=r1 steps=1 model=4000 tool=50")
	var holder string
	testdeploy.WaitFor(t, 20*time.Second, "r1's model call", func() bool {
		for _, e := range readLog(t, d.logPath) {
			if e.Run == "r1" && e.Kind == "model" && e.Ev == "start" {
				holder = e.Worker
				return true
			}
		}
		return false
	})
	d.submit("t1", "r2", "run=r2 steps=1 model=50 tool=50")
	testdeploy.WaitFor(t, 10*time.Second, "r2 to wait for its thread", func() bool { return len(d.runEvents("r2")) > 0 })
	stopping := "a"
	if holder == "a" {
		stopping = "c"
	}
	d.dropConnection("workerproc-" + stopping)
	term := workers[stopping].term()
	if err := workers[stopping].wait(t, 15*time.Second); err != nil {
		t.Fatalf("worker exited with %v after SIGTERM", err)
	}
	testdeploy.WaitFor(t, 20*time.Second, fmt.Sprintf("r2 to finish (a lost hand-back comes back only after the ack wait, %s)", ackWait), func() bool {
		return d.finished([]string{"r1", "r2"})
	})
	for _, r := range []string{"r1", "r2"} {
		d.checkEvents(r)
	}
	if st := d.started("r2"); len(st) != 1 || st[0].Worker != holder || st[0].at.Sub(term) > 15*time.Second {
		t.Fatalf("r2 started %+v; SIGTERM at %s: want once, on %s", st, term, holder)
	}
	d.checkQueuesEmpty()
}

// dropConnection closes a client's connection from the server's side, as
// a node restart or a network fault does; the client reconnects after its
// reconnect wait.
func (d *deployment) dropConnection(name string) {
	d.t.Helper()
	cz, err := d.srv.Server.Connz(&server.ConnzOptions{})
	if err != nil {
		d.t.Fatal(err)
	}
	for _, c := range cz.Conns {
		if c.Name == name {
			if err := d.srv.Server.DisconnectClientByID(c.Cid); err != nil {
				d.t.Fatal(err)
			}
			return
		}
	}
	d.t.Fatalf("no connection named %s", name)
}
