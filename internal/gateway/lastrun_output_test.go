package gateway

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/model/openaitest"
	"github.com/natsagent/natsagent/internal/protocol"
)

// TestRunReadsALargeOutputFromLastRun: a run whose answer is over the
// 4 KiB a thread's last_run carries, read between the release that wrote
// last_run and its terminal record (its worker died there: the record is
// gone), reads whole through GET /threads/{id}/runs/{run_id} and the
// thread's run list, as the Go client's Run and Runs read it.
func TestRunReadsALargeOutputFromLastRun(t *testing.T) {
	big := strings.Repeat("0123456789abcdef", 640) // 10 KiB
	llm := openaitest.NewServer(t, func(*openaitest.Request) openaitest.Reply { return openaitest.Text(big) })
	m, err := model.NewOpenAI(model.OpenAIConfig{BaseURL: llm.URL(), Model: "test"})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, m)
	rec := e.do("POST", "/threads/t1/runs/wait?format=natsagent", with(input("write a lot"), "run_id", "r1")).expect(t, http.StatusOK).run(t)
	if rec.Status != protocol.StatusSuccess {
		t.Fatalf("r1 %+v", rec)
	}
	th, _, err := e.stores.Threads.Get(context.Background(), protocol.DefaultTenant, "t1")
	if err != nil || th.LastRun == nil || th.LastRun.Output != nil || th.LastRun.OutputCheckpoint == "" {
		t.Fatalf("last_run %+v, %v: want r1's summary without its output, naming its checkpoint", th, err)
	}
	runs, err := e.js.KeyValue(context.Background(), e.settings.Names.RunsBucket())
	if err != nil {
		t.Fatal(err)
	}
	if err := runs.Purge(context.Background(), protocol.DefaultTenant+".r1"); err != nil {
		t.Fatal(err)
	}

	check := func(what string, run protocol.Run) {
		t.Helper()
		if run.Status != protocol.StatusSuccess || run.Output == nil || run.Output.Content != big || run.OutputCheckpoint != "" {
			n := -1
			if run.Output != nil {
				n = len(run.Output.Content)
			}
			t.Errorf("%s: %s with an output of %d bytes, output_checkpoint %q; want success with all %d",
				what, run.Status, n, run.OutputCheckpoint, len(big))
		}
	}
	check("GET run", e.do("GET", "/threads/t1/runs/r1?format=natsagent", nil).expect(t, http.StatusOK).run(t))
	var list []protocol.Run
	e.do("GET", "/threads/t1/runs?format=natsagent", nil).expect(t, http.StatusOK).decode(t, &list)
	if len(list) != 1 {
		t.Fatalf("%d runs listed, want r1", len(list))
	}
	check("the run list", list[0])
}
