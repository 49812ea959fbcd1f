package files

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/natstest"
)

// A file tool runs under the run's context, whose deadline is the run's
// (an hour by default). A request to the object store lost with a node
// that went down must fail the one operation, not hold the run: here
// consumer creation (reading a file's chunks, scanning the index) is
// never answered.
func TestObjectStoreOperationsEndWhenARequestIsLost(t *testing.T) {
	nc := natstest.Start(t).Connect()
	names := bus.DefaultNames()
	natstest.Provision(t, nc, bus.Settings{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	open := func(js jetstream.JetStream) Workdir {
		store, err := js.ObjectStore(ctx, names.FilesBucket())
		if err != nil {
			t.Fatal(err)
		}
		index, err := js.KeyValue(ctx, names.ThreadsBucket())
		if err != nil {
			t.Fatal(err)
		}
		return NewObjectStore(store, index, "default", "h1")
	}
	direct, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := open(direct).Write(ctx, "/notes.md", []byte("kept")); err != nil {
		t.Fatal(err)
	}

	old := opTimeout
	opTimeout = 500 * time.Millisecond
	defer func() { opTimeout = old }()
	lossy := open(natstest.LossyAPI(t, nc, natstest.ConsumerCreate))
	for name, op := range map[string]func() error{
		"read": func() error { _, err := lossy.Read(ctx, "/notes.md"); return err },
		"list": func() error { _, err := lossy.List(ctx, "/"); return err },
	} {
		start := time.Now()
		err := op()
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("%s took %s: it waited on the lost request", name, took)
		}
		if err == nil {
			t.Errorf("%s succeeded without an answer to its request", name)
		}
	}
}
