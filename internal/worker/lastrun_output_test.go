package worker

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/model/openaitest"
	"github.com/natsagent/natsagent/internal/protocol"
)

// bigOutput is an answer well over what a thread's last_run carries.
var bigOutput = strings.Repeat("0123456789abcdef", 640) // 10 KiB

// dieAfterRelease starts a worker whose model answers r1 with bigOutput
// and which dies (its connection closed, nothing cleaned up) right after
// r1's release gave the thread back with its last_run, before r1's
// record: the moment finishFromLastRun and recordOverwritten exist for.
// It returns once the release is stored.
func dieAfterRelease(t *testing.T, h *harness) {
	t.Helper()
	dieAfterReleaseOf(t, h, model.NewScripted(func(int, *model.Request) model.Reply {
		return model.Reply{Text: bigOutput}
	}), "write a lot")
	th := h.threadRecord(protocol.DefaultTenant, "t1")
	if th.LastRun.Output != nil || th.LastRun.OutputCheckpoint == "" {
		t.Fatalf("last_run %+v: want r1's summary without its 10 KiB output, naming its checkpoint", th.LastRun)
	}
}

// dieAfterReleaseOf is dieAfterRelease with m answering r1's input.
func dieAfterReleaseOf(t *testing.T, h *harness, m model.Model, input string) {
	t.Helper()
	var wh *workerHandle
	died := make(chan struct{})
	var once atomic.Bool
	testHookReleased = func(j *job) {
		if j.req.RunID == "r1" && once.CompareAndSwap(false, true) {
			wh.nc.Close()
			close(died)
		}
	}
	t.Cleanup(func() { testHookReleased = nil })
	wh = h.startWorker(m, nil)
	h.submit(request("t1", "r1", input))
	select {
	case <-died:
	case <-time.After(60 * time.Second):
		t.Fatal("r1 never released its thread")
	}
	th := h.threadRecord(protocol.DefaultTenant, "t1")
	if th.LastRun == nil || th.LastRun.RunID != "r1" {
		t.Fatalf("last_run %+v: want r1's summary", th.LastRun)
	}
	if _, _, err := h.stores.Runs.Get(context.Background(), protocol.DefaultTenant, "r1"); err == nil {
		t.Fatal("r1 has a record: the worker died too late")
	}
}

func checkFullOutput(t *testing.T, what string, out *model.Message) {
	t.Helper()
	if out == nil || out.Content != bigOutput {
		n := -1
		if out != nil {
			n = len(out.Content)
		}
		t.Fatalf("%s: output of %d bytes, want the whole %d", what, n, len(bigOutput))
	}
}

// TestRunFinishedFromLastRunKeepsALargeOutput: a run whose worker died
// between its release and its record is finished by its redelivery from
// last_run, which leaves a 10 KiB output out; the record, run.finished
// and the view meanwhile carry all of it, read from the run's checkpoint.
func TestRunFinishedFromLastRunKeepsALargeOutput(t *testing.T) {
	h := newHarness(t)
	w := h.watch(protocol.DefaultTenant, "t1", "r1")
	dieAfterRelease(t, h)
	v, _, err := h.stores.RunView(context.Background(), protocol.DefaultTenant, "t1", "r1")
	if err != nil || v.Status != protocol.StatusSuccess {
		t.Fatalf("view %+v, %v", v, err)
	}
	checkFullOutput(t, "the view from last_run", v.Output)

	calls := startCountingWorker(h)
	d := w.finished(t, 60*time.Second)
	if d.Status != protocol.StatusSuccess {
		t.Fatalf("r1 ended %s: %s", d.Status, d.Error)
	}
	checkFullOutput(t, "run.finished", d.Output)
	rec := h.run(protocol.DefaultTenant, "r1")
	checkFullOutput(t, "the record", rec.Output)
	if rec.OutputCheckpoint != "" {
		t.Fatalf("the record keeps output_checkpoint %q", rec.OutputCheckpoint)
	}
	if n := calls.Load(); n != 0 {
		t.Fatalf("the model was called %d times: r1 ran again", n)
	}
}

// TestSteerRecordsALargeOutputOfTheDeadRun: the same dead run, whose
// last_run a steer run replaces: the steer's release records the dead run
// first (or the dead run's redelivery does, should it come back first),
// with all of its output.
func TestSteerRecordsALargeOutputOfTheDeadRun(t *testing.T) {
	const ackWait = 8 * time.Second
	h := newHarnessWith(t, bus.Settings{AckWait: ackWait, MaxDeliver: 5})
	w1 := h.watch(protocol.DefaultTenant, "t1", "r1")
	dieAfterRelease(t, h)

	w2 := h.watch(protocol.DefaultTenant, "t1", "r2")
	steer := request("t1", "r2", "second")
	steer.MultitaskStrategy = protocol.StrategySteer
	h.submit(steer)
	h.startWorker(model.NewScripted(func(int, *model.Request) model.Reply {
		return model.Reply{Text: "steered"}
	}), nil)
	if d := w2.finished(t, 60*time.Second); d.Status != protocol.StatusSuccess {
		t.Fatalf("steer run %+v", d)
	}
	d := w1.finished(t, 10*ackWait)
	if d.Status != protocol.StatusSuccess {
		t.Fatalf("r1 ended %s: %s", d.Status, d.Error)
	}
	checkFullOutput(t, "r1's run.finished", d.Output)
	checkFullOutput(t, "r1's record", h.run(protocol.DefaultTenant, "r1").Output)
}

// TestRunFinishedFromLastRunKeepsALargeInterrupt: the same dead run,
// interrupted for the approval of a call with 10 KiB of arguments. Its
// last_run leaves the interrupt out (and the output, the message with
// that call) and names its checkpoint; the view, the record and
// run.finished written from last_run carry the whole interrupt, read
// there, so a person can still decide on the call.
func TestRunFinishedFromLastRunKeepsALargeInterrupt(t *testing.T) {
	h := newHarness(t)
	var writes recordingTool
	writes.register(h, "write_file")
	args := `{"path":"/big.txt","content":"` + bigOutput + `"}`
	_, m := strictModel(t, func(req *openaitest.Request) openaitest.Reply {
		return openaitest.Reply{ToolCalls: []openaitest.Call{{ID: "w1", Name: "write_file", Arguments: args}}}
	})
	w := h.watch(protocol.DefaultTenant, "t1", "r1")
	dieAfterReleaseOf(t, h, m, "write a big file")
	th := h.threadRecord(protocol.DefaultTenant, "t1")
	if th.LastRun.Status != protocol.StatusInterrupted || th.LastRun.Interrupt != nil || th.LastRun.OutputCheckpoint == "" {
		t.Fatalf("last_run %+v: want r1 interrupted, without its 10 KiB interrupt, naming its checkpoint", th.LastRun)
	}
	checkInterrupt := func(what string, intr *protocol.Interrupt) {
		t.Helper()
		if intr == nil || intr.Kind != protocol.InterruptApproval || len(intr.ActionRequests) != 1 ||
			intr.ActionRequests[0].ToolCallID != "w1" || intr.ActionRequests[0].Arguments != args {
			t.Fatalf("%s: interrupt %+v, want the approval of w1 with its %d bytes of arguments", what, intr, len(args))
		}
	}
	v, _, err := h.stores.RunView(context.Background(), protocol.DefaultTenant, "t1", "r1")
	if err != nil || v.Status != protocol.StatusInterrupted {
		t.Fatalf("view %+v, %v", v, err)
	}
	checkInterrupt("the view from last_run", v.Interrupt)
	if v, err = h.stores.RunOfThread(context.Background(), protocol.DefaultTenant, "t1", "r1"); err != nil {
		t.Fatal(err)
	}
	checkInterrupt("the thread's view from last_run (the gateway's)", v.Interrupt)
	checkFullArgs := func(what string, out *model.Message) {
		t.Helper()
		if out == nil || len(out.ToolCalls) != 1 || out.ToolCalls[0].Arguments != args {
			t.Fatalf("%s: output %+v, want the message with the call", what, out)
		}
	}
	checkFullArgs("the thread's view from last_run", v.Output)

	calls := startCountingWorker(h)
	d := w.finished(t, 60*time.Second)
	if d.Status != protocol.StatusInterrupted {
		t.Fatalf("r1 ended %s: %s", d.Status, d.Error)
	}
	checkInterrupt("run.finished", d.Interrupt)
	rec := h.run(protocol.DefaultTenant, "r1")
	checkInterrupt("the record", rec.Interrupt)
	checkFullArgs("the record", rec.Output)
	if rec.OutputCheckpoint != "" {
		t.Fatalf("the record keeps output_checkpoint %q", rec.OutputCheckpoint)
	}
	if n := calls.Load(); n != 0 {
		t.Fatalf("the model was called %d times: r1 ran again", n)
	}
	if got := writes.calls(); len(got) != 0 {
		t.Fatalf("write_file ran %d times before anyone approved it", len(got))
	}
}

// startCountingWorker starts the worker that takes the run over after the
// first died; its model counts the calls a run settled from last_run must
// not make.
func startCountingWorker(h *harness) *atomic.Int32 {
	var calls atomic.Int32
	h.startWorker(model.NewScripted(func(int, *model.Request) model.Reply {
		calls.Add(1)
		return model.Reply{Text: "ran again"}
	}), nil)
	return &calls
}
