package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/natsagent/natsagent/internal/kv"
)

const (
	acmeKey   = "acme-0123456789-secret-key"
	globexKey = "globex-9876543210-secret-key"
)

// newAuthEnv is a gateway with two API keys, one per tenant, whose logs
// (debug level, every line) are captured.
func newAuthEnv(t *testing.T) (*env, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zapcore.DebugLevel)
	e := newEnvWith(t, textModel("done", 1, 0), func(s *Server) {
		a, err := newAuthenticator([]APIKey{
			{Name: "acme-ci", Tenant: "acme", SHA256: sha256.Sum256([]byte(acmeKey))},
			{Name: "globex-app", Tenant: "globex", SHA256: sha256.Sum256([]byte(globexKey))},
		})
		if err != nil {
			t.Fatal(err)
		}
		s.auth, s.log = a, zap.New(core)
	})
	return e, logs
}

func TestAPIKeysRequiredExceptHealth(t *testing.T) {
	e, _ := newAuthEnv(t)
	e.do("GET", "/healthz", nil).expect(t, http.StatusOK)
	e.do("GET", "/readyz", nil).expect(t, http.StatusOK)

	cases := []struct {
		name, method, path string
		headers            []string
		invalidToken       bool
	}{
		{"no key", "GET", "/threads", nil, false},
		{"no key, run", "POST", "/threads/t1/runs/wait?format=natsagent", nil, false},
		{"no key, unknown route", "GET", "/nothing/here", nil, false},
		{"wrong key", "GET", "/threads", []string{"Authorization", "Bearer not-a-key-at-all-000"}, true},
		{"wrong X-Api-Key", "GET", "/threads", []string{"X-Api-Key", "not-a-key-at-all-000"}, true},
		{"basic scheme", "GET", "/threads", []string{"Authorization", "Basic " + acmeKey}, true},
		{"two different keys", "GET", "/threads", []string{"Authorization", "Bearer " + acmeKey, "X-Api-Key", globexKey}, true},
		{"a tenant header is no credential", "GET", "/threads", []string{"X-Tenant", "acme"}, false},
	}
	for _, c := range cases {
		r := e.do(c.method, c.path, input("x"), c.headers...).expect(t, http.StatusUnauthorized)
		if er := r.apiError(t); er.Code != CodeUnauthorized {
			t.Errorf("%s: code %q", c.name, er.Code)
		}
		challenge := r.header.Get("WWW-Authenticate")
		if !strings.HasPrefix(challenge, `Bearer realm="natsagent"`) || strings.Contains(challenge, "invalid_token") != c.invalidToken {
			t.Errorf("%s: WWW-Authenticate %q", c.name, challenge)
		}
	}
	e.do("GET", "/threads", nil, "Authorization", "Bearer "+acmeKey).expect(t, http.StatusOK)
	e.do("GET", "/threads", nil, "authorization", "bearer "+acmeKey).expect(t, http.StatusOK)
	e.do("GET", "/threads", nil, "X-Api-Key", globexKey).expect(t, http.StatusOK)
}

// TestAPIKeyTenantWins: the tenant comes from the key. A body naming
// another tenant is ignored (a run body has no tenant), X-Tenant naming
// another is refused, and another tenant's key sees nothing of it.
func TestAPIKeyTenantWins(t *testing.T) {
	e, _ := newAuthEnv(t)
	ctx := context.Background()
	acme := []string{"Authorization", "Bearer " + acmeKey}

	rec := e.do("POST", "/threads/t1/runs/wait?format=natsagent", with(input("hi"), "tenant", "globex"), acme...).expect(t, http.StatusOK).run(t)
	if rec.Tenant != "acme" {
		t.Fatalf("run of tenant %q, want the key's tenant acme", rec.Tenant)
	}
	if _, _, err := e.stores.Runs.Get(ctx, "globex", rec.RunID); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("run recorded under the body's tenant: %v", err)
	}
	if _, _, err := e.stores.Runs.Get(ctx, "acme", rec.RunID); err != nil {
		t.Fatalf("run not under acme: %v", err)
	}

	r := e.do("POST", "/threads/t2/runs/wait?format=natsagent", input("hi"), "Authorization", "Bearer "+acmeKey, "X-Tenant", "globex").expect(t, http.StatusForbidden)
	if er := r.apiError(t); er.Code != CodeForbidden || er.Field != "X-Tenant" {
		t.Fatalf("error %+v", er)
	}
	if _, _, err := e.stores.Threads.Get(ctx, "globex", "t2"); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("a refused request created a thread: %v", err)
	}
	e.do("GET", "/threads/t1", nil, "Authorization", "Bearer "+acmeKey, "X-Tenant", "acme").expect(t, http.StatusOK)

	globex := []string{"X-Api-Key", globexKey}
	e.do("GET", "/threads/t1", nil, globex...).expect(t, http.StatusNotFound)
	e.do("GET", "/threads/t1/runs/"+rec.RunID, nil, globex...).expect(t, http.StatusNotFound)
	e.do("POST", "/threads/t1/runs/"+rec.RunID+"/cancel", nil, globex...).expect(t, http.StatusNotFound)
	var list []map[string]any
	e.do("GET", "/threads", nil, globex...).expect(t, http.StatusOK).decode(t, &list)
	if len(list) != 0 {
		t.Fatalf("globex lists acme's threads: %v", list)
	}
}

// TestAPIKeysNeverLogged: no log line, at any level, carries a key or an
// Authorization header, whether the key is accepted or refused.
func TestAPIKeysNeverLogged(t *testing.T) {
	e, logs := newAuthEnv(t)
	e.do("POST", "/threads/t1/runs/wait?format=natsagent", input("hi"), "Authorization", "Bearer "+acmeKey).expect(t, http.StatusOK)
	e.do("GET", "/threads/t1", nil, "X-Api-Key", acmeKey).expect(t, http.StatusOK)
	e.do("GET", "/threads", nil, "Authorization", "Bearer "+globexKey+"-guess").expect(t, http.StatusUnauthorized)
	e.do("GET", "/threads/t1/runs/x/cancel", nil, "Authorization", "Bearer "+acmeKey).expect(t, http.StatusMethodNotAllowed)

	var requestLines, refusals int
	for _, entry := range logs.All() {
		fields, err := json.Marshal(entry.ContextMap())
		if err != nil {
			t.Fatal(err)
		}
		line := entry.Message + " " + string(fields)
		for _, secret := range []string{acmeKey, globexKey, "Bearer", "Authorization"} {
			if strings.Contains(line, secret) {
				t.Errorf("log line carries %q: %s", secret, line)
			}
		}
		switch entry.Message {
		case "http request":
			requestLines++
		case "request refused: no valid credential":
			refusals++
		}
	}
	// The capture works: the request log saw every request.
	if requestLines < 4 || refusals != 1 {
		t.Fatalf("captured %d request lines and %d refusals of %d lines", requestLines, refusals, logs.Len())
	}
}

func TestNewAuthenticatorRefusesBadKeys(t *testing.T) {
	sum := sha256.Sum256([]byte("k"))
	for _, keys := range [][]APIKey{
		{{Name: "a", Tenant: "a.b", SHA256: sum}},
		{{Tenant: "a", SHA256: sum}},
		{{Name: "a", Tenant: "a", SHA256: sum}, {Name: "b", Tenant: "b", SHA256: sum}},
	} {
		if _, err := newAuthenticator(keys); err == nil {
			t.Errorf("%+v accepted", keys)
		}
	}
	a, err := newAuthenticator([]APIKey{{Name: "a", Tenant: "a", SHA256: sum}})
	if err != nil {
		t.Fatal(err)
	}
	if k, ok := a.lookup("k"); !ok || k.Tenant != "a" {
		t.Fatalf("lookup: %+v %v", k, ok)
	}
	if _, ok := a.lookup("K"); ok {
		t.Fatal("wrong key accepted")
	}
}
