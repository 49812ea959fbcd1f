// Package natstest starts real NATS servers for tests: one embedded
// JetStream server in a temp dir on a random loopback port, or a 3-node
// cluster on loopback. Tests in natsagent never mock NATS.
package natstest

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
)

// Server is one embedded JetStream server owned by a test.
type Server struct {
	t      testing.TB
	Server *server.Server
}

// Start runs a JetStream server with a temp store dir, listening on a
// random loopback port; it shuts down when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	e, err := bus.StartEmbedded(bus.EmbeddedConfig{StoreDir: t.TempDir(), Listen: "127.0.0.1:-1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Shutdown)
	return &Server{t: t, Server: e.Server}
}

// URL is the server's client URL.
func (s *Server) URL() string { return s.Server.ClientURL() }

// Connect opens a TCP connection closed at the end of the test.
func (s *Server) Connect() *nats.Conn {
	s.t.Helper()
	nc, err := nats.Connect(s.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(nc.Close)
	return nc
}

// Provision creates natsagent's assets with test-friendly settings merged
// over s (zero fields of settings keep their defaults).
func Provision(t testing.TB, nc *nats.Conn, settings bus.Settings) {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := bus.Provision(ctx, js, settings); err != nil {
		t.Fatal(err)
	}
}

// Cluster is an in-process JetStream cluster on loopback.
type Cluster struct {
	t       testing.TB
	Servers []*server.Server
	opts    []*server.Options
}

// StartCluster runs n clustered JetStream servers and waits for a meta
// leader. Cluster ports are allocated up front because a clustered
// JetStream server refuses to start without its routes.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	ports := make([]int, n)
	var routes []*url.URL
	for i := range ports {
		ports[i] = freePort(t)
		routes = append(routes, &url.URL{Scheme: "nats-route", Host: fmt.Sprintf("127.0.0.1:%d", ports[i])})
	}
	c := &Cluster{t: t}
	for i := 0; i < n; i++ {
		o := &server.Options{
			ServerName: fmt.Sprintf("n%d", i+1),
			Host:       "127.0.0.1",
			Port:       -1,
			JetStream:  true,
			StoreDir:   t.TempDir(),
			NoLog:      true,
			NoSigs:     true,
			Cluster:    server.ClusterOpts{Name: "natsagent-test", Host: "127.0.0.1", Port: ports[i]},
			Routes:     routes,
		}
		s, err := server.NewServer(o)
		if err != nil {
			t.Fatal(err)
		}
		go s.Start()
		if !s.ReadyForConnections(15 * time.Second) {
			t.Fatalf("cluster node %d not ready", i+1)
		}
		c.Servers = append(c.Servers, s)
		c.opts = append(c.opts, o)
	}
	t.Cleanup(func() {
		for _, s := range c.Servers {
			s.Shutdown()
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if c.Leader() != nil {
			return c
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("cluster formed no JetStream meta leader in 30s")
	return nil
}

// Leader returns the current meta leader, or nil.
func (c *Cluster) Leader() *server.Server {
	for _, s := range c.Servers {
		if s.Running() && s.JetStreamIsLeader() && len(s.JetStreamClusterPeers()) == len(c.Servers) {
			return s
		}
	}
	return nil
}

// URLs is the comma-separated client URL list of the running nodes.
func (c *Cluster) URLs() string {
	var urls []string
	for _, s := range c.Servers {
		if s.Running() {
			urls = append(urls, s.ClientURL())
		}
	}
	return strings.Join(urls, ",")
}

// Connect dials the cluster with endless reconnects.
func (c *Cluster) Connect() *nats.Conn {
	c.t.Helper()
	nc, err := nats.Connect(c.URLs(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(nc.Close)
	return nc
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
