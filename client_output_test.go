package natsagent_test

import (
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent"
	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/natsagenttest"
)

// TestClient_ReadsALargeOutputFromLastRun: a run whose answer is over the
// 4 KiB a thread's last_run carries, read in the moment between the
// release that wrote last_run and its terminal record (here: a worker that
// died there, its record never written), reads whole through Run and
// Runs, as the gateway reads it: from the checkpoint last_run names.
func TestClient_ReadsALargeOutputFromLastRun(t *testing.T) {
	big := strings.Repeat("0123456789abcdef", 640) // 10 KiB
	d := natsagenttest.Start(t, natsagent.Config{}, natsagenttest.Text(big))
	ctx := bg(t)
	c := d.Client
	if _, err := c.Submit(ctx, natsagent.RunRequest{RunID: "r1", ThreadID: "th1", Input: natsagent.UserInput("write a lot")}); err != nil {
		t.Fatal(err)
	}
	if run, err := c.Wait(ctx, "th1", "r1"); err != nil || run.Status != natsagent.StatusSuccess {
		t.Fatalf("wait: %+v, %v", run, err)
	}
	th, err := c.Thread(ctx, "th1")
	if err != nil {
		t.Fatal(err)
	}
	if th.LastRun == nil || th.LastRun.RunID != "r1" || th.LastRun.Output != nil || th.LastRun.OutputCheckpoint == "" {
		t.Fatalf("last_run %+v: want r1's summary without its output, naming its checkpoint", th.LastRun)
	}
	// The worker's last write, the terminal record, never happened.
	js, err := jetstream.New(d.Conn)
	if err != nil {
		t.Fatal(err)
	}
	runs, err := js.KeyValue(ctx, bus.DefaultNames().RunsBucket())
	if err != nil {
		t.Fatal(err)
	}
	if err := runs.Purge(ctx, protocol.DefaultTenant+".r1"); err != nil {
		t.Fatal(err)
	}

	check := func(what string, run *natsagent.Run) {
		t.Helper()
		if run == nil || run.Status != natsagent.StatusSuccess || run.Output == nil || run.Output.Content != big {
			n := -1
			if run != nil && run.Output != nil {
				n = len(run.Output.Content)
			}
			t.Errorf("%s: %+v with an output of %d bytes, want success with all %d", what, run, n, len(big))
			return
		}
		if run.OutputCheckpoint != "" {
			t.Errorf("%s: output_checkpoint %q stays, though the output was read", what, run.OutputCheckpoint)
		}
	}
	run, err := c.Run(ctx, "r1")
	if err != nil {
		t.Fatal(err)
	}
	check("Run", run)
	list, err := c.Runs(ctx, "th1")
	if err != nil || len(list) != 1 {
		t.Fatalf("Runs: %d runs, %v", len(list), err)
	}
	check("Runs", list[0])
	run, err = c.Wait(ctx, "th1", "r1")
	if err != nil {
		t.Fatal(err)
	}
	check("Wait", run)
}
