package worker

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
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/testdeploy"
	"github.com/natsagent/natsagent/internal/tools"
)

// harness is a real embedded JetStream server with natsagent provisioned
// and workers started on their own connections.
type harness struct {
	t        testing.TB
	srv      *natstest.Server
	nc       *nats.Conn
	js       jetstream.JetStream
	settings bus.Settings
	names    bus.Names
	stores   *kv.Stores
	tools    *tools.Registry
	// workerURL, when set, is where startWorker connects instead of the
	// server (a proxy in front of it).
	workerURL string
}

// steadyAckWait is the runs consumer's ack wait in tests that count a
// run's attempts, epochs or deliveries: under -race on a loaded CI
// machine a worker's heartbeat or lease renewal can be late by seconds,
// and a short ack wait then redelivers a healthy run and fails the count.
const steadyAckWait = 30 * time.Second

// redeliveryAckWait is the ack wait of tests that need a request
// redelivered, or a lease found stale, within the test: a dead worker's
// run taken over, a heartbeat proved to hold the request.
const redeliveryAckWait = 2 * time.Second

func newHarness(t *testing.T) *harness {
	t.Helper()
	return newHarnessWith(t, bus.Settings{AckWait: steadyAckWait, MaxDeliver: 5})
}

// newRedeliveryHarness is newHarness with a short ack wait
// (redeliveryAckWait), for tests that wait for a redelivery.
func newRedeliveryHarness(t *testing.T) *harness {
	t.Helper()
	return newHarnessWith(t, bus.Settings{AckWait: redeliveryAckWait, MaxDeliver: 5})
}

func newHarnessWith(t testing.TB, settings bus.Settings) *harness {
	t.Helper()
	d := testdeploy.Start(t, settings)
	return &harness{t: t, srv: d.Server, nc: d.NC, js: d.JS, settings: d.Settings, names: d.Settings.Names, stores: d.Stores, tools: tools.NewRegistry()}
}

type workerHandle struct {
	t      testing.TB
	w      *Worker
	nc     *nats.Conn
	cancel context.CancelFunc
	done   chan error
}

// stop shuts the worker down gracefully and waits for it. What Run
// returned goes back into done, for the test's cleanup to find.
func (wh *workerHandle) stop() {
	wh.cancel()
	wh.done <- natstest.Recv(wh.t, wh.done, "the worker to stop")
}

// steered reports whether run, running on this worker, was told of a
// steer: it stops at its next safe boundary. A steer's request reaches the
// running run through the thread record and a control signal, so a test
// waits for this before it lets the run reach a boundary.
func (wh *workerHandle) steered(tenant, run string) bool {
	j := wh.w.runningJob(tenant, run)
	if j == nil {
		return false
	}
	j.hold.Lock()
	preempted := j.preemptCtx
	j.hold.Unlock()
	return preempted != nil && errors.Is(context.Cause(preempted), agent.ErrPreempted)
}

// startWorker starts a worker with m as its model. cfg may adjust the
// configuration before start.
func (h *harness) startWorker(m model.Model, cfg func(*Config)) *workerHandle {
	h.t.Helper()
	url := h.srv.URL()
	if h.workerURL != "" {
		url = h.workerURL
	}
	nc, err := nats.Connect(url, nats.MaxReconnects(-1))
	if err != nil {
		h.t.Fatal(err)
	}
	// The chatbot may call every tool the test registered.
	chatbot := agent.Chatbot()
	chatbot.Tools = h.tools.Names()
	profiles := []agent.Profile{chatbot}
	agents, err := agent.NewAgents(m, h.tools, profiles...)
	if err != nil {
		h.t.Fatal(err)
	}
	c := Config{Settings: h.settings, Concurrency: 4, Agents: agents, Logger: zaptest.NewLogger(h.t), WaitPoll: 200 * time.Millisecond, ShutdownGrace: 5 * time.Second}
	if cfg != nil {
		cfg(&c)
	}
	w, err := New(context.Background(), nc, c)
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	wh := &workerHandle{t: h.t, w: w, nc: nc, cancel: cancel, done: make(chan error, 1)}
	go func() {
		err := w.Run(ctx)
		if err != nil && !errors.Is(err, ErrConnectionClosed) {
			h.t.Errorf("worker: %v", err)
		}
		wh.done <- err
	}()
	h.t.Cleanup(func() {
		cancel()
		select {
		case <-wh.done:
		case <-time.After(20 * time.Second):
			h.t.Error("worker did not stop")
		}
		nc.Close()
	})
	return wh
}

// request builds a run request with one user message.
func request(thread, run, text string) *protocol.RunRequest {
	return &protocol.RunRequest{
		RunID: run, ThreadID: thread, Tenant: protocol.DefaultTenant, Agent: protocol.DefaultAgent,
		Input: &protocol.Input{Messages: []model.Message{{Role: model.RoleUser, Content: text}}},
	}
}

// submit publishes a run request the way the gateway does.
func (h *harness) submit(req *protocol.RunRequest) uint64 {
	h.t.Helper()
	req.Normalize()
	data, err := json.Marshal(req)
	if err != nil {
		h.t.Fatal(err)
	}
	return h.publishRaw(h.names.RunSubject(req.Tenant, req.ThreadID), data, req.RunID)
}

func (h *harness) publishRaw(subject string, data []byte, msgID string) uint64 {
	h.t.Helper()
	m := nats.NewMsg(subject)
	m.Data = data
	if msgID != "" {
		// Every submitter's form: "<tenant>.<run>".
		if tenant, _, ok := h.names.ParseRunSubject(subject); ok {
			msgID = protocol.RunMsgID(tenant, msgID)
		}
		m.Header.Set(nats.MsgIdHdr, msgID)
	}
	ack, err := h.js.PublishMsg(context.Background(), m)
	if err != nil {
		h.t.Fatal(err)
	}
	return ack.Sequence
}

// watcher collects the events of one run as they are stored.
type watcher struct {
	mu     sync.Mutex
	events []protocol.Event
	done   chan struct{}
	cc     jetstream.ConsumeContext
}

func (h *harness) watch(tenant, thread, run string) *watcher {
	h.t.Helper()
	oc, err := h.js.OrderedConsumer(context.Background(), h.names.EventsStream(), jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{h.names.RunEvents(tenant, thread, run)},
	})
	if err != nil {
		h.t.Fatal(err)
	}
	w := &watcher{done: make(chan struct{})}
	cc, err := oc.Consume(func(m jetstream.Msg) {
		var ev protocol.Event
		if err := json.Unmarshal(m.Data(), &ev); err != nil {
			h.t.Errorf("undecodable event: %v", err)
			return
		}
		w.mu.Lock()
		w.events = append(w.events, ev)
		if ev.Type == protocol.EventRunFinished {
			select {
			case <-w.done:
			default:
				close(w.done)
			}
		}
		w.mu.Unlock()
	})
	if err != nil {
		h.t.Fatal(err)
	}
	w.cc = cc
	h.t.Cleanup(cc.Stop)
	return w
}

// finished waits for run.finished and returns its data.
// minFinish is the shortest wait for a run to finish (finished).
const minFinish = time.Minute

func (w *watcher) finished(t *testing.T, timeout time.Duration) protocol.FinishedData {
	t.Helper()
	// The timeout says when a run is overdue, not how fast it must be: on
	// a shared machine under -race a process's first run alone (its
	// token encoder) took 7 s, so no wait is shorter than minFinish.
	timeout = max(timeout, minFinish)
	select {
	case <-w.done:
	case <-time.After(timeout):
		t.Fatalf("run did not finish in %s; events so far: %v", timeout, w.types())
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, ev := range w.events {
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

func (w *watcher) count(eventType string) int {
	n := 0
	for _, ev := range w.all() {
		if ev.Type == eventType {
			n++
		}
	}
	return n
}

func (h *harness) run(tenant, run string) *protocol.Run {
	h.t.Helper()
	// As clients see it: since protocol v2 a running run's record is
	// pending or missing, and its thread's lease says it runs.
	r, err := h.stores.FindRunView(context.Background(), tenant, run)
	if err != nil {
		h.t.Fatalf("get run %s: %v", run, err)
	}
	return r
}

// view reads a run of a known thread as clients see it (kv.RunView).
func (h *harness) view(tenant, thread, run string) *protocol.Run {
	h.t.Helper()
	r, _, err := h.stores.RunView(context.Background(), tenant, thread, run)
	if err != nil {
		h.t.Fatalf("get run %s: %v", run, err)
	}
	return r
}

func (h *harness) threadState(tenant, thread string) []model.Message {
	h.t.Helper()
	th, _, err := h.stores.Threads.Get(context.Background(), tenant, thread)
	if err != nil {
		h.t.Fatalf("get thread %s: %v", thread, err)
	}
	st, _, err := h.stores.Checkpoints.Load(context.Background(), tenant, thread, th.Head)
	if err != nil {
		h.t.Fatal(err)
	}
	return st.Messages
}

func (h *harness) cancel(tenant, thread, run string) (*protocol.CancelReply, *protocol.ErrorReply) {
	h.t.Helper()
	msg, err := h.nc.Request(h.names.CancelSubject(tenant, thread, run), nil, 20*time.Second)
	if err != nil {
		h.t.Fatalf("cancel request: %v", err)
	}
	if msg.Header.Get("Nats-Service-Error-Code") != "" {
		var e protocol.ErrorReply
		if err := json.Unmarshal(msg.Data, &e); err != nil {
			h.t.Fatal(err)
		}
		return nil, &e
	}
	var r protocol.CancelReply
	if err := json.Unmarshal(msg.Data, &r); err != nil {
		h.t.Fatal(err)
	}
	return &r, nil
}

// textModel answers every call with text streamed in pieces.
func textModel(text string, pieces int, pieceDelay time.Duration) *model.Scripted {
	return model.NewScripted(func(int, *model.Request) model.Reply {
		return model.Reply{Text: text, Pieces: pieces, PieceDelay: pieceDelay}
	})
}

// toolThenText calls tool once per user turn, then answers.
func toolThenText(tool, args, text string) *model.Scripted {
	return model.NewScripted(func(n int, req *model.Request) model.Reply {
		last := req.Messages[len(req.Messages)-1]
		if last.Role == model.RoleTool {
			return model.Reply{Text: text + ": " + last.Content, Pieces: 3}
		}
		return model.Reply{Text: "calling", ToolCalls: []model.ToolCall{{ID: fmt.Sprintf("call_%d", n), Name: tool, Arguments: args}}}
	})
}

// maxDeliveriesEnded checks that the run w watches (thread t1, request
// seq), delivered twice to workers that died, ended as an error naming
// that, was dead-lettered with that reason and left the runs stream, and
// that its thread takes the next run.
func (h *harness) maxDeliveriesEnded(t *testing.T, w *watcher, seq uint64) {
	t.Helper()
	fin := w.finished(t, 15*time.Second)
	if fin.Status != protocol.StatusError || !strings.Contains(fin.Error, "delivered 2 times") {
		t.Fatalf("run ended %s: %q", fin.Status, fin.Error)
	}
	dl := h.deadLetter(t, "default", "t1", seq)
	if !strings.Contains(dl.Header.Get(HeaderDLQReason), "delivered 2 times") {
		t.Fatalf("dead letter reason %q", dl.Header.Get(HeaderDLQReason))
	}
	h.waitRunsStreamEmpty(t)
	// The thread is free again: the lease the dead run held was released.
	next := h.watch("default", "t1", "next")
	h.submit(request("t1", "next", "hello"))
	if fin := next.finished(t, 10*time.Second); fin.Status != protocol.StatusSuccess {
		t.Fatalf("next run %s: %s", fin.Status, fin.Error)
	}
}
