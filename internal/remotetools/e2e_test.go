package remotetools_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/app"
	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/remotetools"
	"github.com/natsagent/natsagent/internal/worker"
)

// script is the test model: per scenario (the run's user text), the calls
// it makes first; it records what it was offered and the results it got.
type script struct {
	mu      sync.Mutex
	calls   map[string][]model.ToolCall
	offered map[string][]string
	results map[string]map[string]model.Message // scenario → tool call id → result
}

func (s *script) reply(_ int, req *model.Request) model.Reply {
	s.mu.Lock()
	defer s.mu.Unlock()
	var scenario string
	for _, m := range req.Messages {
		if m.Role == model.RoleUser {
			scenario = strings.Fields(m.Content)[0]
		}
	}
	last := req.Messages[len(req.Messages)-1]
	if last.Role != model.RoleTool {
		var names []string
		for _, t := range req.Tools {
			if strings.HasPrefix(t.Name, remotetools.Prefix) {
				names = append(names, t.Name)
			}
		}
		s.offered[scenario] = names
		return model.Reply{ToolCalls: s.calls[scenario]}
	}
	got := map[string]model.Message{}
	for _, m := range req.Messages {
		if m.Role == model.RoleTool {
			got[m.ToolCallID] = m
		}
	}
	s.results[scenario] = got
	return model.Reply{Text: "done"}
}

// TestRunsCallRemoteTools runs a worker configured as a deployment is: a
// profile selecting every remote tool, another selecting one, tools served
// by a separate connection for tenant acme. A run calls a tool that
// answers and one that times out and goes on; another tenant's run sees
// none of acme's tools and cannot call them by name; a profile's
// unselected tool is refused by name; a tool served after the start
// reaches the next run after a refresh.
func TestRunsCallRemoteTools(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect()
	settings := bus.Settings{AckWait: 5 * time.Second}.WithDefaults()
	natstest.Provision(t, nc, settings)

	var mu sync.Mutex
	var weatherCalls []nats.Header
	var secretCalls atomic.Int32
	release := make(chan struct{})
	defer close(release)
	serve(t, srv, "acme-tools", "1.0.0",
		tool("acme", "weather", "Current weather of a city.", func(req micro.Request) {
			var in struct{ City string }
			_ = json.Unmarshal(req.Data(), &in)
			mu.Lock()
			weatherCalls = append(weatherCalls, nats.Header(req.Headers()))
			mu.Unlock()
			_ = req.Respond([]byte("sunny in " + in.City))
		}).with(remotetools.MetaSchema, `{"type":"object","properties":{"city":{"type":"string"}}}`),
		tool("acme", "slow", "Never answers in time.", func(micro.Request) { <-release }).with(remotetools.MetaTimeout, "300"),
		tool("acme", "secret", "Only for the chatbot.", func(req micro.Request) {
			secretCalls.Add(1)
			_ = req.Respond([]byte("the secret"))
		}),
	)

	cfg := config.Default()
	cfg.RemoteTools.DiscoveryWindow = config.Duration(150 * time.Millisecond)
	cfg.RemoteTools.RefreshInterval = config.Duration(time.Hour)
	cfg.Agents = []config.Agent{
		{Name: "chatbot", SystemPrompt: "You test remote tools.", Tools: []string{"current_time", remotetools.Wildcard}},
		{Name: "narrow", SystemPrompt: "You may check the weather.", Tools: []string{"remote:weather"}},
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s := &script{
		calls: map[string][]model.ToolCall{
			"weather": {{ID: "w1", Name: "remote__weather", Arguments: `{"city":"Paris"}`}, {ID: "s1", Name: "remote__slow", Arguments: `{}`}},
			"beta":    {{ID: "b1", Name: "remote__weather", Arguments: `{"city":"Oslo"}`}},
			"narrow":  {{ID: "n1", Name: "remote__secret", Arguments: `{}`}},
			"late":    {{ID: "l1", Name: "remote__late", Arguments: `{}`}},
		},
		offered: map[string][]string{}, results: map[string]map[string]model.Message{},
	}
	m := model.NewScripted(s.reply)
	log := zaptest.NewLogger(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	catalog, err := app.RemoteTools(ctx, cfg, nc, settings, log)
	if err != nil {
		t.Fatal(err)
	}
	defer catalog.Stop()
	// Wired as cmd/worker does: MCP tools beside the remote ones.
	mcpServers, err := app.MCP(ctx, cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = mcpServers.Close() }()
	agents, err := app.Agents(cfg, m, app.WithMCP(mcpServers), app.WithRemoteTools(catalog))
	if err != nil {
		t.Fatal(err)
	}
	startWorker(t, srv, settings, agents, log)
	discovered(t, catalog, "acme", "remote__secret", "remote__slow", "remote__weather")

	// acme's chatbot: every acme tool offered; one answers, one times out,
	// the run goes on to its answer.
	if fin := runOnce(t, nc, settings, "acme", "chatbot", "t1", "r1", "weather in Paris?"); fin.Status != protocol.StatusSuccess || fin.Output == nil || fin.Output.Content != "done" {
		t.Fatalf("acme's run ended %+v", fin)
	}
	s.mu.Lock()
	if got := strings.Join(s.offered["weather"], ","); got != "remote__secret,remote__slow,remote__weather" {
		t.Errorf("acme's chatbot was offered %s", got)
	}
	if r := s.results["weather"]["w1"]; r.Content != "sunny in Paris" || r.Status == model.ToolStatusError {
		t.Errorf("weather result %+v", r)
	}
	if r := s.results["weather"]["s1"]; r.Status != model.ToolStatusError || !strings.Contains(r.Content, "did not answer within 300ms") {
		t.Errorf("slow result %+v", r)
	}
	s.mu.Unlock()
	mu.Lock()
	if len(weatherCalls) != 1 {
		t.Fatalf("weather calls %v", weatherCalls)
	}
	for k, want := range map[string]string{remotetools.HeaderTenant: "acme", remotetools.HeaderThread: "t1", remotetools.HeaderRun: "r1", remotetools.HeaderToolCall: "w1", remotetools.HeaderUser: "default"} {
		if v := weatherCalls[0].Get(k); v != want {
			t.Errorf("header %s = %q, want %q", k, v, want)
		}
	}
	mu.Unlock()

	// Tenant beta sees none of acme's tools, and naming one does not
	// reach acme's server.
	if fin := runOnce(t, nc, settings, "beta", "chatbot", "t2", "r2", "beta wants the weather"); fin.Status != protocol.StatusSuccess {
		t.Fatalf("beta's run ended %+v", fin)
	}
	s.mu.Lock()
	if got := s.offered["beta"]; len(got) != 0 {
		t.Errorf("beta was offered %v", got)
	}
	if r := s.results["beta"]["b1"]; r.Status != model.ToolStatusError || !strings.Contains(r.Content, "remote__weather") {
		t.Errorf("beta's call result %+v", r)
	}
	s.mu.Unlock()
	mu.Lock()
	if len(weatherCalls) != 1 {
		t.Errorf("acme's weather tool was called by beta's run: %v", weatherCalls)
	}
	mu.Unlock()

	// A profile selecting one tool is offered that one; another called
	// by name is refused before it reaches the server.
	if fin := runOnce(t, nc, settings, "acme", "narrow", "t3", "r3", "narrow asks for the secret"); fin.Status != protocol.StatusSuccess {
		t.Fatalf("narrow run ended %+v", fin)
	}
	s.mu.Lock()
	if got := strings.Join(s.offered["narrow"], ","); got != "remote__weather" {
		t.Errorf("the narrow profile was offered %s", got)
	}
	if r := s.results["narrow"]["n1"]; r.Status != model.ToolStatusError {
		t.Errorf("unselected tool result %+v", r)
	}
	s.mu.Unlock()
	if n := secretCalls.Load(); n != 0 {
		t.Errorf("the unselected tool ran %d times", n)
	}

	// A tool served after the start reaches the next run once refreshed.
	serve(t, srv, "late-tools", "1.0.0", tool("acme", "late", "Came late.", func(req micro.Request) { _ = req.Respond([]byte("late but here")) }))
	discovered(t, catalog, "acme", "remote__late")
	if fin := runOnce(t, nc, settings, "acme", "chatbot", "t4", "r4", "late tool please"); fin.Status != protocol.StatusSuccess {
		t.Fatalf("late run ended %+v", fin)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.results["late"]["l1"]; r.Content != "late but here" {
		t.Errorf("late tool result %+v", r)
	}
}

// A profile entry that can never name a remote tool fails the start with
// the profile's name; a built-in or MCP tool in the remote namespace too.
func TestProfileEntryChecked(t *testing.T) {
	srv := natstest.Start(t)
	cfg := config.Default()
	cfg.Agents = []config.Agent{{Name: "chatbot", Tools: []string{"remote:bad.name"}}}
	catalog := remotetools.New(srv.Connect(), remotetools.Options{})
	_, err := app.Agents(cfg, model.NewScripted(func(int, *model.Request) model.Reply { return model.Reply{Text: "x"} }), app.WithRemoteTools(catalog))
	if err == nil || !strings.Contains(err.Error(), `agent profile "chatbot"`) || !strings.Contains(err.Error(), "remote:bad.name") {
		t.Fatalf("err %v", err)
	}
}

func startWorker(t *testing.T, srv *natstest.Server, settings bus.Settings, agents *agent.Agents, log *zap.Logger) {
	t.Helper()
	nc := srv.Connect()
	w, err := worker.New(context.Background(), nc, worker.Config{Settings: settings, Concurrency: 2, Agents: agents, Logger: log, ShutdownGrace: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = w.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		natstest.Recv(t, done, "the worker to stop")
	})
}

// runOnce submits a run request as a client does and waits for its
// run.finished event.
// discovered refreshes the catalog until it lists names among tenant's
// tools. A discovery takes the answers that came within its window (150ms
// here); under load a service can answer later, and the next discovery
// finds it.
func discovered(t *testing.T, catalog *remotetools.Catalog, tenant string, names ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), natstest.Patience)
	defer cancel()
	for {
		var have []string
		for _, tool := range catalog.Tools(tenant) {
			have = append(have, tool.Spec().Name)
		}
		if !slices.ContainsFunc(names, func(n string) bool { return !slices.Contains(have, n) }) {
			return
		}
		if err := catalog.Refresh(ctx); err != nil {
			t.Fatalf("%s's tools %v, want %v among them: %v", tenant, have, names, err)
		}
	}
}

func runOnce(t *testing.T, nc *nats.Conn, settings bus.Settings, tenant, agentName, thread, run, text string) protocol.FinishedData {
	t.Helper()
	names := settings.Names
	sub, err := nc.SubscribeSync(names.RunEvents(tenant, thread, run))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	req := &protocol.RunRequest{RunID: run, ThreadID: thread, Tenant: tenant, Agent: agentName,
		Input: &protocol.Input{Messages: []model.Message{{Role: model.RoleUser, Content: text}}}}
	req.Normalize()
	data, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	msg := nats.NewMsg(names.RunSubject(tenant, thread))
	msg.Data = data
	msg.Header.Set(nats.MsgIdHdr, protocol.RunMsgID(tenant, run))
	if _, err := js.PublishMsg(context.Background(), msg); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(natstest.Patience)
	for {
		m, err := sub.NextMsg(time.Until(deadline))
		if err != nil {
			t.Fatalf("run %s did not finish: %v", run, err)
		}
		var ev protocol.Event
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			t.Fatal(err)
		}
		if ev.Type != protocol.EventRunFinished {
			continue
		}
		var fin protocol.FinishedData
		if err := json.Unmarshal(ev.Data, &fin); err != nil {
			t.Fatal(err)
		}
		return fin
	}
}
