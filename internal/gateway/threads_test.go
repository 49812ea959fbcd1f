package gateway

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/protocol"
)

func TestHealthAndReadiness(t *testing.T) {
	e := newEnv(t, nil)
	e.do("GET", "/healthz", nil).expect(t, http.StatusOK)
	var ok map[string]string
	e.do("GET", "/readyz", nil).expect(t, http.StatusOK).decode(t, &ok)
	if ok["status"] != "ok" {
		t.Fatalf("readyz %v", ok)
	}
	e.nc.Close()
	r := e.do("GET", "/readyz", nil).expect(t, http.StatusServiceUnavailable)
	if er := r.apiError(t); er.Code != protocol.CodeUnavailable || !strings.Contains(er.Message, "CLOSED") {
		t.Fatalf("readyz error %+v", er)
	}
	e.do("GET", "/healthz", nil).expect(t, http.StatusOK)
}

func TestThreadsCreateGetListConflict(t *testing.T) {
	e := newEnv(t, nil)
	var th threadView
	e.do("POST", "/threads", map[string]any{"thread_id": "t1", "metadata": map[string]any{"user": "ann"}}).expect(t, http.StatusOK).decode(t, &th)
	if th.ThreadID != "t1" || th.Status != protocol.ThreadIdle || th.Metadata["user"] != "ann" || th.CreatedAt.IsZero() {
		t.Fatalf("created %+v", th)
	}
	var got threadView
	e.do("GET", "/threads/t1", nil).expect(t, http.StatusOK).decode(t, &got)
	if got.ThreadID != "t1" || !got.CreatedAt.Equal(th.CreatedAt) || got.Metadata["user"] != "ann" {
		t.Fatalf("get %+v, want %+v", got, th)
	}

	if er := e.do("GET", "/threads/nope", nil).expect(t, http.StatusNotFound).apiError(t); er.Code != protocol.CodeNotFound {
		t.Fatalf("missing thread: %+v", er)
	}
	if er := e.do("POST", "/threads", map[string]any{"thread_id": "t1"}).expect(t, http.StatusConflict).apiError(t); er.Code != protocol.CodeConflict {
		t.Fatalf("second create: %+v", er)
	}
	var same threadView
	e.do("POST", "/threads", map[string]any{"thread_id": "t1", "if_exists": "do_nothing", "metadata": map[string]any{"user": "bob"}}).
		expect(t, http.StatusOK).decode(t, &same)
	if !same.CreatedAt.Equal(th.CreatedAt) || same.Metadata["user"] != "ann" {
		t.Fatalf("do_nothing returned %+v, want the existing thread", same)
	}
	if er := e.do("POST", "/threads", map[string]any{"if_exists": "maybe"}).expect(t, http.StatusBadRequest).apiError(t); er.Field != "if_exists" {
		t.Fatalf("bad if_exists: %+v", er)
	}

	// No id (and no body at all): one is generated.
	var gen threadView
	e.do("POST", "/threads", nil).expect(t, http.StatusOK).decode(t, &gen)
	if !protocol.ValidToken(gen.ThreadID) || gen.ThreadID == "t1" {
		t.Fatalf("generated thread id %q", gen.ThreadID)
	}
	time.Sleep(5 * time.Millisecond)
	var newest threadView
	e.do("POST", "/threads", map[string]any{}).expect(t, http.StatusOK).decode(t, &newest)

	var list []threadView
	e.do("GET", "/threads", nil).expect(t, http.StatusOK).decode(t, &list)
	if len(list) != 3 || list[0].ThreadID != newest.ThreadID || list[2].ThreadID != "t1" {
		t.Fatalf("list %+v, want 3 threads newest first", list)
	}
	e.do("GET", "/threads?limit=1", nil).expect(t, http.StatusOK).decode(t, &list)
	if len(list) != 1 || list[0].ThreadID != newest.ThreadID {
		t.Fatalf("limit=1 gave %+v", list)
	}

	// Tenants see only their own threads.
	e.do("GET", "/threads/t1", nil, "X-Tenant", "acme").expect(t, http.StatusNotFound)
	e.do("POST", "/threads", map[string]any{"thread_id": "t1"}, "X-Tenant", "acme").expect(t, http.StatusOK)
	e.do("GET", "/threads", nil, "X-Tenant", "acme").expect(t, http.StatusOK).decode(t, &list)
	if len(list) != 1 {
		t.Fatalf("tenant acme lists %d threads, want 1", len(list))
	}
	if er := e.do("GET", "/threads", nil, "X-Tenant", "a.b").expect(t, http.StatusBadRequest).apiError(t); er.Field != "X-Tenant" {
		t.Fatalf("bad tenant: %+v", er)
	}
}

func TestInvalidPathIDsAndUnknownRoutes(t *testing.T) {
	e := newEnv(t, nil)
	for _, path := range []string{"/threads/a.b", "/threads/a%2Fb/state", "/threads/" + strings.Repeat("x", 129) + "/runs"} {
		er := e.do("GET", path, nil).expect(t, http.StatusBadRequest).apiError(t)
		if er.Code != protocol.CodeInvalid || er.Field != "thread_id" {
			t.Fatalf("%s: %+v, want invalid thread_id", path, er)
		}
	}
	if er := e.do("GET", "/threads/t1/runs/a*b", nil).expect(t, http.StatusBadRequest).apiError(t); er.Field != "run_id" {
		t.Fatalf("invalid run id: %+v", er)
	}
	if er := e.do("POST", "/threads/t.1/runs", input("hi")).expect(t, http.StatusBadRequest).apiError(t); er.Field != "thread_id" {
		t.Fatalf("invalid thread id on submit: %+v", er)
	}
	if er := e.do("GET", "/nowhere", nil).expect(t, http.StatusNotFound).apiError(t); er.Code != protocol.CodeNotFound {
		t.Fatalf("unknown route: %+v", er)
	}
	r := e.do("DELETE", "/threads", nil).expect(t, http.StatusMethodNotAllowed)
	if r.apiError(t).Code != protocol.CodeInvalid || !strings.Contains(r.header.Get("Allow"), "POST") {
		t.Fatalf("wrong method: %s (Allow %q)", r.body, r.header.Get("Allow"))
	}
}
