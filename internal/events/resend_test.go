package events

import (
	"context"
	"errors"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/protocol"
)

// Issue 7 (node loss): an event whose asynchronous publish failed during
// a leader election ("duplicate message id is in process", or no
// responders) is sent again by Flush and stored once when it carries a
// message id; a permanent failure is reported, not retried.
func TestFlushResendsEventsWithAnIDAfterATransientError(t *testing.T) {
	e := newRestoreEnv(t)
	js, settings, p := e.js, e.settings, e.p
	ctx := context.Background()
	s := p.NewStream("default", "t1", "r1", 1, 0)
	inProcess := &jetstream.APIError{Code: 409, ErrorCode: 10158, Description: "duplicate message id is in process"}

	withID, err := p.Msg("default", "t1", "r1", 1, 1, protocol.EventRunStarted, nil, "r1-started-1")
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	for _, cause := range []error{inProcess, nats.ErrNoResponders} {
		if !s.failed(withID, cause) {
			t.Fatalf("failure %v not kept for a resend", cause)
		}
	}
	s.mu.Unlock()
	if err := s.Flush(ctx); err != nil {
		t.Fatalf("flush: %v", err)
	}
	badRequest := &jetstream.APIError{Code: 400, ErrorCode: 10058, Description: "bad request"}
	s.mu.Lock()
	kept := s.failed(withID, badRequest)
	s.mu.Unlock()
	if kept {
		t.Fatal("a permanent failure was kept for a resend")
	}
	if err := s.Flush(ctx); !errors.Is(err, badRequest) {
		t.Fatalf("flush after a permanent failure: %v, want it", err)
	}
	st, err := js.Stream(ctx, settings.Names.EventsStream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Fatalf("events stored: %d, want 1 (the event with an id, once)", info.State.Msgs)
	}
}
