package bus_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/natstest"
)

// Drain returns only once the messages a subscription was handling are
// handled and the connection is closed: a process exits right after it.
func TestDrainWaitsForHandlers(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect()
	var handled atomic.Int32
	started := make(chan struct{}, 3)
	if _, err := nc.Subscribe("work", func(*nats.Msg) {
		started <- struct{}{}
		time.Sleep(100 * time.Millisecond)
		handled.Add(1)
	}); err != nil {
		t.Fatal(err)
	}
	// The server must know of the subscription before another connection
	// publishes, or the messages go to nobody.
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	pub := srv.Connect()
	for range 3 {
		if err := pub.Publish("work", nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Flush(); err != nil {
		t.Fatal(err)
	}
	select { // the first is being handled, the others are queued
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("no message reached the subscription in 30s")
	}
	if err := bus.Drain(nc, time.Minute); err != nil {
		t.Fatal(err)
	}
	if !nc.IsClosed() {
		t.Error("the connection is not closed after Drain")
	}
	if n := handled.Load(); n != 3 {
		t.Errorf("Drain returned with %d of 3 messages handled", n)
	}
	// Draining a closed connection is not an error.
	if err := bus.Drain(nc, time.Second); err != nil {
		t.Errorf("Drain of a closed connection: %v", err)
	}
}

// A drain that cannot finish in time closes the connection and says so.
func TestDrainTimesOut(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect()
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	started := make(chan struct{})
	if _, err := nc.Subscribe("stuck", func(*nats.Msg) {
		close(started)
		<-release
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish("stuck", nil); err != nil {
		t.Fatal(err)
	}
	natstest.Recv(t, started, "the message on stuck")
	if err := bus.Drain(nc, 50*time.Millisecond); err == nil {
		t.Error("Drain of a connection whose handler never returns: no error")
	}
	if !nc.IsClosed() {
		t.Error("the connection is not closed after a drain that timed out")
	}
}
