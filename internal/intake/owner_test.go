package intake_test

import (
	"context"
	"testing"

	"github.com/natsagent/natsagent/internal/intake"
	"github.com/natsagent/natsagent/internal/protocol"
)

// A thread a NATS user creates is that user's: another user of the same
// tenant gets "not found" for it, as over HTTP, unless the hook lets the
// principal use others' threads.
func TestSubmitOnAnotherUsersThread(t *testing.T) {
	readAll := map[string]bool{"carol": true}
	e := setup(t, intake.Hooks{MayUseThread: func(th *protocol.Thread, p *protocol.Principal) bool {
		return th.Owner == "" || th.Owner == p.User || readAll[p.User]
	}}, nil)
	ack(t, e.send("acme", "h1", `{"run_id":"r1","thread_id":"h1",`+hi+`}`, intake.HeaderRequestInfo, info("acme", "alice", "")))
	th, _, err := e.stores.Threads.Get(context.Background(), "acme", "h1")
	if err != nil || th.Owner != "alice" {
		t.Fatalf("thread %+v, %v: want owner alice", th, err)
	}
	refusal(t, e.send("acme", "h1", `{"run_id":"r2","thread_id":"h1",`+hi+`}`, intake.HeaderRequestInfo, info("acme", "bob", "")), 404, intake.ErrCodeNotFound, "thread h1 not found")
	if _, _, err := e.stores.Runs.Get(context.Background(), "acme", "r2"); err == nil {
		t.Fatal("bob's refused run has a record")
	}
	ack(t, e.send("acme", "h1", `{"run_id":"r3","thread_id":"h1",`+hi+`}`, intake.HeaderRequestInfo, info("acme", "carol", "")))
	ack(t, e.send("acme", "h1", `{"run_id":"r4","thread_id":"h1",`+hi+`}`, intake.HeaderRequestInfo, info("acme", "alice", "")))

	// Without the hook only the owner may.
	e2 := setup(t, intake.Hooks{}, nil)
	ack(t, e2.send("acme", "h1", `{"run_id":"r1","thread_id":"h1",`+hi+`}`, intake.HeaderRequestInfo, info("acme", "alice", "")))
	refusal(t, e2.send("acme", "h1", `{"run_id":"r2","thread_id":"h1",`+hi+`}`, intake.HeaderRequestInfo, info("acme", "carol", "")), 404, intake.ErrCodeNotFound, "not found")
}
