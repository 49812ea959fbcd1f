package deploy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/natsagent/natsagent/internal/app"
	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/gateway"
	"github.com/natsagent/natsagent/internal/natsjwt"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/testdeploy"
	"github.com/natsagent/natsagent/internal/worker"
)

// natsNodes are the compose cluster's nodes: the compose service names,
// which are also the nodes' server names and their route host names.
var natsNodes = []string{"nats-1", "nats-2", "nats-3"}

// natsPasswords are the passwords of tenants.conf's users for the tests
// of the node configs, by user: made once per test binary as the compose
// header says (openssl rand -hex 32), so some begin with a digit, as real
// ones do.
var natsPasswords = sync.OnceValue(func() map[string]string {
	pw := map[string]string{}
	for user := range tenantsPasswords {
		b := make([]byte, 32)
		_, _ = rand.Read(b)
		pw[user] = hex.EncodeToString(b)
	}
	// A hex password that begins with a digit must still be a string to
	// nats-server, which parses environment values as config values.
	pw["worker"] = "0123456789" + pw["worker"][10:]
	return pw
})

// setNATSPasswords puts the users' passwords in the environment, where
// tenants.conf reads them (compose.yaml passes them to the servers).
func setNATSPasswords(t *testing.T) map[string]string {
	t.Helper()
	for user, env := range tenantsPasswords {
		t.Setenv(env, natsPasswords()[user])
	}
	return natsPasswords()
}

// loadNATSConf parses one node's server config with nats-server's own
// parser, with the included tenants.conf and the users' passwords in the
// environment: a typo in a key or a bad value fails here as it would at
// start.
func loadNATSConf(t *testing.T, node string) *server.Options {
	t.Helper()
	setNATSPasswords(t)
	o, err := server.ProcessConfigFile(filepath.Join(natsConfDir, node+".conf"))
	if err != nil {
		t.Fatalf("%s.conf: %v", node, err)
	}
	return o
}

func TestNATSConfigsFormOneCluster(t *testing.T) {
	var first *server.Options
	for _, node := range natsNodes {
		o := loadNATSConf(t, node)
		if o.ServerName != node {
			t.Errorf("%s.conf: server_name %q, want the compose service name %q", node, o.ServerName, node)
		}
		if !o.JetStream {
			t.Errorf("%s.conf: JetStream is off", node)
		}
		if o.StoreDir == "" || o.JetStreamMaxStore <= 0 {
			t.Errorf("%s.conf: JetStream needs a store_dir and a max_file_store (got %q, %d)", node, o.StoreDir, o.JetStreamMaxStore)
		}
		if o.HTTPPort <= 0 {
			t.Errorf("%s.conf: no monitoring port: the healthcheck and the lag need it", node)
		}
		if o.Cluster.Name == "" || o.Cluster.Port <= 0 {
			t.Errorf("%s.conf: cluster needs a name and a port (got %q, %d)", node, o.Cluster.Name, o.Cluster.Port)
		}
		// Each node routes to the two others, at their cluster port.
		var got []string
		for _, r := range o.Routes {
			got = append(got, r.Host)
		}
		var want []string
		for _, other := range natsNodes {
			if other != node {
				want = append(want, fmt.Sprintf("%s:%d", other, o.Cluster.Port))
			}
		}
		if !sameSet(got, want) {
			t.Errorf("%s.conf: routes %v, want %v", node, got, want)
		}
		// Auth is on: the accounts and users of tenants.conf, with the
		// passwords of the environment.
		if got := accountNames(o); !sameSet(got, []string{natsjwt.ServiceAccount, "acme", "globex"}) {
			t.Errorf("%s.conf: accounts %v, want tenants.conf's AGENT, acme and globex (include tenants.conf)", node, got)
		}
		for user, want := range natsPasswords() {
			if acc, pw := userOf(o, user); pw != want || acc != userAccounts[user] {
				t.Errorf("%s.conf: user %s in account %q with password %q, want its password from %s", node, user, acc, pw, tenantsPasswords[user])
			}
		}
		if o.NoAuthUser != "" {
			t.Errorf("%s.conf: no_auth_user %s lets clients in without credentials", node, o.NoAuthUser)
		}
		if first == nil {
			first = o
			continue
		}
		// The nodes differ only in name and routes.
		if o.Cluster.Name != first.Cluster.Name || o.Cluster.Port != first.Cluster.Port || o.Port != first.Port ||
			o.HTTPPort != first.HTTPPort || o.StoreDir != first.StoreDir ||
			o.JetStreamMaxStore != first.JetStreamMaxStore || o.JetStreamMaxMemory != first.JetStreamMaxMemory ||
			!slices.Equal(accountNames(o), accountNames(first)) {
			t.Errorf("%s.conf differs from %s.conf beyond server_name and routes", node, first.ServerName)
		}
	}
}

// An unset password stops a node at start, naming the variable: no node
// runs with an account whose user has no password.
func TestNATSConfigsRequireThePasswords(t *testing.T) {
	for _, env := range tenantsPasswords {
		setNATSPasswords(t)
		if err := os.Unsetenv(env); err != nil {
			t.Fatal(err)
		}
		for _, node := range natsNodes {
			_, err := server.ProcessConfigFile(filepath.Join(natsConfDir, node+".conf"))
			if err == nil || !strings.Contains(err.Error(), env) {
				t.Errorf("%s.conf without %s: %v, want an error naming the variable", node, env, err)
			}
		}
	}
}

// userAccounts are the accounts of tenants.conf's users.
var userAccounts = map[string]string{"gateway": natsjwt.ServiceAccount, "worker": natsjwt.ServiceAccount, "acme": "acme", "globex": "globex"}

// accountNames are the accounts a server config defines, sorted.
func accountNames(o *server.Options) []string {
	var names []string
	for _, a := range o.Accounts {
		names = append(names, a.Name)
	}
	slices.Sort(names)
	return names
}

// userOf returns a configured user's account and password.
func userOf(o *server.Options, name string) (account, password string) {
	for _, u := range o.Users {
		if u.Username == name {
			if u.Account != nil {
				account = u.Account.Name
			}
			return account, u.Password
		}
	}
	return "", ""
}

// TestComposeClusterRunsNatsagent starts the compose cluster's three nodes
// in process, from their config files with tenants.conf and the users'
// passwords in the environment (only addresses move to loopback and the
// stores to a temp dir). natsagent connects as compose.yaml says: the
// gateway and worker services' NATS_USER and NATS_PASSWORD, read by the
// binaries' configuration loader over deploy/natsagent.yaml. As the worker
// user it provisions with replicas 3 as the compose and Kubernetes
// configurations say and reads the workers' lag from the monitoring
// endpoint the way KEDA's nats-jetstream scaler does, with the
// ScaledObject's account, stream and consumer. Then two workers and a
// gateway run runs: one over HTTP, one queued before they started, and one
// that tenant acme submits through its import, whose events it receives;
// acme cannot reach the JetStream API.
func TestComposeClusterRunsNatsagent(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	passwords := setNATSPasswords(t)
	c := natstest.StartClusterWith(t, bus.ClusterConfig{Nodes: len(natsNodes), Monitor: true,
		NodeOptions: func(i int) (*server.Options, error) { return loadNATSConf(t, natsNodes[i]), nil }})
	servers := c.Servers()
	urls := c.URLs()

	// Without credentials, or with another user's password, the cluster
	// refuses the connection.
	if nc, err := nats.Connect(urls, nats.NoReconnect()); err == nil {
		nc.Close()
		t.Fatal("the cluster accepted a client without credentials")
	}
	if nc, err := nats.Connect(urls, nats.UserInfo("worker", passwords["gateway"]), nats.NoReconnect()); err == nil {
		nc.Close()
		t.Fatal("the cluster accepted worker with the gateway's password")
	}

	project := loadCompose(t, composeEnv(passwords))
	workerCfg := composeServiceConfig(t, service(t, project, "worker"), urls)
	gatewayCfg := composeServiceConfig(t, service(t, project, "gateway"), urls)
	if workerCfg.NATS.User != "worker" || gatewayCfg.NATS.User != "gateway" {
		t.Fatalf("compose connects as %q and %q, want worker and gateway", workerCfg.NATS.User, gatewayCfg.NATS.User)
	}
	nc, err := app.Connect(workerCfg, "compose-test-worker")
	if err != nil {
		t.Fatalf("connect as compose's worker: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	composeSettings := settingsOf(t, workerCfg)
	k8sSettings := settingsOf(t, loadConfigMapConfig(t))
	for _, s := range []bus.Settings{composeSettings, k8sSettings} {
		if err := bus.Provision(ctx, js, s); err != nil {
			t.Fatalf("provision with replicas %d as the worker user: %v", s.Replicas, err)
		}
	}
	stream, err := js.Stream(ctx, composeSettings.Names.RunsStream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
		t.Fatalf("runs stream: %d replicas configured, cluster %+v: want R3 on three nodes", info.Config.Replicas, info.Cluster)
	}
	kv, err := js.KeyValue(ctx, composeSettings.Names.ThreadsBucket())
	if err != nil {
		t.Fatal(err)
	}
	if st, err := kv.Status(ctx); err != nil || st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config.Replicas != 3 {
		t.Fatalf("threads bucket is not R3: %v", err)
	}

	// Acme watches its live events through its import.
	d := attackDeployment{URL: urls, Connect: clusterConnect(urls, passwords)}
	acme := d.user(t, "acme")
	acmeEvents, err := acme.nc.SubscribeSync("agent.events.acme.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := acme.nc.Flush(); err != nil {
		t.Fatal(err)
	}

	// One run waits in the queue, no worker runs yet: KEDA's lag must say
	// 1 under the ScaledObject's account.
	so := loadScaledObject(t)
	trig := so.Spec.Triggers[0].Metadata
	if _, err := js.Publish(ctx, k8sSettings.Names.RunSubject("acme", "lag"), runReq("queued", "lag", "acme", "hi"), jetstream.WithMsgID("acme.queued")); err != nil {
		t.Fatal(err)
	}
	testdeploy.WaitFor(t, 10*time.Second, "the consumer leader's /jsz to report a lag of 1 under account "+trig["account"], func() bool {
		leaders := 0
		for _, s := range servers {
			jsz, err := fetchJsz(s.MonitorAddr().String(), trig["account"])
			if err != nil {
				t.Logf("%s: %v", s.Name(), err)
				return false
			}
			if jsz.MetaCluster.ClusterSize != len(servers) {
				return false
			}
			c := jsz.consumer(trig["account"], trig["stream"], trig["consumer"])
			if c == nil || c.Cluster.Leader != s.Name() {
				continue
			}
			leaders++
			if c.NumPending+c.NumAckPending != 1 {
				return false
			}
		}
		return leaders == 1
	})

	// Two workers and a gateway, connected as compose connects them.
	for i := range 2 {
		startComposeWorker(t, workerCfg, fmt.Sprintf("compose-test-worker-%d", i+1))
	}
	gwConn, err := app.Connect(gatewayCfg, "compose-test-gateway")
	if err != nil {
		t.Fatalf("connect as compose's gateway: %v", err)
	}
	t.Cleanup(gwConn.Close)
	gw, err := gateway.New(ctx, gwConn, gateway.Config{Settings: settingsOf(t, gatewayCfg), Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatalf("gateway as the gateway user: %v", err)
	}
	api := httptest.NewServer(gw.Handler())
	t.Cleanup(api.Close)

	if fin := finishedOn(t, acmeEvents, "acme", "queued"); fin.Status != protocol.StatusSuccess {
		t.Fatalf("the queued run ended %s: %s", fin.Status, fin.Error)
	}
	// Over HTTP, as tenant globex (the gateway has no API keys here).
	req, _ := http.NewRequestWithContext(ctx, "POST", api.URL+"/threads/web/runs/wait?format=natsagent",
		strings.NewReader(`{"run_id":"web","input":{"messages":[{"role":"user","content":"hi"}]}}`))
	req.Header.Set("X-Tenant", "globex")
	resp, err := api.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var rec protocol.Run
	err = json.NewDecoder(resp.Body).Decode(&rec)
	_ = resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || rec.Status != protocol.StatusSuccess {
		t.Fatalf("run through the gateway: %d %+v %v", resp.StatusCode, rec, err)
	}

	// Acme submits through its import with the JetStream client and gets
	// the stream's ack, then its run's events.
	ajs, err := jetstream.New(acme.nc)
	if err != nil {
		t.Fatal(err)
	}
	ack, err := ajs.Publish(ctx, "agent.runs.acme.t1", runReq("a1", "t1", "acme", "hi"), jetstream.WithMsgID("acme.a1"))
	if err != nil || ack.Stream != composeSettings.Names.RunsStream() {
		t.Fatalf("acme's submission through its import: %+v, %v", ack, err)
	}
	if fin := finishedOn(t, acmeEvents, "acme", "a1"); fin.Status != protocol.StatusSuccess {
		t.Fatalf("acme's run ended %s: %s", fin.Status, fin.Error)
	}
	// The JetStream API is the service account's alone.
	acme.publishDenied("$JS.API.INFO", nil)
	// No answer comes: the server drops the request.
	short, cancelShort := context.WithTimeout(ctx, 2*time.Second)
	defer cancelShort()
	if _, err := ajs.Stream(short, composeSettings.Names.RunsStream()); err == nil {
		t.Fatal("acme opened the runs stream")
	}
	acme.denied("publish", "$JS.API.STREAM.INFO."+composeSettings.Names.RunsStream())
}

// composeEnv is the environment of `docker compose` with the four NATS
// passwords set.
func composeEnv(passwords map[string]string) []string {
	var env []string
	for user, name := range tenantsPasswords {
		env = append(env, name+"="+passwords[user])
	}
	return env
}

// composeServiceConfig loads deploy/natsagent.yaml as a compose service's
// process does: with the service's NATS_USER and NATS_PASSWORD in the
// environment (internal/config reads them over the file), and the test
// cluster's URLs in place of the compose host names.
func composeServiceConfig(t *testing.T, s types.ServiceConfig, urls string) config.Config {
	t.Helper()
	for _, k := range []string{config.EnvNATSUser, config.EnvNATSPassword} {
		v := s.Environment[k]
		if v == nil || *v == "" {
			t.Fatalf("%s: %s is not set", s.Name, k)
		}
		t.Setenv(k, *v)
	}
	cfg := loadConfig(t, composeConfig)
	for _, k := range []string{config.EnvNATSUser, config.EnvNATSPassword} {
		t.Setenv(k, "")
	}
	cfg.NATS.URL = urls
	return cfg
}

// clusterConnect connects as one of tenants.conf's users with its password
// of the environment, by app.NATSOptions (the binaries' code path).
func clusterConnect(urls string, passwords map[string]string) func(t *testing.T, user string, opts ...nats.Option) *nats.Conn {
	return func(t *testing.T, user string, opts ...nats.Option) *nats.Conn {
		t.Helper()
		cfg := config.Default()
		cfg.NATS.URL, cfg.NATS.User, cfg.NATS.Password = urls, user, config.Secret(passwords[user])
		base, err := app.NATSOptions(cfg.NATS)
		if err != nil {
			t.Fatal(err)
		}
		nc, err := bus.Connect(urls, "compose-test-"+user, append(base, opts...)...)
		if err != nil {
			t.Fatalf("connect as %s: %v", user, err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
}

// startComposeWorker runs a worker as cmd/worker does with cfg (its model,
// agents and submit service), stopped when the test ends.
func startComposeWorker(t *testing.T, cfg config.Config, name string) {
	t.Helper()
	ctx := context.Background()
	nc, err := app.Connect(cfg, name)
	if err != nil {
		t.Fatalf("connect as compose's worker: %v", err)
	}
	t.Cleanup(nc.Close)
	m, _, err := app.Model(cfg)
	if err != nil {
		t.Fatal(err)
	}
	agents, err := app.Agents(cfg, m)
	if err != nil {
		t.Fatal(err)
	}
	hooks, err := app.SubmitHooks(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(ctx, nc, worker.Config{Settings: settingsOf(t, cfg), ID: name, Concurrency: cfg.Worker.Concurrency,
		Agents: agents, Submit: hooks, Logger: zaptest.NewLogger(t), ShutdownGrace: 5 * time.Second})
	if err != nil {
		t.Fatalf("worker as the worker user: %v", err)
	}
	runWorker(t, ctx, w)
}

// jsz is the part of the monitoring endpoint's /jsz answer that KEDA's
// nats-jetstream scaler reads.
type jsz struct {
	Accounts    []jszAccount `json:"account_details"`
	MetaCluster struct {
		ClusterSize int `json:"cluster_size"`
	} `json:"meta_cluster"`
}

type jszAccount struct {
	Name    string      `json:"name"`
	Streams []jszStream `json:"stream_detail"`
}

type jszStream struct {
	Name      string        `json:"name"`
	Consumers []jszConsumer `json:"consumer_detail"`
}

type jszConsumer struct {
	Name          string `json:"name"`
	NumPending    int    `json:"num_pending"`
	NumAckPending int    `json:"num_ack_pending"`
	Cluster       struct {
		Leader string `json:"leader"`
	} `json:"cluster"`
}

func (j *jsz) consumer(account, stream, consumer string) *jszConsumer {
	for _, a := range j.Accounts {
		if a.Name != account {
			continue
		}
		for _, s := range a.Streams {
			if s.Name != stream {
				continue
			}
			for i := range s.Consumers {
				if s.Consumers[i].Name == consumer {
					return &s.Consumers[i]
				}
			}
		}
	}
	return nil
}

// fetchJsz asks a node's monitoring endpoint with the scaler's query.
func fetchJsz(addr, account string) (*jsz, error) {
	resp, err := http.Get(fmt.Sprintf("http://%s/jsz?acc=%s&consumers=true&config=true", addr, account))
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/jsz: %s", resp.Status)
	}
	var j jsz
	if err := json.NewDecoder(resp.Body).Decode(&j); err != nil {
		return nil, err
	}
	return &j, nil
}
