package kv

import (
	"context"
	"errors"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/natstest"
)

// cancelWriteEnv is a provisioned server, a connection to it through a
// proxy that can hold its answers, and the runs bucket on that connection.
type cancelWriteEnv struct {
	srv   *natstest.Server
	proxy *natstest.Lockstep
	nc    *nats.Conn
	js    jetstream.JetStream
	kv    jetstream.KeyValue
}

func newCancelWriteEnv(t *testing.T) *cancelWriteEnv {
	t.Helper()
	srv := natstest.Start(t)
	natstest.Provision(t, srv.Connect(), bus.Settings{})
	proxy := natstest.NewLockstep(t, srv.Server.Addr().String())
	nc := natstest.Dial(t, proxy.URL())
	s := storesOn(t, nc)
	return &cancelWriteEnv{srv: srv, proxy: proxy, nc: nc, js: s.Runs.js, kv: s.Runs.kv}
}

type writeResult struct {
	rev uint64
	err error
}

// write starts a put of key under ctx and returns where its result comes.
func (e *cancelWriteEnv) write(ctx context.Context, key string) <-chan writeResult {
	done := make(chan writeResult, 1)
	go func() {
		rev, err := writeKey(ctx, e.js, e.kv, key, []byte(`{}`), anyRevision, 0)
		done <- writeResult{rev, err}
	}()
	return done
}

// result is the write's result if it comes within half the request
// timeout after its context was cancelled: the bound a cancelled write
// must keep when its connection is down.
func result(t *testing.T, done <-chan writeResult) writeResult {
	t.Helper()
	wait, cancel := context.WithTimeout(context.Background(), bus.RequestTimeout/2)
	defer cancel()
	select {
	case r := <-done:
		return r
	case <-wait.Done():
		t.Fatalf("the cancelled write still waits %s after its cancel, with the connection down", bus.RequestTimeout/2)
		return writeResult{}
	}
}

// A write sent while the connection is up and then cancelled still gets
// its answer (the outcome of a compare-and-set is known more often).
func TestCancelledWriteWaitsForItsAnswerWhileConnected(t *testing.T) {
	e := newCancelWriteEnv(t)
	e.proxy.Hold()
	ctx, cancel := context.WithCancel(context.Background())
	done := e.write(ctx, "default.kept")
	natstest.WaitFor(t, natstest.MinWait, "the write to reach the server", func() bool { return len(e.proxy.Pubs()) > 0 })
	cancel()
	e.proxy.Release()
	r := <-done
	if r.err != nil || r.rev == 0 {
		t.Fatalf("a cancelled write answered while connected: revision %d, %v; want its revision", r.rev, r.err)
	}
}

// A write waiting while its connection is down (the server stopped: the
// publish sits in nats.go's reconnect buffer) returns promptly when its
// context is cancelled, as unknown (context.Canceled, what a cancelled
// write that timed out returns), not after the whole request timeout.
func TestCancelledWriteReturnsWhileDisconnected(t *testing.T) {
	e := newCancelWriteEnv(t)
	down := e.nc.StatusChanged(nats.RECONNECTING)
	e.srv.Server.Shutdown()
	<-down
	ctx, cancel := context.WithCancel(context.Background())
	done := e.write(ctx, "default.buffered")
	natstest.WaitFor(t, natstest.MinWait, "the write to sit in the reconnect buffer", func() bool {
		n, err := e.nc.Buffered()
		return err == nil && n > 0
	})
	cancel()
	r := result(t, done)
	if !errors.Is(r.err, context.Canceled) || r.rev != 0 {
		t.Fatalf("revision %d, %v: want no revision and context.Canceled", r.rev, r.err)
	}
}

// A write sent while connected, cancelled while it waits for its answer,
// returns promptly once the connection drops (the server stopped before
// it answered), as unknown: the server may have stored it.
func TestCancelledWriteReturnsWhenTheConnectionDrops(t *testing.T) {
	e := newCancelWriteEnv(t)
	e.proxy.Hold()
	ctx, cancel := context.WithCancel(context.Background())
	done := e.write(ctx, "default.dropped")
	natstest.WaitFor(t, natstest.MinWait, "the write to reach the server", func() bool { return len(e.proxy.Pubs()) > 0 })
	cancel()
	down := e.nc.StatusChanged(nats.RECONNECTING)
	e.srv.Server.Shutdown()
	<-down
	r := result(t, done)
	if !errors.Is(r.err, context.Canceled) || r.rev != 0 {
		t.Fatalf("revision %d, %v: want no revision and context.Canceled", r.rev, r.err)
	}
}
