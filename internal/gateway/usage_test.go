package gateway

import (
	"net/http"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/testdeploy"
)

func TestUsageEndpoints(t *testing.T) {
	m := model.NewScripted(func(n int, req *model.Request) model.Reply {
		return model.Reply{Text: "ok", Usage: &model.Usage{PromptTokens: 100 + n, CompletionTokens: 10}}
	})
	e := newEnv(t, m)
	first := e.do("POST", "/threads/t1/runs/wait?format=natsagent", input("first")).expect(t, http.StatusOK).run(t)
	if first.Usage == nil || first.Usage.Total.Input != 100 || first.Usage.Total.Calls != 1 {
		t.Fatalf("usage on the record %+v", first.Usage)
	}
	second := e.do("POST", "/threads/t1/runs/wait?format=natsagent", input("second")).expect(t, http.StatusOK).run(t)

	var ru protocol.RunUsage
	e.do("GET", "/threads/t1/runs/"+second.RunID+"/usage", nil).expect(t, http.StatusOK).decode(t, &ru)
	if ru.RunID != second.RunID || !ru.Final || ru.Total.Input != 101 || ru.Total.Output != 10 || ru.Own.Calls != 1 || ru.Total.Models["scripted"] == nil {
		t.Fatalf("run usage %+v", ru)
	}
	var th protocol.ThreadUsage
	testdeploy.WaitFor(t, 10*time.Second, "both runs in the thread's usage", func() bool {
		e.do("GET", "/threads/t1/usage", nil).expect(t, http.StatusOK).decode(t, &th)
		return len(th.Runs) == 2
	})
	if th.ThreadID != "t1" || th.Total.Input != 201 || th.Total.Calls != 2 || th.Runs[first.RunID].Usage.Input != 100 {
		t.Fatalf("thread usage %+v", th)
	}

	// Unknown runs and threads, a run asked for on another thread, and
	// another tenant's view are not found; bad ids are refused.
	e.do("GET", "/threads/t1/runs/nope/usage", nil).expect(t, http.StatusNotFound)
	e.do("GET", "/threads/t2/runs/"+first.RunID+"/usage", nil).expect(t, http.StatusNotFound)
	e.do("GET", "/threads/nope/usage", nil).expect(t, http.StatusNotFound)
	e.do("GET", "/threads/t1/usage", nil, "X-Tenant", "acme").expect(t, http.StatusNotFound)
	e.do("GET", "/threads/t1/runs/"+first.RunID+"/usage", nil, "X-Tenant", "acme").expect(t, http.StatusNotFound)
	if code := e.do("GET", "/threads/t1/runs/bad.id/usage", nil).expect(t, http.StatusBadRequest).apiError(t).Code; code != protocol.CodeInvalid {
		t.Fatalf("code %s", code)
	}

	// A thread without a finished run has zero usage, not an error.
	e.do("POST", "/threads", map[string]any{"thread_id": "empty"}).expect(t, http.StatusOK)
	var empty protocol.ThreadUsage
	e.do("GET", "/threads/empty/usage", nil).expect(t, http.StatusOK).decode(t, &empty)
	if empty.ThreadID != "empty" || empty.Total.Calls != 0 {
		t.Fatalf("empty thread usage %+v", empty)
	}
}
