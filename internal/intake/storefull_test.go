package intake_test

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/intake"
)

// A submission JetStream has no room for is refused 507 with err_code
// ErrCodeStoreFull, naming the stream that is full; a JetStream client
// reads the answer as an API error that bus.IsStoreFull recognises. With
// room again, the same submission is taken.
func TestSubmitStoreFull(t *testing.T) {
	e := setup(t, intake.Hooks{}, nil)
	ctx := context.Background()
	open := e.runs.CachedInfo().Config
	full := open
	full.MaxBytes, full.Discard = 1, jetstream.DiscardNew
	js, err := jetstream.New(e.nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.UpdateStream(ctx, full); err != nil {
		t.Fatal(err)
	}
	body := `{"run_id":"r1","thread_id":"h1",` + hi + `}`
	reqInfo := []string{intake.HeaderRequestInfo, info("default", "u1", "")}
	m := e.send("default", "h1", body, reqInfo...)
	refusal(t, m, 507, intake.ErrCodeStoreFull, open.Name)

	// What a nats.go JetStream client makes of the answer.
	_, err = js.Publish(ctx, "agent.submit.default.h1", []byte(body))
	if _, full := bus.IsStoreFull(err); !full {
		t.Fatalf("a client publishing to the submit service got %v, not a full store", err)
	}

	if _, err := js.UpdateStream(ctx, open); err != nil {
		t.Fatal(err)
	}
	ack(t, e.send("default", "h1", body, reqInfo...))
}
