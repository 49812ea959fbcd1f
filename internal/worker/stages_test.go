package worker

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/model/openaitest"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/testdeploy"
)

// The sequential round trips a no-op run waits for between its delivery
// and its ack: its stages (operations.md, "What a run costs"). Each is a
// wait on the server that the next write needs; the latency of a run is
// about this many round trips, so the count must not grow back unseen.
const (
	// A run a plain publish sent, on a new thread: look ∥ lease,
	// checkpoint, release, terminal record, run.finished.
	stagesNewThread = 5
	// The same on a thread an earlier run left idle: look, lease,
	// checkpoint, release, terminal record, run.finished.
	stagesIdleThread = 6
)

// TestRunStages counts a no-op run's stages with a proxy that lets the
// server's answers reach the worker in rounds (natstest.Lockstep): a
// request that needs an answer waits for the next round. A loaded machine
// can only add rounds (a request sent late), so the fewest of a few tries
// is the count.
func TestRunStages(t *testing.T) {
	h := newHarnessWith(t, bus.Settings{AckWait: 30 * time.Second})
	proxy := natstest.NewLockstep(t, h.srv.URL())
	h.workerURL = proxy.URL()
	_, m := strictModel(t, func(*openaitest.Request) openaitest.Reply { return openaitest.Text("ok") })
	h.startWorker(m, func(c *Config) { c.Concurrency = 1 })

	// Warm: the worker's first run loads what later runs find ready.
	warm := h.watch(protocol.DefaultTenant, "warm", "warm")
	h.submit(request("warm", "warm", "hi"))
	if fin := warm.finished(t, time.Minute); fin.Status != protocol.StatusSuccess {
		t.Fatalf("warm-up run %s: %s", fin.Status, fin.Error)
	}

	cons, err := h.js.Consumer(context.Background(), h.names.RunsStream(), bus.RunsConsumer)
	if err != nil {
		t.Fatal(err)
	}
	count := func(t *testing.T, thread, run string) int {
		t.Helper()
		// The previous run's ack is out first: it comes after its
		// run.finished, and counted in this run's rounds it would end
		// them at once (0 stages).
		testdeploy.WaitFor(t, time.Minute, "the previous run's request acked", func() bool {
			info, err := cons.Info(context.Background())
			return err == nil && info.NumAckPending == 0 && info.NumPending == 0
		})
		w := h.watch(protocol.DefaultTenant, thread, run)
		proxy.Hold()
		seq := h.submit(request(thread, run, "hi"))
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		// The run's request is acked once the run ended: +ACK on its
		// delivery's ack subject (an in-progress signal is +WPI),
		// $JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.... Its
		// own: the previous run's ack follows its run.finished, and on a
		// loaded machine came in this run's first round, which then
		// counted 0 stages.
		ackOf := "$JS.ACK." + h.names.RunsStream() + "." + bus.RunsConsumer + "."
		rounds, err := proxy.Rounds(ctx, 150*time.Millisecond, func(p natstest.Pub) bool {
			rest, ok := strings.CutPrefix(p.Subject, ackOf)
			tok := strings.Split(rest, ".")
			return ok && len(tok) > 1 && tok[1] == strconv.FormatUint(seq, 10) && bytes.HasPrefix(p.Data, []byte("+ACK"))
		})
		proxy.Release()
		if err != nil {
			t.Fatalf("run %s was not acked: %v", run, err)
		}
		if fin := w.finished(t, time.Minute); fin.Status != protocol.StatusSuccess {
			t.Fatalf("run %s ended %s: %s", run, fin.Status, fin.Error)
		}
		// Round 1 delivered the request; each round after it answered
		// one stage.
		t.Logf("run %s: %d stages:\n%s", run, rounds-1, roundsText(proxy.Pubs(), rounds))
		return rounds - 1
	}
	fewest := func(t *testing.T, thread string, first bool) int {
		t.Helper()
		n := -1
		for try := range 3 {
			th := fmt.Sprintf("%s%d", thread, try)
			if !first {
				// A first run leaves the thread idle.
				count(t, th, th+"-a")
			}
			got := count(t, th, th+"-b")
			if n < 0 || got < n {
				n = got
			}
		}
		return n
	}
	t.Run("new thread", func(t *testing.T) {
		if n := fewest(t, "new", true); n != stagesNewThread {
			t.Errorf("a run on a new thread waits for %d stages, want %d (fewer: lower the figure here and in operations.md)", n, stagesNewThread)
		}
	})
	t.Run("idle thread", func(t *testing.T) {
		if n := fewest(t, "idle", false); n != stagesIdleThread {
			t.Errorf("a run on an idle thread waits for %d stages, want %d (fewer: lower the figure here and in operations.md)", n, stagesIdleThread)
		}
	})
}

// roundsText lists the subjects the worker published in each round up to
// last, for a failure to show where the stages went.
func roundsText(pubs []natstest.Pub, last int) string {
	var b strings.Builder
	for r := 1; r <= last; r++ {
		fmt.Fprintf(&b, "  %d:", r)
		for _, p := range pubs {
			if p.Round == r && !strings.HasPrefix(p.Subject, "$JS.API.CONSUMER.MSG.NEXT.") {
				fmt.Fprintf(&b, " %s", p.Subject)
			}
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// Two requests of a new thread delivered together: both may take the
// thread's lease beside their reads (guessLease), and the younger must
// give it back. Whichever way the race goes, the older run goes first and
// is not refused (its strategy is reject: a lease it mistook for another
// run's would refuse it), the younger follows, and the thread counts two
// leases (the one given back left no trace).
func TestGuessedLeaseKeepsOrder(t *testing.T) {
	// A long ack wait: a run stalled by a loaded machine is not taken
	// over (a second attempt and lease), which the counts below exclude.
	h := newHarnessWith(t, bus.Settings{AckWait: 30 * time.Second})
	var watchers [][2]*watcher
	for i := range 8 {
		thread := fmt.Sprintf("pair%d", i)
		old, young := request(thread, thread+"-old", "first"), request(thread, thread+"-young", "second")
		old.MultitaskStrategy = protocol.StrategyReject
		watchers = append(watchers, [2]*watcher{h.watch(protocol.DefaultTenant, thread, old.RunID), h.watch(protocol.DefaultTenant, thread, young.RunID)})
		h.submit(old)
		h.submit(young)
	}
	h.startWorker(textModel("ok", 1, 0), func(c *Config) { c.Concurrency = 16 })
	for i, w := range watchers {
		thread := fmt.Sprintf("pair%d", i)
		oldFin, youngFin := w[0].finished(t, time.Minute), w[1].finished(t, time.Minute)
		if oldFin.Status != protocol.StatusSuccess || youngFin.Status != protocol.StatusSuccess {
			t.Fatalf("%s: older run %s (%s), younger %s (%s)", thread, oldFin.Status, oldFin.Error, youngFin.Status, youngFin.Error)
		}
		oldRec, youngRec := h.view(protocol.DefaultTenant, thread, thread+"-old"), h.view(protocol.DefaultTenant, thread, thread+"-young")
		if youngRec.StartedAt.Before(*oldRec.FinishedAt) {
			t.Errorf("%s: the younger run started at %s, before the older one finished at %s", thread, youngRec.StartedAt, oldRec.FinishedAt)
		}
		if oldRec.Attempt != 1 || youngRec.Attempt != 1 {
			t.Errorf("%s: attempts %d and %d, want 1 each", thread, oldRec.Attempt, youngRec.Attempt)
		}
		th, _, err := h.stores.Threads.Get(context.Background(), protocol.DefaultTenant, thread)
		if err != nil {
			t.Fatal(err)
		}
		if th.Lease != nil || th.Epoch != 2 || strings.Join(th.RecentRuns, ",") != thread+"-old,"+thread+"-young" {
			t.Errorf("%s: thread lease %+v, epoch %d, recent runs %v; want no lease, epoch 2, the two runs in order", thread, th.Lease, th.Epoch, th.RecentRuns)
		}
	}
}
