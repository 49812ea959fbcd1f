package memory

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap/zaptest"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/jobs"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/model/openaitest"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/testdeploy"
	"github.com/natsagent/natsagent/internal/tools"
	"github.com/natsagent/natsagent/internal/worker"
)

// TestMemoryEndToEnd runs the whole path on an embedded JetStream server
// and the strict OpenAI-compatible test server: a run with memory enabled
// remembers a note, its memory job runs on the worker after the debounce
// window and stores facts in KV, and the next run of the same user (on
// another thread) has both in its request.
func TestMemoryEndToEnd(t *testing.T) {
	e := newEnv(t, Config{})
	llm := openaitest.NewServer(t, func(req *openaitest.Request) openaitest.Reply {
		if strings.Contains(req.Messages[0].Content, "long-term memory about one user") {
			return openaitest.Text(`{"facts":[{"content":"The user is vegetarian.","category":"preference","confidence":0.9},` +
				`{"content":"The user may own a bike.","category":"context","confidence":0.3}]}`)
		}
		last := req.LastMessage()
		switch {
		case last.Role == model.RoleTool:
			return openaitest.Text("Noted!")
		case strings.Contains(last.Content, "remember that"):
			return openaitest.ToolCall(middleware.RememberTool, `{"note":"Lives in Lyon"}`)
		}
		return openaitest.Text("How about a ratatouille?")
	})
	m, err := model.NewOpenAI(model.OpenAIConfig{BaseURL: llm.URL(), Model: "test"})
	if err != nil {
		t.Fatal(err)
	}
	profile := agent.Chatbot()
	profile.Middleware.Settings = map[string]json.RawMessage{
		"memory": json.RawMessage(`{"enabled": true, "facts": {"enabled": true, "debounce_seconds": 1, "model": "extractor"}}`),
	}
	agents, err := agent.NewAgentsWith(agent.Resources{Model: m, Tools: tools.NewRegistry(), Memory: e.store}, profile)
	if err != nil {
		t.Fatal(err)
	}
	nc := e.srv.Connect()
	runner, err := jobs.NewRunner(context.Background(), e.js, jobs.Config{
		Settings: e.settings,
		Handlers: map[string]jobs.Handler{JobKind: NewExtractor(e.store, e.stores, m, zaptest.NewLogger(t)).Handle},
		Logger:   zaptest.NewLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(context.Background(), nc, worker.Config{Settings: e.settings, Agents: agents, Jobs: runner, Logger: zaptest.NewLogger(t), ShutdownGrace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := natstest.Recv(t, done, "the worker to stop"); err != nil {
			t.Errorf("worker: %v", err)
		}
	})

	e.submit("h1", "r1", "kim", "Please remember that I live in Lyon. I'm vegetarian, by the way.")
	e.waitRun("r1")
	if notes, _ := e.store.Notes(context.Background(), "default", "kim"); notes != "- Lives in Lyon" {
		t.Fatalf("notes %q", notes)
	}
	testdeploy.WaitFor(t, 60*time.Second, "facts in KV", func() bool {
		f, _ := e.store.Facts(context.Background(), "default", "kim")
		return len(f) > 0
	})
	facts, _ := e.store.Facts(context.Background(), "default", "kim")
	if len(facts) != 1 || facts[0].Content != "The user is vegetarian." || facts[0].SourceThread != "h1" {
		t.Fatalf("facts %+v", facts)
	}

	e.submit("h2", "r2", "kim", "What should I cook tonight?")
	e.waitRun("r2")
	var next *openaitest.Request
	for _, r := range llm.Requests() {
		if r.LastMessage().Content == "What should I cook tonight?" {
			next = &r
		}
	}
	if next == nil {
		t.Fatal("the second run never called the model")
	}
	sys := next.Messages[0].Content
	if next.Messages[0].Role != model.RoleSystem || !strings.Contains(sys, "- Lives in Lyon") ||
		!strings.Contains(sys, "- [preference | 0.90] The user is vegetarian.") || strings.Contains(sys, "bike") {
		t.Fatalf("the next run's request lacks the memory:\n%s", sys)
	}
	if v := llm.Violations(); len(v) > 0 {
		t.Fatalf("a strict provider would have refused requests: %v", v)
	}
	var extractions int
	for _, r := range llm.Requests() {
		if strings.Contains(r.Messages[0].Content, "long-term memory about one user") {
			extractions++
			if r.Model != "extractor" || len(r.Tools) != 0 {
				t.Errorf("extraction request: model %q, %d tools", r.Model, len(r.Tools))
			}
		}
	}
	if extractions != 1 {
		t.Fatalf("%d extraction calls so far, want 1", extractions)
	}
}

func (e *env) submit(thread, run, user, text string) {
	e.t.Helper()
	req := &protocol.RunRequest{
		RunID: run, ThreadID: thread, Tenant: protocol.DefaultTenant, Agent: protocol.DefaultAgent,
		Input:  &protocol.Input{Messages: []model.Message{{Role: model.RoleUser, Content: text}}},
		Config: protocol.RunConfig{UserID: user},
	}
	req.Normalize()
	data, err := json.Marshal(req)
	if err != nil {
		e.t.Fatal(err)
	}
	m := nats.NewMsg(e.settings.Names.RunSubject(req.Tenant, thread))
	m.Data = data
	m.Header.Set(nats.MsgIdHdr, protocol.RunMsgID(req.Tenant, run))
	if _, err := e.js.PublishMsg(context.Background(), m); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) waitRun(run string) {
	e.t.Helper()
	var rec *protocol.Run
	testdeploy.WaitFor(e.t, 60*time.Second, "run "+run, func() bool {
		r, _, err := e.stores.Runs.Get(context.Background(), protocol.DefaultTenant, run)
		rec = r
		return err == nil && r.Status.Terminal()
	})
	if rec.Status != protocol.StatusSuccess {
		e.t.Fatalf("run %s ended %s: %s", run, rec.Status, rec.Error)
	}
}
