package worker

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsagent/natsagent/internal/intake"
	"github.com/natsagent/natsagent/internal/protocol"
)

// A cancel that crossed a tenant's service import carries the server's
// Nats-Request-Info: another account than the subject's tenant is refused
// (403) and the run goes on; so is another user of the tenant, as if the
// thread did not exist (404); its owner cancels. (The server sets the
// header; here, without accounts, the test sets it as the server would.)
func TestCancelChecksTheRequestersAccount(t *testing.T) {
	h := newHarness(t)
	// A minute of answer: the refused cancels must come while it runs,
	// however slow the machine; the accepted one ends it.
	h.startWorker(textModel(strings.TrimSpace(strings.Repeat("slow ", 600)), 600, 100*time.Millisecond), nil)
	w := h.watch("default", "t1", "r1")
	if _, err := h.stores.Threads.Put(context.Background(), &protocol.Thread{ThreadID: "t1", Tenant: "default", Owner: "alice", Status: protocol.ThreadIdle}, 0); err != nil {
		t.Fatal(err)
	}
	h.submit(request("t1", "r1", "hi"))
	deadline := time.Now().Add(time.Minute)
	for {
		if rec, _, err := h.stores.RunView(context.Background(), "default", "t1", "r1"); err == nil && rec.Status == protocol.StatusRunning {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("run did not start")
		}
		time.Sleep(20 * time.Millisecond)
	}
	send := func(account, user string) *nats.Msg {
		m := nats.NewMsg(h.names.CancelSubject("default", "t1", "r1"))
		m.Header.Set(intake.HeaderRequestInfo, `{"acc":"`+account+`","user":"`+user+`"}`)
		reply, err := h.nc.RequestMsg(m, 20*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return reply
	}
	reply := send("globex", "alice")
	var er protocol.ErrorReply
	if err := json.Unmarshal(reply.Data, &er); err != nil || er.Error.Code != codeForbidden || reply.Header.Get("Nats-Service-Error-Code") != "403" ||
		!strings.Contains(er.Error.Message, `account "globex" may not cancel runs of tenant "default"`) {
		t.Fatalf("cancel from another account answered %s %v", reply.Data, reply.Header)
	}
	if rec := h.view("default", "t1", "r1"); rec.Status != protocol.StatusRunning {
		t.Fatalf("run is %s after a refused cancel", rec.Status)
	}
	reply = send("default", "bob")
	er = protocol.ErrorReply{}
	if err := json.Unmarshal(reply.Data, &er); err != nil || er.Error.Code != protocol.CodeNotFound {
		t.Fatalf("cancel by another user of the tenant answered %s %v", reply.Data, reply.Header)
	}
	if rec := h.view("default", "t1", "r1"); rec.Status != protocol.StatusRunning {
		t.Fatalf("run is %s after another user's cancel", rec.Status)
	}
	reply = send("default", "alice")
	var ok protocol.CancelReply
	if err := json.Unmarshal(reply.Data, &ok); err != nil || ok.RunID != "r1" || ok.Status != protocol.StatusCancelled {
		t.Fatalf("cancel from the tenant's account answered %s", reply.Data)
	}
	if fin := w.finished(t, 10*time.Second); fin.Status != protocol.StatusCancelled {
		t.Fatalf("run ended %s", fin.Status)
	}
}
