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
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"go.uber.org/zap/zaptest"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/app"
	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/gateway"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/natsjwt"
	"github.com/natsagent/natsagent/internal/natsjwt/natsjwttest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/tools"
	"github.com/natsagent/natsagent/internal/worker"
)

// jwtDeployment is a nats-server in operator mode trusting a natsjwt
// store made for the test.
type jwtDeployment struct {
	t     *testing.T
	url   string
	store *natsjwt.Store
}

// jwtTenants are the tenants of startJWTDeployment; each has one user
// named like it.
var jwtTenants = []string{"acme", "globex"}

// startJWTDeployment runs a real nats-server in JWT mode (the account
// layout of docs/operations.md, "NATS JWT mode"), as an operator sets it
// up: `natsagent jwt init` (AGENT with users gateway and worker, SYS with
// user sys), the server config with the full resolver, then tenants acme
// and globex, each with a user of its own name, added and pushed. It
// returns the server's URL and a function that connects as "gateway",
// "worker", "acme", "globex" or "sys" (failing the test if the server
// refuses); the connection is closed when the test ends. Nothing is
// provisioned and no worker runs.
func startJWTDeployment(t *testing.T) (string, func(user string) *nats.Conn) {
	t.Helper()
	d := newJWTDeployment(t)
	return d.url, func(user string) *nats.Conn {
		t.Helper()
		nc, err := d.connect(user)
		if err != nil {
			t.Fatalf("connect as %s: %v", user, err)
		}
		return nc
	}
}

func newJWTDeployment(t *testing.T) *jwtDeployment {
	t.Helper()
	store, err := natsjwt.Init(filepath.Join(t.TempDir(), "natsjwt"), "")
	if err != nil {
		t.Fatal(err)
	}
	srv := natsjwttest.StartServer(t, store, true)
	d := &jwtDeployment{t: t, url: srv.ClientURL(), store: store}
	for _, tenant := range jwtTenants {
		if err := store.AddTenant(tenant); err != nil {
			t.Fatal(err)
		}
		if _, err := store.AddUser(tenant, tenant); err != nil {
			t.Fatal(err)
		}
	}
	d.push()
	return d
}

// jwtAccount is the account of startJWTDeployment's user.
func jwtAccount(user string) string {
	switch user {
	case "gateway", "worker":
		return natsjwt.ServiceAccount
	case natsjwt.SystemUser:
		return natsjwt.SystemAccount
	}
	return user
}

// connect connects as user with its creds file the way the binaries do
// (nats.creds_file through app.NATSOptions).
func (d *jwtDeployment) connect(user string, opts ...nats.Option) (*nats.Conn, error) {
	d.t.Helper()
	cfg := config.Default()
	cfg.NATS.URL, cfg.NATS.CredsFile = d.url, d.store.CredsPath(jwtAccount(user), user)
	nopts, err := app.NATSOptions(cfg.NATS)
	if err != nil {
		return nil, err
	}
	nc, err := bus.Connect(d.url, "jwt-test-"+user, append(nopts, opts...)...)
	if err != nil {
		return nil, err
	}
	d.t.Cleanup(nc.Close)
	return nc, nil
}

// push sends the store's account JWTs to the server, as `natsagent jwt
// push` does.
func (d *jwtDeployment) push() {
	d.t.Helper()
	sys, err := d.connect(natsjwt.SystemUser)
	if err != nil {
		d.t.Fatal(err)
	}
	defer sys.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := d.store.Push(ctx, sys); err != nil {
		d.t.Fatal(err)
	}
}

// pushJWT sends one account JWT as the system user and returns the
// server's refusal, if any.
func (d *jwtDeployment) pushJWT(token string) error {
	d.t.Helper()
	sys, err := d.connect(natsjwt.SystemUser)
	if err != nil {
		d.t.Fatal(err)
	}
	defer sys.Close()
	msg, err := sys.Request("$SYS.REQ.CLAIMS.UPDATE", []byte(token), 5*time.Second)
	if err != nil {
		d.t.Fatal(err)
	}
	var r struct {
		Error *struct {
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &r); err != nil {
		d.t.Fatal(err)
	}
	if r.Error != nil {
		return errors.New(r.Error.Description)
	}
	return nil
}

// key reads a seed from the store's directory (its documented layout).
func (d *jwtDeployment) key(parts ...string) nkeys.KeyPair {
	d.t.Helper()
	seed, err := os.ReadFile(filepath.Join(append([]string{d.store.Dir(), "keys"}, parts...)...))
	if err != nil {
		d.t.Fatal(err)
	}
	kp, err := nkeys.FromSeed(seed)
	if err != nil {
		d.t.Fatal(err)
	}
	return kp
}

// jwtUser is a connection that records the server's asynchronous errors
// (permission violations) and its close.
type jwtUser struct {
	t      *testing.T
	name   string
	nc     *nats.Conn
	errs   chan error
	closed chan struct{}
}

func (d *jwtDeployment) user(name string) *jwtUser {
	d.t.Helper()
	u := &jwtUser{t: d.t, name: name, errs: make(chan error, 100), closed: make(chan struct{})}
	nc, err := d.connect(name, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { u.errs <- err }),
		nats.ClosedHandler(func(*nats.Conn) { close(u.closed) }), nats.NoReconnect())
	if err != nil {
		d.t.Fatalf("connect as %s: %v", name, err)
	}
	u.nc = nc
	return u
}

// denied waits for the server's permission violation of op ("publish" or
// "subscription") on subject.
func (u *jwtUser) denied(op, subject string) {
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

func (u *jwtUser) clean() {
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

// submit publishes a run request as a tenant's client does, on
// P.runs.<tenant>.<thread>, and checks the acknowledgement.
func (u *jwtUser) submit(req protocol.RunRequest) {
	u.t.Helper()
	u.submitWith(req, nil)
}

// submitWith is submit with extra headers.
func (u *jwtUser) submitWith(req protocol.RunRequest, hdr nats.Header) {
	u.t.Helper()
	data, _ := json.Marshal(req)
	m := nats.NewMsg("agent.runs." + u.name + "." + req.ThreadID)
	m.Data = data
	for k, v := range hdr {
		m.Header[k] = v
	}
	m.Header.Set(nats.MsgIdHdr, req.RunID)
	reply, err := u.nc.RequestMsg(m, 5*time.Second)
	if err != nil {
		u.t.Fatalf("%s: submit %s: %v", u.name, req.RunID, err)
	}
	var ack jetstream.PubAck
	if err := json.Unmarshal(reply.Data, &ack); err != nil || ack.Stream != "AGENT_RUNS" {
		u.t.Fatalf("%s: submit %s: ack %s", u.name, req.RunID, reply.Data)
	}
}

// jwtFinished reads live events from sub until run's run.finished; every
// event must be tenant's.
func jwtFinished(t *testing.T, sub *nats.Subscription, tenant, run string) protocol.FinishedData {
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

func jwtRun(tenant, thread, run, text string) protocol.RunRequest {
	return protocol.RunRequest{RunID: run, ThreadID: thread, Tenant: tenant, Agent: protocol.DefaultAgent,
		Input: &protocol.Input{Messages: []model.Message{{Role: "user", Content: text}}}}
}

// submission is what the test's submit service saw of one request.
type submission struct {
	subject string
	info    struct {
		Account string `json:"acc"`
		User    string `json:"user"`
		NameTag string `json:"name_tag"`
	}
}

// serveSubmit is a stand-in for the workers' submit service: a queue
// subscription on P.submit.> in AGENT that stores the request in the runs
// stream under the subject's tenant and answers with the stream's
// acknowledgement. It reports each request it saw.
func serveSubmit(t *testing.T, nc *nats.Conn, js jetstream.JetStream) <-chan submission {
	t.Helper()
	seen := make(chan submission, 100)
	sub, err := nc.QueueSubscribe("agent.submit.*.*", "submit", func(m *nats.Msg) {
		var s submission
		s.subject = m.Subject
		if err := json.Unmarshal([]byte(m.Header.Get("Nats-Request-Info")), &s.info); err != nil {
			t.Errorf("submission on %s without a valid Nats-Request-Info: %v", m.Subject, err)
		}
		seen <- s
		tok := strings.Split(m.Subject, ".")
		out := nats.NewMsg("agent.runs." + tok[2] + "." + tok[3])
		out.Data = m.Data
		out.Header.Set(nats.MsgIdHdr, m.Header.Get(nats.MsgIdHdr))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ack, err := js.PublishMsg(ctx, out)
		if err != nil {
			t.Errorf("submit service: %v", err)
			return
		}
		data, _ := json.Marshal(ack)
		_ = m.Respond(data)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return seen
}

// TestJWTIsolation runs the account layout in JWT mode (natsjwt) on a
// real nats-server with a real worker and gateway in AGENT, and proves:
// tenant acme submits through its import (P.runs.acme.<thread> reaches
// P.submit.acme.<thread> with the server's Nats-Request-Info naming
// acme's account and user), watches its events and cancels its run;
// globex cannot publish, subscribe or request on acme's subjects nor
// reach JetStream, KV, Object Store or $SRV; an account JWT for globex
// with its own import of acme's exports is refused or gets nothing
// through; removing globex closes its connections and leaves acme
// working.
func TestJWTIsolation(t *testing.T) {
	d := newJWTDeployment(t)
	ctx := context.Background()
	acmeAcc, err := d.store.Account("acme")
	if err != nil {
		t.Fatal(err)
	}

	// The service users: provisioning, a worker, a gateway, and the
	// stand-in submit service.
	workerConn := d.user("worker")
	gatewayConn := d.user("gateway")
	settings := bus.Settings{}.WithDefaults()
	wjs, err := jetstream.New(workerConn.nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := bus.Provision(ctx, wjs, settings); err != nil {
		t.Fatalf("provision as the worker user: %v", err)
	}
	m := model.NewScripted(func(_ int, req *model.Request) model.Reply {
		if req.Messages[len(req.Messages)-1].Content == "hold" {
			return model.Reply{Text: "held", Delay: 3 * time.Second}
		}
		return model.Reply{Text: "hello"}
	})
	agents, err := agent.NewAgents(m, tools.NewRegistry(), agent.Chatbot())
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
	submitConn := d.user("worker")
	sjs, err := jetstream.New(submitConn.nc)
	if err != nil {
		t.Fatal(err)
	}
	seen := serveSubmit(t, submitConn.nc, sjs)
	gw, err := gateway.New(ctx, gatewayConn.nc, gateway.Config{Settings: settings, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatalf("gateway as the gateway user: %v", err)
	}
	api := httptest.NewServer(gw.Handler())
	t.Cleanup(api.Close)
	req, _ := http.NewRequest("POST", api.URL+"/threads/gh/runs/wait", strings.NewReader(`{"run_id":"g-gw","input":{"messages":[{"role":"user","content":"hi"}]}}`))
	req.Header.Set("X-Tenant", "globex")
	resp, err := api.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var body bytes.Buffer
	_, _ = body.ReadFrom(resp.Body)
	resp.Body.Close()
	var rec protocol.Run
	if err := json.Unmarshal(body.Bytes(), &rec); err != nil || rec.Status != protocol.StatusSuccess {
		t.Fatalf("globex's run through the gateway: %d %s", resp.StatusCode, body.String())
	}

	// Acme: submit through the import, events through the stream import,
	// cancel through the service import answered by the real worker.
	acme := d.user("acme")
	acmeEvents, err := acme.nc.SubscribeSync("agent.events.acme.>")
	if err != nil {
		t.Fatal(err)
	}
	globex := d.user("globex")
	globexEvents, err := globex.nc.SubscribeSync("agent.events.globex.>")
	if err != nil {
		t.Fatal(err)
	}
	// Every reply in globex's account, which has its own _INBOX
	// namespace: it must see none of acme's.
	snoop := d.user("globex")
	globexInboxes, err := snoop.nc.SubscribeSync("_INBOX.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := snoop.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	acme.submit(jwtRun("acme", "ah", "a-hi", "hi"))
	s := <-seen
	if s.subject != "agent.submit.acme.ah" || s.info.Account != acmeAcc.Subject || s.info.NameTag != "acme" || !nkeys.IsValidPublicUserKey(s.info.User) {
		t.Fatalf("the submit service saw %+v, want subject agent.submit.acme.ah from account %s, user acme", s, acmeAcc.Subject)
	}
	if fin := jwtFinished(t, acmeEvents, "acme", "a-hi"); fin.Status != protocol.StatusSuccess {
		t.Fatalf("acme's run ended %s: %s", fin.Status, fin.Error)
	}
	// A Nats-Request-Info the client wrote itself is replaced by the
	// server's.
	globexAcc, err := d.store.Account("globex")
	if err != nil {
		t.Fatal(err)
	}
	acme.submitWith(jwtRun("acme", "ah", "a-info", "hi"), nats.Header{"Nats-Request-Info": {`{"acc":"` + globexAcc.Subject + `","name_tag":"globex"}`}})
	if s := <-seen; s.info.Account != acmeAcc.Subject || s.info.NameTag != "acme" {
		t.Fatalf("a client's own Nats-Request-Info reached the submit service: %+v", s.info)
	}
	if fin := jwtFinished(t, acmeEvents, "acme", "a-info"); fin.Status != protocol.StatusSuccess {
		t.Fatalf("acme's run ended %s: %s", fin.Status, fin.Error)
	}
	acme.submit(jwtRun("acme", "ah2", "a-hold", "hold"))
	<-seen
	reply, err := acme.nc.Request("agent.ctl.acme.ah2.a-hold.cancel", nil, 10*time.Second)
	if err != nil {
		t.Fatalf("acme cancels its own run: %v", err)
	}
	var cancelled protocol.CancelReply
	if err := json.Unmarshal(reply.Data, &cancelled); err != nil || cancelled.RunID != "a-hold" {
		t.Fatalf("cancel reply %s", reply.Data)
	}
	if fin := jwtFinished(t, acmeEvents, "acme", "a-hold"); fin.Status != protocol.StatusCancelled {
		t.Fatalf("acme's cancelled run ended %s", fin.Status)
	}
	acme.clean()

	// Globex's own user: refused on acme's subjects and on every
	// JetStream, KV, Object Store and service discovery subject.
	for _, subject := range []string{"agent.events.acme.>", "agent.events.>", ">", "agent.submit.>", "agent.ctl.>", "agent.runs.>", "$JS.>", "$KV.>", "$O.>", "$SRV.>"} {
		sub, err := globex.nc.SubscribeSync(subject)
		if err != nil {
			t.Fatal(err)
		}
		globex.denied("subscription", subject)
		defer func() { _ = sub.Unsubscribe() }()
	}
	for _, subject := range []string{
		"agent.runs.acme.ah", "agent.submit.acme.ah", "agent.ctl.acme.ah2.a-hold.cancel", "agent.events.acme.ah.a-hi.x.lifecycle",
		"$JS.API.INFO", "$JS.API.STREAM.INFO.AGENT_EVENTS", "$JS.API.CONSUMER.CREATE.AGENT_RUNS", "$KV.agent_runs.acme.a-hi",
		"$O.agent_files.M.x", "$SRV.PING", "agent.submit.globex.gh",
	} {
		if err := globex.nc.PublishRequest(subject, globex.nc.NewRespInbox(), []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		globex.denied("publish", subject)
	}
	if _, err := globex.nc.Request("agent.ctl.acme.ah2.a-hold.cancel", nil, time.Second); err == nil {
		t.Fatal("globex's cancel request on acme's subject was answered")
	}
	globex.denied("publish", "agent.ctl.acme.ah2.a-hold.cancel")
	// Its own subjects reach only its own runs: the subject's tenant wins.
	globex.submit(jwtRun("acme", "gh", "g-forged", "hi"))
	if s := <-seen; s.subject != "agent.submit.globex.gh" || s.info.Account == acmeAcc.Subject {
		t.Fatalf("globex's submission reached the submit service as %+v", s)
	}
	if fin := jwtFinished(t, globexEvents, "globex", "g-forged"); fin.Status != protocol.StatusError {
		t.Fatalf("a globex request naming acme ended %s, want error", fin.Status)
	}
	globex.clean()
	own := globex.nc.NewRespInbox()
	own = own[:strings.LastIndex(own, ".")+1]
	replies := 0
	for {
		m, err := globexInboxes.NextMsg(200 * time.Millisecond)
		if err != nil {
			break
		}
		if !strings.HasPrefix(m.Subject, own) {
			t.Fatalf("globex's account received a reply that is not globex's: %s %s", m.Subject, m.Data)
		}
		replies++
	}
	if replies == 0 {
		t.Fatal("globex's _INBOX.> subscription saw not even globex's own replies")
	}
	snoop.clean()

	// Globex's account forged to import acme's exports, and a user of
	// globex with every permission in its account (signed by globex's
	// key) that tries them: its requests find no responder and its
	// subscription to everything receives nothing while acme runs.
	globexKey := d.key("accounts", "globex.nk")
	operatorKey := d.key("operator.nk")
	uk, _ := nkeys.CreateUser()
	upub, _ := uk.PublicKey()
	uc := jwt.NewUserClaims(upub)
	uc.Name = "mallory"
	uc.Pub.Allow.Add(">")
	uc.Sub.Allow.Add(">")
	ujwt, err := uc.Encode(globexKey)
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := uk.Seed()
	creds, _ := jwt.FormatUserConfig(ujwt, seed)
	credsFile := filepath.Join(t.TempDir(), "mallory.creds")
	if err := os.WriteFile(credsFile, creds, 0o600); err != nil {
		t.Fatal(err)
	}
	mallory, err := nats.Connect(d.url, nats.UserCredentials(credsFile), nats.NoReconnect())
	if err != nil {
		t.Fatalf("globex's forged user: %v", err)
	}
	defer mallory.Close()
	// Everything but its own requests, which would answer themselves.
	everything, err := mallory.SubscribeSync(">")
	if err != nil {
		t.Fatal(err)
	}
	requester, err := nats.Connect(d.url, nats.UserCredentials(credsFile), nats.NoReconnect())
	if err != nil {
		t.Fatal(err)
	}
	defer requester.Close()
	run := 0
	nothingThrough := func(what string) {
		t.Helper()
		if err := mallory.Flush(); err != nil {
			t.Fatal(err)
		}
		if err := everything.Unsubscribe(); err != nil {
			t.Fatal(err)
		}
		if err := mallory.Flush(); err != nil {
			t.Fatal(err)
		}
		if _, err := requester.Request("steal.submit.ah", []byte(`{}`), 2*time.Second); !errors.Is(err, nats.ErrNoResponders) {
			t.Fatalf("%s: a request through the forged import: %v, want no responders", what, err)
		}
		if everything, err = mallory.SubscribeSync(">"); err != nil {
			t.Fatal(err)
		}
		if err := mallory.Flush(); err != nil {
			t.Fatal(err)
		}
		run++
		id := "a-again" + string(rune('0'+run))
		acme.submit(jwtRun("acme", "ah", id, "hi"))
		if s := <-seen; s.info.Account != acmeAcc.Subject {
			t.Fatalf("%s: the submit service saw a request of account %s", what, s.info.Account)
		}
		if fin := jwtFinished(t, acmeEvents, "acme", id); fin.Status != protocol.StatusSuccess {
			t.Fatalf("acme's run ended %s", fin.Status)
		}
		if m, err := everything.NextMsg(300 * time.Millisecond); err == nil {
			t.Fatalf("%s: globex's forged user received %s: %s", what, m.Subject, m.Data)
		}
		select {
		case s := <-seen:
			t.Fatalf("%s: the submit service received %+v", what, s)
		default:
		}
	}
	forged := func(signer nkeys.KeyPair, imports ...*jwt.Import) string {
		t.Helper()
		ac, err := d.store.Account("globex")
		if err != nil {
			t.Fatal(err)
		}
		ac.Imports.Add(imports...)
		token, err := ac.Encode(signer)
		if err != nil {
			t.Fatal(err)
		}
		return token
	}
	agentAcc, err := d.store.Account(natsjwt.ServiceAccount)
	if err != nil {
		t.Fatal(err)
	}
	stealSubmit := &jwt.Import{Subject: "agent.submit.acme.*", LocalSubject: "steal.submit.*", Account: agentAcc.Subject, Type: jwt.Service}
	stealEvents := &jwt.Import{Subject: "agent.events.acme.>", LocalSubject: "steal.events.>", Account: agentAcc.Subject, Type: jwt.Stream}
	// Signed by globex's own key: the full resolver stores what the
	// system user pushes, but the server never applies an account JWT
	// its operator did not sign.
	_ = d.pushJWT(forged(globexKey, stealSubmit, stealEvents))
	nothingThrough("globex's JWT signed by globex")
	// Signed by the operator, with an activation AGENT did not sign for
	// globex: not a valid account JWT.
	selfAct := jwt.NewActivationClaims(agentAcc.Subject)
	selfAct.ImportSubject, selfAct.ImportType = "agent.submit.acme.*", jwt.Service
	selfToken, err := selfAct.Encode(globexKey)
	if err != nil {
		t.Fatal(err)
	}
	var acmeToken string
	for _, imp := range acmeAcc.Imports {
		if imp.Subject == "agent.submit.acme.*" {
			acmeToken = imp.Token
		}
	}
	for what, token := range map[string]string{"an activation signed by globex": selfToken, "acme's activation": acmeToken} {
		imp := *stealSubmit
		imp.Token = token
		if err := d.pushJWT(forged(operatorKey, &imp)); err == nil {
			t.Fatalf("the server took a globex account JWT importing acme's submissions with %s", what)
		}
	}
	// Signed by the operator, without activation: taken, imports ignored.
	if err := d.pushJWT(forged(operatorKey, stealSubmit, stealEvents)); err != nil {
		t.Fatalf("the operator-signed globex JWT with imports without activation: %v", err)
	}
	nothingThrough("globex's JWT signed by the operator, imports without activation")

	// Removing globex closes its connections, refuses its creds and
	// leaves acme working.
	globexCreds, err := os.ReadFile(d.store.CredsPath("globex", "globex"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.store.RemoveTenant("globex"); err != nil {
		t.Fatal(err)
	}
	d.push()
	for _, c := range []struct {
		name   string
		closed func() bool
	}{{"globex", func() bool { return isClosed(globex.closed) }}, {"mallory", mallory.IsClosed}} {
		deadline := time.Now().Add(5 * time.Second)
		for !c.closed() && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if !c.closed() {
			t.Fatalf("%s's connection stayed open after globex was removed", c.name)
		}
	}
	oldCreds := filepath.Join(t.TempDir(), "globex.creds")
	if err := os.WriteFile(oldCreds, globexCreds, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := nats.Connect(d.url, nats.UserCredentials(oldCreds)); err == nil {
		t.Fatal("removed tenant globex's user connected")
	}
	acme.submit(jwtRun("acme", "ah", "a-after", "hi"))
	<-seen
	if fin := jwtFinished(t, acmeEvents, "acme", "a-after"); fin.Status != protocol.StatusSuccess {
		t.Fatalf("acme's run after globex's removal ended %s", fin.Status)
	}
	acme.clean()
	workerConn.clean()
	gatewayConn.clean()
	submitConn.clean()
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// TestStartJWTDeployment checks the helper the attacker suite runs
// against: every user connects, gateway and worker share AGENT, and each
// tenant is its own account (as the server reports its connections).
func TestStartJWTDeployment(t *testing.T) {
	_, connect := startJWTDeployment(t)
	users := []string{"gateway", "worker", "acme", "globex", natsjwt.SystemUser}
	var sys *nats.Conn
	for _, user := range users {
		nc := connect(user)
		if err := nc.Flush(); err != nil {
			t.Fatalf("%s: %v", user, err)
		}
		if user == natsjwt.SystemUser {
			sys = nc
		}
	}
	m, err := sys.Request("$SYS.REQ.SERVER.PING.CONNZ", []byte(`{"auth":true}`), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var connz struct {
		Data struct {
			Conns []struct {
				Name    string `json:"name"`
				Account string `json:"account"`
				NameTag string `json:"name_tag"`
			} `json:"connections"`
		} `json:"data"`
	}
	if err := json.Unmarshal(m.Data, &connz); err != nil {
		t.Fatal(err)
	}
	account := map[string]string{}
	for _, c := range connz.Data.Conns {
		account[strings.TrimPrefix(c.Name, "jwt-test-")] = c.Account
	}
	for _, u := range users {
		if account[u] == "" {
			t.Fatalf("the server has no connection of %s: %s", u, m.Data)
		}
	}
	if account["gateway"] != account["worker"] {
		t.Error("gateway and worker are in different accounts")
	}
	distinct := map[string]bool{}
	for _, u := range []string{"gateway", "acme", "globex", natsjwt.SystemUser} {
		distinct[account[u]] = true
	}
	if len(distinct) != 4 {
		t.Errorf("AGENT, acme, globex and SYS are not four accounts: %v", account)
	}
}
