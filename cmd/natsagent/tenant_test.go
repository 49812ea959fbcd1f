package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
)

// tenant add creates the accounts file, adds tenants idempotently, and
// the file is one nats-server loads with each tenant in its own account;
// tenant list reads it back.
func TestTenantAddAndList(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "tenants.conf")
	invoke(t.Context(), "tenant", "add", "acme", "--conf", conf).must(t, 0).has(t, "tenant acme added", "NATSAGENT_ACME_PASSWORD")
	first, _ := os.ReadFile(conf)
	invoke(t.Context(), "tenant", "add", "acme", "--conf", conf).must(t, 0).has(t, "already in")
	if again, _ := os.ReadFile(conf); string(again) != string(first) {
		t.Fatal("adding acme again changed the file")
	}
	invoke(t.Context(), "tenant", "add", "--conf", conf, "--user", "globex-app", "--password-env", "GLOBEX_PW", "globex").must(t, 0).has(t, "user globex-app", "$GLOBEX_PW")
	invoke(t.Context(), "tenant", "list", "--conf", conf).must(t, 0).has(t, "acme", "globex", "globex-app", "GLOBEX_PW")

	for _, env := range []string{"NATSAGENT_GATEWAY_PASSWORD", "NATSAGENT_WORKER_PASSWORD", "NATSAGENT_ACME_PASSWORD", "GLOBEX_PW"} {
		t.Setenv(env, "pw")
	}
	main := filepath.Join(dir, "server.conf")
	_ = os.WriteFile(main, []byte("jetstream {store_dir: "+filepath.Join(dir, "js")+"}\ninclude tenants.conf\n"), 0o600)
	opts, err := server.ProcessConfigFile(main)
	if err != nil {
		t.Fatalf("nats-server refuses the file: %v", err)
	}
	users := map[string]string{}
	for _, u := range opts.Users {
		users[u.Username] = u.Account.Name
	}
	if users["acme"] != "acme" || users["globex-app"] != "globex" || users["worker"] != "AGENT" {
		t.Fatalf("users by account %v", users)
	}
}

func TestTenantAddRefuses(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "tenants.conf")
	invoke(t.Context(), "tenant", "add", "acme", "--conf", conf).must(t, 0)
	for _, c := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"tenant", "add", "a.b", "--conf", conf}, 1, `tenant "a.b" is not valid`},
		{[]string{"tenant", "add", "AGENT", "--conf", conf}, 1, "choose another name"},
		{[]string{"tenant", "add", "acme", "--user", "other", "--conf", conf}, 1, "already configured"},
		{[]string{"tenant", "add", "globex", "--user", "worker", "--conf", conf}, 1, "already the user of the workers"},
		{[]string{"tenant", "add", "globex", "--prefix", "other", "--conf", conf}, 1, `is for prefix "agent"`},
		{[]string{"tenant", "add", "--conf", conf}, 2, "name the tenant"},
		{[]string{"tenant", "add", "a", "b", "--conf", conf}, 2, `unexpected argument "b"`},
		{[]string{"tenant", "remove", "acme"}, 2, `unknown subcommand "remove"`},
		{[]string{"tenant", "list", "--conf", filepath.Join(dir, "none.conf")}, 1, "does not exist"},
	} {
		invoke(t.Context(), c.args...).must(t, c.code).says(t, c.says)
	}
	// A file edited by hand is left alone.
	data, _ := os.ReadFile(conf)
	edited := strings.Replace(string(data), `"agent.runs.acme.*"`, `"agent.runs.>"`, 1)
	_ = os.WriteFile(conf, []byte(edited), 0o644)
	invoke(t.Context(), "tenant", "add", "globex", "--conf", conf).must(t, 1).says(t, "edited by hand")
	if now, _ := os.ReadFile(conf); string(now) != edited {
		t.Fatal("a hand-edited file was rewritten")
	}
}

// The shipped example is what tenant add writes for acme and globex.
func TestTenantAddWritesTheShippedExample(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "tenants.conf")
	invoke(t.Context(), "tenant", "add", "acme", "--conf", conf).must(t, 0)
	invoke(t.Context(), "tenant", "add", "globex", "--conf", conf).must(t, 0)
	got, _ := os.ReadFile(conf)
	want, err := os.ReadFile(filepath.Join("..", "..", "deploy", "nats", "tenants.conf"))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Fatal("deploy/nats/tenants.conf is not what natsagent tenant add acme; add globex writes")
	}
}
