package erase_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsagent/natsagent/internal/erase"
	"github.com/natsagent/natsagent/internal/intake"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/protocol"
)

func requestInfo(acc, user string) string {
	b, _ := json.Marshal(map[string]any{"acc": acc, "user": user})
	return string(b)
}

// ask sends a delete request, with Nats-Request-Info when info is set (as
// the server adds it to a request that crossed a tenant's import), and
// returns the status and body of the answer (200 for a DeleteReply).
func (e *env) ask(t *testing.T, subject, info string, cancel bool) (int, string) {
	t.Helper()
	m := nats.NewMsg(subject)
	if info != "" {
		m.Header.Set(intake.HeaderRequestInfo, info)
	}
	if cancel {
		m.Header.Set(erase.HeaderCancel, "true")
	}
	reply, err := e.nc.RequestMsg(m, 30*time.Second)
	if err != nil {
		t.Fatalf("request %s: %v", subject, err)
	}
	if code := reply.Header.Get("Nats-Service-Error-Code"); code != "" {
		var er protocol.ErrorReply
		if err := json.Unmarshal(reply.Data, &er); err != nil {
			t.Fatalf("error reply %s: %v", reply.Data, err)
		}
		status, err := strconv.Atoi(code)
		if err != nil {
			t.Fatalf("error code %q", code)
		}
		return status, er.Error.Code + ": " + er.Error.Message
	}
	var ok protocol.DeleteReply
	if err := json.Unmarshal(reply.Data, &ok); err != nil || !ok.Deleted {
		t.Fatalf("reply %s: %v", reply.Data, err)
	}
	return 200, string(reply.Data)
}

// The delete service checks the requester as the submit service does:
// another account gets 403, another user of the tenant 404 (as for a
// thread that does not exist), the owner and a request from inside the
// service account may delete; a busy thread is 409 unless cancel.
func TestDeleteService(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	svc, err := erase.Serve(e.nc, erase.ServiceConfig{Eraser: e.eraser, MayUseThread: func(th *protocol.Thread, p *protocol.Principal) bool {
		return th.Owner == "" || th.Owner == p.User || p.User == "carol" // carol reads all threads
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Stop)
	e.seed(t, "acme", "h1", "alice")
	e.seed(t, "acme", "h2", "alice")
	e.seed(t, "acme", "h3", "alice")

	for _, c := range []struct {
		subject, info, want string
		status              int
	}{
		{"agent.ctl.acme.h1.delete", requestInfo("globex", "alice"), "forbidden", 403},
		{"agent.ctl.acme.h1.delete", requestInfo("acme", "bob"), "not_found: thread h1", 404},
		{"agent.ctl.acme.h1.h1-r1.delete", requestInfo("acme", "bob"), "not_found: thread h1", 404},
		{"agent.ctl.acme.nope.delete", requestInfo("acme", "alice"), "not_found", 404},
		{"agent.ctl.acme.h1.nope.delete", requestInfo("acme", "alice"), "not_found", 404},
		{"agent.ctl.acme.h1.delete", `{not json`, "invalid", 400},
	} {
		status, body := e.ask(t, c.subject, c.info, false)
		if status != c.status || !strings.Contains(body, c.want) {
			t.Errorf("%s as %s: %d %s, want %d %s", c.subject, c.info, status, body, c.status, c.want)
		}
	}
	if _, _, err := e.stores.Threads.Get(ctx, "acme", "h1"); err != nil {
		t.Fatalf("refused deletions touched h1: %v", err)
	}
	// The owner deletes a run, then the thread; carol (reads all) another.
	if status, body := e.ask(t, "agent.ctl.acme.h1.h1-r1.delete", requestInfo("acme", "alice"), false); status != 200 {
		t.Fatalf("alice deletes her run: %d %s", status, body)
	}
	if _, _, err := e.stores.Runs.Get(ctx, "acme", "h1-r1"); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("deleted run: %v", err)
	}
	if status, body := e.ask(t, "agent.ctl.acme.h1.delete", requestInfo("acme", "alice"), false); status != 200 {
		t.Fatalf("alice deletes her thread: %d %s", status, body)
	}
	if status, body := e.ask(t, "agent.ctl.acme.h2.delete", requestInfo("acme", "carol"), false); status != 200 {
		t.Fatalf("carol deletes alice's thread: %d %s", status, body)
	}
	for _, h := range []string{"h1", "h2"} {
		if got := e.leftovers(t, "acme", h); len(got) > 0 {
			t.Fatalf("acme/%s left:\n%s", h, strings.Join(got, "\n"))
		}
	}
	// Busy: refused, then deleted with cancel once the holder is gone
	// (nobody serves cancel here: the test releases the lease itself,
	// as the worker running the run would).
	_, _, err = e.stores.Threads.Mutate(ctx, "acme", "h3", func(th *protocol.Thread) error {
		th.Status = protocol.ThreadBusy
		th.Lease = &protocol.Lease{RunID: "h3-r9", Worker: "w1", Epoch: 2, AcquiredAt: time.Now(), RenewedAt: time.Now()}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if status, body := e.ask(t, "agent.ctl.acme.h3.delete", "", false); status != 409 || !strings.Contains(body, protocol.CodeBusy) {
		t.Fatalf("delete of a busy thread: %d %s", status, body)
	}
	cancelled, err := e.nc.Subscribe("agent.ctl.acme.h3.h3-r9.cancel", func(m *nats.Msg) {
		go func() {
			_, _, _ = e.stores.Threads.Mutate(ctx, "acme", "h3", func(th *protocol.Thread) error {
				th.Lease, th.Status = nil, protocol.ThreadIdle
				return nil
			})
			data, _ := json.Marshal(protocol.CancelReply{RunID: "h3-r9", Status: protocol.StatusCancelled})
			_ = m.Respond(data)
		}()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cancelled.Unsubscribe()
	if status, body := e.ask(t, "agent.ctl.acme.h3.delete", "", true); status != 200 {
		t.Fatalf("delete with cancel: %d %s", status, body)
	}
	if got := e.leftovers(t, "acme", "h3"); len(got) > 0 {
		t.Fatalf("acme/h3 left:\n%s", strings.Join(got, "\n"))
	}
}
