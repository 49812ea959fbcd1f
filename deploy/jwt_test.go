package deploy

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/natsagent/natsagent/internal/app"
	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/natsjwt"
	"github.com/natsagent/natsagent/internal/natsjwt/natsjwttest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/testdeploy"
)

// jwtDeployment is a nats-server in operator mode trusting a natsjwt
// store made for the test.
type jwtDeployment struct {
	t     *testing.T
	url   string
	srv   *server.Server
	store *natsjwt.Store
}

// jwtTenants are the tenants of startJWTDeployment; each has one user
// named like it.
var jwtTenants = []string{"acme", "globex"}

// newJWTDeployment runs a real nats-server in JWT mode (the account
// layout of docs/operations.md, "NATS JWT mode"), as an operator sets it
// up: `natsagent jwt init` (AGENT with users gateway and worker, SYS with
// user sys), the server config with the full resolver, then tenants acme
// and globex, each with a user of its own name, added and pushed. Nothing
// is provisioned and no worker runs.
func newJWTDeployment(t *testing.T) *jwtDeployment {
	t.Helper()
	store, err := natsjwt.Init(filepath.Join(t.TempDir(), "natsjwt"), "")
	if err != nil {
		t.Fatal(err)
	}
	srv := natsjwttest.StartServer(t, store, true)
	d := &jwtDeployment{t: t, url: srv.ClientURL(), srv: srv, store: store}
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

// attack is the deployment for the attacker suite: it connects as
// "gateway", "worker", "acme", "globex" or "sys" (failing the test if the
// server refuses), and names tenants' accounts by their public keys.
func (d *jwtDeployment) attack() attackDeployment {
	return attackDeployment{
		URL: d.url,
		Connect: func(t *testing.T, user string, opts ...nats.Option) *nats.Conn {
			t.Helper()
			nc, err := d.connect(user, opts...)
			if err != nil {
				t.Fatalf("connect as %s: %v", user, err)
			}
			return nc
		},
		Account: func(tenant string) string {
			ac, err := d.store.Account(tenant)
			if err != nil {
				d.t.Fatal(err)
			}
			return ac.Subject
		},
	}
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

// TestTenantIsolationJWT runs the attacker suite against a real
// nats-server in JWT mode (natsjwt), with the workers' submit service.
func TestTenantIsolationJWT(t *testing.T) {
	runAttackerSuite(t, newJWTDeployment(t).attack())
}

// TestJWTIsolation proves, on a real nats-server in JWT mode with the
// workers' submit service, what only an operator's keys can try and the
// attacker suite therefore does not: an account JWT for globex with its
// own import of acme's exports is refused or gets nothing through, and
// removing globex closes its connections, refuses its creds and leaves
// acme working. Acme's requests reach the submit service with the
// server's Nats-Request-Info: acme's account key, its user's key and
// name, and its tenant tag.
func TestJWTIsolation(t *testing.T) {
	d := newJWTDeployment(t)
	ad := d.attack()
	svc := startServices(t, ad)
	acmeAcc, err := d.store.Account("acme")
	if err != nil {
		t.Fatal(err)
	}
	acme := ad.user(t, "acme")
	acmeEvents, err := acme.nc.SubscribeSync("agent.events.acme.>")
	if err != nil {
		t.Fatal(err)
	}
	globex := ad.user(t, "globex", nats.NoReconnect())
	if err := globex.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// acmeRuns submits run as acme and checks it succeeds, stamped with
	// acme's user, and is the only submission since the last one.
	accepted := 0
	acmeRuns := func(what, run string) {
		t.Helper()
		acme.submit("ah", run, "hi")
		if fin := finishedOn(t, acmeEvents, "acme", run); fin.Status != protocol.StatusSuccess {
			t.Fatalf("%s: acme's run %s ended %s: %s", what, run, fin.Status, fin.Error)
		}
		if s := svc.submission("acme", run); s != (submitted{user: "acme", principal: "acme"}) {
			t.Fatalf("%s: acme's run was stamped %+v", what, s)
		}
		infos := svc.accepted()
		if len(infos) != accepted+1 {
			t.Fatalf("%s: the submit service accepted %d submissions, want acme's one: %+v", what, len(infos)-accepted, infos[accepted:])
		}
		accepted = len(infos)
		last := infos[len(infos)-1]
		if last.tenant != "acme" || last.info.Account != acmeAcc.Subject || last.info.NameTag != "acme" || !nkeys.IsValidPublicUserKey(last.info.User) ||
			!slices.Contains(last.info.Tags, natsjwt.TenantTag("acme")) {
			t.Fatalf("%s: the submit service saw %+v, want account %s, a user key named acme with acme's tag", what, last, acmeAcc.Subject)
		}
	}
	acmeRuns("first", "a-hi")

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
		acmeRuns(what, "a-again"+string(rune('0'+run)))
		if m, err := everything.NextMsg(300 * time.Millisecond); err == nil {
			t.Fatalf("%s: globex's forged user received %s: %s", what, m.Subject, m.Data)
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
	}{{"globex", globex.isClosed}, {"mallory", mallory.IsClosed}} {
		deadline := time.Now().Add(testdeploy.MinWait)
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
	acmeRuns("after globex's removal", "a-after")
	for _, u := range append(svc.conns, acme) {
		u.clean()
	}
}

// TestJWTDeployment checks the deployment the attacker suite runs
// against: every user connects, gateway and worker share AGENT, and each
// tenant is its own account (as the server reports its connections).
func TestJWTDeployment(t *testing.T) {
	d := newJWTDeployment(t).attack()
	users := []string{"gateway", "worker", "acme", "globex", natsjwt.SystemUser}
	var sys *nats.Conn
	for _, user := range users {
		nc := d.Connect(t, user)
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
