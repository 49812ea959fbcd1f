package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/natsagent/natsagent/internal/app"
	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/tenancy"
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
	url := startTenantsServer(t)
	runAttackerSuite(t, attackDeployment{URL: url, Connect: passwordConnect(url)})
}

// natsUser is a connection of one of the deployment's users that records
// the server's asynchronous errors (permission violations).
type natsUser struct {
	t    *testing.T
	name string
	nc   *nats.Conn
	errs chan error
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

var _ = context.Background
