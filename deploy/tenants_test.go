package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/app"
	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/gateway"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/tools"
	"github.com/natsagent/natsagent/internal/worker"
)

// tenantsConf is the tenant isolation config under test.
var tenantsConf = filepath.Join(natsConfDir, "tenants.conf")

// tenantsPasswords are the environment variables tenants.conf reads.
var tenantsPasswords = map[string]string{
	"gateway": "NATSAGENT_GATEWAY_PASSWORD",
	"worker":  "NATSAGENT_WORKER_PASSWORD",
	"acme":    "NATSAGENT_ACME_PASSWORD",
	"globex":  "NATSAGENT_GLOBEX_PASSWORD",
}

// startTenantsServer runs a real nats-server whose configuration includes
// tenants.conf as an operator would (`include tenants.conf`), on a random
// loopback port with JetStream in a temp dir.
func startTenantsServer(t *testing.T) string {
	t.Helper()
	for user, env := range tenantsPasswords {
		t.Setenv(env, user+"-test-password")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tenants.conf"), read(t, tenantsConf), 0o600); err != nil {
		t.Fatal(err)
	}
	main := filepath.Join(dir, "server.conf")
	if err := os.WriteFile(main, []byte("jetstream {}\ninclude tenants.conf\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(main)
	if err != nil {
		t.Fatalf("tenants.conf: %v", err)
	}
	opts.Host, opts.Port = "127.0.0.1", -1
	opts.StoreDir = filepath.Join(dir, "js")
	opts.NoLog, opts.NoSigs = true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server with tenants.conf not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s.ClientURL()
}

// natsUser is a connection of one of tenants.conf's users that records
// the server's asynchronous errors (permission violations).
type natsUser struct {
	t    *testing.T
	name string
	nc   *nats.Conn
	errs chan error
}

// connectAs connects as user with app.Connect's options (the binaries'
// code path for user and password); tenants use their inbox prefix.
func connectAs(t *testing.T, url, user string) *natsUser {
	t.Helper()
	cfg := config.Default()
	cfg.NATS.URL, cfg.NATS.User, cfg.NATS.Password = url, user, config.Secret(user+"-test-password")
	opts, err := app.NATSOptions(cfg.NATS)
	if err != nil {
		t.Fatal(err)
	}
	u := &natsUser{t: t, name: user, errs: make(chan error, 100)}
	opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { u.errs <- err }))
	if user != "gateway" && user != "worker" {
		opts = append(opts, nats.CustomInboxPrefix("_INBOX."+user))
	}
	if u.nc, err = bus.Connect(url, "tenants-test-"+user, opts...); err != nil {
		t.Fatalf("connect as %s: %v", user, err)
	}
	t.Cleanup(u.nc.Close)
	return u
}

// denied waits for the server's permission violation of op ("publish" or
// "subscription") on subject.
func (u *natsUser) denied(op, subject string) {
	u.t.Helper()
	want := strings.ToLower(op + ` to "` + subject + `"`)
	deadline := time.After(5 * time.Second)
	for {
		select {
		case err := <-u.errs:
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(strings.ToLower(err.Error()), want) {
				return
			}
			u.t.Errorf("%s: unexpected error %v while waiting for the violation of %s %s", u.name, err, op, subject)
		case <-deadline:
			u.t.Fatalf("%s: %s %s was not refused by the server", u.name, op, subject)
		}
	}
}

// publishDenied publishes data to subject and expects the refusal.
func (u *natsUser) publishDenied(subject string, data []byte) {
	u.t.Helper()
	if err := u.nc.PublishRequest(subject, u.nc.NewRespInbox(), data); err != nil {
		u.t.Fatal(err)
	}
	u.denied("publish", subject)
}

// subscribeDenied subscribes to subject, expects the refusal, and checks
// that nothing arrives.
func (u *natsUser) subscribeDenied(subject string) *nats.Subscription {
	u.t.Helper()
	sub, err := u.nc.SubscribeSync(subject)
	if err != nil {
		u.t.Fatal(err)
	}
	u.denied("subscription", subject)
	return sub
}

// clean fails the test if the server refused anything not yet checked.
func (u *natsUser) clean() {
	u.t.Helper()
	if err := u.nc.Flush(); err != nil {
		u.t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	for {
		select {
		case err := <-u.errs:
			u.t.Errorf("%s: the server refused: %v", u.name, err)
		default:
			return
		}
	}
}

// submit publishes a run request on the tenant's own subject and returns
// the stream's acknowledgement.
func (u *natsUser) submit(req protocol.RunRequest) {
	u.t.Helper()
	data, _ := json.Marshal(req)
	m := nats.NewMsg("agent.runs." + u.name + "." + req.ThreadID)
	m.Data = data
	m.Header.Set(nats.MsgIdHdr, req.RunID)
	reply, err := u.nc.RequestMsg(m, 5*time.Second)
	if err != nil {
		u.t.Fatalf("%s: submit %s: %v", u.name, req.RunID, err)
	}
	var ack struct {
		Stream string `json:"stream"`
		Error  *struct {
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(reply.Data, &ack); err != nil || ack.Error != nil || ack.Stream != "AGENT_RUNS" {
		u.t.Fatalf("%s: submit %s: ack %s", u.name, req.RunID, reply.Data)
	}
}

// finished reads live events from sub until run's run.finished.
func finishedOn(t *testing.T, sub *nats.Subscription, tenant, run string) protocol.FinishedData {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		m, err := sub.NextMsg(time.Until(deadline))
		if err != nil {
			break
		}
		var ev protocol.Event
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			t.Fatalf("event %s: %v", m.Data, err)
		}
		if ev.Tenant != tenant {
			t.Fatalf("a subscriber of tenant %s received an event of tenant %s on %s", tenant, ev.Tenant, m.Subject)
		}
		if ev.RunID == run && ev.Type == protocol.EventRunFinished {
			var d protocol.FinishedData
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				t.Fatal(err)
			}
			return d
		}
	}
	t.Fatalf("no run.finished of %s.%s", tenant, run)
	return protocol.FinishedData{}
}

func userInput(text string) *protocol.Input {
	return &protocol.Input{Messages: []model.Message{{Role: "user", Content: text}}}
}

// TestTenantIsolation starts nats-server with deploy/nats/tenants.conf,
// provisions and runs a worker and a gateway with the service users, and
// proves with real permission violations that tenant acme's user can use
// its own runs and cannot read, submit to, steer, cancel or approve
// tenant globex's, nor reach JetStream's API, streams or buckets.
func TestTenantIsolation(t *testing.T) {
	url := startTenantsServer(t)
	ctx := context.Background()

	// The service users: provisioning, a worker, a gateway.
	workerConn := connectAs(t, url, "worker")
	gatewayConn := connectAs(t, url, "gateway")
	settings := bus.Settings{}.WithDefaults()
	wjs, err := jetstream.New(workerConn.nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := bus.Provision(ctx, wjs, settings); err != nil {
		t.Fatalf("provision as the worker user: %v", err)
	}
	var writes struct {
		sync.Mutex
		n int
	}
	registry := tools.NewRegistry()
	registry.Register(tools.Func(model.ToolSpec{Name: "write_file", Parameters: json.RawMessage(`{"type":"object"}`)},
		func(context.Context, json.RawMessage) (string, error) {
			writes.Lock()
			defer writes.Unlock()
			writes.n++
			return "written", nil
		}))
	m := model.NewScripted(func(_ int, req *model.Request) model.Reply {
		last := req.Messages[len(req.Messages)-1]
		switch {
		case last.Role == "tool":
			return model.Reply{Text: "file written"}
		case last.Content == "hold":
			return model.Reply{Text: "held", Delay: 2 * time.Second}
		case last.Content == "write":
			return model.Reply{ToolCalls: []model.ToolCall{{ID: "c1", Name: "write_file", Arguments: `{"path":"/a.txt","content":"A"}`}}}
		}
		return model.Reply{Text: "hello"}
	})
	chatbot := agent.Chatbot()
	chatbot.Tools = []string{"write_file"}
	agents, err := agent.NewAgents(m, registry, chatbot)
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(ctx, workerConn.nc, worker.Config{Settings: settings, Concurrency: 4, Agents: agents,
		Logger: zaptest.NewLogger(t), WaitPoll: 200 * time.Millisecond, ShutdownGrace: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stopWorker := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	t.Cleanup(func() {
		stopWorker()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Error("worker did not stop")
		}
	})
	gw, err := gateway.New(ctx, gatewayConn.nc, gateway.Config{Settings: settings, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatalf("gateway as the gateway user: %v", err)
	}
	api := httptest.NewServer(gw.Handler())
	t.Cleanup(api.Close)
	asGlobex := func(method, path, body string) protocol.Run {
		t.Helper()
		req, _ := http.NewRequest(method, api.URL+path, strings.NewReader(body))
		req.Header.Set("X-Tenant", "globex")
		resp, err := api.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var buf bytes.Buffer
		_, _ = buf.ReadFrom(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, buf.String())
		}
		var rec protocol.Run
		if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
			t.Fatal(err)
		}
		return rec
	}

	// Tenant globex (through the gateway): a run waiting for approval, and
	// a run that stays running for 2s.
	interrupted := asGlobex("POST", "/threads/gw/runs/wait", `{"run_id":"g-write","input":{"messages":[{"role":"user","content":"write"}]}}`)
	if interrupted.Status != protocol.StatusInterrupted {
		t.Fatalf("globex's write run ended %s, want interrupted", interrupted.Status)
	}
	asGlobex("POST", "/threads/gh/runs", `{"run_id":"g-hold","input":{"messages":[{"role":"user","content":"hold"}]}}`)

	// Tenant acme uses its own runs with plain NATS.
	acme := connectAs(t, url, "acme")
	acmeEvents, err := acme.nc.SubscribeSync("agent.events.acme.>")
	if err != nil {
		t.Fatal(err)
	}
	acme.submit(protocol.RunRequest{RunID: "a-hi", ThreadID: "ah", Tenant: "acme", Agent: protocol.DefaultAgent, Input: userInput("hi")})
	if fin := finishedOn(t, acmeEvents, "acme", "a-hi"); fin.Status != protocol.StatusSuccess {
		t.Fatalf("acme's own run ended %s: %s", fin.Status, fin.Error)
	}
	acme.submit(protocol.RunRequest{RunID: "a-hold", ThreadID: "ah2", Tenant: "acme", Agent: protocol.DefaultAgent, Input: userInput("hold")})
	reply, err := acme.nc.Request("agent.ctl.acme.ah2.a-hold.cancel", nil, 10*time.Second)
	if err != nil {
		t.Fatalf("acme cancels its own run: %v", err)
	}
	var cancelled protocol.CancelReply
	if err := json.Unmarshal(reply.Data, &cancelled); err != nil || cancelled.RunID != "a-hold" {
		t.Fatalf("cancel reply %s", reply.Data)
	}
	if fin := finishedOn(t, acmeEvents, "acme", "a-hold"); fin.Status != protocol.StatusCancelled {
		t.Fatalf("acme's cancelled run ended %s", fin.Status)
	}
	acme.clean()

	// Tenant acme cannot read globex's events, nor everyone's, nor
	// anyone's replies.
	for _, subject := range []string{"agent.events.globex.>", "agent.events.>", ">", "_INBOX.>", "_INBOX.globex.>", "agent.ctl.>", "agent.runs.>"} {
		sub := acme.subscribeDenied(subject)
		defer func() { _ = sub.Unsubscribe() }()
	}
	// Nor submit into globex's thread, steer its running run, approve its
	// interrupted one, or cancel either.
	run := func(req protocol.RunRequest) []byte {
		data, _ := json.Marshal(req)
		return data
	}
	acme.publishDenied("agent.runs.globex.gh", run(protocol.RunRequest{RunID: "x-new", ThreadID: "gh", Tenant: "globex", Agent: protocol.DefaultAgent, Input: userInput("hi")}))
	acme.publishDenied("agent.runs.globex.gh", run(protocol.RunRequest{RunID: "x-steer", ThreadID: "gh", Tenant: "globex", Agent: protocol.DefaultAgent,
		Input: userInput("stop that"), MultitaskStrategy: protocol.StrategySteer}))
	approve, _ := json.Marshal(protocol.Resume{Decisions: []protocol.Decision{{Type: protocol.DecisionApprove}}})
	acme.publishDenied("agent.runs.globex.gw", run(protocol.RunRequest{RunID: "x-approve", ThreadID: "gw", Tenant: "globex", Agent: protocol.DefaultAgent,
		Command: &protocol.Command{Resume: approve}}))
	acme.publishDenied("agent.ctl.globex.gh.g-hold.cancel", nil)
	acme.publishDenied("agent.ctl.globex.gw.g-write.cancel", nil)
	// Naming globex's run under its own tenant reaches nothing of globex.
	reply, err = acme.nc.Request("agent.ctl.acme.gh.g-hold.cancel", nil, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var notFound protocol.ErrorReply
	if err := json.Unmarshal(reply.Data, &notFound); err != nil || notFound.Error.Code != protocol.CodeNotFound {
		t.Fatalf("cancel of globex's run id under acme answered %s, want not_found", reply.Data)
	}
	// Nor use JetStream: streams, consumers, KV and Object Store.
	for _, subject := range []string{
		"$JS.API.INFO",
		"$JS.API.STREAM.INFO.AGENT_EVENTS",
		"$JS.API.STREAM.MSG.GET.AGENT_EVENTS",
		"$JS.API.CONSUMER.CREATE.AGENT_EVENTS",
		"$JS.API.DIRECT.GET.KV_agent_runs.$KV.agent_runs.globex.g-hold",
		"$JS.API.STREAM.INFO.KV_agent_threads",
		"$KV.agent_runs.globex.g-hold",
		"$O.agent_files.M.x",
		"agent.events.globex.gh.g-hold.x.lifecycle",
	} {
		acme.publishDenied(subject, []byte(`{}`))
	}
	// The JetStream client fails the same way.
	ajs, err := jetstream.New(acme.nc)
	if err != nil {
		t.Fatal(err)
	}
	jsCtx, cancel := context.WithTimeout(ctx, time.Second)
	if _, err := ajs.Stream(jsCtx, "AGENT_EVENTS"); err == nil {
		t.Fatal("acme opened the events stream")
	}
	cancel()
	acme.denied("publish", "$JS.API.STREAM.INFO.AGENT_EVENTS")
	jsCtx, cancel = context.WithTimeout(ctx, time.Second)
	if _, err := ajs.KeyValue(jsCtx, "agent_runs"); err == nil {
		t.Fatal("acme opened the runs bucket")
	}
	cancel()
	acme.denied("publish", "$JS.API.STREAM.INFO.KV_agent_runs")
	// A request on its own subject naming globex is recorded, if at all,
	// under acme: the subject's tenant wins.
	acme.submit(protocol.RunRequest{RunID: "a-forged", ThreadID: "af", Tenant: "globex", Agent: protocol.DefaultAgent, Input: userInput("hi")})
	if fin := finishedOn(t, acmeEvents, "acme", "a-forged"); fin.Status != protocol.StatusError {
		t.Fatalf("a request naming another tenant ended %s, want error", fin.Status)
	}

	// Globex's runs went on untouched: the held run succeeded, the
	// interrupted one still waits, and nothing was written.
	if rec := asGlobex("GET", "/threads/gh/runs/g-hold/join", ""); rec.Status != protocol.StatusSuccess {
		t.Fatalf("globex's held run ended %s (%s)", rec.Status, rec.Error)
	}
	if rec := asGlobex("GET", "/threads/gw/runs/g-write", ""); rec.Status != protocol.StatusInterrupted {
		t.Fatalf("globex's interrupted run is %s", rec.Status)
	}
	stores, err := kv.Open(ctx, wjs, settings.Names)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"x-new", "x-steer", "x-approve", "a-forged"} {
		if _, _, err := stores.Runs.Get(ctx, "globex", id); !errors.Is(err, kv.ErrNotFound) {
			t.Fatalf("globex has a run %s: %v", id, err)
		}
	}
	writes.Lock()
	if writes.n != 0 {
		t.Fatalf("write_file ran %d times before globex approved", writes.n)
	}
	writes.Unlock()

	// Globex itself approves with its own user, and watches its events.
	globex := connectAs(t, url, "globex")
	globexEvents, err := globex.nc.SubscribeSync("agent.events.globex.>")
	if err != nil {
		t.Fatal(err)
	}
	globex.submit(protocol.RunRequest{RunID: "g-approve", ThreadID: "gw", Tenant: "globex", Agent: protocol.DefaultAgent, Command: &protocol.Command{Resume: approve}})
	if fin := finishedOn(t, globexEvents, "globex", "g-approve"); fin.Status != protocol.StatusSuccess {
		t.Fatalf("globex's approval ended %s: %s", fin.Status, fin.Error)
	}
	writes.Lock()
	if writes.n != 1 {
		t.Fatalf("write_file ran %d times after globex approved, want 1", writes.n)
	}
	writes.Unlock()
	globex.clean()

	// The service users had every permission they used.
	workerConn.clean()
	gatewayConn.clean()
	acme.clean()
}
