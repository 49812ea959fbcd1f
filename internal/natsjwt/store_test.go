package natsjwt_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"github.com/natsagent/natsagent/internal/natsjwt"
	"github.com/natsagent/natsagent/internal/natsjwt/natsjwttest"
	"github.com/natsagent/natsagent/internal/natstest"
)

func initStore(t *testing.T) *natsjwt.Store {
	t.Helper()
	s, err := natsjwt.Init(filepath.Join(t.TempDir(), "jwt"), "")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestStoreFiles checks the directory's layout and modes, and that names
// that are not tokens, and the operator's own account names, are refused
// before anything is written.
func TestStoreFiles(t *testing.T) {
	s := initStore(t)
	if err := s.AddTenant("acme"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddUser("acme", "app"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"natsjwt.json", "operator.jwt", "keys/operator.nk", "keys/accounts/SYS.nk", "keys/accounts/AGENT.nk", "keys/accounts/acme.nk",
		"accounts/SYS.jwt", "accounts/AGENT.jwt", "accounts/acme.jwt", "creds/SYS/sys.creds", "creds/AGENT/gateway.creds", "creds/AGENT/worker.creds", "creds/acme/app.creds"} {
		if _, err := os.Stat(filepath.Join(s.Dir(), p)); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
	err := filepath.WalkDir(s.Dir(), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		want := fs.FileMode(0o600)
		if d.IsDir() {
			want = 0o700
		}
		if info.Mode().Perm() != want {
			t.Errorf("%s has mode %v, want %v", p, info.Mode().Perm(), want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	if _, err := natsjwt.Init(s.Dir(), ""); !errors.Is(err, natsjwt.ErrExists) {
		t.Errorf("a second init of the same directory: %v, want ErrExists", err)
	}
	if err := s.AddTenant("acme"); !errors.Is(err, natsjwt.ErrExists) {
		t.Errorf("acme added twice: %v", err)
	}
	if _, err := s.AddUser("acme", "app"); !errors.Is(err, natsjwt.ErrExists) {
		t.Errorf("acme's user app added twice: %v", err)
	}
	// Tenant tags are lower case: Acme's users would carry acme's tag.
	if err := s.AddTenant("Acme"); !errors.Is(err, natsjwt.ErrExists) || !strings.Contains(err.Error(), "differ only in case") {
		t.Errorf("tenant Acme beside acme: %v, want ErrExists", err)
	}
	for _, bad := range []string{"", "a.b", "a*", ">", "../x", "a b", "AGENT", "SYS", strings.Repeat("x", 129)} {
		if err := s.AddTenant(bad); err == nil {
			t.Errorf("tenant %q was added", bad)
		}
		if _, err := s.AddUser("acme", bad); err == nil && bad != "AGENT" && bad != "SYS" {
			t.Errorf("user %q was added", bad)
		}
		if _, err := s.AddUser(bad, "x"); err == nil && bad != "AGENT" && bad != "SYS" {
			t.Errorf("a user was added to account %q", bad)
		}
	}
	if err := s.RevokeUser(natsjwt.SystemAccount, natsjwt.SystemUser); err == nil || !strings.Contains(err.Error(), "user-rotate") {
		t.Errorf("revoking the user that pushes: %v", err)
	}
	if _, err := s.AddUser("nobody", "x"); !errors.Is(err, natsjwt.ErrNotFound) {
		t.Errorf("user of an unknown tenant: %v", err)
	}
	if _, err := natsjwt.Init(t.TempDir(), "a.b"); err == nil {
		t.Error("prefix a.b was taken")
	}
	tenants, err := s.Tenants()
	if err != nil || len(tenants) != 1 || tenants[0] != "acme" {
		t.Fatalf("tenants %v, %v", tenants, err)
	}
	if _, err := natsjwt.Open(t.TempDir()); err == nil || !strings.Contains(err.Error(), "natsagent jwt init") {
		t.Errorf("open of an empty dir: %v", err)
	}
	o, err := natsjwt.Open(s.Dir())
	if err != nil || o.Prefix() != "agent" {
		t.Fatalf("open: %v, prefix %q", err, o.Prefix())
	}
}

// TestAccountLayout decodes the JWTs: AGENT has JetStream and private
// exports, one set per tenant; a tenant has no JetStream, imports with
// activations signed by AGENT for its own key, and users confined to
// their subjects.
func TestAccountLayout(t *testing.T) {
	s := initStore(t)
	for _, tenant := range []string{"acme", "globex"} {
		if err := s.AddTenant(tenant); err != nil {
			t.Fatal(err)
		}
	}
	agent, _ := s.Account(natsjwt.ServiceAccount)
	if !agent.Limits.IsJSEnabled() {
		t.Error("AGENT has no JetStream")
	}
	// Named by its key, the name /jsz reports and KEDA's scaler matches.
	if agent.Name != agent.Subject {
		t.Errorf("AGENT's JWT is named %q, want its key %s", agent.Name, agent.Subject)
	}
	if len(agent.Exports) != 12 {
		t.Fatalf("AGENT exports %d subjects, want 12", len(agent.Exports))
	}
	for _, e := range agent.Exports {
		if !e.TokenReq {
			t.Errorf("export %s is public", e.Subject)
		}
	}
	acme, _ := s.Account("acme")
	if acme.Limits.IsJSEnabled() {
		t.Error("acme has JetStream")
	}
	if acme.Limits.LeafNodeConn != 0 {
		t.Errorf("acme may connect %d leaf nodes", acme.Limits.LeafNodeConn)
	}
	if len(acme.Imports) != 6 {
		t.Fatalf("acme imports %d", len(acme.Imports))
	}
	for _, imp := range acme.Imports {
		act, err := jwt.DecodeActivationClaims(imp.Token)
		if err != nil {
			t.Fatal(err)
		}
		if act.Issuer != agent.Subject || act.Subject != acme.Subject || act.ImportSubject != imp.Subject {
			t.Errorf("activation of %s: issuer %s subject %s for %s", imp.Subject, act.Issuer, act.Subject, act.ImportSubject)
		}
		if !strings.Contains(string(imp.Subject), ".acme.") {
			t.Errorf("acme imports %s", imp.Subject)
		}
	}
	// Users: a tenant's confined to its subjects, the service users'
	// those of tenants.conf's NATSAGENT_SERVICE and the replies of imports.
	if _, err := s.AddUser("acme", "app"); err != nil {
		t.Fatal(err)
	}
	const tenantDeny = "$JS.> $KV.> $O.> $SRV.> $SYS.>"
	// A tenant's users carry its tenant tag (Nats-Request-Info names the
	// account by its key); the service and system users carry none.
	for _, c := range []struct{ account, user, pub, sub, deny, tags string }{
		{"acme", "app", "agent.runs.acme.* agent.ctl.acme.*.*.cancel agent.ctl.acme.*.delete agent.ctl.acme.*.*.delete", "agent.events.acme.> agent.live.acme.> _INBOX.>", tenantDeny, "natsagent-tenant:acme"},
		{natsjwt.ServiceAccount, "worker", "$JS.API.> $JS.ACK.> $JS.FC.> $KV.> $O.> $SRV.> agent.> _INBOX.> _R_.>", "agent.> _INBOX.> $JS.EVENT.ADVISORY.> $SRV.>", "", ""},
		{natsjwt.SystemAccount, natsjwt.SystemUser, "", "", "", ""},
	} {
		data, err := os.ReadFile(s.CredsPath(c.account, c.user))
		if err != nil {
			t.Fatal(err)
		}
		token, err := jwt.ParseDecoratedJWT(data)
		if err != nil {
			t.Fatal(err)
		}
		uc, err := jwt.DecodeUserClaims(token)
		if err != nil {
			t.Fatal(err)
		}
		acc, _ := s.Account(c.account)
		if uc.Issuer != acc.Subject || uc.Name != c.user {
			t.Errorf("%s of %s: issued by %s as %q", c.user, c.account, uc.Issuer, uc.Name)
		}
		if tags := strings.Join(uc.Tags, " "); tags != c.tags {
			t.Errorf("%s of %s has tags %q, want %q", c.user, c.account, tags, c.tags)
		}
		if got, deny := strings.Join(uc.Pub.Allow, " "), strings.Join(uc.Pub.Deny, " "); got != c.pub || deny != c.deny {
			t.Errorf("%s of %s publishes to %s, denied %s; want %s, denied %s", c.user, c.account, got, deny, c.pub, c.deny)
		}
		if got, deny := strings.Join(uc.Sub.Allow, " "), strings.Join(uc.Sub.Deny, " "); got != c.sub || deny != c.deny {
			t.Errorf("%s of %s subscribes to %s, denied %s; want %s, denied %s", c.user, c.account, got, deny, c.sub, c.deny)
		}
	}
	pub, err := s.RemoveTenant("acme")
	if err != nil {
		t.Fatal(err)
	}
	last, err := os.ReadFile(filepath.Join(s.Dir(), "removed", pub+".jwt"))
	if err != nil {
		t.Fatal(err)
	}
	gone, err := jwt.DecodeAccountClaims(string(last))
	if err != nil {
		t.Fatal(err)
	}
	if gone.Revocations[jwt.All] == 0 || gone.Limits.Conn != 0 || gone.Limits.LeafNodeConn != 0 {
		t.Errorf("removed acme's last JWT keeps users (revocations %v) or connections (%d, leaf %d)", gone.Revocations, gone.Limits.Conn, gone.Limits.LeafNodeConn)
	}
	agent, _ = s.Account(natsjwt.ServiceAccount)
	for _, e := range agent.Exports {
		if strings.Contains(string(e.Subject), ".acme.") {
			t.Errorf("removed tenant acme still exported %s", e.Subject)
		}
	}
	if len(agent.Exports) != 6 {
		t.Errorf("AGENT exports %d subjects after acme's removal, want globex's 6", len(agent.Exports))
	}
	if _, err := s.AddUser("acme", "x"); !errors.Is(err, natsjwt.ErrNotFound) {
		t.Errorf("user of a removed tenant: %v", err)
	}
}

// conn connects as account's user, recording the server's asynchronous
// errors and the connection's close.
type conn struct {
	nc     *nats.Conn
	errs   chan error
	closed chan struct{}
}

func connect(t *testing.T, url string, s *natsjwt.Store, account, user string) (*conn, error) {
	t.Helper()
	c := &conn{errs: make(chan error, 10), closed: make(chan struct{})}
	nc, err := natsjwttest.Connect(t, url, s, account, user, nats.NoReconnect(),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { c.errs <- err }),
		nats.ClosedHandler(func(*nats.Conn) { close(c.closed) }))
	c.nc = nc
	return c, err
}

func (c *conn) waitClosed(t *testing.T, why string) {
	t.Helper()
	select {
	case <-c.closed:
	case <-time.After(natstest.Patience):
		t.Fatalf("the server kept the connection open after %s", why)
	}
}

func copyFile(t *testing.T, from string) string {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	to := filepath.Join(t.TempDir(), filepath.Base(from))
	if err := os.WriteFile(to, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return to
}

// shutOut keeps a copy of account's user's creds, makes change (a
// revocation, rotation or removal, and what brings it to the servers),
// then checks that the server closes c and refuses the old creds at every
// url. It returns the copy.
func shutOut(t *testing.T, s *natsjwt.Store, c *conn, account, user, what string, change func(), urls ...string) string {
	t.Helper()
	creds := copyFile(t, s.CredsPath(account, user))
	change()
	c.waitClosed(t, what)
	for _, url := range urls {
		if _, err := nats.Connect(url, nats.UserCredentials(creds)); err == nil {
			t.Fatalf("%s's user %s connected to %s with its old creds after %s", account, user, url, what)
		}
	}
	return creds
}

// TestPushFullResolver runs a server with the full resolver that knows
// only SYS and AGENT, and proves each change works on it once pushed: a
// tenant added, a user revoked (disconnected, then refused), a user
// rotated (old creds refused, new ones work), a tenant removed
// (disconnected, then refused).
func TestPushFullResolver(t *testing.T) {
	s := initStore(t)
	srv := natsjwttest.StartServer(t, s, true)
	url := srv.ClientURL()
	if err := s.AddTenant("acme"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddUser("acme", "app"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddUser("acme", "ops"); err != nil {
		t.Fatal(err)
	}
	if _, err := connect(t, url, s, "acme", "app"); err == nil {
		t.Fatal("acme connected before it was pushed")
	}
	sys, err := connect(t, url, s, natsjwt.SystemAccount, natsjwt.SystemUser)
	if err != nil {
		t.Fatal(err)
	}
	push := func() natsjwt.PushResult {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		res, err := s.Push(ctx, sys.nc)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if res := push(); len(res.Updated) != 3 || res.Updated[2] != "acme" {
		t.Fatalf("pushed %v", res.Updated)
	}
	app, err := connect(t, url, s, "acme", "app")
	if err != nil {
		t.Fatalf("acme's app after the push: %v", err)
	}
	ops, err := connect(t, url, s, "acme", "ops")
	if err != nil {
		t.Fatal(err)
	}

	// Revoke: the connection is closed, the creds refused.
	shutOut(t, s, ops, "acme", "ops", "ops was revoked", func() {
		if err := s.RevokeUser("acme", "ops"); err != nil {
			t.Fatal(err)
		}
		push()
	}, url)
	if app.nc.IsClosed() {
		t.Fatal("revoking ops closed app's connection")
	}

	// Rotate: old creds closed and refused, new ones connect.
	shutOut(t, s, app, "acme", "app", "app was rotated", func() {
		if _, err := s.RotateUser("acme", "app"); err != nil {
			t.Fatal(err)
		}
		push()
	}, url)
	app, err = connect(t, url, s, "acme", "app")
	if err != nil {
		t.Fatalf("app's new creds: %v", err)
	}

	// Remove: the last JWT alone (every user revoked) closes the
	// connections and refuses the creds; the push then deletes the
	// account from the resolver.
	var pub string
	appCreds := shutOut(t, s, app, "acme", "app", "acme was removed", func() {
		if pub, err = s.RemoveTenant("acme"); err != nil {
			t.Fatal(err)
		}
		last, err := os.ReadFile(filepath.Join(s.Dir(), "removed", pub+".jwt"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sys.nc.Request("$SYS.REQ.CLAIMS.UPDATE", last, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}, url)
	listed := func() string {
		t.Helper()
		m, err := sys.nc.Request("$SYS.REQ.CLAIMS.LIST", nil, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return string(m.Data)
	}
	if !strings.Contains(listed(), pub) {
		t.Fatalf("the resolver does not list acme %s before the push: %s", pub, listed())
	}
	if res := push(); len(res.Deleted) != 1 || res.Deleted[0] != pub {
		t.Fatalf("push after the removal deleted %v", res.Deleted)
	}
	if strings.Contains(listed(), pub) {
		t.Fatalf("the resolver still lists removed tenant acme: %s", listed())
	}
	if res := push(); len(res.Deleted) != 0 {
		t.Fatalf("a second push deleted %v again", res.Deleted)
	}

	// The name can be used again: a new account key (how a tenant's
	// account key is replaced), whose users connect; the old creds stay
	// refused.
	if err := s.AddTenant("acme"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddUser("acme", "app"); err != nil {
		t.Fatal(err)
	}
	push()
	if _, err := connect(t, url, s, "acme", "app"); err != nil {
		t.Fatalf("the new acme's app: %v", err)
	}
	if _, err := nats.Connect(url, nats.UserCredentials(appCreds)); err == nil {
		t.Fatal("the removed acme's creds connected after acme was added again")
	}
}

// TestPushMemoryResolver: a server with resolver MEMORY takes no pushes,
// and the error says what to do instead.
func TestPushMemoryResolver(t *testing.T) {
	s := initStore(t)
	srv := natsjwttest.StartServer(t, s, false)
	sys, err := connect(t, srv.ClientURL(), s, natsjwt.SystemAccount, natsjwt.SystemUser)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := s.Push(ctx, sys.nc); err == nil || !strings.Contains(err.Error(), "render it again and reload") {
		t.Fatalf("push to a MEMORY resolver: %v", err)
	}
}

// TestMemoryResolverReload: with resolver MEMORY, a change reaches a
// running server when the configuration is rendered again and the server
// reloaded: a tenant added, a user revoked (disconnected, refused), a
// tenant removed (disconnected, refused).
func TestMemoryResolverReload(t *testing.T) {
	s := initStore(t)
	srv := natsjwttest.StartServer(t, s, false)
	url := srv.ClientURL()
	if err := s.AddTenant("acme"); err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"app", "ops"} {
		if _, err := s.AddUser("acme", u); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := connect(t, url, s, "acme", "app"); err == nil {
		t.Fatal("acme connected before the reload")
	}
	natsjwttest.Reload(t, srv, s)
	app, err := connect(t, url, s, "acme", "app")
	if err != nil {
		t.Fatalf("acme after the reload: %v", err)
	}
	ops, err := connect(t, url, s, "acme", "ops")
	if err != nil {
		t.Fatal(err)
	}
	shutOut(t, s, ops, "acme", "ops", "ops was revoked and the server reloaded", func() {
		if err := s.RevokeUser("acme", "ops"); err != nil {
			t.Fatal(err)
		}
		natsjwttest.Reload(t, srv, s)
	}, url)
	shutOut(t, s, app, "acme", "app", "acme was removed and the server reloaded", func() {
		if _, err := s.RemoveTenant("acme"); err != nil {
			t.Fatal(err)
		}
		natsjwttest.Reload(t, srv, s)
	}, url)
}

// TestPushCluster: in a 3-node cluster with the full resolver, a push to
// one node reaches the others: a tenant added there connects to another
// node, a rotation pushed there closes the old key's connection on
// another node, and a removal closes and refuses the tenant everywhere.
func TestPushCluster(t *testing.T) {
	s := initStore(t)
	nodes := natsjwttest.StartCluster(t, s, 3)
	if err := s.AddTenant("acme"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddUser("acme", "app"); err != nil {
		t.Fatal(err)
	}
	sys, err := connect(t, nodes[0].ClientURL(), s, natsjwt.SystemAccount, natsjwt.SystemUser)
	if err != nil {
		t.Fatal(err)
	}
	push := func() {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := s.Push(ctx, sys.nc); err != nil {
			t.Fatal(err)
		}
	}
	// eventually connects as acme's app to node i, within 5s.
	eventually := func(i int) *conn {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			c, err := connect(t, nodes[i].ClientURL(), s, "acme", "app")
			if err == nil {
				return c
			}
			if time.Now().After(deadline) {
				t.Fatalf("acme's app on node %d: %v", i+1, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	push()
	app := eventually(2)
	shutOut(t, s, app, "acme", "app", "app was rotated on another node", func() {
		if _, err := s.RotateUser("acme", "app"); err != nil {
			t.Fatal(err)
		}
		push()
	}, nodes[2].ClientURL())
	app = eventually(1)
	urls := make([]string, len(nodes))
	for i, n := range nodes {
		urls[i] = n.ClientURL()
	}
	shutOut(t, s, app, "acme", "app", "acme was removed", func() {
		if _, err := s.RemoveTenant("acme"); err != nil {
			t.Fatal(err)
		}
		push()
	}, urls...)
}
