package tenancy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
)

func TestLayoutOfATenant(t *testing.T) {
	l, err := Layout("", "acme")
	if err != nil {
		t.Fatal(err)
	}
	if l.Prefix != "agent" || len(l.Exports) != 6 || len(l.Imports) != 6 {
		t.Fatalf("layout %+v", l)
	}
	want := []Import{
		{KindService, ServiceAccount, "agent.submit.acme.*", "agent.runs.acme.*", true},
		{KindService, ServiceAccount, "agent.ctl.acme.*.*.cancel", "agent.ctl.acme.*.*.cancel", true},
		{KindService, ServiceAccount, "agent.ctl.acme.*.delete", "agent.ctl.acme.*.delete", true},
		{KindService, ServiceAccount, "agent.ctl.acme.*.*.delete", "agent.ctl.acme.*.*.delete", true},
		{KindStream, ServiceAccount, "agent.events.acme.>", "agent.events.acme.>", false},
		{KindStream, ServiceAccount, "agent.live.acme.>", "agent.live.acme.>", false},
	}
	for i, im := range l.Imports {
		if im != want[i] {
			t.Errorf("import %d: %+v, want %+v", i, im, want[i])
		}
		e := l.Exports[i]
		if e.Kind != im.Kind || e.Subject != im.Subject || len(e.Accounts) != 1 || e.Accounts[0] != "acme" ||
			(e.Kind == KindService) != (e.ResponseType == ResponseSingleton) {
			t.Errorf("export %d: %+v", i, e)
		}
	}
	if strings.Join(l.User.PublishAllow, " ") != "agent.runs.acme.* agent.ctl.acme.*.*.cancel agent.ctl.acme.*.delete agent.ctl.acme.*.*.delete" ||
		strings.Join(l.User.SubscribeAllow, " ") != "agent.events.acme.> agent.live.acme.> _INBOX.>" {
		t.Fatalf("user permissions %+v", l.User)
	}
	for _, bad := range []string{"", "a.b", "a*", ">", "AGENT", "agent", "sys", "$G", strings.Repeat("a", 129), "a b"} {
		if _, err := Layout("agent", bad); err == nil {
			t.Errorf("tenant %q accepted", bad)
		}
	}
	if _, err := Layout("a.b", "acme"); err == nil {
		t.Error("prefix a.b accepted")
	}
}

// The rendered file is a configuration nats-server accepts, and reads
// back through its manifest.
func TestRenderStaticParsesAndRoundTrips(t *testing.T) {
	c := StaticConfig{Prefix: "ag", Tenants: []StaticTenant{{Name: "acme"}, {Name: "big-co", User: "bigco-app", PasswordEnv: "BIGCO_PW"}}}
	data, err := RenderStatic(c)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, env := range []string{GatewayPasswordEnv, WorkerPasswordEnv, "NATSAGENT_ACME_PASSWORD", "BIGCO_PW"} {
		t.Setenv(env, "pw")
	}
	_ = os.WriteFile(filepath.Join(dir, "tenants.conf"), data, 0o600)
	_ = os.WriteFile(filepath.Join(dir, "server.conf"), []byte("include tenants.conf\n"), 0o600)
	opts, err := server.ProcessConfigFile(filepath.Join(dir, "server.conf"))
	if err != nil {
		t.Fatalf("nats-server refuses the rendered file: %v\n%s", err, data)
	}
	accounts := map[string]bool{}
	for _, a := range opts.Accounts {
		accounts[a.Name] = true
	}
	if !accounts["AGENT"] || !accounts["acme"] || !accounts["big-co"] {
		t.Fatalf("accounts %v", accounts)
	}
	users := map[string]string{}
	for _, u := range opts.Users {
		users[u.Username] = u.Account.Name
	}
	if users["gateway"] != "AGENT" || users["worker"] != "AGENT" || users["acme"] != "acme" || users["bigco-app"] != "big-co" {
		t.Fatalf("users %v", users)
	}
	back, err := ParseStatic(data)
	if err != nil {
		t.Fatal(err)
	}
	if back.Prefix != "ag" || len(back.Tenants) != 2 || back.Tenants[1] != (StaticTenant{"big-co", "bigco-app", "BIGCO_PW"}) || back.Tenants[0].User != "acme" {
		t.Fatalf("parsed %+v", back)
	}
	edited := strings.Replace(string(data), `"ag.runs.acme.*"`, `"ag.runs.*"`, 1)
	if _, err := ParseStatic([]byte(edited)); err == nil || !strings.Contains(err.Error(), "edited by hand") {
		t.Fatalf("a hand edit: %v", err)
	}
	if _, err := ParseStatic([]byte("accounts {}\n")); err == nil || !strings.Contains(err.Error(), "no natsagent manifest") {
		t.Fatalf("a foreign file: %v", err)
	}
}

func TestAddIsIdempotentAndChecksCollisions(t *testing.T) {
	c := StaticConfig{Prefix: "agent"}
	c, added, err := c.Add(StaticTenant{Name: "acme"})
	if err != nil || !added {
		t.Fatal(added, err)
	}
	if _, added, err := c.Add(StaticTenant{Name: "acme"}); err != nil || added {
		t.Fatalf("adding acme again: added %v, %v", added, err)
	}
	for _, bad := range []struct {
		t    StaticTenant
		want string
	}{
		{StaticTenant{Name: "acme", User: "other"}, "already configured"},
		{StaticTenant{Name: "globex", User: "acme"}, "already the user of tenant acme"},
		{StaticTenant{Name: "globex", User: "worker"}, "already the user of the workers"},
		{StaticTenant{Name: "globex", PasswordEnv: "NATSAGENT_ACME_PASSWORD"}, "already the password of tenant acme"},
		{StaticTenant{Name: "globex", PasswordEnv: "1X"}, "not valid"},
		{StaticTenant{Name: "glo.bex"}, "not valid"},
		{StaticTenant{Name: "AGENT"}, "choose another name"},
	} {
		if _, _, err := c.Add(bad.t); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%+v: %v, want %q", bad.t, err, bad.want)
		}
	}
}
