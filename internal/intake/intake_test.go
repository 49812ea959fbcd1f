package intake_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"go.uber.org/zap/zaptest"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/events"
	"github.com/natsagent/natsagent/internal/intake"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/limits"
	"github.com/natsagent/natsagent/internal/natsjwt"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/submit"
	"github.com/natsagent/natsagent/internal/testdeploy"
)

type env struct {
	t      *testing.T
	nc     *nats.Conn
	runs   jetstream.Stream
	stores *kv.Stores
}

// setup runs the submit service on an embedded JetStream server, with
// hooks and, when policy is not nil, the tenants' limits it sets. Without
// accounts nothing replaces Nats-Request-Info, so the tests set it as a
// NATS server would after a service import (deploy/attack_test.go proves
// the server's part against the shipped configuration).
func setup(t *testing.T, hooks intake.Hooks, policy *limits.Policy) *env {
	t.Helper()
	d := testdeploy.Start(t, bus.Settings{})
	ctx := context.Background()
	pub, err := events.NewPublisher(ctx, d.JS, d.Settings.Names, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := intake.Config{Settings: d.Settings, Stores: d.Stores, Logger: zaptest.NewLogger(t), Hooks: hooks,
		Queue: &submit.Queue{JS: d.JS, Names: d.Settings.Names, Stores: d.Stores, Events: pub, Submitter: "intake"}}
	if policy != nil {
		if cfg.Limits, err = limits.Open(ctx, d.JS, d.Settings, *policy); err != nil {
			t.Fatal(err)
		}
	}
	s, err := intake.Start(d.NC, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	runs, err := d.JS.Stream(ctx, d.Settings.Names.RunsStream())
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, nc: d.NC, runs: runs, stores: d.Stores}
}

func info(acc, user, nameTag string, tags ...string) string {
	b, _ := json.Marshal(map[string]any{"acc": acc, "user": user, "name_tag": nameTag, "tags": tags, "server": "n1"})
	return string(b)
}

// newKey is a new public key of an account or user, as a server in
// operator mode names them in Nats-Request-Info.
func newKey(t *testing.T, create func() (nkeys.KeyPair, error)) string {
	t.Helper()
	kp, err := create()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

// send requests on P.submit.<tenant>.<thread> and returns the answer.
func (e *env) send(tenant, thread, body string, headers ...string) *nats.Msg {
	e.t.Helper()
	m := nats.NewMsg("agent.submit." + tenant + "." + thread)
	m.Data = []byte(body)
	for i := 0; i+1 < len(headers); i += 2 {
		m.Header.Set(headers[i], headers[i+1])
	}
	reply, err := e.nc.RequestMsg(m, 10*time.Second)
	if err != nil {
		e.t.Fatalf("submit: %v", err)
	}
	return reply
}

func ack(t *testing.T, m *nats.Msg) jetstream.PubAck {
	t.Helper()
	var a struct {
		jetstream.PubAck
		Error json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &a); err != nil || a.Error != nil || a.Stream != "AGENT_RUNS" || a.Sequence == 0 {
		t.Fatalf("answer %s, want a PubAck of AGENT_RUNS", m.Data)
	}
	return a.PubAck
}

func refusal(t *testing.T, m *nats.Msg, status, errCode int, contains string) {
	t.Helper()
	var a struct {
		Error *struct {
			Code        int    `json:"code"`
			ErrCode     int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &a); err != nil || a.Error == nil {
		t.Fatalf("answer %s, want an error", m.Data)
	}
	if a.Error.Code != status || a.Error.ErrCode != errCode || !strings.Contains(a.Error.Description, contains) {
		t.Fatalf("answer %s, want code %d err_code %d containing %q", m.Data, status, errCode, contains)
	}
	if m.Header.Get("Nats-Service-Error-Code") == "" || m.Header.Get("Nats-Service-Error") != a.Error.Description {
		t.Fatalf("service error headers %v", m.Header)
	}
}

const hi = `"input":{"messages":[{"role":"user","content":"hi"}]}`

// A tenant's request is stored with the principal the server vouched for
// (name_tag before user), the user id set to it, and the message id
// "<tenant>.<run>", whatever the body claimed.
func TestSubmitStampsThePrincipal(t *testing.T) {
	e := setup(t, intake.Hooks{Roles: func(tenant string, ci intake.ClientInfo) []string { return []string{tenant + "-role"} }}, nil)
	body := `{"run_id":"r1","thread_id":"h1",` + hi + `,"principal":{"user":"boss","roles":["admin"]}}`
	a := ack(t, e.send("acme", "h1", body, intake.HeaderRequestInfo, info("acme", "alice", ""), nats.MsgIdHdr, "r1"))
	m, err := e.runs.GetMsg(context.Background(), a.Sequence)
	if err != nil {
		t.Fatal(err)
	}
	var req protocol.RunRequest
	if err := json.Unmarshal(m.Data, &req); err != nil {
		t.Fatal(err)
	}
	if m.Subject != "agent.runs.acme.h1" || m.Header.Get(nats.MsgIdHdr) != "acme.r1" ||
		req.Principal == nil || req.Principal.User != "alice" || strings.Join(req.Principal.Roles, ",") != "acme-role" || req.Config.UserID != "alice" {
		t.Fatalf("stored %s %v: %s", m.Subject, m.Header, m.Data)
	}
	rec, _, err := e.stores.Runs.Get(context.Background(), "acme", "r1")
	if err != nil || rec.Status != protocol.StatusPending {
		t.Fatalf("record %+v, %v", rec, err)
	}
	// A retry is answered with the same request, stored once.
	if again := ack(t, e.send("acme", "h1", body, intake.HeaderRequestInfo, info("acme", "alice", ""))); again.Sequence != a.Sequence || !again.Duplicate {
		t.Fatalf("retry ack %+v, first %+v", again, a)
	}
	// A JWT user's name tag names the principal.
	a = ack(t, e.send("acme", "h2", `{"run_id":"r2","thread_id":"h2",`+hi+`}`, intake.HeaderRequestInfo, info("acme", "UABC", "bob")))
	m, _ = e.runs.GetMsg(context.Background(), a.Sequence)
	if !strings.Contains(string(m.Data), `"principal":{"user":"bob"`) {
		t.Fatalf("stored %s", m.Data)
	}
}

// In JWT mode the server names the account by its public key and the
// user by its public key; the user JWT's tenant tag (natsjwt) says which
// tenant the account is, and its name is the principal.
func TestSubmitJWTAccount(t *testing.T) {
	e := setup(t, intake.Hooks{}, nil)
	acc, user := newKey(t, nkeys.CreateAccount), newKey(t, nkeys.CreateUser)
	a := ack(t, e.send("acme", "h1", `{"run_id":"r1","thread_id":"h1",`+hi+`}`,
		intake.HeaderRequestInfo, info(acc, user, "bob", "team:blue", natsjwt.TenantTag("acme"))))
	m, err := e.runs.GetMsg(context.Background(), a.Sequence)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(m.Data), `"principal":{"user":"bob"`) || !strings.Contains(string(m.Data), `"user_id":"bob"`) {
		t.Fatalf("stored %s", m.Data)
	}
	// Without a name the user's key is the principal.
	a = ack(t, e.send("acme", "h2", `{"run_id":"r2","thread_id":"h2",`+hi+`}`, intake.HeaderRequestInfo, info(acc, user, "", natsjwt.TenantTag("acme"))))
	if m, _ = e.runs.GetMsg(context.Background(), a.Sequence); !strings.Contains(string(m.Data), `"principal":{"user":"`+user+`"`) {
		t.Fatalf("stored %s", m.Data)
	}
	// JWT tags are lower case: tenant Acme's users carry "natsagent-tenant:acme".
	ack(t, e.send("Acme", "h1", `{"run_id":"r3","thread_id":"h1",`+hi+`}`, intake.HeaderRequestInfo, info(acc, user, "bob", "natsagent-tenant:acme")))

	// Forged or stale: an account key whose user has no tenant tag, the
	// tag of another tenant, a tag that only starts like the tenant's, and
	// a static account named like an account key (never taken for the
	// tenant without the tag).
	other := newKey(t, nkeys.CreateAccount)
	for _, c := range []struct {
		name, tenant, info string
	}{
		{"no tag", "acme", info(acc, user, "bob")},
		{"other tags", "acme", info(acc, user, "bob", "natsagent-tenant", "acme", "tenant:acme")},
		{"another tenant's tag", "acme", info(acc, user, "bob", natsjwt.TenantTag("globex"))},
		{"a longer tenant's tag", "acme", info(acc, user, "bob", natsjwt.TenantTag("acme-2"))},
		{"account key as tenant", other, info(other, "alice", "")},
	} {
		t.Run(c.name, func(t *testing.T) {
			refusal(t, e.send(c.tenant, "h1", `{"run_id":"x1","thread_id":"h1",`+hi+`}`, intake.HeaderRequestInfo, c.info),
				403, intake.ErrCodeForbidden, "may not submit runs of tenant")
		})
	}
	if _, _, err := e.stores.Runs.Get(context.Background(), "acme", "x1"); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("a refused request has a record: %v", err)
	}
	// The refusal says what to do.
	refusal(t, e.send("acme", "h1", `{"run_id":"x1","thread_id":"h1",`+hi+`}`, intake.HeaderRequestInfo, info(acc, user, "bob")),
		403, intake.ErrCodeForbidden, `has no tag "natsagent-tenant:acme" (a user issued before natsagent tagged tenant users needs new creds: natsagent jwt user-rotate --account acme`)
}

func TestSubmitRefusals(t *testing.T) {
	e := setup(t, intake.Hooks{}, nil)
	alice := info("acme", "alice", "")
	cases := []struct {
		name, tenant, thread, body string
		headers                    []string
		status, errCode            int
		contains                   string
	}{
		{"another account", "globex", "h1", `{"run_id":"x1","thread_id":"h1",` + hi + `}`, []string{intake.HeaderRequestInfo, alice}, 403, intake.ErrCodeForbidden, `account "acme" may not submit runs of tenant "globex"`},
		{"another user id", "acme", "h1", `{"run_id":"x2","thread_id":"h1",` + hi + `,"config":{"user_id":"carol"}}`, []string{intake.HeaderRequestInfo, alice}, 403, intake.ErrCodeForbidden, `config.user_id "carol" is not your user "alice"`},
		{"body tenant", "acme", "h1", `{"run_id":"x3","thread_id":"h1","tenant":"globex",` + hi + `}`, []string{intake.HeaderRequestInfo, alice}, 400, intake.ErrCodeInvalid, `tenant: "globex" does not match the subject's tenant "acme"`},
		{"body thread", "acme", "h1", `{"run_id":"x4","thread_id":"h9",` + hi + `}`, []string{intake.HeaderRequestInfo, alice}, 400, intake.ErrCodeInvalid, `thread_id: "h9" does not match`},
		{"another tenant's msg id", "acme", "h1", `{"run_id":"r1","thread_id":"h1",` + hi + `}`, []string{intake.HeaderRequestInfo, alice, nats.MsgIdHdr, "globex.r1"}, 400, intake.ErrCodeInvalid, `Nats-Msg-Id: "globex.r1" does not match the run: it must be "acme.r1"`},
		{"invalid thread token", "acme", "h%1", `{}`, []string{intake.HeaderRequestInfo, alice}, 400, intake.ErrCodeInvalid, "thread_id (subject)"},
		{"undecodable", "acme", "h1", `{"run_id":`, []string{intake.HeaderRequestInfo, alice}, 400, intake.ErrCodeInvalid, ""},
		{"no input", "acme", "h1", `{"run_id":"x5","thread_id":"h1"}`, []string{intake.HeaderRequestInfo, alice}, 400, intake.ErrCodeInvalid, "input"},
		{"parent", "acme", "h1", `{"run_id":"x8","thread_id":"h1",` + hi + `,"parent":{"run_id":"p","thread_id":"other","tool_call_id":"c"}}`, []string{intake.HeaderRequestInfo, alice}, 403, intake.ErrCodeForbidden, "parent: subagent runs are started by the subagent service"},
		{"broken request info", "acme", "h1", `{"run_id":"x6","thread_id":"h1",` + hi + `}`, []string{intake.HeaderRequestInfo, "{"}, 400, intake.ErrCodeInvalid, "Nats-Request-Info"},
		{"too large", "acme", "h1", `{"run_id":"x7","thread_id":"h1","input":{"messages":[{"role":"user","content":"` + strings.Repeat("a", protocol.DefaultMaxRequestBytes) + `"}]}}`, []string{intake.HeaderRequestInfo, alice}, 400, intake.ErrCodeInvalid, "over the limit"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			refusal(t, e.send(c.tenant, c.thread, c.body, c.headers...), c.status, c.errCode, c.contains)
		})
	}
	info, err := e.runs.Info(context.Background())
	if err != nil || info.State.Msgs != 0 {
		t.Fatalf("the runs stream holds %d requests (%v), want none", info.State.Msgs, err)
	}
	for _, run := range []string{"x1", "x2", "x3", "x4", "x5", "x6", "x7", "x8", "r1"} {
		for _, tenant := range []string{"acme", "globex"} {
			if _, _, err := e.stores.Runs.Get(context.Background(), tenant, run); !errors.Is(err, kv.ErrNotFound) {
				t.Fatalf("%s.%s has a record: %v", tenant, run, err)
			}
		}
	}
}

// The Authorize hook decides, and may allow acting for another user.
func TestSubmitAuthorizeHook(t *testing.T) {
	e := setup(t, intake.Hooks{Authorize: func(_ context.Context, tenant string, p *protocol.Principal, req *protocol.RunRequest) error {
		if req.Agent != "chatbot" {
			return errors.New("agent " + req.Agent + " is not allowed for " + p.User)
		}
		return nil
	}}, nil)
	alice := info("acme", "alice", "")
	refusal(t, e.send("acme", "h1", `{"run_id":"r1","thread_id":"h1","agent":"coder",`+hi+`}`, intake.HeaderRequestInfo, alice), 403, intake.ErrCodeForbidden, "agent coder is not allowed for alice")
	a := ack(t, e.send("acme", "h1", `{"run_id":"r2","thread_id":"h1",`+hi+`,"config":{"user_id":"carol"}}`, intake.HeaderRequestInfo, alice))
	m, _ := e.runs.GetMsg(context.Background(), a.Sequence)
	if !strings.Contains(string(m.Data), `"user_id":"carol"`) {
		t.Fatalf("stored %s", m.Data)
	}
}

// Without a reply subject the request is still submitted; a JetStream
// client's Publish gets the PubAck (inside the service account, as a
// trusted client; through an import in deploy's tests).
func TestSubmitWithoutReplyAndWithJetStreamPublish(t *testing.T) {
	e := setup(t, intake.Hooks{}, nil)
	if err := e.nc.Publish("agent.submit.acme.h1", []byte(`{"run_id":"r1","thread_id":"h1",`+hi+`}`)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, _, err := e.stores.Runs.Get(context.Background(), "acme", "r1"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a request without reply was not submitted")
		}
		time.Sleep(20 * time.Millisecond)
	}
	js, _ := jetstream.New(e.nc)
	a, err := js.Publish(context.Background(), "agent.submit.acme.h2", []byte(`{"run_id":"r2","thread_id":"h2",`+hi+`}`))
	if err != nil || a.Stream != "AGENT_RUNS" {
		t.Fatalf("js.Publish: %+v, %v", a, err)
	}
	_, err = js.Publish(context.Background(), "agent.submit.acme.h3", []byte(`{"run_id":"r3","thread_id":"h9",`+hi+`}`))
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.Code != 400 || apiErr.ErrorCode != intake.ErrCodeInvalid || !strings.Contains(apiErr.Description, "thread_id") {
		t.Fatalf("js.Publish of an invalid request: %v, want the API error", err)
	}
}
