package gateway

import (
	"crypto/sha256"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/natsagent/natsagent/internal/metrics/prom"
)

// /metrics is open like the health checks when API keys are required,
// and every request is counted by route pattern, never by path: an
// unknown path is "unmatched", so clients cannot add series.
func TestMetricsOpenBesideAPIKeysAndCountedByRoute(t *testing.T) {
	rec, err := prom.New(prom.Options{Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnvWith(t, nil, func(s *Server) {
		a, err := newAuthenticator([]APIKey{{Name: "acme-ci", Tenant: "acme", SHA256: sha256.Sum256([]byte(acmeKey))}})
		if err != nil {
			t.Fatal(err)
		}
		s.auth = a
		s.cfg.Metrics = rec
		s.cfg.MetricsHandler = rec.Handler()
		s.routes()
	})
	e.do("GET", "/threads", nil).expect(t, http.StatusUnauthorized)
	e.do("GET", "/threads", nil, "X-Api-Key", acmeKey).expect(t, http.StatusOK)
	e.do("GET", "/threads/t-secret-1/state", nil, "X-Api-Key", acmeKey).expect(t, http.StatusNotFound)
	e.do("GET", "/no/such/route/r-secret-2", nil).expect(t, http.StatusUnauthorized)

	r := e.do("GET", "/metrics", nil).expect(t, http.StatusOK)
	body := string(r.body)
	for _, want := range []string{
		`natsagent_http_requests_total{code="401",route="GET /threads"} 1`,
		`natsagent_http_requests_total{code="200",route="GET /threads"} 1`,
		`natsagent_http_requests_total{code="404",route="GET /threads/{thread_id}/state"} 1`,
		`natsagent_http_requests_total{code="401",route="unmatched"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("no %s in /metrics:\n%s", want, grepLines(body, "natsagent_http_requests_total"))
		}
	}
	if strings.Contains(body, "secret") {
		t.Errorf("a path's ids became label values:\n%s", grepLines(body, "secret"))
	}
	// The scrape itself is counted once it ended.
	if n := requestsCounted(t, rec, "GET /metrics", "200"); n != 1 {
		t.Errorf("scrapes counted %v, want 1", n)
	}
}

// Without a metrics handler there is no /metrics route.
func TestNoMetricsRouteWhenOff(t *testing.T) {
	e := newEnv(t, nil)
	e.do("GET", "/metrics", nil).expect(t, http.StatusNotFound)
}

func requestsCounted(t *testing.T, rec *prom.Recorder, route, code string) float64 {
	t.Helper()
	mfs, err := rec.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "natsagent_http_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			if l["route"] == route && l["code"] == code {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// The store's search index reports what it holds: a search reads the
// tenant in, within the configured budget.
func TestStoreIndexMetrics(t *testing.T) {
	rec, err := prom.New(prom.Options{Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnvWith(t, nil, func(s *Server) {
		s.cfg.Metrics = rec
		s.cfg.MetricsHandler = rec.Handler()
		s.cfg.StoreIndexMemory = 4 << 20
		s.routes()
		if err := s.openStore(t.Context()); err != nil {
			t.Fatal(err)
		}
	})
	e.do("PUT", "/store/items", map[string]any{"namespace": []string{"docs"}, "key": "a", "value": map[string]any{"title": "Alpha"}}).expect(t, http.StatusNoContent)
	e.do("POST", "/store/items/search", map[string]any{"namespace_prefix": []string{"docs"}}).expect(t, http.StatusOK)
	body := string(e.do("GET", "/metrics", nil).expect(t, http.StatusOK).body)
	for _, want := range []string{
		"natsagent_store_index_budget_bytes 4.194304e+06",
		"natsagent_store_index_tenants 1",
		"natsagent_store_index_loads_total 1",
		"natsagent_store_index_evictions_total 0",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("no %s in /metrics:\n%s", want, grepLines(body, "natsagent_store_index"))
		}
	}
	if strings.Contains(body, "natsagent_store_index_bytes 0\n") || !strings.Contains(body, "natsagent_store_index_bytes ") {
		t.Errorf("the index holds no bytes:\n%s", grepLines(body, "natsagent_store_index"))
	}
}
