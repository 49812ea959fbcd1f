package worker

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/testdeploy"
	"github.com/natsagent/natsagent/internal/tools"
)

// A checkpoint the store refuses (here: the bucket is full; in a cluster:
// a node lost mid-write) does not end the run as an error: the run is
// handed back and the next attempt continues from the last checkpoint
// that was saved, once the store takes writes again.
func TestRefusedCheckpointHandsTheRunBack(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	var toolRuns atomic.Int32
	h.tools.Register(tools.Func(model.ToolSpec{Name: "step"}, func(context.Context, json.RawMessage) (string, error) {
		toolRuns.Add(1)
		return "stepped", nil
	}))
	// Slow answers leave the test time to reopen the store between the
	// second attempt's start and its first checkpoint.
	m := model.NewScripted(func(n int, req *model.Request) model.Reply {
		if last := req.Messages[len(req.Messages)-1]; last.Role == model.RoleTool {
			return model.Reply{Text: "done: " + last.Content, Delay: time.Second}
		}
		return model.Reply{Text: "working", Delay: time.Second, ToolCalls: []model.ToolCall{{ID: "c1", Name: "step", Arguments: "{}"}}}
	})

	// The checkpoints bucket refuses every write.
	stream, err := h.js.Stream(ctx, "KV_"+h.names.CheckpointsBucket())
	if err != nil {
		t.Fatal(err)
	}
	open := stream.CachedInfo().Config
	full := open
	full.MaxBytes = 1
	if _, err := h.js.UpdateStream(ctx, full); err != nil {
		t.Fatal(err)
	}

	h.startWorker(m, nil)
	w := h.watch("default", "t1", "r1")
	h.submit(request("t1", "r1", "take one step"))

	testdeploy.WaitFor(t, 20*time.Second, "a second attempt after the refused checkpoint", func() bool {
		for _, ev := range w.all() {
			if ev.Type == protocol.EventRunFinished {
				t.Fatalf("the run ended (%s) instead of being handed back: %v", string(ev.Data), w.types())
			}
			if ev.Type == protocol.EventRunStarted && ev.Attempt == 2 {
				return true
			}
		}
		return false
	})
	if _, err := h.js.UpdateStream(ctx, open); err != nil {
		t.Fatal(err)
	}

	fin := w.finished(t, 20*time.Second)
	if fin.Status != protocol.StatusSuccess || fin.Output == nil || fin.Output.Content != "done: stepped" {
		t.Fatalf("run ended %s with %+v", fin.Status, fin.Output)
	}
	if n := toolRuns.Load(); n != 1 {
		t.Fatalf("the tool ran %d times, want 1", n)
	}
	time.Sleep(300 * time.Millisecond)
	if n := w.count(protocol.EventRunFinished); n != 1 {
		t.Fatalf("%d run.finished events, want 1", n)
	}
	if rec := h.run("default", "r1"); rec.Status != protocol.StatusSuccess || rec.Attempt < 2 {
		t.Fatalf("record %s attempt %d", rec.Status, rec.Attempt)
	}
}
