// Package natstest starts real NATS servers for tests: one embedded
// JetStream server in a temp dir on a random loopback port, or a 3-node
// cluster on loopback. Tests in natsagent never mock NATS.
package natstest

import (
	"context"
	"net"
	"sync/atomic"
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
	return StartWith(t, bus.EmbeddedConfig{})
}

// StartWith is Start with cfg's options (its store dir and listen address
// are the test's).
func StartWith(t testing.TB, cfg bus.EmbeddedConfig) *Server {
	t.Helper()
	cfg.StoreDir, cfg.Listen = t.TempDir(), "127.0.0.1:-1"
	e, err := bus.StartEmbedded(cfg)
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
	return Dial(s.t, s.URL())
}

// Dial connects to url (a server's, or a proxy's in front of it) as
// Connect does: reconnecting forever, 50 ms apart, closed at the end of
// the test.
func Dial(t testing.TB, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
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

// RefusingListener stands on a loopback port where a configuration says
// NATS is, and counts the connections it is offered (closing each), for
// tests that prove a process connects to nothing. It returns the NATS URL
// of the port.
func RefusingListener(t testing.TB) (url string, accepted *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	accepted = new(atomic.Int32)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			_ = c.Close()
		}
	}()
	return "nats://" + ln.Addr().String(), accepted
}

// MinWait is the shortest WaitFor: a condition that holds in the end
// passes sooner or later, and only a broken one waits this long.
const MinWait = time.Minute

// WaitFor polls cond until it holds, failing the test after timeout with
// what it was waiting for. It is for states nothing announces (a publish
// sitting in a connection's buffer, a record written by another process);
// wait on the event where there is one.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	// The timeout says when waiting has gone on too long, not how fast
	// the code must be: under -race on a machine shared with stress-ng a
	// run's first answer took 7 s. No wait gives up before MinWait.
	timeout = max(timeout, MinWait)
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for %s", timeout, what)
}
