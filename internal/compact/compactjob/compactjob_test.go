package compactjob_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/compact"
	"github.com/natsagent/natsagent/internal/compact/compactjob"
	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/jobs"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
	"github.com/natsagent/natsagent/internal/testdeploy"
	"github.com/natsagent/natsagent/internal/testdeploy/jobworker"
	"github.com/natsagent/natsagent/internal/tools"
)

const summaryMarker = "You compress the earlier part of a conversation"

// env is an embedded JetStream server with natsagent provisioned, workers
// that take runs and compaction jobs, and one in-memory workdir per
// thread shared by them.
type env struct {
	t        *testing.T
	srv      *natstest.Server
	nc       *nats.Conn
	js       jetstream.JetStream
	settings bus.Settings
	stores   *kv.Stores
	tools    *tools.Registry

	mu   sync.Mutex
	dirs map[string]*files.Memory
}

func newEnv(t *testing.T) *env {
	t.Helper()
	d := testdeploy.Start(t, bus.Settings{AckWait: 2 * time.Second, MaxDeliver: 5})
	srv, nc, js, settings, stores := d.Server, d.NC, d.JS, d.Settings, d.Stores
	return &env{t: t, srv: srv, nc: nc, js: js, settings: settings, stores: stores, tools: tools.NewRegistry(), dirs: map[string]*files.Memory{}}
}

func (e *env) workdir(tenant, thread string) files.Workdir {
	e.mu.Lock()
	defer e.mu.Unlock()
	w, ok := e.dirs[tenant+"/"+thread]
	if !ok {
		w = files.NewMemory()
		e.dirs[tenant+"/"+thread] = w
	}
	return w
}

// compressionSettings summarize at 20 messages and keep 4.
const compressionSettings = `{"trigger_messages": 20, "keep": {"messages": 4}}`

// startWorker starts a worker whose chatbot uses m with the given
// context_compression settings; it serves compaction jobs too.
func (e *env) startWorker(m model.Model, settings string) *nats.Conn {
	e.t.Helper()
	chatbot := agent.Chatbot()
	chatbot.Tools = e.tools.Names()
	chatbot.Middleware = middleware.ChainConfig{Settings: map[string]json.RawMessage{
		"context_compression": json.RawMessage(settings),
		"tool_approval":       json.RawMessage(`{"enabled": false}`),
	}}
	agents, err := agent.NewAgents(m, e.tools, chatbot)
	if err != nil {
		e.t.Fatal(err)
	}
	return jobworker.Start(e.t, e.srv.URL(), e.settings, agents, e.workdir, 4)
}

// seed makes thread hold msgs, as a finished earlier run leaves it.
func (e *env) seed(thread string, msgs []model.Message) {
	e.t.Helper()
	ctx := context.Background()
	d := &kv.Delta{ID: "e1-1", RunID: "old", Step: 1, Time: time.Now().UTC(), Update: state.Update{Messages: msgs}}
	if _, err := e.stores.Checkpoints.Put(ctx, protocol.DefaultTenant, thread, d); err != nil {
		e.t.Fatal(err)
	}
	now := time.Now().UTC()
	th := &protocol.Thread{ThreadID: thread, Tenant: protocol.DefaultTenant, CreatedAt: now, UpdatedAt: now, Status: protocol.ThreadIdle, Head: d.ID, Epoch: 1}
	if _, err := e.stores.Threads.Put(ctx, th, 0); err != nil {
		e.t.Fatal(err)
	}
}

func conversation(pairs int) []model.Message {
	var msgs []model.Message
	for i := range pairs {
		msgs = append(msgs,
			model.Message{ID: fmt.Sprintf("u%d", i), Role: model.RoleUser, Content: fmt.Sprintf("Question %d about the project plan, with some detail.", i)},
			model.Message{ID: fmt.Sprintf("f%d", i), Role: model.RoleAssistant, Content: fmt.Sprintf("Answer %d: the plan covers step %d in depth.", i, i)})
	}
	return msgs
}

func (e *env) state(thread string) (*protocol.Thread, *state.State) {
	e.t.Helper()
	th, _, err := e.stores.Threads.Get(context.Background(), protocol.DefaultTenant, thread)
	if err != nil {
		e.t.Fatal(err)
	}
	st, _, err := e.stores.Checkpoints.Load(context.Background(), protocol.DefaultTenant, thread, th.Head)
	if err != nil {
		e.t.Fatal(err)
	}
	return th, st
}

// follow collects the events of one run or job.
type follow struct {
	mu     sync.Mutex
	events []protocol.Event
}

func (e *env) follow(thread, id string) *follow {
	e.t.Helper()
	oc, err := e.js.OrderedConsumer(context.Background(), e.settings.Names.EventsStream(), jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{e.settings.Names.RunEvents(protocol.DefaultTenant, thread, id)},
	})
	if err != nil {
		e.t.Fatal(err)
	}
	f := &follow{}
	cc, err := oc.Consume(func(m jetstream.Msg) {
		var ev protocol.Event
		if json.Unmarshal(m.Data(), &ev) == nil {
			f.mu.Lock()
			f.events = append(f.events, ev)
			f.mu.Unlock()
		}
	})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(cc.Stop)
	return f
}

func (f *follow) wait(t *testing.T, what string, done func(protocol.Event) bool) protocol.Event {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		f.mu.Lock()
		for _, ev := range f.events {
			if done(ev) {
				f.mu.Unlock()
				return ev
			}
		}
		f.mu.Unlock()
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
	return protocol.Event{}
}

func (f *follow) result(t *testing.T) middleware.CompressionData {
	t.Helper()
	ev := f.wait(t, "the compaction result", func(ev protocol.Event) bool {
		var d middleware.CompressionData
		return ev.Type == middleware.EventContextCompression && json.Unmarshal(ev.Data, &d) == nil && d.Phase != middleware.CompressionStarted
	})
	var d middleware.CompressionData
	if err := json.Unmarshal(ev.Data, &d); err != nil {
		t.Fatal(err)
	}
	return d
}

func (f *follow) finished(t *testing.T) protocol.FinishedData {
	t.Helper()
	ev := f.wait(t, "run.finished", func(ev protocol.Event) bool { return ev.Type == protocol.EventRunFinished })
	var d protocol.FinishedData
	if err := json.Unmarshal(ev.Data, &d); err != nil {
		t.Fatal(err)
	}
	return d
}

func (e *env) submit(thread, run, text string) {
	e.t.Helper()
	req := &protocol.RunRequest{RunID: run, ThreadID: thread, Tenant: protocol.DefaultTenant, Agent: protocol.DefaultAgent,
		Input: &protocol.Input{Messages: []model.Message{{Role: model.RoleUser, Content: text}}}}
	req.Normalize()
	data, err := json.Marshal(req)
	if err != nil {
		e.t.Fatal(err)
	}
	m := nats.NewMsg(e.settings.Names.RunSubject(req.Tenant, req.ThreadID))
	m.Data = data
	m.Header.Set(nats.MsgIdHdr, protocol.RunMsgID(req.Tenant, run))
	if _, err := e.js.PublishMsg(context.Background(), m); err != nil {
		e.t.Fatal(err)
	}
}

// counting answers main calls with answer(n) and summary calls with a
// summary, counting each kind.
type counting struct {
	mains, summaries atomic.Int32
	answer           func(n int, req *model.Request) model.Reply
	mu               sync.Mutex
	lastMain         *model.Request
}

func (c *counting) model() *model.Scripted {
	return model.NewScripted(func(_ int, req *model.Request) model.Reply {
		if len(req.Messages) > 0 && strings.Contains(req.Messages[0].Content, summaryMarker) {
			c.summaries.Add(1)
			return model.Reply{Text: "SUMMARY: the person planned the project step by step."}
		}
		n := int(c.mains.Add(1)) - 1
		c.mu.Lock()
		c.lastMain = req
		c.mu.Unlock()
		if c.answer != nil {
			return c.answer(n, req)
		}
		return model.Reply{Text: "noted"}
	})
}

func (c *counting) last() *model.Request {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lastMain
}

// An idle thread is compacted as a job: its summary is recorded in a new
// checkpoint (the head moved with CAS), every message stays stored, the
// result reports the tokens before and after, and the next run starts
// from the summary without summarizing again.
func TestCompactJob_IdleThread(t *testing.T) {
	e := newEnv(t)
	c := &counting{}
	e.startWorker(c.model(), compressionSettings)
	e.seed("h1", conversation(8)) // 16 messages: under the trigger
	f := e.follow("h1", "job1")
	if _, err := compact.Enqueue(context.Background(), e.js, e.settings.Names, compact.Request{JobID: "job1", Tenant: protocol.DefaultTenant, ThreadID: "h1"}); err != nil {
		t.Fatal(err)
	}
	d := f.result(t)
	if d.Phase != middleware.CompressionCompleted || d.Checkpoint != compact.CheckpointID("job1") || d.Summarized != 12 || d.JobID != "job1" || d.Reason != middleware.CompressionReasonRequest {
		t.Fatalf("result = %+v", d)
	}
	if d.TokensBefore <= d.TokensAfter || d.TokensAfter == 0 {
		t.Fatalf("tokens before %d, after %d", d.TokensBefore, d.TokensAfter)
	}
	th, st := e.state("h1")
	if th.Head != compact.CheckpointID("job1") || th.Lease != nil {
		t.Fatalf("thread = %+v", th)
	}
	if len(st.Messages) != 16 {
		t.Fatalf("%d stored messages after compaction", len(st.Messages))
	}
	var rec middleware.ContextSummary
	if ok, _ := st.Value(middleware.ContextSummaryValue, &rec); !ok || rec.CutBeforeMessageID != "u6" || rec.RunID != "job1" || rec.TokensAfter != d.TokensAfter {
		t.Fatalf("summary record = %+v", rec)
	}
	if hist, err := e.workdir(protocol.DefaultTenant, "h1").Read(context.Background(), rec.HistoryPath); err != nil || !strings.Contains(string(hist), "Question 0") {
		t.Fatalf("history file: %v", err)
	}
	if c.summaries.Load() != 1 {
		t.Fatalf("%d summary calls", c.summaries.Load())
	}

	run := e.follow("h1", "r1")
	e.submit("h1", "r1", "What is next?")
	if fin := run.finished(t); fin.Status != protocol.StatusSuccess {
		t.Fatalf("run ended %+v", fin)
	}
	req := c.last()
	if c.summaries.Load() != 1 || !strings.Contains(req.Messages[1].Content, "SUMMARY: the person planned") || len(req.Messages) != 1+1+4+1 {
		t.Fatalf("the run's request (%d messages) after compaction: %+v", len(req.Messages), req.Messages[:2])
	}
	// The same job again (a retried request) changes nothing.
	g := e.follow("h1", "job1")
	if _, err := compact.Enqueue(context.Background(), e.js, e.settings.Names, compact.Request{JobID: "job1", Tenant: protocol.DefaultTenant, ThreadID: "h1"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if again := g.result(t); again.Checkpoint != d.Checkpoint || c.summaries.Load() != 1 {
		t.Fatalf("a duplicate job ran again: %+v", again)
	}
}

// A thread a run holds is refused; its head does not move.
func TestCompactJob_BusyThreadRefused(t *testing.T) {
	e := newEnv(t)
	c := &counting{}
	e.startWorker(c.model(), compressionSettings)
	e.seed("h1", conversation(8))
	if _, _, err := e.stores.Threads.Mutate(context.Background(), protocol.DefaultTenant, "h1", func(th *protocol.Thread) error {
		now := time.Now().UTC()
		th.Lease = &protocol.Lease{RunID: "busy-run", Worker: "w", Epoch: 2, AcquiredAt: now, RenewedAt: now}
		th.Epoch, th.Status = 2, protocol.ThreadBusy
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	f := e.follow("h1", "job2")
	if _, err := compact.Enqueue(context.Background(), e.js, e.settings.Names, compact.Request{JobID: "job2", Tenant: protocol.DefaultTenant, ThreadID: "h1"}); err != nil {
		t.Fatal(err)
	}
	d := f.result(t)
	if d.Phase != middleware.CompressionFailed || d.Code != middleware.CodeBusy || !strings.Contains(d.Error, "busy-run") {
		t.Fatalf("result = %+v", d)
	}
	if th, _ := e.state("h1"); th.Head != "e1-1" || c.summaries.Load() != 0 {
		t.Fatalf("head %s, %d summaries", th.Head, c.summaries.Load())
	}
	// An unknown thread is reported, not retried.
	g := e.follow("nope", "job3")
	if _, err := compact.Enqueue(context.Background(), e.js, e.settings.Names, compact.Request{JobID: "job3", Tenant: protocol.DefaultTenant, ThreadID: "nope"}); err != nil {
		t.Fatal(err)
	}
	if d := g.result(t); d.Code != middleware.CodeNotFound {
		t.Fatalf("result = %+v", d)
	}
}

// A summary made in a run survives the worker's death: the next worker
// continues from the checkpoint, projects its request from the summary in
// state and does not summarize again.
func TestSummarySurvivesRedelivery(t *testing.T) {
	e := newEnv(t)
	var blockOnce atomic.Bool
	started := make(chan struct{})
	e.tools.Register(tools.Func(model.ToolSpec{Name: "slow", Description: "slow work", Parameters: json.RawMessage(`{"type":"object"}`)},
		func(ctx context.Context, _ json.RawMessage) (string, error) {
			if blockOnce.CompareAndSwap(false, true) {
				close(started)
				<-ctx.Done() // the worker dies in the middle
				return "", ctx.Err()
			}
			return "slow work done", nil
		}))
	first := &counting{answer: func(n int, req *model.Request) model.Reply {
		return model.Reply{ToolCalls: []model.ToolCall{{ID: "c1", Name: "slow", Arguments: "{}"}}}
	}}
	a := e.startWorker(first.model(), compressionSettings)
	e.seed("h1", conversation(10)) // 20 messages: the run's input puts it over
	run := e.follow("h1", "r1")
	e.submit("h1", "r1", "Do the slow work.")
	select {
	case <-started:
	case <-time.After(20 * time.Second):
		t.Fatal("the tool never started")
	}
	if first.summaries.Load() != 1 {
		t.Fatalf("%d summaries on the first worker", first.summaries.Load())
	}
	// The summary is in the checkpoint the first worker wrote.
	_, st := e.state("h1")
	if _, ok := st.Values[middleware.ContextSummaryValue]; !ok {
		t.Fatal("the summary was not checkpointed with the response")
	}
	a.Close() // gone: no acks, no heartbeats, no writes

	second := &counting{}
	e.startWorker(second.model(), compressionSettings)
	if fin := run.finished(t); fin.Status != protocol.StatusSuccess {
		t.Fatalf("run ended %+v", fin)
	}
	if second.summaries.Load() != 0 || second.mains.Load() != 1 {
		t.Fatalf("the second worker made %d summaries and %d main calls", second.summaries.Load(), second.mains.Load())
	}
	req := second.last()
	asked := false
	for _, m := range req.Messages {
		asked = asked || m.Content == "Do the slow work."
	}
	if !strings.Contains(req.Messages[1].Content, "SUMMARY: the person planned") || !asked || len(req.Messages) != 1+1+4+2 {
		t.Fatalf("the second worker's request: %+v", req.Messages)
	}
	if last := req.Messages[len(req.Messages)-1]; last.Role != model.RoleTool || last.Content != "slow work done" {
		t.Fatalf("last message %+v", last)
	}
	_, st = e.state("h1")
	if len(st.Messages) != 20+4 {
		t.Fatalf("%d stored messages", len(st.Messages))
	}
}

func TestRequestValidate(t *testing.T) {
	for _, r := range []compact.Request{
		{JobID: "a.b", Tenant: "default", ThreadID: "h"},
		{JobID: "j", Tenant: "default", ThreadID: ""},
		{JobID: "j", Tenant: "default", ThreadID: "h", Agent: "bad agent"},
	} {
		if err := r.Validate(); err == nil {
			t.Errorf("%+v validated", r)
		}
	}
	// A payload that does not decode is dead-lettered at once.
	h := compactjob.NewHandler(nil, nil, nil, nil, nil)
	err := h.Handle(context.Background(), &jobs.Job{Kind: compact.JobKind, Data: []byte(`{"job_id":"j","tenant":"default","thread_id":"h","extra":1}`)})
	if !jobs.IsPermanent(err) {
		t.Fatalf("err = %v", err)
	}
}
