package gateway

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/kv"
)

// A run whose message id the runs stream already holds for another request
// (here written by a broken trusted submitter under another tenant's
// subject) gets 409 naming the run id, never 200 pending for a run that
// will not run; and no record is left behind.
func TestSubmitWhoseMsgIDIsTakenIsAConflict(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	forged := nats.NewMsg(e.settings.Names.RunSubject("acme", "elsewhere"))
	forged.Data = []byte(`{}`)
	forged.Header.Set(jetstream.MsgIDHeader, "default.r1")
	if _, err := e.js.PublishMsg(ctx, forged); err != nil {
		t.Fatal(err)
	}
	er := e.do("POST", "/threads/t1/runs", with(input("hi"), "run_id", "r1")).expect(t, http.StatusConflict).apiError(t)
	if !strings.Contains(er.Message, "run r1") || strings.Contains(er.Message, "acme") {
		t.Fatalf("409 message %q: want it to name run r1 and not the other tenant", er.Message)
	}
	if _, _, err := e.stores.Runs.Get(ctx, "default", "r1"); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("a record of r1 was left: %v", err)
	}
	// Another run id goes through.
	e.do("POST", "/threads/t1/runs", with(input("hi"), "run_id", "r2")).expect(t, http.StatusOK)
}
