package memory

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/natstest"
)

// The memory middleware reads notes and facts under the run's context
// (deadline: the run's timeout). A read lost with a NATS node must fail
// that read, not hold the run: here message gets are never answered.
func TestMemoryReadsEndWhenARequestIsLost(t *testing.T) {
	nc := natstest.Start(t).Connect()
	settings := bus.Settings{}.WithDefaults()
	natstest.Provision(t, nc, settings)
	lossy := natstest.LossyAPI(t, nc, func(api string) bool {
		return strings.HasPrefix(api, "DIRECT.GET.") || strings.HasPrefix(api, "STREAM.MSG.GET.")
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	store, err := Open(ctx, lossy, Config{Names: settings.Names})
	if err != nil {
		t.Fatal(err)
	}
	old := opTimeout
	opTimeout = 500 * time.Millisecond
	defer func() { opTimeout = old }()
	start := time.Now()
	_, err = store.Notes(ctx, "default", "ada")
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("Notes took %s: it waited on the lost request", took)
	}
	if err == nil {
		t.Fatal("Notes succeeded without an answer to its read")
	}
}
