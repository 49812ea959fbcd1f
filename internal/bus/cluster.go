package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// ClusterConfig configures an in-process JetStream cluster on loopback,
// for tests and the soak command: the same servers a deployment runs, each
// on its own client and route ports, so node loss is real (its
// connections drop, its Raft groups elect new leaders).
type ClusterConfig struct {
	// Dir holds one store directory per node (required).
	Dir string
	// Nodes is the number of servers (default 3).
	Nodes int
	// Name is the cluster's name (default "natsagent"; a name from
	// NodeOptions wins).
	Name string
	// NodeOptions, when set, returns the base options of node i (for
	// example parsed from a deployment's config file); listen addresses,
	// routes, the store directory and signal handling are set over them.
	NodeOptions func(i int) (*server.Options, error)
	// Monitor gives every node an HTTP monitoring port on loopback.
	Monitor bool
	// Logger receives the servers' logs (default: none).
	Logger server.Logger
}

// Cluster is a running in-process JetStream cluster. Every node keeps its
// ports and store across Shutdown and Restart, so clients configured with
// ClientURLs find a restarted node where it was.
type Cluster struct {
	cfg   ClusterConfig
	mu    sync.Mutex
	nodes []*clusterNode
}

type clusterNode struct {
	name string
	url  string
	opts *server.Options // kept for restarts; each start uses a clone
	srv  *server.Server  // nil while the node is down
}

// errNodeNotReady: a node's server did not take connections in time,
// usually because one of its ports was taken.
var errNodeNotReady = errors.New("not ready")

// nodeReadyWait bounds a node's start; a variable for tests.
var nodeReadyWait = 15 * time.Second

// StartCluster starts the nodes and waits until JetStream has a meta
// leader that sees every node. Route and client ports are chosen up front:
// a clustered JetStream server refuses to start without its routes, and a
// restarted node must come back on the same addresses. A port can be
// taken by another process between its choice and its node's start (on a
// test machine that starts many servers at once); a node that does not
// come up then has the cluster started again on new ports, up to three
// times.
func StartCluster(ctx context.Context, cfg ClusterConfig) (*Cluster, error) {
	if cfg.Dir == "" {
		return nil, errors.New("cluster: a directory for the nodes' stores is required")
	}
	if cfg.Nodes <= 0 {
		cfg.Nodes = 3
	}
	if cfg.Name == "" {
		cfg.Name = "natsagent"
	}
	for attempt := 1; ; attempt++ {
		c, err := startCluster(ctx, cfg)
		if err == nil || !errors.Is(err, errNodeNotReady) || attempt == 3 || ctx.Err() != nil {
			return c, err
		}
	}
}

// startCluster is one attempt of StartCluster, on ports chosen for it.
func startCluster(ctx context.Context, cfg ClusterConfig) (*Cluster, error) {
	c := &Cluster{cfg: cfg}
	routes := make([]*url.URL, cfg.Nodes)
	clusterPorts := make([]int, cfg.Nodes)
	for i := range cfg.Nodes {
		p, err := freePort()
		if err != nil {
			return nil, err
		}
		clusterPorts[i] = p
		routes[i] = &url.URL{Scheme: "nats-route", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(p))}
	}
	for i := range cfg.Nodes {
		o := &server.Options{}
		if cfg.NodeOptions != nil {
			base, err := cfg.NodeOptions(i)
			if err != nil {
				return nil, fmt.Errorf("cluster node %d: %w", i+1, err)
			}
			o = base.Clone()
		}
		if o.ServerName == "" {
			o.ServerName = fmt.Sprintf("n%d", i+1)
		}
		clientPort, err := freePort()
		if err != nil {
			return nil, err
		}
		o.Host, o.Port = "127.0.0.1", clientPort
		o.JetStream = true
		o.StoreDir = filepath.Join(cfg.Dir, o.ServerName)
		o.NoSigs = true
		o.NoLog = cfg.Logger == nil
		if o.Cluster.Name == "" {
			o.Cluster.Name = cfg.Name
		}
		o.Cluster.Host, o.Cluster.Port = "127.0.0.1", clusterPorts[i]
		o.Routes = routes
		o.HTTPHost, o.HTTPPort = "", 0
		if cfg.Monitor {
			if o.HTTPPort, err = freePort(); err != nil {
				return nil, err
			}
			o.HTTPHost = "127.0.0.1"
		}
		if err := os.MkdirAll(o.StoreDir, 0o700); err != nil {
			return nil, err
		}
		c.nodes = append(c.nodes, &clusterNode{name: o.ServerName, url: fmt.Sprintf("nats://127.0.0.1:%d", clientPort), opts: o})
	}
	for _, n := range c.nodes {
		if err := c.start(n); err != nil {
			c.Close()
			return nil, err
		}
	}
	if err := c.WaitReady(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) start(n *clusterNode) error {
	s, err := server.NewServer(n.opts.Clone())
	if err != nil {
		return fmt.Errorf("cluster node %s: %w", n.name, err)
	}
	if c.cfg.Logger != nil {
		s.SetLogger(c.cfg.Logger, false, false)
	}
	go s.Start()
	if !s.ReadyForConnections(nodeReadyWait) {
		s.Shutdown()
		return fmt.Errorf("cluster node %s: %w after %s (is %s taken?)", n.name, errNodeNotReady, nodeReadyWait, n.url)
	}
	c.mu.Lock()
	n.srv = s
	c.mu.Unlock()
	return nil
}

// Names returns the nodes' server names, in order.
func (c *Cluster) Names() []string {
	out := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = n.name
	}
	return out
}

// Servers returns the running servers, in node order.
func (c *Cluster) Servers() []*server.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*server.Server
	for _, n := range c.nodes {
		if n.srv != nil {
			out = append(out, n.srv)
		}
	}
	return out
}

// Server returns the running server of a node, or nil while it is down.
func (c *Cluster) Server(name string) *server.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.nodes {
		if n.name == name {
			return n.srv
		}
	}
	return nil
}

// ClientURLs returns every node's client URL, running or not: the list a
// deployment configures once, so its clients reconnect to whichever nodes
// are up.
func (c *Cluster) ClientURLs() []string {
	out := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = n.url
	}
	return out
}

// Leader returns the JetStream meta leader, or nil during an election.
func (c *Cluster) Leader() *server.Server {
	for _, s := range c.Servers() {
		if s.Running() && s.JetStreamIsLeader() {
			return s
		}
	}
	return nil
}

// StreamLeader returns the server leading a stream of the global account
// (where every stream lives without configured accounts), or nil.
func (c *Cluster) StreamLeader(stream string) *server.Server {
	return c.StreamLeaderIn(server.DEFAULT_GLOBAL_ACCOUNT, stream)
}

// StreamLeaderIn returns the server leading a stream of an account, or nil.
func (c *Cluster) StreamLeaderIn(account, stream string) *server.Server {
	for _, s := range c.Servers() {
		if s.Running() && s.JetStreamIsStreamLeader(account, stream) {
			return s
		}
	}
	return nil
}

// ConsumerLeader returns the server leading a consumer of the global
// account, or nil.
func (c *Cluster) ConsumerLeader(stream, consumer string) *server.Server {
	for _, s := range c.Servers() {
		if s.Running() && s.JetStreamIsConsumerLeader(server.DEFAULT_GLOBAL_ACCOUNT, stream, consumer) {
			return s
		}
	}
	return nil
}

// MoveStreamLeader makes node to the leader of a stream of the global
// account (a leader stepdown with a preferred placement) and waits until
// it is. A test that must lose the meta leader and a stream's leader at
// once moves one onto the other: with R3, two nodes down is no quorum.
func (c *Cluster) MoveStreamLeader(ctx context.Context, stream, to string) error {
	return c.moveLeader(ctx, "$JS.API.STREAM.LEADER.STEPDOWN."+stream, to, func() *server.Server { return c.StreamLeader(stream) })
}

// MoveConsumerLeader makes node to the leader of a consumer of the global
// account and waits until it is.
func (c *Cluster) MoveConsumerLeader(ctx context.Context, stream, consumer, to string) error {
	return c.moveLeader(ctx, "$JS.API.CONSUMER.LEADER.STEPDOWN."+stream+"."+consumer, to, func() *server.Server { return c.ConsumerLeader(stream, consumer) })
}

func (c *Cluster) moveLeader(ctx context.Context, subject, to string, leader func() *server.Server) error {
	for {
		cur := leader()
		if cur != nil && cur.Name() == to {
			return nil
		}
		if cur != nil {
			if err := c.stepDown(ctx, cur, subject, to); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: %s did not become leader (%s): %w", to, subject, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// stepDown asks for a leader stepdown with a preferred successor, over an
// in-process connection to s.
func (c *Cluster) stepDown(ctx context.Context, s *server.Server, subject, to string) error {
	nc, err := nats.Connect("", nats.InProcessServer(s))
	if err != nil {
		return err
	}
	defer nc.Close()
	body, _ := json.Marshal(map[string]any{"placement": map[string]string{"preferred": to}})
	reqCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	m, err := nc.RequestWithContext(reqCtx, subject, body)
	if err != nil {
		return nil // an election in progress: look again
	}
	var resp struct {
		Error *struct {
			Description string `json:"description"`
		} `json:"error"`
	}
	if json.Unmarshal(m.Data, &resp) == nil && resp.Error != nil && !strings.Contains(resp.Error.Description, "already leader") {
		return fmt.Errorf("cluster: %s: %s", subject, resp.Error.Description)
	}
	return nil
}

// Shutdown stops a node abruptly (no lame duck: its clients see the
// connection drop) and waits until it is down. Its store stays for Restart.
func (c *Cluster) Shutdown(name string) error {
	c.mu.Lock()
	var s *server.Server
	for _, n := range c.nodes {
		if n.name == name {
			s, n.srv = n.srv, nil
		}
	}
	c.mu.Unlock()
	if s == nil {
		return fmt.Errorf("cluster: no running node %q", name)
	}
	s.Shutdown()
	s.WaitForShutdown()
	return nil
}

// Restart starts a stopped node again, on its ports and store.
func (c *Cluster) Restart(name string) (*server.Server, error) {
	c.mu.Lock()
	var node *clusterNode
	for _, n := range c.nodes {
		if n.name == name {
			node = n
		}
	}
	c.mu.Unlock()
	switch {
	case node == nil:
		return nil, fmt.Errorf("cluster: no node %q", name)
	case node.srv != nil:
		return nil, fmt.Errorf("cluster: node %q is running", name)
	}
	if err := c.start(node); err != nil {
		return nil, err
	}
	return c.Server(name), nil
}

// WaitReady waits until JetStream has a meta leader that counts every
// running node as a peer, and every running node is current with it.
func (c *Cluster) WaitReady(ctx context.Context) error {
	for {
		if c.ready() {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: no JetStream meta leader with every running node as a current peer: %w", ctx.Err())
		case <-time.After(25 * time.Millisecond):
		}
	}
}

func (c *Cluster) ready() bool {
	running := c.Servers()
	leader := c.Leader()
	if leader == nil || len(leader.JetStreamClusterPeers()) < len(running) {
		return false
	}
	for _, s := range running {
		if !s.JetStreamIsCurrent() {
			return false
		}
	}
	return true
}

// Close stops every running node.
func (c *Cluster) Close() {
	for _, s := range c.Servers() {
		s.Shutdown()
		s.WaitForShutdown()
	}
	c.mu.Lock()
	for _, n := range c.nodes {
		n.srv = nil
	}
	c.mu.Unlock()
}

// freePort asks the kernel for a free loopback port. Another process may
// take it before the server binds it (StartCluster then starts again on
// new ports). A variable for tests.
var freePort = func() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("cluster: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
