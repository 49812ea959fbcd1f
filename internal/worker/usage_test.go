package worker

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/testdeploy"
	"github.com/natsagent/natsagent/internal/tools"
)

// usageOfEvents decodes the call usage the run's message.completed
// events carry (meta.usage; protocol v1 published it as usage.model).
func usageOfEvents(t *testing.T, w *watcher) []protocol.UsageModelData {
	t.Helper()
	var out []protocol.UsageModelData
	for _, ev := range w.all() {
		if ev.Type == protocol.EventUsageModel {
			t.Fatalf("protocol v2 publishes no %s", ev.Type)
		}
		if ev.Type != protocol.EventMessageCompleted {
			continue
		}
		var m struct {
			ID   string `json:"id"`
			Meta struct {
				Usage *protocol.UsageModelData `json:"usage"`
			} `json:"meta"`
		}
		if err := json.Unmarshal(ev.Data, &m); err != nil {
			t.Fatal(err)
		}
		if m.Meta.Usage != nil {
			m.Meta.Usage.MessageID = m.ID
			out = append(out, *m.Meta.Usage)
		}
	}
	return out
}

func (h *harness) usageOfThread(t *testing.T, tenant, thread string) *protocol.ThreadUsage {
	t.Helper()
	var th *protocol.ThreadUsage
	testdeploy.WaitFor(t, 10*time.Second, "thread usage", func() bool {
		var err error
		rec, _, err := h.stores.Threads.Get(context.Background(), tenant, thread)
		if err != nil || rec.Usage == nil {
			return false
		}
		th, err = h.stores.Usage.ThreadOf(context.Background(), rec)
		return err == nil
	})
	return th
}

// A worker dies after a model call was checkpointed; the worker that
// takes the run over continues from that checkpoint. The call made before
// the crash counts once in the run's totals on its record and in the
// thread's totals on the thread record (protocol v2: nothing goes to the
// usage bucket); the call cut by the crash never
// completed and counts nowhere.
func TestUsage_RedeliveredRunCountsCheckpointedCallOnce(t *testing.T) {
	h := newRedeliveryHarness(t) // the dead worker's run is redelivered
	h.tools.Register(tools.Func(model.ToolSpec{Name: "side_effect"}, func(ctx context.Context, _ json.RawMessage) (string, error) {
		return "done", nil
	}))
	stuck := make(chan struct{})
	cached := 64
	dying := model.NewScripted(func(n int, req *model.Request) model.Reply {
		if n == 0 {
			return model.Reply{Text: "working", ToolCalls: []model.ToolCall{{ID: "c1", Name: "side_effect", Arguments: "{}"}},
				Usage: &model.Usage{PromptTokens: 100, CompletionTokens: 10, CachedTokens: &cached}}
		}
		close(stuck)
		return model.Reply{Delay: time.Hour, Usage: &model.Usage{PromptTokens: 5000, CompletionTokens: 500}}
	})
	a := h.startWorker(dying, nil)
	w := h.watch("default", "t1", "r1")
	h.submit(request("t1", "r1", "do the thing"))
	natstest.Recv(t, stuck, "the second model call of run r1")
	a.nc.Close()

	healthy := model.NewScripted(func(n int, req *model.Request) model.Reply {
		return model.Reply{Text: "finished", Usage: &model.Usage{PromptTokens: 200, CompletionTokens: 20}}
	})
	h.startWorker(healthy, nil)
	if fin := w.finished(t, 20*time.Second); fin.Status != protocol.StatusSuccess {
		t.Fatalf("run ended %s: %s", fin.Status, fin.Error)
	}

	rec := h.run("default", "r1")
	if rec.Usage == nil {
		t.Fatal("no usage on the run record")
	}
	check := func(what string, u protocol.UsageTotals) {
		t.Helper()
		if u.Input != 300 || u.Output != 30 || u.Calls != 2 || u.Main.Calls != 2 || u.Cached == nil || *u.Cached != cached || u.CachedCalls != 1 || u.Models["scripted"].Main.Input != 300 {
			t.Fatalf("%s: %+v", what, u)
		}
	}
	check("record", rec.Usage.Total)
	if !rec.Usage.Final || rec.Usage.RunID != "r1" || rec.Usage.ThreadID != "t1" {
		t.Fatalf("record usage %+v", rec.Usage)
	}
	th := h.usageOfThread(t, "default", "t1")
	check("thread", th.Total)
	if _, _, err := h.stores.Usage.Run(context.Background(), "default", "r1"); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("the run's usage went to the usage bucket too: %v", err)
	}
	if _, _, err := h.stores.Usage.Thread(context.Background(), "default", "t1"); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("the thread's usage went to the usage bucket too: %v", err)
	}
	ru, err := h.stores.Usage.RunOf(context.Background(), rec)
	if err != nil {
		t.Fatal(err)
	}
	check("run as read", ru.Total)

	// Each completed call published its usage event once, the one before
	// the crash by the worker that made it.
	evs := usageOfEvents(t, w)
	if len(evs) != 2 || evs[0].InputTokens != 100 || evs[1].InputTokens != 200 || evs[0].CachedTokens == nil {
		t.Fatalf("usage events %+v", evs)
	}
	for _, ev := range evs {
		if ev.Context.Tokens <= 0 || ev.Context.Window != 128000 || ev.Purpose != protocol.PurposeMain {
			t.Fatalf("usage event %+v", ev)
		}
	}

	// The next run on the thread adds its own, once.
	w2 := h.watch("default", "t1", "r2")
	h.submit(request("t1", "r2", "again"))
	if fin := w2.finished(t, 10*time.Second); fin.Status != protocol.StatusSuccess {
		t.Fatalf("r2 ended %s", fin.Status)
	}
	testdeploy.WaitFor(t, 10*time.Second, "r2 in the thread's usage", func() bool {
		th = h.usageOfThread(t, "default", "t1")
		return len(th.Runs) == 2
	})
	if th.Total.Input != 500 || th.Total.Calls != 3 {
		t.Fatalf("thread after r2: %+v", th.Total.TokenCounts)
	}
}

// A run that stops early (cancelled while the model answers) still
// records what it spent.
func TestUsage_CancelledRunRecordsItsCalls(t *testing.T) {
	h := newHarness(t)
	h.tools.Register(tools.Func(model.ToolSpec{Name: "side_effect"}, func(ctx context.Context, _ json.RawMessage) (string, error) {
		return "done", nil
	}))
	stuck := make(chan struct{})
	m := model.NewScripted(func(n int, req *model.Request) model.Reply {
		if n == 0 {
			return model.Reply{ToolCalls: []model.ToolCall{{ID: "c1", Name: "side_effect", Arguments: "{}"}}}
		}
		close(stuck)
		return model.Reply{Delay: time.Hour}
	})
	h.startWorker(m, nil)
	w := h.watch("default", "t1", "r1")
	h.submit(request("t1", "r1", "do the thing"))
	natstest.Recv(t, stuck, "the model call of run r1")
	if _, errReply := h.cancel("default", "t1", "r1"); errReply != nil {
		t.Fatalf("cancel: %+v", errReply.Error)
	}
	if fin := w.finished(t, 10*time.Second); fin.Status != protocol.StatusCancelled {
		t.Fatalf("run ended %s", fin.Status)
	}
	rec := h.run("default", "r1")
	// The provider reported nothing: one call, estimated.
	if rec.Usage == nil || rec.Usage.Total.Calls != 1 || rec.Usage.Total.ApproximateCalls != 1 || rec.Usage.Total.Input <= 0 {
		t.Fatalf("record usage %+v", rec.Usage)
	}
	if th := h.usageOfThread(t, "default", "t1"); th.Total.Calls != 1 {
		t.Fatalf("thread usage %+v", th.Total.TokenCounts)
	}
}

// A worker that wrote a run's final record but died before it released
// the thread (the write that adds the run's usage to the thread's
// totals): the thread's next run breaks the finished run's lease, and
// that release adds the usage, once.
func TestUsage_AddedWhenAFinishedRunsLeaseIsReaped(t *testing.T) {
	h := newRedeliveryHarness(t) // the gone worker's lease goes stale (5 ack waits)
	h.startWorker(textModel("next", 1, 0), nil)
	ctx := context.Background()
	usage := &protocol.RunUsage{RunID: "r1", ThreadID: "t1", Tenant: "default", Final: true}
	usage.Own.AddCall("scripted", protocol.PurposeMain, 120, 12, nil, false)
	usage.Recompute()
	now := time.Now().UTC()
	rec := &protocol.Run{RunID: "r1", ThreadID: "t1", Tenant: "default", Agent: protocol.DefaultAgent,
		Status: protocol.StatusSuccess, Attempt: 1, CreatedAt: now, StartedAt: &now, FinishedAt: &now, Usage: usage, Epoch: 1, Seq: 2}
	if _, err := h.stores.Runs.Create(ctx, rec); err != nil {
		t.Fatal(err)
	}
	th := &protocol.Thread{ThreadID: "t1", Tenant: "default", CreatedAt: now, UpdatedAt: now, Status: protocol.ThreadBusy, Epoch: 1,
		Lease: &protocol.Lease{RunID: "r1", Worker: "gone", Epoch: 1, AcquiredAt: now, RenewedAt: now}}
	if _, err := h.stores.Threads.Put(ctx, th, 0); err != nil {
		t.Fatal(err)
	}
	w := h.watch("default", "t1", "r2")
	h.submit(request("t1", "r2", "next"))
	if fin := w.finished(t, 20*time.Second); fin.Status != protocol.StatusSuccess {
		t.Fatalf("r2 ended %s: %s", fin.Status, fin.Error)
	}
	got := h.usageOfThread(t, "default", "t1")
	r1, ok := got.Runs["r1"]
	if !ok || r1.Usage.Input != 120 || r1.Usage.Calls != 1 {
		t.Fatalf("thread usage runs %+v", got.Runs)
	}
	r2 := h.run("default", "r2")
	if r2.Usage == nil || got.Total.Input != 120+r2.Usage.Total.Input || got.Total.Calls != 1+r2.Usage.Total.Calls {
		t.Fatalf("thread usage %+v, r2 %+v", got.Total.TokenCounts, r2.Usage)
	}
	h.waitRunsStreamEmpty(t)
}
