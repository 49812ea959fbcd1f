package subagents_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/testdeploy"
	"github.com/natsagent/natsagent/internal/tools"
	"github.com/natsagent/natsagent/internal/worker"
)

// env is an embedded JetStream server with natsagent provisioned, a lead
// profile (model "lead") and subagent profiles, and workers started on
// their own connections. Scripted models route on the request's model
// name, which is the profile's.
type env struct {
	t        *testing.T
	srv      *natstest.Server
	nc       *nats.Conn
	js       jetstream.JetStream
	settings bus.Settings
	names    bus.Names
	stores   *kv.Stores
	reg      *tools.Registry
	// profiles are what every worker of the env serves; tests may adjust
	// them before starting workers.
	profiles []agent.Profile
}

// newEnv's ack wait is long: under -race on a loaded machine a worker's
// heartbeat can be seconds late, and a short ack wait then redelivers a
// healthy lead or child, which the tests count as a second attempt.
func newEnv(t *testing.T) *env {
	t.Helper()
	return newEnvAckWait(t, 30*time.Second)
}

// newRedeliveryEnv is newEnv with a short ack wait, for tests that wait
// for a dead worker's run to be redelivered.
func newRedeliveryEnv(t *testing.T) *env {
	t.Helper()
	return newEnvAckWait(t, 2*time.Second)
}

func newEnvAckWait(t *testing.T, ackWait time.Duration) *env {
	t.Helper()
	d := testdeploy.Start(t, bus.Settings{AckWait: ackWait, MaxDeliver: 5})
	srv, nc, js, settings, stores := d.Server, d.NC, d.JS, d.Settings, d.Stores
	reg := tools.NewRegistry()
	lead := agent.Chatbot()
	lead.Model = "lead"
	lead.Tools = []string{"current_time"}
	noRetry := map[string]json.RawMessage{"model_retry": json.RawMessage(`{"max_retries":0,"network_budget_seconds":0}`)}
	return &env{t: t, srv: srv, nc: nc, js: js, settings: settings, names: settings.Names, stores: stores, reg: reg,
		profiles: []agent.Profile{
			lead,
			{Name: "researcher", Kind: middleware.KindSubagent, Model: "researcher", Description: "Finds facts and reports them.",
				SystemPrompt: "You are the researcher.", Tools: []string{"current_time", "write_file"}},
			{Name: "failing", Kind: middleware.KindSubagent, Model: "failing", Description: "Always fails.",
				SystemPrompt: "You fail.", Middleware: middleware.ChainConfig{Settings: noRetry}},
		}}
}

// setLead changes the lead profile.
func (e *env) setLead(fn func(*agent.Profile)) {
	for i := range e.profiles {
		if e.profiles[i].Name == protocol.DefaultAgent {
			fn(&e.profiles[i])
		}
	}
}

type workerHandle struct {
	nc     *nats.Conn
	cancel context.CancelFunc
	done   chan struct{} // closed when Run returned
}

// startWorker starts a worker named id with m as its model.
func (e *env) startWorker(id string, m model.Model, concurrency int, cfg func(*worker.Config)) *workerHandle {
	e.t.Helper()
	nc, err := nats.Connect(e.srv.URL(), nats.MaxReconnects(-1))
	if err != nil {
		e.t.Fatal(err)
	}
	agents, err := agent.NewAgents(m, e.reg, e.profiles...)
	if err != nil {
		e.t.Fatal(err)
	}
	c := worker.Config{Settings: e.settings, ID: id, Concurrency: concurrency, Agents: agents, Logger: zaptest.NewLogger(e.t),
		WaitPoll: 200 * time.Millisecond, ShutdownGrace: 3 * time.Second}
	if cfg != nil {
		cfg(&c)
	}
	w, err := worker.New(context.Background(), nc, c)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	wh := &workerHandle{nc: nc, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(wh.done)
		err := w.Run(ctx)
		if err != nil && !errors.Is(err, worker.ErrConnectionClosed) {
			e.t.Errorf("worker %s: %v", id, err)
		}
	}()
	e.t.Cleanup(func() {
		cancel()
		select {
		case <-wh.done:
		case <-time.After(20 * time.Second):
			e.t.Errorf("worker %s did not stop", id)
		}
		nc.Close()
	})
	return wh
}

// submit publishes a lead run request the way the gateway does.
func (e *env) submit(thread, run, text string) {
	e.t.Helper()
	e.submitReq(&protocol.RunRequest{RunID: run, ThreadID: thread, Agent: protocol.DefaultAgent,
		Input: &protocol.Input{Messages: []model.Message{{Role: model.RoleUser, Content: text}}}})
}

func (e *env) submitReq(req *protocol.RunRequest) {
	e.t.Helper()
	req.Normalize()
	data, err := json.Marshal(req)
	if err != nil {
		e.t.Fatal(err)
	}
	m := nats.NewMsg(e.names.RunSubject(req.Tenant, req.ThreadID))
	m.Data = data
	m.Header.Set(nats.MsgIdHdr, protocol.RunMsgID(req.Tenant, req.RunID))
	if _, err := e.js.PublishMsg(context.Background(), m); err != nil {
		e.t.Fatal(err)
	}
}

// record reads a run record; nil when it does not exist.
func (e *env) record(run string) *protocol.Run {
	e.t.Helper()
	r, err := e.stores.FindRunView(context.Background(), protocol.DefaultTenant, run)
	if errors.Is(err, kv.ErrNotFound) {
		return nil
	}
	if err != nil {
		e.t.Fatalf("get run %s: %v", run, err)
	}
	return r
}

// waitStatus waits until a run's record has one of the statuses.
func (e *env) waitStatus(run string, timeout time.Duration, statuses ...protocol.Status) *protocol.Run {
	e.t.Helper()
	var last *protocol.Run
	testdeploy.WaitFor(e.t, timeout, fmt.Sprintf("run %s to be %v", run, statuses), func() bool {
		last = e.record(run)
		if last == nil {
			return false
		}
		for _, s := range statuses {
			if last.Status == s {
				return true
			}
		}
		return false
	})
	return last
}

// messages reads a thread's transcript.
func (e *env) messages(thread string) []model.Message {
	e.t.Helper()
	th, _, err := e.stores.Threads.Get(context.Background(), protocol.DefaultTenant, thread)
	if err != nil {
		e.t.Fatalf("get thread %s: %v", thread, err)
	}
	st, _, err := e.stores.Checkpoints.Load(context.Background(), protocol.DefaultTenant, thread, th.Head)
	if err != nil {
		e.t.Fatal(err)
	}
	return st.Messages
}

// cancel sends the run cancel request.
func (e *env) cancel(thread, run string) {
	e.t.Helper()
	if _, err := e.nc.Request(e.names.CancelSubject(protocol.DefaultTenant, thread, run), nil, 30*time.Second); err != nil {
		e.t.Fatalf("cancel %s: %v", run, err)
	}
}

// child returns the ids of the child a lead's tool call starts.
func child(leadThread, leadRun, subagent, toolCallID string) (thread, run string) {
	thread = protocol.SubagentThreadID(leadThread, leadRun, subagent, toolCallID)
	return thread, protocol.SubagentRunID(thread, leadRun, toolCallID)
}

// watcher collects the events of one run as they are stored.
type watcher struct {
	mu     sync.Mutex
	events []protocol.Event
	done   chan struct{}
}

func (e *env) watch(thread, run string) *watcher {
	e.t.Helper()
	oc, err := e.js.OrderedConsumer(context.Background(), e.names.EventsStream(), jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{e.names.RunEvents(protocol.DefaultTenant, thread, run)},
	})
	if err != nil {
		e.t.Fatal(err)
	}
	w := &watcher{done: make(chan struct{})}
	cc, err := oc.Consume(func(m jetstream.Msg) {
		var ev protocol.Event
		if err := json.Unmarshal(m.Data(), &ev); err != nil {
			return
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		w.events = append(w.events, ev)
		if ev.Type == protocol.EventRunFinished {
			select {
			case <-w.done:
			default:
				close(w.done)
			}
		}
	})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(cc.Stop)
	// And its live events (subagent.progress, deltas): core NATS.
	sub, err := e.js.Conn().Subscribe(e.names.RunLive(protocol.DefaultTenant, thread, run), func(m *nats.Msg) {
		var ev protocol.Event
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			return
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		w.events = append(w.events, ev)
	})
	if err != nil {
		e.t.Fatal(err)
	}
	if err := e.js.Conn().Flush(); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = sub.Unsubscribe() })
	return w
}

func (w *watcher) finished(t *testing.T, timeout time.Duration) protocol.FinishedData {
	t.Helper()
	select {
	case <-w.done:
	case <-time.After(timeout):
		t.Fatalf("run did not finish in %s; events: %v", timeout, w.types())
	}
	for _, ev := range w.all() {
		if ev.Type == protocol.EventRunFinished {
			var d protocol.FinishedData
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				t.Fatal(err)
			}
			return d
		}
	}
	t.Fatal("no run.finished")
	return protocol.FinishedData{}
}

func (w *watcher) all() []protocol.Event {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]protocol.Event(nil), w.events...)
}

func (w *watcher) types() []string {
	var out []string
	for _, ev := range w.all() {
		out = append(out, ev.Type)
	}
	return out
}

// subagentEvents returns the data of the events of one type.
func (w *watcher) subagentEvents(eventType string) []protocol.SubagentEventData {
	var out []protocol.SubagentEventData
	for _, ev := range w.all() {
		if ev.Type == eventType {
			var d protocol.SubagentEventData
			_ = json.Unmarshal(ev.Data, &d)
			out = append(out, d)
		}
	}
	return out
}

// conversation is the request's messages without the trailing context
// message (the todo list, the subagents still running: the middleware
// package's promptcontext.go), which follows the last tool results.
func conversation(req *model.Request) []model.Message {
	msgs := req.Messages
	if n := len(msgs); n > 0 && msgs[n-1].Name == model.ContextMessageName {
		msgs = msgs[:n-1]
	}
	return msgs
}

// answered reports whether the request ends with tool results.
func answered(req *model.Request) bool {
	msgs := conversation(req)
	n := len(msgs)
	return n > 0 && msgs[n-1].Role == model.RoleTool
}

// toolResults joins the tool results of a request's last turn.
func toolResults(req *model.Request) string {
	msgs := conversation(req)
	var parts []string
	for i := len(msgs) - 1; i >= 0 && msgs[i].Role == model.RoleTool; i-- {
		parts = append([]string{msgs[i].Name + "=" + msgs[i].Content}, parts...)
	}
	return strings.Join(parts, " | ")
}

func taskCall(id, subagent, description string) model.ToolCall {
	args, _ := json.Marshal(map[string]string{"description": description, "subagent_type": subagent})
	return model.ToolCall{ID: id, Name: middleware.TaskTool, Arguments: string(args)}
}

// blockUntil waits for ch to close or ctx to end, like a model call that
// takes as long as the test wants.
func blockUntil(ctx context.Context, ch <-chan struct{}) error {
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// script is a model whose replies per profile (the request's model name)
// are functions of the call's context and request; it counts calls per
// profile.
type script struct {
	mu    sync.Mutex
	calls map[string]int
	fns   map[string]func(ctx context.Context, req *model.Request) model.Reply
}

func newScript(fns map[string]func(ctx context.Context, req *model.Request) model.Reply) *script {
	return &script{calls: make(map[string]int), fns: fns}
}

func (s *script) count(profile string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[profile]
}

func (s *script) model() model.Model { return model.Func(s.generate) }

func (s *script) generate(ctx context.Context, req *model.Request, onDelta func(model.Delta)) (*model.Response, error) {
	fn := s.fns[req.Model]
	if fn == nil {
		return nil, fmt.Errorf("no script for model %q", req.Model)
	}
	s.mu.Lock()
	s.calls[req.Model]++
	s.mu.Unlock()
	r := fn(ctx, req)
	if r.Delay > 0 {
		t := time.NewTimer(r.Delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("model call stopped: %w", err)
	}
	if r.Err != nil {
		return nil, r.Err
	}
	if r.Text != "" && onDelta != nil {
		onDelta(model.Delta{Content: r.Text})
	}
	finish := model.FinishStop
	if len(r.ToolCalls) > 0 {
		finish = model.FinishToolCalls
	}
	return &model.Response{Message: model.Message{Role: model.RoleAssistant, Content: r.Text, ToolCalls: r.ToolCalls}, FinishReason: finish, Usage: r.Usage}, nil
}
