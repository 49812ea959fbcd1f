package workerproc

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/protocol"
)

// interval is one execution (a model call or a tool call) of a run in one
// worker process, from its start to its end; an execution its process
// was killed in ends, at the latest, when the process was seen gone.
type interval struct {
	execution
	start, end time.Time
	completed  bool // ended normally (not aborted, not killed)
}

// intervals pairs the log's start lines with their end or abort lines.
// deaths holds when each killed process was gone.
func intervals(t *testing.T, log []execution, deaths map[string]time.Time) []interval {
	t.Helper()
	key := func(e execution) string {
		return fmt.Sprintf("%s|%s|%s|%d|%s|%s", e.Kind, e.Worker, e.Run, e.Step, e.Call, e.Nonce)
	}
	open := map[string]*interval{}
	var out []*interval
	for _, e := range log {
		switch e.Ev {
		case "start":
			iv := &interval{execution: e, start: time.Unix(0, e.T)}
			open[key(e)] = iv
			out = append(out, iv)
		case "end", "abort":
			iv := open[key(e)]
			if iv == nil {
				t.Fatalf("execution log: %s without a start: %+v", e.Ev, e)
			}
			iv.end, iv.completed = time.Unix(0, e.T), e.Ev == "end"
			delete(open, key(e))
		}
	}
	for _, iv := range open {
		death, killed := deaths[iv.Worker]
		if !killed {
			t.Fatalf("%s %s of run %s step %d never ended in the live worker %s", iv.Kind, iv.Call, iv.Run, iv.Step, iv.Worker)
		}
		iv.end = death
	}
	res := make([]interval, len(out))
	for i, iv := range out {
		res[i] = *iv
	}
	return res
}

// Worker processes are killed with SIGKILL at random points of multi-step
// runs (model call, tool, model call, tool, model call, tool, answer),
// again and again, and replaced. Every run finishes, from its last
// checkpoint, with exactly one run.finished and gapless event numbers; no
// run executes in two processes at once; a tool call whose result was
// checkpointed is never executed again, and one executed twice is exactly
// the documented at-least-once case: its first execution completed in a
// process killed before the checkpoint that would have stored its result.
func TestSIGKILLWorkersMidRun(t *testing.T) {
	const (
		runs, threads = 40, 20
		workers       = 3
		concurrency   = 4
		kills         = 20
	)
	d := newDeployment(t, 2*time.Second, 100)
	live := map[string]*proc{}
	next := 0
	spawn := func() {
		id := fmt.Sprintf("w%02d", next)
		next++
		live[id] = d.start(id, concurrency, 5*time.Second)
	}
	for range workers {
		spawn()
	}
	var ids []string
	for i := range runs {
		run, thread := fmt.Sprintf("r%02d", i), fmt.Sprintf("t%02d", i%threads)
		ids = append(ids, run)
		d.submit(thread, run, fmt.Sprintf("run=%s steps=3 model=100-300 tool=100-300", run))
	}

	deaths := map[string]time.Time{}
	midExecution := 0
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	for len(deaths) < kills && !d.finished(ids) {
		time.Sleep(time.Duration(250+rng.IntN(350)) * time.Millisecond)
		// Prefer a process with an execution in flight: that is where a
		// kill hurts. On a starved machine most of a run's time is spent
		// starting processes and waiting on NATS, so wait a moment for
		// one rather than kill whatever is there.
		var candidates, all []string
		for look := time.Now().Add(2 * time.Second); ; {
			busy := map[string]bool{}
			for _, iv := range openExecutions(readLog(t, d.logPath)) {
				busy[iv] = true
			}
			candidates, all = candidates[:0], all[:0]
			for id := range live {
				all = append(all, id)
				if busy[id] {
					candidates = append(candidates, id)
				}
			}
			if len(candidates) > 0 || time.Now().After(look) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if len(candidates) == 0 {
			candidates = all
		} else {
			midExecution++
		}
		sort.Strings(candidates)
		victim := live[candidates[rng.IntN(len(candidates))]]
		deaths[victim.id] = victim.kill()
		delete(live, victim.id)
		spawn()
	}
	d.waitFinished(ids, 90*time.Second)
	if len(deaths) < kills/2 || midExecution < kills/4 {
		t.Fatalf("only %d kills (%d mid-execution) before the runs finished: the test proved little", len(deaths), midExecution)
	}

	for _, run := range ids {
		fin := d.checkEvents(run)
		if want := fmt.Sprintf("done %s after 3 steps", run); fin.Output == nil || fin.Output.Content != want {
			t.Fatalf("run %s answered %+v, want %q", run, fin.Output, want)
		}
		rec, _, err := d.stores.Runs.Get(t.Context(), protocol.DefaultTenant, run)
		if err != nil || rec.Status != protocol.StatusSuccess {
			t.Fatalf("run %s record %+v (%v)", run, rec, err)
		}
	}

	ivs := intervals(t, readLog(t, d.logPath), deaths)
	byRun := map[string][]interval{}
	for _, iv := range ivs {
		byRun[iv.Run] = append(byRun[iv.Run], iv)
	}
	// No run executes in two processes at once. What the lease and the
	// epochs promise is that a run is taken over only after the process
	// that ran it stopped renewing (here: died); so whatever a killed
	// process executed for a run ended before any other process started
	// executing it.
	for run, list := range byRun {
		for i, a := range list {
			for _, b := range list[i+1:] {
				if a.Worker != b.Worker && a.start.Before(b.end) && b.start.Before(a.end) {
					t.Fatalf("run %s executed in two processes at once: %s %s %s-%s and %s %s %s-%s", run,
						a.Worker, a.Kind, a.start.Format("15:04:05.000"), a.end.Format("15:04:05.000"),
						b.Worker, b.Kind, b.start.Format("15:04:05.000"), b.end.Format("15:04:05.000"))
				}
			}
		}
	}

	// Tool calls against the checkpoints.
	toolExecs := map[string][]interval{} // by call id, in start order
	for _, iv := range ivs {
		if iv.Kind == "tool" {
			toolExecs[iv.Call] = append(toolExecs[iv.Call], iv)
		}
	}
	reexecuted := 0
	checkpointed := map[string]bool{} // tool calls of model responses in the chains
	for thread := range threads {
		results, calls := toolResults(d.chain(fmt.Sprintf("t%02d", thread)))
		for call := range calls {
			checkpointed[call] = true
			got := results[call]
			if len(got) != 1 {
				t.Fatalf("tool call %s has %d results in the thread, want 1", call, len(got))
			}
			nonce := strings.TrimPrefix(got[0].msg.Content, "recorded ")
			execs := toolExecs[call]
			if len(execs) == 0 {
				t.Fatalf("tool call %s has a result but never executed", call)
			}
			last := execs[len(execs)-1]
			if last.Nonce != nonce || !last.completed {
				t.Fatalf("tool call %s: the stored result %q is not from its last execution %+v", call, got[0].msg.Content, last)
			}
			for _, e := range execs[:len(execs)-1] {
				// An earlier execution: its process died before a checkpoint
				// stored its result (the result would be in the chain, and
				// the call not run again).
				if _, killed := deaths[e.Worker]; !killed {
					t.Fatalf("tool call %s ran again after %s, which was not killed, ran it", call, e.Worker)
				}
				if e.completed {
					reexecuted++
				}
			}
			// Nothing executed the call after its result was stored.
			for _, e := range execs {
				if e.start.After(got[0].delta.Time) {
					t.Fatalf("tool call %s executed at %s, after checkpoint %s stored its result at %s", call, e.start, got[0].delta.ID, got[0].delta.Time)
				}
			}
		}
	}
	// A tool runs only for a model response already checkpointed: every
	// executed call is in its thread's chain.
	for call := range toolExecs {
		if !checkpointed[call] {
			t.Fatalf("tool call %s executed, but the model response asking for it is in no checkpoint", call)
		}
	}
	d.checkQueuesEmpty()

	takenOver := 0
	for _, run := range ids {
		if len(d.started(run)) > 1 {
			takenOver++
		}
	}
	t.Logf("%d runs, %d kills (%d mid-execution), %d runs continued by another process, %d tool executions repeated (died after the tool, before its checkpoint)",
		runs, len(deaths), midExecution, takenOver, reexecuted)
}

// openExecutions returns the workers with an execution started and not
// yet ended.
func openExecutions(log []execution) []string {
	open := map[string]int{}
	for _, e := range log {
		switch e.Ev {
		case "start":
			open[e.Worker]++
		case "end", "abort":
			open[e.Worker]--
		}
	}
	var out []string
	for w, n := range open {
		if n > 0 {
			out = append(out, w)
		}
	}
	return out
}
