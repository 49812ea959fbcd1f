package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/compact"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
	"github.com/natsagent/natsagent/internal/testdeploy/jobworker"
	"github.com/natsagent/natsagent/internal/tools"
)

// startCompactingWorker starts a worker that also takes compaction jobs;
// its chatbot summarizes at 12 messages and keeps 4.
func (e *env) startCompactingWorker(m model.Model) {
	e.t.Helper()
	chatbot := agent.Chatbot()
	chatbot.Middleware = middleware.ChainConfig{Settings: map[string]json.RawMessage{
		"context_compression": json.RawMessage(`{"trigger_messages": 12, "keep": {"messages": 4}}`),
	}}
	agents, err := agent.NewAgents(m, tools.NewRegistry(), chatbot)
	if err != nil {
		e.t.Fatal(err)
	}
	jobworker.Start(e.t, e.srv.URL(), e.settings, agents, nil, 2)
}

// seedThread gives a thread 10 messages, as an earlier run left them.
func (e *env) seedThread(thread string) {
	e.t.Helper()
	var msgs []model.Message
	for i := range 5 {
		msgs = append(msgs,
			model.Message{ID: fmt.Sprintf("u%d", i), Role: model.RoleUser, Content: fmt.Sprintf("Question %d, asked at some length so it counts.", i)},
			model.Message{ID: fmt.Sprintf("f%d", i), Role: model.RoleAssistant, Content: fmt.Sprintf("Answer %d, given at some length so it counts.", i)})
	}
	ctx := context.Background()
	if _, err := e.stores.Checkpoints.Put(ctx, protocol.DefaultTenant, thread, &kv.Delta{ID: "e1-1", RunID: "old", Step: 1, Time: time.Now().UTC(), Update: state.Update{Messages: msgs}}); err != nil {
		e.t.Fatal(err)
	}
	th := newThread(protocol.DefaultTenant, thread, nil)
	th.Head, th.Epoch = "e1-1", 1
	if _, err := e.stores.Threads.Put(ctx, th, 0); err != nil {
		e.t.Fatal(err)
	}
}

func summarizer() *model.Scripted {
	return model.NewScripted(func(_ int, req *model.Request) model.Reply {
		return model.Reply{Text: "SUMMARY: five questions were answered."}
	})
}

// An idle thread's compaction, waited for: the answer reports the tokens
// before and after, and the thread's state holds the summary and every
// message.
func TestCompactEndpoint_IdleThreadWait(t *testing.T) {
	e := newEnv(t, nil)
	e.startCompactingWorker(summarizer())
	e.seedThread("h1")
	r := e.do("POST", "/threads/h1/compact?wait=true", map[string]any{"job_id": "job-1"}).expect(t, http.StatusOK)
	var reply compactReply
	r.decode(t, &reply)
	d := reply.Result
	if reply.JobID != "job-1" || reply.Status != protocol.CompressionCompleted || d == nil || d.Summarized != 6 || d.Checkpoint != compact.CheckpointID("job-1") {
		t.Fatalf("reply = %s", r.body)
	}
	if d.TokensBefore <= d.TokensAfter || d.TokensAfter == 0 {
		t.Fatalf("tokens before %d, after %d", d.TokensBefore, d.TokensAfter)
	}
	var st struct {
		Values map[string]json.RawMessage `json:"values"`
	}
	e.do("GET", "/threads/h1/state", nil).expect(t, http.StatusOK).decode(t, &st)
	var msgs []model.Message
	_ = json.Unmarshal(st.Values["messages"], &msgs)
	if len(msgs) != 10 || !strings.Contains(string(st.Values[middleware.ContextSummaryValue]), "SUMMARY: five questions") {
		t.Fatalf("state after compaction: %d messages, summary %s", len(msgs), st.Values[middleware.ContextSummaryValue])
	}
}

// Without wait the job is queued (202) and reports on its events subject.
func TestCompactEndpoint_Background(t *testing.T) {
	e := newEnv(t, nil)
	e.startCompactingWorker(summarizer())
	e.seedThread("h1")
	r := e.do("POST", "/threads/h1/compact", nil).expect(t, http.StatusAccepted)
	var reply compactReply
	r.decode(t, &reply)
	if reply.Status != "queued" || reply.Events != "agent.events.default.h1."+reply.JobID+".custom" || !protocol.ValidToken(reply.JobID) {
		t.Fatalf("reply = %s", r.body)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		th, _, err := e.stores.Threads.Get(context.Background(), protocol.DefaultTenant, "h1")
		if err == nil && th.Head == compact.CheckpointID(reply.JobID) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the queued compaction never moved the thread's head")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A busy thread is refused before anything is queued.
func TestCompactEndpoint_BusyThread409(t *testing.T) {
	e := newEnv(t, nil)
	e.seedThread("h1")
	ctx := context.Background()
	now := time.Now().UTC()
	if _, err := e.stores.Runs.Create(ctx, &protocol.Run{RunID: "r-busy", ThreadID: "h1", Tenant: protocol.DefaultTenant, Agent: protocol.DefaultAgent, Status: protocol.StatusRunning, CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.stores.Threads.Mutate(ctx, protocol.DefaultTenant, "h1", func(th *protocol.Thread) error {
		th.Lease = &protocol.Lease{RunID: "r-busy", Worker: "w", Epoch: 2, AcquiredAt: now, RenewedAt: now}
		th.Status = protocol.ThreadBusy
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	r := e.do("POST", "/threads/h1/compact?wait=true", nil).expect(t, http.StatusConflict)
	if body := r.apiError(t); body.Code != protocol.CodeConflict || !strings.Contains(body.Message, "r-busy") {
		t.Fatalf("error = %+v", body)
	}
	js := e.js
	info, err := js.Stream(ctx, e.settings.Names.JobsStream())
	if err != nil {
		t.Fatal(err)
	}
	if n := info.CachedInfo().State.Msgs; n != 0 {
		t.Fatalf("%d jobs queued for a busy thread", n)
	}
	e.do("POST", "/threads/nope/compact", nil).expect(t, http.StatusNotFound)
	e.do("POST", "/threads/h1/compact?wait=maybe", nil).expect(t, http.StatusBadRequest)
}
