package deploy

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/app"
	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/natsjwt"
	"github.com/natsagent/natsagent/internal/tenancy"
	"github.com/natsagent/natsagent/internal/testdeploy"
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
// loopback port with JetStream in a temp dir and monitoring on another.
func startTenantsServer(t *testing.T) *server.Server {
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
	opts.HTTPHost, opts.HTTPPort = "127.0.0.1", -1
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
	return s
}

// passwordConnect connects as one of tenants.conf's users with
// app.NATSOptions (the binaries' code path for user and password).
func passwordConnect(url string) func(t *testing.T, user string, opts ...nats.Option) *nats.Conn {
	return func(t *testing.T, user string, opts ...nats.Option) *nats.Conn {
		t.Helper()
		cfg := config.Default()
		cfg.NATS.URL, cfg.NATS.User, cfg.NATS.Password = url, user, config.Secret(user+"-test-password")
		base, err := app.NATSOptions(cfg.NATS)
		if err != nil {
			t.Fatal(err)
		}
		nc, err := bus.Connect(url, "tenants-test-"+user, append(base, opts...)...)
		if err != nil {
			t.Fatalf("connect as %s: %v", user, err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
}

// The shipped tenants.conf is what natsagent renders for tenants acme and
// globex: `natsagent tenant add` can take it over.
func TestTenantsConfIsRendered(t *testing.T) {
	want, err := tenancy.RenderStatic(tenancy.StaticConfig{Prefix: "agent", Tenants: []tenancy.StaticTenant{{Name: "acme"}, {Name: "globex"}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := read(t, tenantsConf); !bytes.Equal(got, want) {
		t.Fatalf("deploy/nats/tenants.conf differs from the rendered layout; regenerate it:\n  natsagent tenant add acme --conf deploy/nats/tenants.conf && natsagent tenant add globex --conf deploy/nats/tenants.conf")
	}
}

// TestTenantIsolation runs the attacker suite against a real nats-server
// with the shipped tenants.conf (static accounts).
func TestTenantIsolation(t *testing.T) {
	url := startTenantsServer(t).ClientURL()
	runAttackerSuite(t, attackDeployment{URL: url, Connect: passwordConnect(url), Account: func(tenant string) string { return tenant }})
}

// With tenant accounts the streams are the service account's: KEDA's
// query finds the workers' consumer and its lag under AGENT (tenants.conf,
// the ScaledObject's account, as the shipped Helm values include it) or
// AGENT's public key (JWT mode), and nothing under $G, the account of a
// server without accounts (docs/operations.md, Deploy).
func TestScalerAccountWithTenantAccounts(t *testing.T) {
	trig := loadScaledObject(t).Spec.Triggers[0].Metadata
	if trig["account"] != natsjwt.ServiceAccount {
		t.Fatalf("the ScaledObject reads account %s; tenants.conf's streams are in %s", trig["account"], natsjwt.ServiceAccount)
	}
	static := startTenantsServer(t)
	jd := newJWTDeployment(t)
	agent, err := jd.store.Account(natsjwt.ServiceAccount)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, account string
		srv           *server.Server
		d             attackDeployment
	}{
		{"tenants.conf", natsjwt.ServiceAccount, static, attackDeployment{Connect: passwordConnect(static.ClientURL())}},
		{"JWT mode", agent.Subject, jd.srv, jd.attack()},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			settings := bus.Settings{}.WithDefaults()
			js, err := jetstream.New(c.d.Connect(t, "worker"))
			if err != nil {
				t.Fatal(err)
			}
			if err := bus.Provision(ctx, js, settings); err != nil {
				t.Fatal(err)
			}
			if _, err := js.Publish(ctx, settings.Names.RunSubject("acme", "lag"), []byte(`{}`)); err != nil {
				t.Fatal(err)
			}
			addr := c.srv.MonitorAddr().String()
			testdeploy.WaitFor(t, 10*time.Second, "/jsz to report a lag of 1 under "+c.account, func() bool {
				jsz, err := fetchJsz(addr, c.account)
				if err != nil {
					t.Fatal(err)
				}
				cons := jsz.consumer(c.account, trig["stream"], trig["consumer"])
				return cons != nil && cons.NumPending+cons.NumAckPending == 1
			})
			jsz, err := fetchJsz(addr, server.DEFAULT_GLOBAL_ACCOUNT)
			if err != nil {
				t.Fatal(err)
			}
			if cons := jsz.consumer(server.DEFAULT_GLOBAL_ACCOUNT, trig["stream"], trig["consumer"]); cons != nil {
				t.Fatalf("/jsz reports the consumer under %s too: %+v", server.DEFAULT_GLOBAL_ACCOUNT, cons)
			}
		})
	}
}
