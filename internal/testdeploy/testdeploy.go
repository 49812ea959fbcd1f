// Package testdeploy starts what most end-to-end tests stand on: an
// embedded JetStream server (temp dir, random loopback port) with every
// natsagent stream and bucket provisioned, a connection, and the stores
// bound to it. Everything is torn down when the test ends.
package testdeploy

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/natstest"
)

// Deployment is a provisioned server and a client of it.
type Deployment struct {
	Server *natstest.Server
	NC     *nats.Conn
	JS     jetstream.JetStream
	// Settings are the ones provisioned: the test's, over the defaults.
	Settings bus.Settings
	Stores   *kv.Stores
}

// Start provisions natsagent with settings (zero fields keep their
// defaults) on a new embedded server.
func Start(t testing.TB, settings bus.Settings) *Deployment {
	t.Helper()
	return StartOn(t, natstest.Start(t), settings)
}

// StartOn provisions natsagent with settings on srv.
func StartOn(t testing.TB, srv *natstest.Server, settings bus.Settings) *Deployment {
	t.Helper()
	nc := srv.Connect()
	settings = settings.WithDefaults()
	natstest.Provision(t, nc, settings)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stores, err := kv.Open(context.Background(), js, settings.Names)
	if err != nil {
		t.Fatal(err)
	}
	return &Deployment{Server: srv, NC: nc, JS: js, Settings: settings, Stores: stores}
}

// MinWait is the shortest WaitFor (natstest.MinWait).
const MinWait = natstest.MinWait

// WaitFor is natstest.WaitFor.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	natstest.WaitFor(t, timeout, what, cond)
}
