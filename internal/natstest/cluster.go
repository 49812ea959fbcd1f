package natstest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/natsagent/natsagent/internal/bus"
)

// Cluster is an in-process JetStream cluster on loopback owned by a test:
// bus.Cluster with its errors turned into test failures. It stops when the
// test ends.
type Cluster struct {
	*bus.Cluster
	t testing.TB
}

// StartCluster runs n clustered JetStream servers (n1, n2, ...) and waits
// until JetStream has a meta leader that sees all of them.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	return StartClusterWith(t, bus.ClusterConfig{Nodes: n, Name: "natsagent-test"})
}

// StartClusterWith runs a cluster configured by cfg; an empty cfg.Dir is a
// temp dir of the test.
func StartClusterWith(t testing.TB, cfg bus.ClusterConfig) *Cluster {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := bus.StartCluster(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return &Cluster{Cluster: c, t: t}
}

// URLs is the comma-separated client URL list of every node, the form
// nats.Connect and natsagent's nats.url take.
func (c *Cluster) URLs() string { return strings.Join(c.ClientURLs(), ",") }

// Connect dials the cluster the way natsagent's binaries do (bus.Connect:
// endless reconnects); the connection closes when the test ends.
func (c *Cluster) Connect(opts ...nats.Option) *nats.Conn {
	c.t.Helper()
	nc, err := bus.Connect(c.URLs(), "natstest", opts...)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(nc.Close)
	return nc
}

// Shutdown stops a node abruptly; its store stays for Restart.
func (c *Cluster) Shutdown(name string) {
	c.t.Helper()
	if err := c.Cluster.Shutdown(name); err != nil {
		c.t.Fatal(err)
	}
}

// Restart starts a stopped node again on its ports and store.
func (c *Cluster) Restart(name string) *server.Server {
	c.t.Helper()
	s, err := c.Cluster.Restart(name)
	if err != nil {
		c.t.Fatal(err)
	}
	return s
}

// WaitReady waits up to 30s for a meta leader that sees every running node.
func (c *Cluster) WaitReady() {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Cluster.WaitReady(ctx); err != nil {
		c.t.Fatal(err)
	}
}
