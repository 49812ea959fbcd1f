package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/limits"
	"github.com/natsagent/natsagent/internal/protocol"
)

func openLimiter(t *testing.T, e *env, p limits.Policy) *limits.Limiter {
	t.Helper()
	l, err := limits.Open(context.Background(), e.js, e.settings, p)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// The values found accepted (a run that then ended "timeout" at once) are
// refused with the field and the maximum, in the body's config and in
// LangGraph's config.configurable.
func TestRunNumbersAreCapped(t *testing.T) {
	e := newEnv(t, nil)
	const msgs = `"input":{"messages":[{"role":"user","content":"hi"}]}`
	for _, c := range []struct{ body, field, want string }{
		{`{"config":{"timeout_seconds":9223372036854775807},` + msgs + `}`, "config.timeout_seconds", "9223372036854775807 is out of range: use 1 to 604800 seconds"},
		{`{"config":{"timeout_seconds":9300000000},` + msgs + `}`, "config.timeout_seconds", "9300000000 is out of range: use 1 to 604800 seconds"},
		{`{"config":{"configurable":{"timeout_seconds":9300000000}},` + msgs + `}`, "config.timeout_seconds", "use 1 to 604800 seconds"},
		{`{"config":{"max_steps":9223372036854775807},` + msgs + `}`, "config.max_steps", "use 1 to 10000"},
		{`{"config":{"timeout_seconds":-5},` + msgs + `}`, "config.timeout_seconds", "out of range"},
	} {
		r := e.do("POST", "/threads/t1/runs", c.body).expect(t, http.StatusBadRequest)
		if got := r.apiError(t); got.Field != c.field || !strings.Contains(got.Message, c.want) {
			t.Errorf("%s: %+v, want field %s and %q", c.body, got, c.field, c.want)
		}
	}
	e.do("POST", "/threads", map[string]any{"thread_id": "t1"}).expect(t, http.StatusOK)
	r := e.do("GET", "/threads/t1/runs?offset=9223372036854775807", nil).expect(t, http.StatusBadRequest)
	if got := r.apiError(t); got.Field != "offset" || !strings.Contains(got.Message, "0 to 1000000") {
		t.Errorf("offset: %+v", got)
	}
}

// A tenant's own maximum run time and steps are refused at submission.
func TestTenantRunBoundsOverHTTP(t *testing.T) {
	e := newEnvWith(t, nil, nil)
	e.gw.cfg.Limits = openLimiter(t, e, limits.Policy{Default: limits.Tenant{MaxRunTime: time.Hour, MaxSteps: 100}})
	r := e.do("POST", "/threads/t1/runs", with(input("hi"), "config", map[string]any{"timeout_seconds": 3601})).expect(t, http.StatusBadRequest)
	if got := r.apiError(t); got.Field != "config.timeout_seconds" || !strings.Contains(got.Message, "maximum run time of 3600 seconds") {
		t.Errorf("timeout over the tenant's maximum: %+v", got)
	}
	r = e.do("POST", "/threads/t1/runs", with(input("hi"), "config", map[string]any{"max_steps": 101})).expect(t, http.StatusBadRequest)
	if got := r.apiError(t); got.Field != "config.max_steps" || !strings.Contains(got.Message, "maximum of 100 steps") {
		t.Errorf("steps over the tenant's maximum: %+v", got)
	}
	e.do("POST", "/threads/t1/runs", with(input("hi"), "config", map[string]any{"timeout_seconds": 3600, "max_steps": 100})).expect(t, http.StatusOK)
}

// runs_per_minute holds across gateways: two gateways share one count per
// tenant, the run over it is refused with 429 and Retry-After, and other
// tenants are not affected.
func TestRunsPerMinuteAcrossGateways(t *testing.T) {
	e := newEnv(t, nil)
	p := limits.Policy{Tenants: map[string]limits.Tenant{"acme": {RunsPerMinute: 3}}}
	e.gw.cfg.Limits = openLimiter(t, e, p)
	gw2, err := New(context.Background(), e.nc, Config{Settings: e.settings, Logger: zaptest.NewLogger(t), Limits: openLimiter(t, e, p)})
	if err != nil {
		t.Fatal(err)
	}
	hs2 := httptest.NewServer(gw2.Handler())
	t.Cleanup(hs2.Close)
	other := &env{t: t, http: hs2}

	// Keep the test inside one calendar minute.
	if s := time.Now().Second(); s > 50 {
		time.Sleep(time.Duration(61-s) * time.Second)
	}
	e.do("POST", "/threads/a1/runs", input("1"), "X-Tenant", "acme").expect(t, http.StatusOK)
	other.do("POST", "/threads/a2/runs", input("2"), "X-Tenant", "acme").expect(t, http.StatusOK)
	e.do("POST", "/threads/a3/runs", input("3"), "X-Tenant", "acme").expect(t, http.StatusOK)
	for _, g := range []*env{e, other} {
		r := g.do("POST", "/threads/a4/runs", input("4"), "X-Tenant", "acme").expect(t, http.StatusTooManyRequests)
		got := r.apiError(t)
		if got.Code != protocol.CodeRateLimited || !strings.Contains(got.Message, "3 runs this minute") || !strings.Contains(got.Message, "runs_per_minute") {
			t.Errorf("refusal: %+v", got)
		}
		if n, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || n < 1 || n > 60 {
			t.Errorf("Retry-After %q, want 1 to 60 seconds", r.header.Get("Retry-After"))
		}
	}
	if _, _, err := e.stores.Threads.Get(context.Background(), "acme", "a4"); err == nil {
		t.Error("a refused run created its thread")
	}
	e.do("POST", "/threads/g1/runs", input("other tenant"), "X-Tenant", "globex").expect(t, http.StatusOK)
}

// An upload that would take the tenant's files over max_file_bytes is
// refused with 507 and nothing is stored.
func TestFileQuotaOverHTTP(t *testing.T) {
	var lim *limits.Limiter
	e := newEnvWith(t, nil, func(s *Server) {
		l, err := limits.Open(context.Background(), s.js, s.cfg.Settings, limits.Policy{Default: limits.Tenant{MaxFileBytes: 10}})
		if err != nil {
			t.Fatal(err)
		}
		lim = l
		s.cfg.Files = func(tenant, thread string) files.Workdir {
			return lim.Files(objectStoreFiles(t, s.js, s.names)(tenant, thread), tenant)
		}
	})
	e.do("POST", "/threads", map[string]any{"thread_id": "t1"}).expect(t, http.StatusOK)
	e.raw("PUT", "/threads/t1/files/a.txt", "", []byte("12345678")).expect(t, http.StatusCreated)
	r := e.raw("PUT", "/threads/t1/files/b.txt", "", []byte("12345")).expect(t, http.StatusInsufficientStorage)
	if got := r.apiError(t); got.Code != protocol.CodeQuotaExceeded || !strings.Contains(got.Message, "quota of 10 bytes") {
		t.Fatalf("refusal %+v", got)
	}
	e.do("GET", "/threads/t1/files/b.txt", nil).expect(t, http.StatusNotFound)
}

// A tenant at its max_event_bytes gets 507 for a new run; nothing stored
// is touched, and other tenants submit as before.
func TestEventQuotaOverHTTP(t *testing.T) {
	e := newEnv(t, nil)
	lim := openLimiter(t, e, limits.Policy{Tenants: map[string]limits.Tenant{"acme": {MaxEventBytes: 100}}})
	e.gw.cfg.Limits = lim
	e.do("POST", "/threads/a1/runs", input("1"), "X-Tenant", "acme").expect(t, http.StatusOK)
	if err := lim.AddEventBytes(context.Background(), "acme", 100); err != nil {
		t.Fatal(err)
	}
	r := e.do("POST", "/threads/a1/runs", input("2"), "X-Tenant", "acme").expect(t, http.StatusInsufficientStorage)
	if got := r.apiError(t); got.Code != protocol.CodeQuotaExceeded || !strings.Contains(got.Message, "max_event_bytes") {
		t.Fatalf("refusal %+v", got)
	}
	e.do("GET", "/threads/a1/runs", nil, "X-Tenant", "acme").expect(t, http.StatusOK)
	e.do("POST", "/threads/g1/runs", input("other"), "X-Tenant", "globex").expect(t, http.StatusOK)
}
