package subagents_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/subagents"
	"github.com/natsagent/natsagent/internal/testdeploy"
	"github.com/natsagent/natsagent/internal/tools"
)

// heldLead starts a worker whose lead run "lead1" on thread "t1" stays
// running (in a tool call) until the returned release is called, so raw
// clients can start its children. Researcher children answer "done:
// <task>", or run until cancelled when the task says "block".
func heldLead(t *testing.T, e *env) (release func()) {
	t.Helper()
	held := make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(held) }) }
	e.reg.Register(tools.Func(model.ToolSpec{Name: "hold", Parameters: json.RawMessage(`{"type":"object"}`)}, func(ctx context.Context, _ json.RawMessage) (string, error) {
		select {
		case <-held:
			return "released", nil
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}))
	e.setLead(func(p *agent.Profile) { p.Tools = []string{"hold"} })
	s := newScript(map[string]func(context.Context, *model.Request) model.Reply{
		"lead": leadDelegates(model.ToolCall{ID: "h", Name: "hold", Arguments: "{}"}),
		"researcher": func(_ context.Context, req *model.Request) model.Reply {
			if strings.Contains(req.LastUserContent(), "block") {
				return model.Reply{Delay: time.Hour}
			}
			return model.Reply{Text: "done: " + req.LastUserContent()}
		},
	})
	e.startWorker("wa", s.model(), 8, nil)
	t.Cleanup(release) // before the worker stops
	e.submit("t1", "lead1", "hold on")
	e.waitStatus("lead1", 10*time.Second, protocol.StatusRunning)
	return release
}

// rawClient talks to the service with nothing but nats.go, on its own
// connection.
type rawClient struct {
	t  *testing.T
	nc *nats.Conn
}

func (c rawClient) request(subject string, body any, timeout time.Duration) *nats.Msg {
	c.t.Helper()
	data, ok := body.([]byte)
	if !ok {
		data, _ = json.Marshal(body)
	}
	msg, err := c.nc.Request(subject, data, timeout)
	if err != nil {
		c.t.Fatalf("request %s: %v", subject, err)
	}
	return msg
}

// ok decodes a success reply into v.
func (c rawClient) ok(msg *nats.Msg, v any) {
	c.t.Helper()
	if code := msg.Header.Get("Nats-Service-Error-Code"); code != "" {
		c.t.Fatalf("error reply %s: %s (%s)", code, msg.Header.Get("Nats-Service-Error"), msg.Data)
	}
	if err := json.Unmarshal(msg.Data, v); err != nil {
		c.t.Fatalf("reply %s: %v", msg.Data, err)
	}
}

// fails checks an error reply's code and returns its body.
func (c rawClient) fails(msg *nats.Msg, code string) protocol.SubagentError {
	c.t.Helper()
	if got := msg.Header.Get("Nats-Service-Error-Code"); got != code {
		c.t.Fatalf("reply code %q (%s: %s), want %s", got, msg.Header.Get("Nats-Service-Error"), msg.Data, code)
	}
	if msg.Header.Get("Nats-Service-Error") == "" {
		c.t.Error("error reply without a description")
	}
	var body protocol.SubagentErrorReply
	if err := json.Unmarshal(msg.Data, &body); err != nil {
		c.t.Fatalf("error body %s: %v", msg.Data, err)
	}
	return body.Error
}

// A client with only nats.go discovers the service, starts a subagent for
// a running run, starts it again (the same child), reads its status, awaits
// its answer, cancels another child, and gets coded errors for bad input,
// unknown runs and a busy child thread.
func TestRawClientDrivesTheService(t *testing.T) {
	e := newEnv(t)
	release := heldLead(t, e)
	c := rawClient{t: t, nc: e.srv.Connect()}
	subj := func(op string) string { return "agent.subagent.default." + op }

	// Discovery.
	var info struct {
		Name      string            `json:"name"`
		Version   string            `json:"version"`
		Metadata  map[string]string `json:"metadata"`
		Endpoints []struct {
			Name       string `json:"name"`
			Subject    string `json:"subject"`
			QueueGroup string `json:"queue_group"`
		} `json:"endpoints"`
	}
	c.ok(c.request("$SRV.INFO.natsagent-subagents", nil, 5*time.Second), &info)
	if info.Version != protocol.SubagentServiceVersion || info.Metadata["natsagent"] != "subagents" || len(info.Endpoints) != 4 {
		t.Fatalf("service info %+v", info)
	}
	for _, ep := range info.Endpoints {
		if ep.Subject != "agent.subagent.*."+ep.Name || ep.QueueGroup != "natsagent-subagents" {
			t.Errorf("endpoint %+v", ep)
		}
	}

	start := map[string]any{"parent": map[string]string{"run_id": "lead1", "thread_id": "t1", "tool_call_id": "raw-1"}, "subagent": "researcher", "task": "summarize the report"}
	var first, again protocol.SubagentStarted
	c.ok(c.request(subj("start"), start, 10*time.Second), &first)
	wantThread, wantRun := child("t1", "lead1", "researcher", "raw-1")
	if first.RunID != wantRun || first.ThreadID != wantThread || first.Existing {
		t.Fatalf("started %+v, want run %s thread %s", first, wantRun, wantThread)
	}
	c.ok(c.request(subj("start"), start, 10*time.Second), &again)
	if again.RunID != first.RunID || !again.Existing {
		t.Fatalf("retried start %+v", again)
	}

	// Concurrent retries of one start make one child, started once.
	same := map[string]any{"parent": map[string]string{"run_id": "lead1", "thread_id": "t1", "tool_call_id": "raw-c"}, "subagent": "researcher", "task": "count me once"}
	var wg sync.WaitGroup
	replies := make([]protocol.SubagentStarted, 5)
	for i := range replies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			data, _ := json.Marshal(same)
			msg, err := c.nc.Request(subj("start"), data, 10*time.Second)
			if err == nil {
				err = json.Unmarshal(msg.Data, &replies[i])
			}
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	fresh := 0
	for _, r := range replies {
		if r.RunID != replies[0].RunID || r.RunID == "" {
			t.Fatalf("concurrent starts answered %+v", replies)
		}
		if !r.Existing {
			fresh++
		}
	}
	if fresh != 1 {
		t.Errorf("%d of the concurrent starts say they started the child, want 1: %+v", fresh, replies)
	}
	e.waitStatus(replies[0].RunID, 10*time.Second, protocol.StatusSuccess)
	if ids, err := e.stores.Threads.RunIDs(context.Background(), protocol.DefaultTenant, replies[0].ThreadID); err != nil || len(ids) != 1 {
		t.Errorf("the child thread has runs %v (%v), want one", ids, err)
	}

	var done protocol.SubagentStatus
	c.ok(c.request(subj("await"), map[string]any{"run_id": first.RunID, "timeout_ms": 15000}, 20*time.Second), &done)
	if done.Status != protocol.StatusSuccess || done.Result != "done: summarize the report" || done.TimedOut || done.ParentRunID != "lead1" || done.Subagent != "researcher" {
		t.Fatalf("await %+v", done)
	}
	var st protocol.SubagentStatus
	c.ok(c.request(subj("status"), map[string]string{"run_id": first.RunID}, 10*time.Second), &st)
	if st.Status != protocol.StatusSuccess || st.Result != done.Result || len(st.Progress) == 0 || !strings.HasPrefix(st.Progress[len(st.Progress)-1], "says: done") {
		t.Fatalf("status %+v", st)
	}
	// Only children of the named parent are visible.
	c.fails(c.request(subj("status"), map[string]string{"run_id": first.RunID, "parent_run_id": "someone-else"}, 10*time.Second), "404")

	// A child that runs until cancelled; its thread is busy meanwhile.
	block := map[string]any{"parent": map[string]string{"run_id": "lead1", "thread_id": "t1", "tool_call_id": "raw-2"}, "subagent": "researcher", "task": "block forever"}
	var blocked protocol.SubagentStarted
	c.ok(c.request(subj("start"), block, 10*time.Second), &blocked)
	e.waitStatus(blocked.RunID, 10*time.Second, protocol.StatusRunning)
	cont := map[string]any{"parent": map[string]string{"run_id": "lead1", "thread_id": "t1", "tool_call_id": "raw-3"}, "subagent": "researcher", "task": "more", "thread_id": blocked.ThreadID}
	busy := c.fails(c.request(subj("start"), cont, 10*time.Second), "409")
	if busy.Code != protocol.CodeBusy || busy.ActiveRunID != blocked.RunID || busy.ThreadID != blocked.ThreadID {
		t.Errorf("busy reply %+v", busy)
	}
	var cancelled protocol.SubagentStatus
	c.ok(c.request(subj("cancel"), map[string]string{"run_id": blocked.RunID}, 40*time.Second), &cancelled)
	if cancelled.Status != protocol.StatusCancelled {
		t.Errorf("cancel answered %+v", cancelled)
	}
	// Once the thread is free, it can be continued.
	var continued protocol.SubagentStarted
	c.ok(c.request(subj("start"), cont, 10*time.Second), &continued)
	if continued.ThreadID != blocked.ThreadID || continued.RunID == blocked.RunID {
		t.Errorf("continuation %+v", continued)
	}

	// Errors, with their codes.
	c.fails(c.request(subj("start"), []byte(`{"parent":`), 5*time.Second), "400")
	c.fails(c.request(subj("start"), map[string]any{"parent": map[string]string{"run_id": "lead1", "thread_id": "t1", "tool_call_id": "x"}, "subagent": "nobody", "task": "x"}, 5*time.Second), "400")
	c.fails(c.request(subj("start"), map[string]any{"parent": map[string]string{"run_id": "lead1", "thread_id": "t1"}, "subagent": "researcher", "task": "x"}, 5*time.Second), "400")
	c.fails(c.request(subj("start"), map[string]any{"parent": map[string]string{"run_id": "ghost", "thread_id": "t1", "tool_call_id": "x"}, "subagent": "researcher", "task": "x"}, 5*time.Second), "404")
	c.fails(c.request(subj("status"), map[string]string{"run_id": "ghost"}, 5*time.Second), "404")
	c.fails(c.request(subj("await"), map[string]string{"run_id": "lead1"}, 5*time.Second), "404") // not a subagent run
	c.fails(c.request("agent.subagent.bad$tenant.status", map[string]string{"run_id": "x"}, 5*time.Second), "400")
	// A subagent cannot be a parent.
	c.fails(c.request(subj("start"), map[string]any{"parent": map[string]string{"run_id": continued.RunID, "thread_id": continued.ThreadID, "tool_call_id": "x"}, "subagent": "researcher", "task": "x"}, 5*time.Second), "400")

	c.ok(c.request(subj("cancel"), map[string]string{"run_id": continued.RunID}, 40*time.Second), &cancelled)

	release()
	e.waitStatus("lead1", 20*time.Second, protocol.StatusSuccess)
	// A finished run starts nothing.
	c.fails(c.request(subj("start"), map[string]any{"parent": map[string]string{"run_id": "lead1", "thread_id": "t1", "tool_call_id": "late"}, "subagent": "researcher", "task": "x"}, 5*time.Second), "409")
}

// An await whose child does not end answers when its timeout passes, and
// while awaits wait, the service keeps answering other requests: a
// status asked once a hundred awaits reached the service is answered
// while they all still wait, and they answer when their child ends. No
// wall-clock bound but the lower one (an await never answers before its
// timeout): the awaits that must still wait have the longest timeout, so
// a loaded host that takes seconds to answer the status fails nothing.
func TestAwaitTimeoutDoesNotBlockOtherRequests(t *testing.T) {
	e := newEnv(t)
	heldLead(t, e)
	c := rawClient{t: t, nc: e.srv.Connect()}
	var blocked protocol.SubagentStarted
	c.ok(c.request("agent.subagent.default.start", map[string]any{"parent": map[string]string{"run_id": "lead1", "thread_id": "t1", "tool_call_id": "b"}, "subagent": "researcher", "task": "block"}, 10*time.Second), &blocked)

	const short = time.Second
	began := time.Now()
	var timedOut protocol.SubagentStatus
	c.ok(c.request("agent.subagent.default.await", map[string]any{"run_id": blocked.RunID, "timeout_ms": short.Milliseconds()}, short+natstest.Patience), &timedOut)
	if !timedOut.TimedOut || timedOut.Status.Terminal() {
		t.Fatalf("await past its timeout answered %+v", timedOut)
	}
	if took := time.Since(began); took < short {
		t.Fatalf("await answered after %s, before its timeout of %s", took, short)
	}

	const awaits = 100
	body, _ := json.Marshal(map[string]any{"run_id": blocked.RunID, "timeout_ms": subagents.MaxAwaitTimeout.Milliseconds()})
	received := awaitsReceived(t, c.nc)
	replies := make(chan *nats.Msg, awaits)
	for range awaits {
		go func() {
			msg, err := c.nc.Request("agent.subagent.default.await", body, subagents.MaxAwaitTimeout+natstest.Patience)
			if err != nil {
				t.Error(err)
				replies <- nil
				return
			}
			replies <- msg
		}()
	}
	testdeploy.WaitFor(t, natstest.Patience, "the awaits to reach the service", func() bool {
		return awaitsReceived(t, c.nc) >= received+awaits
	})
	var st protocol.SubagentStatus
	c.ok(c.request("agent.subagent.default.status", map[string]string{"run_id": blocked.RunID}, natstest.Patience), &st)
	if st.Status == "" || st.Status.Terminal() {
		t.Errorf("status answered %+v", st)
	}
	if n := len(replies); n != 0 {
		t.Fatalf("%d awaits answered before their child ended or their timeout", n)
	}
	// The child ends: every await answers with its end.
	c.request("agent.subagent.default.cancel", map[string]string{"run_id": blocked.RunID}, natstest.Patience)
	for range awaits {
		msg := natstest.Recv(t, replies, "an await to answer once its child ended")
		if msg == nil {
			continue
		}
		var got protocol.SubagentStatus
		c.ok(msg, &got)
		if got.TimedOut || !got.Status.Terminal() {
			t.Fatalf("await answered %+v, want the child's end", got)
		}
	}
}

// awaitsReceived is the number of await requests the subagent service
// (every instance) has received, from its micro stats.
func awaitsReceived(t *testing.T, nc *nats.Conn) int {
	t.Helper()
	subject, err := micro.ControlSubject(micro.StatsVerb, protocol.SubagentService, "")
	if err != nil {
		t.Fatal(err)
	}
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest(subject, inbox, nil); err != nil {
		t.Fatal(err)
	}
	n := 0
	for {
		// Every instance answers; one answer per worker, all at once.
		msg, err := sub.NextMsg(time.Second)
		if err != nil {
			return n
		}
		var stats micro.Stats
		if err := json.Unmarshal(msg.Data, &stats); err != nil {
			t.Fatal(err)
		}
		for _, ep := range stats.Endpoints {
			if ep.Name == protocol.SubagentAwaitOp {
				n += ep.NumRequests
			}
		}
	}
}
