package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/gateway"
	"github.com/natsagent/natsagent/internal/intake"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/natsjwt"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/testdeploy"
	"github.com/natsagent/natsagent/internal/tools"
	"github.com/natsagent/natsagent/internal/worker"
)

// attackDeployment is a NATS deployment with natsagent's account layout
// (internal/tenancy) for prefix "agent": the service account's users
// "gateway" and "worker", and tenants "acme" and "globex" with one user
// each, of the same names. The static configuration (TestTenantIsolation)
// and the JWT mode (TestTenantIsolationJWT) run the same suite against
// their servers.
type attackDeployment struct {
	URL string
	// Connect connects as user with opts added to its own.
	Connect func(t *testing.T, user string, opts ...nats.Option) *nats.Conn
	// Account is tenant's account as the server names it in
	// Nats-Request-Info: the tenant (static) or its public key (JWT).
	Account func(tenant string) string
}

// user connects as name, recording the server's asynchronous errors and
// the connection's close.
func (d attackDeployment) user(t *testing.T, name string, opts ...nats.Option) *natsUser {
	t.Helper()
	u := &natsUser{t: t, name: name, errs: make(chan error, 1000), closed: make(chan struct{})}
	u.nc = d.Connect(t, name, append([]nats.Option{nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case u.errs <- err:
		default:
		}
	}), nats.ClosedHandler(func(*nats.Conn) { close(u.closed) })}, opts...)...)
	return u
}

// submitted is what the submit service saw of a request: the principal
// it stamped and the user id the body asked for.
type submitted struct{ user, principal, bodyUserID string }

// requestInfo is a Nats-Request-Info the submit service accepted, with
// the tenant of the subject it came on.
type requestInfo struct {
	tenant string
	info   intake.ClientInfo
}

// services are natsagent's processes on an attackDeployment, as its
// service users: the streams provisioned as "worker", two workers (each
// with the submit service) and a gateway with its HTTP API, stopped when
// the test ends. Their agent's scripted model answers "hold" after 3s,
// "write" with a write_file call (which needs approval), anything else
// with "hello".
type services struct {
	t        *testing.T
	settings bus.Settings
	js       jetstream.JetStream // the first worker's connection
	api      *httptest.Server
	conns    []*natsUser // the workers' and the gateway's
	// seen is what the submit service stamped, by "<tenant>.<run>".
	seen sync.Map
	mu   sync.Mutex
	// infos are the Nats-Request-Info headers the submit service accepted.
	infos []requestInfo
	// writes counts write_file's executions.
	writes int
}

func startServices(t *testing.T, d attackDeployment) *services {
	t.Helper()
	ctx := context.Background()
	s := &services{t: t, settings: bus.Settings{}.WithDefaults()}
	svc := d.user(t, "worker")
	var err error
	if s.js, err = jetstream.New(svc.nc); err != nil {
		t.Fatal(err)
	}
	if err := bus.Provision(ctx, s.js, s.settings); err != nil {
		t.Fatalf("provision as the worker user: %v", err)
	}
	hooks := intake.Hooks{
		Authorize: func(ctx context.Context, tenant string, p *protocol.Principal, req *protocol.RunRequest) error {
			sub := submitted{user: p.User, bodyUserID: req.Config.UserID}
			if req.Principal != nil {
				sub.principal = req.Principal.User
			}
			s.seen.Store(tenant+"."+req.RunID, sub)
			return intake.DefaultAuthorize(ctx, tenant, p, req)
		},
		Roles: func(tenant string, info intake.ClientInfo) []string {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.infos = append(s.infos, requestInfo{tenant, info})
			return nil
		},
	}
	registry := tools.NewRegistry()
	registry.Register(tools.Func(model.ToolSpec{Name: "write_file", Parameters: json.RawMessage(`{"type":"object"}`)},
		func(context.Context, json.RawMessage) (string, error) {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.writes++
			return "written", nil
		}))
	m := model.NewScripted(func(_ int, req *model.Request) model.Reply {
		last := req.Messages[len(req.Messages)-1]
		switch {
		case last.Role == "tool":
			return model.Reply{Text: "file written"}
		case last.Content == "hold":
			return model.Reply{Text: "held", Delay: 3 * time.Second}
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
	for _, wc := range []*natsUser{svc, d.user(t, "worker")} {
		w, err := worker.New(ctx, wc.nc, worker.Config{Settings: s.settings, Concurrency: 4, Agents: agents, Submit: hooks,
			Logger: zaptest.NewLogger(t), WaitPoll: 200 * time.Millisecond, ShutdownGrace: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		runWorker(t, ctx, w)
		s.conns = append(s.conns, wc)
	}
	gwConn := d.user(t, "gateway")
	gw, err := gateway.New(ctx, gwConn.nc, gateway.Config{Settings: s.settings, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatalf("gateway as the gateway user: %v", err)
	}
	s.conns = append(s.conns, gwConn)
	s.api = httptest.NewServer(gw.Handler())
	t.Cleanup(s.api.Close)
	return s
}

// submission is what the submit service stamped on tenant's run.
func (s *services) submission(tenant, run string) submitted {
	v, _ := s.seen.Load(tenant + "." + run)
	sub, _ := v.(submitted)
	return sub
}

// accepted is a copy of the Nats-Request-Info headers accepted so far.
func (s *services) accepted() []requestInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.infos)
}

func (s *services) writeCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.writes
}

// post sends an HTTP request to the gateway as tenant and returns the run
// it answers, failing the test unless the status is want.
func (s *services) post(tenant, path, body string, want int) protocol.Run {
	s.t.Helper()
	req, _ := http.NewRequest("POST", s.api.URL+path, strings.NewReader(body))
	req.Header.Set("X-Tenant", tenant)
	resp, err := s.api.Client().Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	if resp.StatusCode != want {
		s.t.Fatalf("%s POST %s: %d %s, want %d", tenant, path, resp.StatusCode, buf.String(), want)
	}
	var rec protocol.Run
	_ = json.Unmarshal(buf.Bytes(), &rec)
	return rec
}

// runReq is a run request's JSON.
func runReq(run, thread, tenant, text string) []byte {
	data, _ := json.Marshal(protocol.RunRequest{RunID: run, ThreadID: thread, Tenant: tenant, Input: userInput(text)})
	return data
}

// runAttackerSuite starts two workers and a gateway with the service
// users, and tenant acme tries everything an attacker review found or
// could think of against tenant globex: replies that name globex's
// buckets, streams and subjects, globex's subjects themselves, the
// JetStream API, forged Nats-Request-Info headers and body principals,
// and run id collisions. Every trick must fail, and globex's records and
// messages must be byte-for-byte what they were. Acme's own runs work over
// plain NATS and the JetStream client, through its imports, and every
// submission the service accepted came with the server's account and user
// of its subject's tenant.
func runAttackerSuite(t *testing.T, d attackDeployment) {
	ctx := context.Background()
	svc := startServices(t, d)
	settings, sjs := svc.settings, svc.js
	asGlobex := func(path, body string) protocol.Run {
		t.Helper()
		return svc.post("globex", path, body, 200)
	}
	own := submitted{user: "acme", principal: "acme"}

	// Globex (through the gateway): a run waiting for approval, one done.
	if rec := asGlobex("/threads/gw/runs/wait?format=natsagent", `{"run_id":"g-write","input":{"messages":[{"role":"user","content":"write"}]}}`); rec.Status != protocol.StatusInterrupted {
		t.Fatalf("globex's write run ended %s, want interrupted", rec.Status)
	}
	if rec := asGlobex("/threads/gd/runs/wait?format=natsagent", `{"run_id":"g-done","input":{"messages":[{"role":"user","content":"hi"}]}}`); rec.Status != protocol.StatusSuccess {
		t.Fatalf("globex's run ended %s", rec.Status)
	}

	// Acme uses its own runs over NATS: the JetStream client's Publish
	// through its import gets the stream's ack, live events arrive, and
	// cancel works.
	acme := d.user(t, "acme")
	acmeEvents, err := acme.nc.SubscribeSync("agent.events.acme.>")
	if err != nil {
		t.Fatal(err)
	}
	acmeLive, err := acme.nc.SubscribeSync("agent.live.acme.>")
	if err != nil {
		t.Fatal(err)
	}
	ajs, err := jetstream.New(acme.nc)
	if err != nil {
		t.Fatal(err)
	}
	ack, err := ajs.Publish(ctx, "agent.runs.acme.ah", runReq("a-hi", "ah", "acme", "hi"), jetstream.WithMsgID("acme.a-hi"))
	if err != nil || ack.Stream != settings.Names.RunsStream() || ack.Sequence == 0 {
		t.Fatalf("acme's js.Publish through its import: %+v, %v", ack, err)
	}
	if fin := finishedOn(t, acmeEvents, "acme", "a-hi"); fin.Status != protocol.StatusSuccess {
		t.Fatalf("acme's own run ended %s: %s", fin.Status, fin.Error)
	}
	// Its token deltas came live, through acme's import of agent.live.
	liveDeltaOn(t, acmeLive, "acme", "a-hi")
	if s := svc.submission("acme", "a-hi"); s != own {
		t.Fatalf("acme's run was stamped %+v", s)
	}
	if _, err := ajs.Publish(ctx, "agent.runs.acme.ah2", runReq("a-hold", "ah2", "acme", "hold")); err != nil {
		t.Fatal(err)
	}
	reply, err := acme.nc.Request("agent.ctl.acme.ah2.a-hold.cancel", nil, 15*time.Second)
	if err != nil {
		t.Fatalf("acme cancels its own run: %v", err)
	}
	var cancelled protocol.CancelReply
	if err := json.Unmarshal(reply.Data, &cancelled); err != nil || cancelled.RunID != "a-hold" || cancelled.Status != protocol.StatusCancelled {
		t.Fatalf("cancel reply %s", reply.Data)
	}
	if fin := finishedOn(t, acmeEvents, "acme", "a-hold"); fin.Status != protocol.StatusCancelled {
		t.Fatalf("acme's cancelled run ended %s", fin.Status)
	}
	acme.clean()

	before := stableSnapshot(t, sjs)

	// 1. Replies naming globex's records, events, runs and the JetStream
	// API, on submissions (valid: answered with the ack; invalid: with an
	// error) and cancels. The server maps each reply back into acme's own
	// account, where nobody serves those subjects.
	replies := []string{
		"$KV.agent_threads.globex.gw",
		"$KV.agent_runs.globex.g-write",
		"agent.events.globex.gw.g-write.lifecycle",
		"agent.runs.globex.gw",
		"$JS.API.STREAM.PURGE.AGENT_EVENTS",
	}
	var tricks []string
	for i, r := range replies {
		run := fmt.Sprintf("a-reply-%d", i)
		tricks = append(tricks, run)
		for _, msg := range []*nats.Msg{
			{Subject: "agent.runs.acme.ar", Reply: r, Data: runReq(run, "ar", "acme", "hi")},
			{Subject: "agent.runs.acme.ar", Reply: r, Data: runReq(run+"-bad", "elsewhere", "acme", "hi")},
			{Subject: "agent.ctl.acme.ah.a-hi.cancel", Reply: r},
			{Subject: "agent.ctl.acme.ar.nope.cancel", Reply: r},
		} {
			if err := acme.nc.PublishMsg(msg); err != nil {
				t.Fatal(err)
			}
		}
		// And as plain publishes without a reply: still submitted.
		if err := acme.nc.Publish("agent.runs.acme.ap", runReq(run+"-plain", "ap", "acme", "hi")); err != nil {
			t.Fatal(err)
		}
		tricks = append(tricks, run+"-plain")
	}
	acme.clean()

	// 2. Globex's subjects, the submit service itself, the JetStream API,
	// KV, Object Store and service discovery: refused by the server.
	for _, subject := range []string{"agent.events.globex.>", "agent.events.>", "agent.live.globex.>", "agent.live.>", ">", "agent.runs.>", "agent.runs.globex.*", "agent.ctl.>",
		"agent.submit.>", "agent.submit.acme.*", "$JS.>", "$JS.API.>", "$KV.>", "$KV.agent_runs.globex.>", "$O.>", "$SRV.>", "agent.subagent.>", "agent.tools.>"} {
		sub := acme.subscribeDenied(subject)
		defer func() { _ = sub.Unsubscribe() }()
	}
	approve, _ := json.Marshal(protocol.Resume{Decisions: []protocol.Decision{{Type: protocol.DecisionApprove}}})
	approval, _ := json.Marshal(protocol.RunRequest{RunID: "x-approve", ThreadID: "gw", Tenant: "globex", Command: &protocol.Command{Resume: approve}})
	for _, p := range []struct {
		subject string
		data    []byte
	}{
		{"agent.runs.globex.gw", approval},
		{"agent.runs.globex.gn", runReq("x-new", "gn", "globex", "hi")},
		{"agent.ctl.globex.gw.g-write.cancel", nil},
		{"agent.ctl.globex.gd.delete", nil},
		{"agent.ctl.globex.gd.g-done.delete", nil},
		{"agent.submit.globex.gw", approval},
		{"agent.submit.acme.ax", runReq("x-direct", "ax", "acme", "hi")},
		{"agent.events.globex.gw.g-write.lifecycle", []byte(`{"type":"run.finished"}`)},
		{"agent.subagent.globex.start", []byte(`{}`)},
		{"$JS.API.INFO", nil},
		{"$JS.API.STREAM.INFO.AGENT_EVENTS", nil},
		{"$JS.API.STREAM.PURGE.AGENT_EVENTS", nil},
		{"$JS.API.STREAM.MSG.GET.AGENT_RUNS", []byte(`{"seq":1}`)},
		{"$JS.API.DIRECT.GET.KV_agent_runs.$KV.agent_runs.globex.g-write", nil},
		{"$JS.API.CONSUMER.CREATE.AGENT_EVENTS", []byte(`{}`)},
		{"$KV.agent_runs.globex.g-write", []byte(`{}`)},
		{"$KV.agent_threads.globex.gw", []byte(`{}`)},
		{"$O.agent_files.M.x", []byte(`{}`)},
		{"$SRV.PING", nil},
		{"_INBOX.x", nil},
	} {
		acme.publishDenied(p.subject, p.data)
	}
	// Requests fail the same way (nats.go reports the violation).
	if _, err := acme.nc.Request("agent.runs.globex.gw", approval, time.Second); err == nil {
		t.Fatal("acme's request to globex's runs was answered")
	}
	acme.denied("publish", "agent.runs.globex.gw")
	if _, err := ajs.Stream(ctx, "AGENT_EVENTS"); err == nil {
		t.Fatal("acme opened the events stream")
	}
	acme.denied("publish", "$JS.API.STREAM.INFO.AGENT_EVENTS")
	if _, err := ajs.KeyValue(ctx, "agent_runs"); err == nil {
		t.Fatal("acme opened the runs bucket")
	}
	acme.denied("publish", "$JS.API.STREAM.INFO.KV_agent_runs")
	// Globex's replies live in globex's account: acme's _INBOX.> sees none.
	acmeInbox, err := acme.nc.SubscribeSync("_INBOX.>")
	if err != nil {
		t.Fatal(err)
	}
	globex := d.user(t, "globex")
	// Globex's live events, from before acme's r1 and globex's r1 below:
	// globex's come, acme's never.
	globexLive, err := globex.nc.SubscribeSync("agent.live.globex.>")
	if err != nil {
		t.Fatal(err)
	}
	reply, err = globex.nc.Request("agent.ctl.globex.gw.nope.cancel", nil, 15*time.Second)
	if err != nil || !strings.Contains(string(reply.Data), protocol.CodeNotFound) {
		t.Fatalf("globex's own cancel of an unknown run: %v %s", err, reply.Data)
	}
	if m, err := acmeInbox.NextMsg(300 * time.Millisecond); err == nil {
		t.Fatalf("acme's _INBOX.> received %s %s", m.Subject, m.Data)
	}
	_ = acmeInbox.Unsubscribe()

	// 3. A forged Nats-Request-Info, naming globex, or another user of
	// acme's account (which the submit service would take): the server
	// replaces it, and the run is acme's, stamped with acme's user.
	for run, info := range map[string]string{
		"a-forged-info":  `{"acc":"` + d.Account("globex") + `","user":"globex","name_tag":"globex-admin","tags":["` + natsjwt.TenantTag("globex") + `"]}`,
		"a-forged-admin": `{"acc":"` + d.Account("acme") + `","user":"acme-admin","name_tag":"acme-admin","tags":["` + natsjwt.TenantTag("acme") + `"]}`,
	} {
		forged := nats.NewMsg("agent.runs.acme.af")
		forged.Header.Set(intake.HeaderRequestInfo, info)
		forged.Data = runReq(run, "af", "acme", "hi")
		reply, err = acme.nc.RequestMsg(forged, 15*time.Second)
		if err != nil || !strings.Contains(string(reply.Data), `"stream":"AGENT_RUNS"`) {
			t.Fatalf("acme's request with a forged Nats-Request-Info: %v %s", err, reply.Data)
		}
		if s := svc.submission("acme", run); s != own {
			t.Fatalf("a forged Nats-Request-Info %s was stamped %+v, want acme's user", info, s)
		}
		tricks = append(tricks, run)
	}

	// 4. Forged principal, tenant and user id in the body.
	var body map[string]any
	_ = json.Unmarshal(runReq("a-forged-principal", "af", "acme", "hi"), &body)
	body["principal"] = map[string]any{"user": "globex-admin", "roles": []string{"admin"}}
	data, _ := json.Marshal(body)
	if _, err := ajs.Publish(ctx, "agent.runs.acme.af", data); err != nil {
		t.Fatalf("acme's run with a forged body principal: %v", err)
	}
	if s := svc.submission("acme", "a-forged-principal"); s != own {
		t.Fatalf("a forged body principal was stamped %+v", s)
	}
	tricks = append(tricks, "a-forged-principal")
	body["run_id"], body["config"] = "a-forged-user", map[string]any{"user_id": "globex-admin"}
	data, _ = json.Marshal(body)
	var apiErr *jetstream.APIError
	if _, err := ajs.Publish(ctx, "agent.runs.acme.af", data); !errors.As(err, &apiErr) || apiErr.Code != 403 || !strings.Contains(apiErr.Description, "config.user_id") {
		t.Fatalf("acme's run for another user id: %v, want 403", err)
	}
	if _, err := ajs.Publish(ctx, "agent.runs.acme.af", runReq("a-forged-tenant", "af", "globex", "hi")); !errors.As(err, &apiErr) || apiErr.Code != 400 || !strings.Contains(apiErr.Description, "tenant") {
		t.Fatalf("acme's run naming globex in the body: %v, want 400", err)
	}

	// Acme's tricks ran as acme's runs, or not at all; then globex's data
	// is what it was, byte for byte.
	for _, run := range tricks {
		waitRunFinished(t, sjs, "acme", run)
	}
	after := stableSnapshot(t, sjs)
	if diff := snapshotDiff(before, after); diff != "" {
		t.Fatalf("globex's data changed during acme's tricks:\n%s", diff)
	}

	// 5. Run id collisions: another tenant's message id is refused, and a
	// run id acme used does not block globex's.
	if _, err := ajs.Publish(ctx, "agent.runs.acme.ac", runReq("r1", "ac", "acme", "hi"), jetstream.WithMsgID("globex.r1")); !errors.As(err, &apiErr) || apiErr.Code != 400 || !strings.Contains(apiErr.Description, "Nats-Msg-Id") {
		t.Fatalf("acme's request with globex's message id: %v, want 400", err)
	}
	if _, err := ajs.Publish(ctx, "agent.runs.acme.ac", runReq("r1", "ac", "acme", "hi"), jetstream.WithMsgID("r1")); err != nil {
		t.Fatalf("acme's r1 with the bare message id: %v", err)
	}
	if fin := finishedOn(t, acmeEvents, "acme", "r1"); fin.Status != protocol.StatusSuccess {
		t.Fatalf("acme's r1 ended %s", fin.Status)
	}
	if rec := asGlobex("/threads/gc/runs/wait?format=natsagent", `{"run_id":"r1","input":{"messages":[{"role":"user","content":"hi"}]}}`); rec.Status != protocol.StatusSuccess {
		t.Fatalf("globex's r1 after acme's r1 ended %q, want success", rec.Status)
	}
	liveDeltaOn(t, globexLive, "globex", "r1")
	// Its lifecycle events are stored too, not dropped as duplicates of
	// acme's r1's.
	evStream, err := sjs.Stream(ctx, settings.Names.EventsStream())
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(testdeploy.MinWait); ; time.Sleep(50 * time.Millisecond) {
		m, err := evStream.GetLastMsgForSubject(ctx, settings.Names.EventSubject("globex", "gc", "r1", protocol.KindLifecycle))
		if err == nil && strings.Contains(string(m.Data), `"type":"run.finished"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("globex's r1 has no stored run.finished (%v)", err)
		}
	}

	// Globex approves its run with its own NATS user; the tool runs once.
	if n := svc.writeCount(); n != 0 {
		t.Fatalf("write_file ran %d times before globex approved", n)
	}
	globexEvents, err := globex.nc.SubscribeSync("agent.events.globex.>")
	if err != nil {
		t.Fatal(err)
	}
	resume, _ := json.Marshal(protocol.RunRequest{RunID: "g-approve", ThreadID: "gw", Tenant: "globex", Command: &protocol.Command{Resume: approve}})
	if reply, err := globex.nc.Request("agent.runs.globex.gw", resume, 15*time.Second); err != nil || !strings.Contains(string(reply.Data), `"stream":"AGENT_RUNS"`) {
		t.Fatalf("globex's approval: %v", err)
	}
	if fin := finishedOn(t, globexEvents, "globex", "g-approve"); fin.Status != protocol.StatusSuccess {
		t.Fatalf("globex's approval ended %s: %s", fin.Status, fin.Error)
	}
	if n := svc.writeCount(); n != 1 {
		t.Fatalf("write_file ran %d times after globex approved, want 1", n)
	}

	// Every submission the service accepted carried the server's account
	// and user of its subject's tenant.
	tenants := map[string]bool{}
	for _, r := range svc.accepted() {
		user := r.info.NameTag
		if user == "" {
			user = r.info.User
		}
		if r.info.Account != d.Account(r.tenant) || user != r.tenant {
			t.Errorf("a submission of tenant %s came from account %s, user %s: want %s's", r.tenant, r.info.Account, user, r.tenant)
		}
		tenants[r.tenant] = true
	}
	if !tenants["acme"] || !tenants["globex"] {
		t.Errorf("the submit service accepted submissions of %v, want acme's and globex's", tenants)
	}

	// 6. Deletion over NATS: acme deletes its own thread through its
	// import; naming globex's thread on acme's subject finds nothing (the
	// tenant is the subject's), and globex's thread stays.
	if reply, err := acme.nc.Request("agent.ctl.acme.gd.delete", nil, 30*time.Second); err != nil || !strings.Contains(string(reply.Data), protocol.CodeNotFound) {
		t.Fatalf("acme's delete of a thread named like globex's: %v %s", err, replyData(reply))
	}
	if reply, err := acme.nc.Request("agent.ctl.acme.ah.a-hi.delete", nil, 30*time.Second); err != nil || !strings.Contains(string(reply.Data), `"deleted":true`) {
		t.Fatalf("acme deletes its finished run: %v %s", err, replyData(reply))
	}
	if reply, err := acme.nc.Request("agent.ctl.acme.ah.delete", nil, 60*time.Second); err != nil || !strings.Contains(string(reply.Data), `"deleted":true`) {
		t.Fatalf("acme deletes its own thread: %v %s", err, replyData(reply))
	}
	threadsKV, err := sjs.KeyValue(ctx, "agent_threads")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := threadsKV.Get(ctx, "acme.ah"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("acme's deleted thread: %v", err)
	}
	if _, err := threadsKV.Get(ctx, "globex.gd"); err != nil {
		t.Fatalf("globex's thread after acme's deletions: %v", err)
	}

	// The service users had every permission they used.
	for _, u := range append(svc.conns, globex, acme) {
		u.clean()
	}
}

func replyData(m *nats.Msg) []byte {
	if m == nil {
		return nil
	}
	return m.Data
}

// runWorker runs w until the test ends, then stops it and waits for it.
func runWorker(t *testing.T, ctx context.Context, w *worker.Worker) {
	t.Helper()
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	t.Cleanup(func() {
		stop()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Error("worker did not stop")
		}
	})
}

// waitRunFinished waits until tenant's run has a terminal record, read
// with a service connection.
func waitRunFinished(t *testing.T, js jetstream.JetStream, tenant, run string) {
	t.Helper()
	bucket, err := js.KeyValue(context.Background(), "agent_runs")
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(testdeploy.MinWait)
	for {
		e, err := bucket.Get(context.Background(), tenant+"."+run)
		if err == nil {
			var rec protocol.Run
			if json.Unmarshal(e.Value(), &rec) == nil && rec.Status.Terminal() {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's run %s did not finish (%v)", tenant, run, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// globexData lists every stored message of tenant globex: its keys in the
// buckets (with their history) and its requests and events in the
// streams, one line each (sequence, subject, headers, data).
func globexData(t *testing.T, js jetstream.JetStream) []string {
	t.Helper()
	ctx := context.Background()
	var out []string
	for _, s := range []struct{ stream, filter string }{
		{"KV_agent_runs", "$KV.agent_runs.globex.>"},
		{"KV_agent_threads", "$KV.agent_threads.globex.>"},
		{"KV_agent_checkpoints", "$KV.agent_checkpoints.globex.>"},
		{"KV_agent_usage", "$KV.agent_usage.globex.>"},
		{"AGENT_RUNS", "agent.runs.globex.>"},
		{"AGENT_EVENTS", "agent.events.globex.>"},
	} {
		st, err := js.Stream(ctx, s.stream)
		if err != nil {
			t.Fatalf("stream %s: %v", s.stream, err)
		}
		var seq uint64
		for {
			m, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(s.filter))
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				break
			}
			if err != nil {
				t.Fatalf("read %s: %v", s.stream, err)
			}
			keys := make([]string, 0, len(m.Header))
			for k := range m.Header {
				keys = append(keys, k+"="+strings.Join(m.Header[k], ","))
			}
			slices.Sort(keys)
			out = append(out, fmt.Sprintf("%s %d %s %v %q", s.stream, m.Sequence, m.Subject, keys, m.Data))
			seq = m.Sequence + 1
		}
	}
	return out
}

// stableSnapshot is globexData once two reads 300ms apart agree (workers
// finish acking and indexing after a run's last event).
func stableSnapshot(t *testing.T, js jetstream.JetStream) []string {
	t.Helper()
	prev := globexData(t, js)
	for range 50 {
		time.Sleep(300 * time.Millisecond)
		cur := globexData(t, js)
		if snapshotDiff(prev, cur) == "" {
			if len(cur) == 0 {
				t.Fatal("globex has no data to compare")
			}
			return cur
		}
		prev = cur
	}
	t.Fatal("globex's data kept changing")
	return nil
}

func snapshotDiff(a, b []string) string {
	var d []string
	for _, x := range a {
		if !slices.Contains(b, x) {
			d = append(d, "- "+x)
		}
	}
	for _, x := range b {
		if !slices.Contains(a, x) {
			d = append(d, "+ "+x)
		}
	}
	return strings.Join(d, "\n")
}

// natsUser is a connection of one of the deployment's users that records
// the server's asynchronous errors (permission violations).
type natsUser struct {
	t      *testing.T
	name   string
	nc     *nats.Conn
	errs   chan error
	closed chan struct{}
}

// denied waits for the server's permission violation of op ("publish" or
// "subscription") on subject.
func (u *natsUser) denied(op, subject string) {
	u.t.Helper()
	want := strings.ToLower(op + ` to "` + subject + `"`)
	deadline := time.After(testdeploy.MinWait)
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

// publishDenied publishes data to subject (as a request, with a reply
// inbox) and expects the refusal.
func (u *natsUser) publishDenied(subject string, data []byte) {
	u.t.Helper()
	if err := u.nc.PublishRequest(subject, u.nc.NewRespInbox(), data); err != nil {
		u.t.Fatal(err)
	}
	u.denied("publish", subject)
}

// subscribeDenied subscribes to subject, expects the refusal, and returns
// the subscription, which must receive nothing.
func (u *natsUser) subscribeDenied(subject string) *nats.Subscription {
	u.t.Helper()
	sub, err := u.nc.SubscribeSync(subject)
	if err != nil {
		u.t.Fatal(err)
	}
	u.denied("subscription", subject)
	return sub
}

// submit requests a run of tenant u.name on thread, as a plain NATS
// client of the tenant does (through its import), and checks the stream's
// acknowledgement.
func (u *natsUser) submit(thread, run, text string) {
	u.t.Helper()
	m := nats.NewMsg("agent.runs." + u.name + "." + thread)
	m.Data = runReq(run, thread, u.name, text)
	m.Header.Set(nats.MsgIdHdr, run)
	reply, err := u.nc.RequestMsg(m, 15*time.Second)
	if err != nil {
		u.t.Fatalf("%s: submit %s: %v", u.name, run, err)
	}
	var ack jetstream.PubAck
	if err := json.Unmarshal(reply.Data, &ack); err != nil || ack.Stream != "AGENT_RUNS" || ack.Sequence == 0 {
		u.t.Fatalf("%s: submit %s: answer %s, want the runs stream's ack", u.name, run, reply.Data)
	}
}

// isClosed reports whether the server closed the connection (or the
// test did).
func (u *natsUser) isClosed() bool {
	select {
	case <-u.closed:
		return true
	default:
		return false
	}
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

// finishedOn reads live events from sub until run's run.finished.
func finishedOn(t *testing.T, sub *nats.Subscription, tenant, run string) protocol.FinishedData {
	t.Helper()
	deadline := time.Now().Add(testdeploy.MinWait)
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

// liveDeltaOn waits on sub for a live message.delta of tenant's run,
// failing on any event of another tenant before it.
func liveDeltaOn(t *testing.T, sub *nats.Subscription, tenant, run string) {
	t.Helper()
	deadline := time.Now().Add(testdeploy.MinWait)
	for time.Now().Before(deadline) {
		m, err := sub.NextMsg(time.Until(deadline))
		if err != nil {
			break
		}
		var ev protocol.Event
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			t.Fatalf("live event %s: %v", m.Data, err)
		}
		if ev.Tenant != tenant || !strings.HasPrefix(m.Subject, "agent.live."+tenant+".") {
			t.Fatalf("a live subscriber of tenant %s received an event of tenant %s on %s", tenant, ev.Tenant, m.Subject)
		}
		if ev.RunID == run && ev.Type == protocol.EventMessageDelta {
			if !ev.Live || ev.V != protocol.EnvelopeVersion || ev.Seq != 0 || ev.Index == 0 {
				t.Fatalf("a live delta's envelope: %s", m.Data)
			}
			return
		}
	}
	t.Fatalf("no live message.delta of %s.%s", tenant, run)
}

func userInput(text string) *protocol.Input {
	return &protocol.Input{Messages: []model.Message{{Role: "user", Content: text}}}
}
