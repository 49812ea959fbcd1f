package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/natsagent/natsagent/internal/natstest"
)

// TestJWTCommands drives `natsagent jwt` as an operator would: init,
// server-config (full resolver) for a real nats-server, tenant-add with a
// first user and --server, user-rotate, user-revoke and tenant-remove
// pushed to the running server, and refusals of bad names and flags.
func TestJWTCommands(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "natsjwt")
	mustRun := func(args ...string) string {
		t.Helper()
		code, out, errOut := runCLI(append([]string{"jwt"}, args...)...)
		if code != 0 {
			t.Fatalf("natsagent jwt %v: exit %d\n%s%s", args, code, out, errOut)
		}
		return out
	}
	if out := mustRun("init", "--dir", dir); !strings.Contains(out, filepath.Join(dir, "creds", "AGENT", "worker.creds")) {
		t.Fatalf("init printed %s", out)
	}

	// The server, configured with the fragment as an operator includes it.
	srvDir := t.TempDir()
	fragment := filepath.Join(srvDir, "natsjwt.conf")
	mustRun("server-config", "--dir", dir, "--resolver-dir", filepath.Join(srvDir, "jwt"), "--out", fragment)
	main := filepath.Join(srvDir, "server.conf")
	if err := os.WriteFile(main, []byte("jetstream {store_dir: \""+filepath.Join(srvDir, "js")+"\"}\ninclude natsjwt.conf\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(main)
	if err != nil {
		t.Fatal(err)
	}
	opts.Host, opts.Port, opts.NoLog, opts.NoSigs = "127.0.0.1", -1, true, true
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	url := srv.ClientURL()

	out := mustRun("tenant-add", "--dir", dir, "--tenant", "acme", "--user", "app", "--server", url)
	creds := filepath.Join(dir, "creds", "acme", "app.creds")
	if !strings.Contains(out, creds) || !strings.Contains(out, "pushed 3 accounts") {
		t.Fatalf("tenant-add printed %s", out)
	}
	closed := make(chan struct{})
	nc, err := nats.Connect(url, nats.UserCredentials(creds), nats.NoReconnect(), nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
	if err != nil {
		t.Fatalf("acme's app: %v", err)
	}
	defer nc.Close()
	old, _ := os.ReadFile(creds)
	oldCreds := filepath.Join(t.TempDir(), "old.creds")
	if err := os.WriteFile(oldCreds, old, 0o600); err != nil {
		t.Fatal(err)
	}
	mustRun("user-rotate", "--dir", dir, "--account", "acme", "--user", "app", "--server", url)
	select {
	case <-closed:
	case <-time.After(natstest.Patience):
		t.Fatal("the rotated user's connection stayed open")
	}
	if _, err := nats.Connect(url, nats.UserCredentials(oldCreds)); err == nil {
		t.Fatal("old creds connected after user-rotate")
	}
	nc2, err := nats.Connect(url, nats.UserCredentials(creds), nats.NoReconnect())
	if err != nil {
		t.Fatalf("new creds after user-rotate: %v", err)
	}
	defer nc2.Close()
	// A new user needs no push: the server checks its JWT against the
	// account key it knows.
	if out := mustRun("user-add", "--dir", dir, "--account", "acme", "--user", "ops"); strings.Contains(out, "push") {
		t.Fatalf("user-add asked for a push: %s", out)
	}
	ops, err := nats.Connect(url, nats.UserCredentials(filepath.Join(dir, "creds", "acme", "ops.creds")))
	if err != nil {
		t.Fatalf("a user added without a push: %v", err)
	}
	ops.Close()
	mustRun("user-revoke", "--dir", dir, "--account", "acme", "--user", "app", "--server", url)
	if _, err := nats.Connect(url, nats.UserCredentials(oldCreds)); err == nil {
		t.Fatal("revoked creds connected")
	}
	if _, err := os.Stat(creds); !os.IsNotExist(err) {
		t.Fatalf("user-revoke kept the creds file: %v", err)
	}
	if out := mustRun("tenant-remove", "--dir", dir, "--tenant", "acme", "--server", url); !strings.Contains(out, "deleted removed accounts") {
		t.Fatalf("tenant-remove printed %s", out)
	}
	if _, err := os.Stat(filepath.Join(dir, "creds", "acme")); !os.IsNotExist(err) {
		t.Fatalf("tenant-remove kept acme's creds: %v", err)
	}

	// Refusals, before anything is written.
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"tenant-add", "--dir", dir, "--tenant", "a.b"}, 1, "not a valid id"},
		{[]string{"tenant-add", "--dir", dir, "--tenant", "AGENT"}, 1, "taken by natsagent's service account"},
		{[]string{"tenant-add", "--dir", dir, "--tenant", "x", "--user", "../y"}, 1, "not a valid id"},
		{[]string{"user-add", "--dir", dir, "--account", "nobody", "--user", "u"}, 1, "not found"},
		{[]string{"user-add", "--account", "acme", "--user", "u"}, 2, "--dir"},
		{[]string{"push", "--dir", dir}, 2, "--server"},
		{[]string{"init", "--dir", dir}, 1, "already holds an operator"},
		{[]string{"server-config", "--dir", t.TempDir()}, 1, "natsagent jwt init"},
		{[]string{"nope"}, 2, `unknown command "nope"`},
	} {
		code, _, errOut := runCLI(append([]string{"jwt"}, c.args...)...)
		if code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("jwt %v: exit %d, want %d with %q:\n%s", c.args, code, c.code, c.want, errOut)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "accounts", "x.jwt")); !os.IsNotExist(err) {
		t.Errorf("tenant x was created although its user name was refused: %v", err)
	}
	if code, _, errOut := runCLI("help", "jwt"); code != 0 || !strings.Contains(errOut, "tenant-remove") {
		t.Errorf("help jwt: %d\n%s", code, errOut)
	}
}
