package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/app"
	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/model/openaitest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/testdeploy"
	"github.com/natsagent/natsagent/internal/testdeploy/jobworker"
)

// strictModel runs every request through the strict provider rules
// (openaitest.Validate) before m answers it, and keeps what they found.
type strictModel struct {
	m        model.Model
	mu       sync.Mutex
	problems []string
}

func (s *strictModel) Generate(ctx context.Context, req *model.Request, onDelta func(model.Delta)) (*model.Response, error) {
	wire := &openaitest.Request{Model: req.Model}
	for _, ts := range req.Tools {
		wire.Tools = append(wire.Tools, openaitest.Tool{Type: "function", Function: openaitest.Function{Name: ts.Name}})
	}
	for _, m := range req.WithSystem() {
		wm := openaitest.Message{Role: m.Role, Content: m.Content, Name: m.Name, ToolCallID: m.ToolCallID}
		for _, tc := range m.ToolCalls {
			wm.ToolCalls = append(wm.ToolCalls, openaitest.ToolCallMsg{ID: tc.ID, Type: "function",
				Function: openaitest.FunctionCall{Name: tc.Name, Arguments: tc.Arguments}})
		}
		wire.Messages = append(wire.Messages, wm)
	}
	if p := openaitest.Validate(wire); len(p) > 0 {
		s.mu.Lock()
		s.problems = append(s.problems, p...)
		s.mu.Unlock()
	}
	return s.m.Generate(ctx, req, onDelta)
}

// newDemoEnv is a deployment as `gateway --dev` assembles it without a
// model (app.Agents over the demo model: the chatbot, the demo subagent,
// the demo's context window), its worker on an embedded JetStream server.
func newDemoEnv(t *testing.T) *cliEnv {
	t.Helper()
	d := testdeploy.Start(t, bus.Settings{Names: bus.Names{Prefix: testPrefix}, AckWait: 5 * time.Second, MaxDeliver: 5})
	e := &cliEnv{t: t, srv: d.Server, settings: d.Settings, stores: d.Stores, workdirs: make(map[string]*files.Memory)}
	strict := &strictModel{m: model.NewDemo(model.DemoOptions{WordDelay: -1, SlowDelay: 50 * time.Millisecond})}
	t.Cleanup(func() {
		strict.mu.Lock()
		defer strict.mu.Unlock()
		if len(strict.problems) > 0 {
			t.Errorf("the demo sent requests a strict provider refuses: %q", strict.problems)
		}
	})
	cfg := config.Default()
	if !cfg.UsesDemoModel() {
		t.Fatal("the default configuration has a model")
	}
	agents, err := app.Agents(cfg, strict)
	if err != nil {
		t.Fatal(err)
	}
	workdir := func(tenant, thread string) files.Workdir { return e.workdir(tenant, thread) }
	jobworker.Start(t, e.srv.URL(), e.settings, agents, workdir, 4)
	return e
}

// events reads every stored event of a run.
func (e *cliEnv) events(run *protocol.Run) []protocol.Event {
	e.t.Helper()
	nc := e.srv.Connect()
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := js.OrderedConsumer(ctx, e.settings.Names.EventsStream(), jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{e.settings.Names.RunEvents(run.Tenant, run.ThreadID, run.RunID)}})
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	var out []protocol.Event
	for n := info.NumPending; uint64(len(out)) < n; {
		batch, err := cons.Fetch(int(n)-len(out), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			e.t.Fatal(err)
		}
		for msg := range batch.Messages() {
			var ev protocol.Event
			if err := json.Unmarshal(msg.Data(), &ev); err != nil {
				e.t.Fatalf("event %s: %v", msg.Subject(), err)
			}
			out = append(out, ev)
		}
		if batch.Error() != nil {
			e.t.Fatal(batch.Error())
		}
	}
	return out
}

// eventsOf are the events of a type, with their data.
func eventsOf(evs []protocol.Event, typ string) []protocol.Event {
	var out []protocol.Event
	for _, ev := range evs {
		if ev.Type == typ {
			out = append(out, ev)
		}
	}
	return out
}

// lastRun is the thread's most recent run once the thread is idle or
// waits for a person.
func (e *cliEnv) lastRun(thread string) *protocol.Run {
	e.t.Helper()
	var th *protocol.Thread
	testdeploy.WaitFor(e.t, 30*time.Second, "thread "+thread+" at rest", func() bool {
		t, _, err := e.stores.Threads.Get(context.Background(), protocol.DefaultTenant, thread)
		th = t
		return err == nil && t.Lease == nil && t.LastRunID != ""
	})
	return e.record(th.LastRunID)
}

// Each word of the README's demo lines does what it says, through the CLI
// and a real worker, and every request the demo model saw was one a
// strict provider accepts.
func TestDemoModelShowsTheProduct(t *testing.T) {
	e := newDemoEnv(t)

	t.Run("write asks for approval", func(t *testing.T) {
		e.cli("run", "--thread", "w1", "--run-id", "w1a", "write a file").must(t, 0)
		rec := e.waitStatus("w1a", protocol.StatusInterrupted)
		if rec.Interrupt == nil || rec.Interrupt.Kind != protocol.InterruptApproval || len(rec.Interrupt.ActionRequests) != 1 || rec.Interrupt.ActionRequests[0].Name != "write_file" {
			t.Fatalf("interrupt %+v", rec.Interrupt)
		}
		if evs := eventsOf(e.events(rec), middleware.EventApprovalRequested); len(evs) != 1 {
			t.Fatalf("approval.requested events: %d", len(evs))
		}
		e.cli("approve", "--thread", "w1", "--run-id", "w1b").must(t, 0)
		done := e.waitStatus("w1b", protocol.StatusSuccess)
		if got, err := e.workdir(protocol.DefaultTenant, "w1").Read(context.Background(), "/demo.txt"); err != nil || !strings.Contains(string(got), "demo model") {
			t.Fatalf("/demo.txt after approval: %q, %v", got, err)
		}
		if out := outputText(done); !strings.Contains(out, "write_file") {
			t.Fatalf("output %q does not quote the write", out)
		}
	})

	t.Run("ask asks a question", func(t *testing.T) {
		e.cli("run", "--thread", "a1", "--run-id", "a1a", "ask me something").must(t, 0)
		rec := e.waitStatus("a1a", protocol.StatusInterrupted)
		if rec.Interrupt == nil || rec.Interrupt.Kind != protocol.InterruptClarification || !strings.Contains(rec.Interrupt.Question, "city") || len(rec.Interrupt.Options) != 3 {
			t.Fatalf("interrupt %+v", rec.Interrupt)
		}
		e.cli("answer", "--thread", "a1", "--run-id", "a1b", "Lyon").must(t, 0)
		done := e.waitStatus("a1b", protocol.StatusSuccess)
		if out := outputText(done); !strings.Contains(out, "Lyon") {
			t.Fatalf("output %q does not quote the answer", out)
		}
	})

	t.Run("subagent runs a subagent", func(t *testing.T) {
		e.cli("run", "--thread", "s1", "--run-id", "s1a", "hand this to a subagent").must(t, 0)
		rec := e.waitStatus("s1a", protocol.StatusSuccess)
		evs := e.events(rec)
		started, finished := eventsOf(evs, protocol.EventSubagentStarted), eventsOf(evs, protocol.EventSubagentFinished)
		if len(started) != 1 || len(finished) != 1 {
			t.Fatalf("subagent events: %d started, %d finished", len(started), len(finished))
		}
		var child protocol.SubagentEventData
		if err := json.Unmarshal(finished[0].Data, &child); err != nil {
			t.Fatal(err)
		}
		kid := e.record(child.RunID)
		if kid.Status != protocol.StatusSuccess || kid.Agent != app.DemoSubagent || kid.Parent == nil || kid.Parent.RunID != "s1a" {
			t.Fatalf("child run %+v", kid)
		}
		if out := outputText(rec); !strings.Contains(out, "According to the task tool") {
			t.Fatalf("output %q does not quote the subagent", out)
		}
	})

	t.Run("long compacts the next turn", func(t *testing.T) {
		e.cli("run", "--thread", "l1", "--run-id", "l1a", "give me a long reply").must(t, 0)
		first := e.waitStatus("l1a", protocol.StatusSuccess)
		if n := len(eventsOf(e.events(first), middleware.EventContextCompression)); n != 0 {
			t.Fatalf("the long reply's own run compressed (%d events)", n)
		}
		e.cli("run", "--thread", "l1", "--run-id", "l1b", "and now?").must(t, 0)
		next := e.waitStatus("l1b", protocol.StatusSuccess)
		summarized := false
		for _, ev := range eventsOf(e.events(next), middleware.EventContextCompression) {
			var d middleware.CompressionData
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				t.Fatal(err)
			}
			summarized = summarized || (d.Phase == middleware.CompressionCompleted && d.Summarized > 0 && d.TokensAfter < d.TokensBefore)
		}
		if !summarized {
			t.Fatal("the turn after the long reply did not summarize the thread")
		}
	})

	t.Run("slow streams until cancelled", func(t *testing.T) {
		nc := e.srv.Connect()
		defer nc.Close()
		deltas := make(chan struct{}, 1000)
		sub, err := nc.Subscribe(e.settings.Names.ThreadLive(protocol.DefaultTenant, "c1"), func(msg *nats.Msg) {
			var ev protocol.Event
			if json.Unmarshal(msg.Data, &ev) == nil && ev.Type == protocol.EventMessageDelta {
				deltas <- struct{}{}
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		e.cli("run", "--detach", "--thread", "c1", "--run-id", "c1a", "count slowly").must(t, 0)
		for i := range 5 {
			select {
			case <-deltas:
			case <-time.After(30 * time.Second):
				t.Fatalf("%d deltas of the slow answer in 30s", i)
			}
		}
		e.cli("cancel", "--thread", "c1").must(t, 0).has(t, "run c1a cancelled")
		rec := e.waitStatus("c1a", protocol.StatusCancelled)
		if len(eventsOf(e.events(rec), protocol.EventMessageCompleted)) != 0 {
			t.Fatal("the slow answer completed before the cancel")
		}
		e.cli("cancel", "--thread", "c1").must(t, 1).says(t, "thread c1 has no active run")
	})

	t.Run("slow can be steered", func(t *testing.T) {
		e.cli("run", "--detach", "--thread", "c2", "--run-id", "c2a", "count slowly").must(t, 0)
		e.waitStatus("c2a", protocol.StatusRunning)
		e.cli("steer", "--thread", "c2", "--run-id", "c2b", "Stop, tell me the time instead").must(t, 0)
		steered := e.waitStatus("c2a", protocol.StatusSteered)
		if steered.SupersededBy != "c2b" {
			t.Fatalf("steered run %+v", steered)
		}
		done := e.waitStatus("c2b", protocol.StatusSuccess)
		if out := outputText(done); !strings.Contains(out, "According to the current_time tool") {
			t.Fatalf("the steering run answered %q", out)
		}
	})
}

// outputText is the text of a run's final message.
func outputText(rec *protocol.Run) string {
	if rec.Output == nil {
		return ""
	}
	return fmt.Sprint(rec.Output.Content)
}
