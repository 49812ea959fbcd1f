// Package natsjwttest starts, for tests, a real nats-server that trusts a
// natsjwt store: the configuration fragment the store renders, included
// in a server config file and read by server.ProcessConfigFile as
// nats-server reads it, on a random loopback port with JetStream in a
// temp dir.
package natsjwttest

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/natsagent/natsagent/internal/natsjwt"
)

// StartServer runs a server trusting store, with monitoring on another
// loopback port, until the test ends. With
// full, its resolver is full (a temp dir; tenants must be pushed);
// otherwise MEMORY with every account preloaded.
func StartServer(t testing.TB, store *natsjwt.Store, full bool) *server.Server {
	t.Helper()
	dir := t.TempDir()
	resolverDir := ""
	if full {
		resolverDir = filepath.Join(dir, "jwt")
	}
	fragment, err := store.ServerConfig(resolverDir)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "natsjwt.conf"), []byte(fragment), 0o600); err != nil {
		t.Fatal(err)
	}
	main := filepath.Join(dir, "server.conf")
	conf := "jetstream {store_dir: \"" + filepath.Join(dir, "js") + "\"}\ninclude natsjwt.conf\n"
	if err := os.WriteFile(main, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(main)
	if err != nil {
		t.Fatalf("server config from natsjwt: %v\n%s", err, fragment)
	}
	opts.Host, opts.Port = "127.0.0.1", -1
	opts.HTTPHost, opts.HTTPPort = "127.0.0.1", -1
	opts.NoLog, opts.NoSigs = true, true
	s, err := server.NewServer(opts)
	configs.Store(s, main)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server trusting the natsjwt operator is not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}

// Connect connects to url as account's user with its creds file from
// store; the connection is closed when the test ends.
func Connect(t testing.TB, url string, store *natsjwt.Store, account, user string, opts ...nats.Option) (*nats.Conn, error) {
	t.Helper()
	opts = append([]nats.Option{nats.UserCredentials(store.CredsPath(account, user)), nats.Name("natsjwttest-" + account + "-" + user)}, opts...)
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, err
	}
	t.Cleanup(nc.Close)
	return nc, nil
}

// configs maps a server StartServer started to its config file.
var configs sync.Map

// Reload renders store's server configuration again (MEMORY resolver:
// every account preloaded) into srv's config and reloads srv, as
// `nats-server --signal reload` does after an operator rendered the
// fragment again.
func Reload(t testing.TB, srv *server.Server, store *natsjwt.Store) {
	t.Helper()
	v, ok := configs.Load(srv)
	if !ok {
		t.Fatal("natsjwttest.Reload: the server was not started by StartServer")
	}
	main := v.(string)
	fragment, err := store.ServerConfig("")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(filepath.Dir(main), "natsjwt.conf"), []byte(fragment), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(main)
	if err != nil {
		t.Fatal(err)
	}
	opts.Host, opts.Port = "127.0.0.1", srv.Addr().(*net.TCPAddr).Port
	opts.HTTPHost, opts.HTTPPort = "127.0.0.1", -1 // as started (the server keeps -1 in its options)
	opts.NoLog, opts.NoSigs = true, true
	if err := srv.ReloadOptions(opts); err != nil {
		t.Fatalf("reload with the rendered config: %v", err)
	}
}

// StartCluster runs n clustered servers trusting store, each with its
// own full resolver directory, on loopback, until the test ends.
func StartCluster(t testing.TB, store *natsjwt.Store, n int) []*server.Server {
	t.Helper()
	ports := make([]int, n)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ports[i] = l.Addr().(*net.TCPAddr).Port
		l.Close()
	}
	var routes []string
	for _, p := range ports {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", p))
	}
	servers := make([]*server.Server, n)
	for i := range servers {
		dir := t.TempDir()
		fragment, err := store.ServerConfig(filepath.Join(dir, "jwt"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "natsjwt.conf"), []byte(fragment), 0o600); err != nil {
			t.Fatal(err)
		}
		main := filepath.Join(dir, "server.conf")
		conf := fmt.Sprintf("server_name: n%d\njetstream {store_dir: %q}\ncluster {name: natsjwt, listen: \"127.0.0.1:%d\", routes: [%s]}\ninclude natsjwt.conf\n",
			i+1, filepath.Join(dir, "js"), ports[i], strings.Join(routes, ", "))
		if err := os.WriteFile(main, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		opts, err := server.ProcessConfigFile(main)
		if err != nil {
			t.Fatalf("cluster node config: %v", err)
		}
		opts.Host, opts.Port = "127.0.0.1", -1
		opts.NoLog, opts.NoSigs = true, true
		s, err := server.NewServer(opts)
		if err != nil {
			t.Fatal(err)
		}
		go s.Start()
		t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
		servers[i] = s
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, s := range servers {
		if !s.ReadyForConnections(time.Until(deadline)) {
			t.Fatal("a cluster node trusting the natsjwt operator is not ready")
		}
		for s.NumRoutes() < n-1 {
			if time.Now().After(deadline) {
				t.Fatalf("node %s has %d routes, want %d", s.Name(), s.NumRoutes(), n-1)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return servers
}
