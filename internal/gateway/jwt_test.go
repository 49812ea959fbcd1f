package gateway

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/MicahParks/jwkset"
	"github.com/golang-jwt/jwt/v5"
	"go.uber.org/zap/zaptest"

	"github.com/natsagent/natsagent/internal/protocol"
)

const (
	testIssuer   = "https://id.example.com/"
	testAudience = "natsagent"
)

// idp is an identity provider on loopback: it serves a JWKS and signs
// tokens with the keys in it (and with keys not in it).
type idp struct {
	t    testing.TB
	rsa  *rsa.PrivateKey
	ec   *ecdsa.PrivateKey
	srv  *httptest.Server
	mu   sync.Mutex
	keys []jwkset.JWKMarshal
	hits int
}

func newIDP(t testing.TB) *idp {
	t.Helper()
	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ek, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p := &idp{t: t, rsa: rk, ec: ek}
	p.publish("rsa1", &rk.PublicKey, jwkset.AlgRS256)
	p.publish("ec1", &ek.PublicKey, jwkset.AlgES256)
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.hits++
		_ = json.NewEncoder(w).Encode(jwkset.JWKSMarshal{Keys: p.keys})
	}))
	t.Cleanup(p.srv.Close)
	return p
}

// publish adds a public key to the served set.
func (p *idp) publish(kid string, pub any, alg jwkset.ALG) {
	p.t.Helper()
	jwk, err := jwkset.NewJWKFromKey(pub, jwkset.JWKOptions{Metadata: jwkset.JWKMetadataOptions{KID: kid, ALG: alg, USE: jwkset.UseSig}})
	if err != nil {
		p.t.Fatal(err)
	}
	p.mu.Lock()
	p.keys = append(p.keys, jwk.Marshal())
	p.mu.Unlock()
}

func (p *idp) fetches() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.hits
}

// claims are valid claims of user alice of tenant acme, edited by kv
// pairs (a nil value deletes the claim).
func claims(kv ...any) jwt.MapClaims {
	now := time.Now()
	c := jwt.MapClaims{"iss": testIssuer, "aud": []string{testAudience, "other"}, "sub": "alice", "org": "acme",
		"iat": now.Unix(), "nbf": now.Unix(), "exp": now.Add(time.Hour).Unix()}
	for i := 0; i < len(kv); i += 2 {
		if kv[i+1] == nil {
			delete(c, kv[i].(string))
		} else {
			c[kv[i].(string)] = kv[i+1]
		}
	}
	return c
}

func sign(t testing.TB, m jwt.SigningMethod, kid string, key any, c jwt.MapClaims) string {
	t.Helper()
	tok := jwt.NewWithClaims(m, c)
	if kid != "" {
		tok.Header["kid"] = kid
	}
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// jwtConfig is the gateway's configuration for p's tokens.
func (p *idp) jwtConfig(t testing.TB) *JWT {
	t.Helper()
	keys, err := JWKS(t.Context(), p.srv.URL, time.Hour, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	return &JWT{Issuer: testIssuer, Audience: testAudience, Algorithms: []string{"RS256", "ES256"}, Keys: keys,
		TenantClaim: "org", UserClaim: "sub", RolesClaim: "roles", Leeway: 30 * time.Second}
}

// newJWTEnv is a gateway accepting p's tokens and one API key of acme.
func newJWTEnv(t *testing.T, p *idp) *env {
	t.Helper()
	return newEnvWith(t, textModel("done", 1, 0), func(s *Server) {
		a, err := newAuthenticatorWith([]APIKey{{Name: "acme-ci", Tenant: "acme", SHA256: sha256.Sum256([]byte(acmeKey))}}, p.jwtConfig(t))
		if err != nil {
			t.Fatal(err)
		}
		s.auth = a
	})
}

func TestJWTValidation(t *testing.T) {
	p := newIDP(t)
	e := newJWTEnv(t, p)
	other, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&p.rsa.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	pubPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})
	none := sign(t, jwt.SigningMethodNone, "rsa1", jwt.UnsafeAllowNoneSignatureType, claims())
	valid := sign(t, jwt.SigningMethodRS256, "rsa1", p.rsa, claims())
	head, _, _ := strings.Cut(valid, ".")
	_, sig, _ := strings.Cut(valid[len(head)+1:], ".")
	forgedPayload := sign(t, jwt.SigningMethodRS256, "rsa1", p.rsa, claims("sub", "mallory"))
	parts := strings.Split(forgedPayload, ".")
	tampered := parts[0] + "." + parts[1] + "." + sig // mallory's claims, alice's signature

	for _, c := range []struct {
		name, token, want string
	}{
		{"expired", sign(t, jwt.SigningMethodRS256, "rsa1", p.rsa, claims("exp", time.Now().Add(-time.Hour).Unix(), "iat", time.Now().Add(-2*time.Hour).Unix(), "nbf", nil)), "has expired"},
		{"not yet valid", sign(t, jwt.SigningMethodRS256, "rsa1", p.rsa, claims("nbf", time.Now().Add(time.Hour).Unix())), "is not valid yet"},
		{"issued in the future", sign(t, jwt.SigningMethodRS256, "rsa1", p.rsa, claims("iat", time.Now().Add(time.Hour).Unix())), "is not valid yet"},
		{"wrong audience", sign(t, jwt.SigningMethodRS256, "rsa1", p.rsa, claims("aud", "another-api")), `audience (aud) does not include "natsagent"`},
		{"wrong issuer", sign(t, jwt.SigningMethodRS256, "rsa1", p.rsa, claims("iss", "https://evil.example.com/")), "was not issued by " + testIssuer},
		{"unknown key id", sign(t, jwt.SigningMethodRS256, "rsa9", other, claims()), `signed with key "rsa9", which is not in the identity provider's key set`},
		{"known kid, other key", sign(t, jwt.SigningMethodRS256, "rsa1", other, claims()), "signature that is not valid"},
		{"alg none", none, `signed with algorithm "none"; this gateway accepts RS256, ES256`},
		{"HS256 with the RSA public key", sign(t, jwt.SigningMethodHS256, "rsa1", pubPEM, claims()), `signed with algorithm "HS256"`},
		{"HS256 with the RSA public key, no kid", sign(t, jwt.SigningMethodHS256, "", pubPEM, claims()), `signed with algorithm "HS256"`},
		{"tampered payload", tampered, "signature that is not valid"},
		{"missing exp", sign(t, jwt.SigningMethodRS256, "rsa1", p.rsa, claims("exp", nil)), "has no expiry (exp claim)"},
		{"missing tenant claim", sign(t, jwt.SigningMethodRS256, "rsa1", p.rsa, claims("org", nil)), "has no org claim (its tenant)"},
		{"tenant not a token", sign(t, jwt.SigningMethodRS256, "rsa1", p.rsa, claims("org", "acme.>")), "org claim (its tenant) must be"},
		{"user not a token", sign(t, jwt.SigningMethodRS256, "rsa1", p.rsa, claims("sub", "auth0|alice")), "sub claim (its user) must be"},
		{"role not a token", sign(t, jwt.SigningMethodRS256, "rsa1", p.rsa, claims("roles", []string{"member", "a*"})), `names role "a*"`},
		{"roles not strings", sign(t, jwt.SigningMethodRS256, "rsa1", p.rsa, claims("roles", []any{1})), "must list role names"},
		{"malformed", "abc.def.ghi", "is not a well-formed JWT"},
	} {
		r := e.do("GET", "/threads", nil, "Authorization", "Bearer "+c.token).expect(t, http.StatusUnauthorized)
		if er := r.apiError(t); er.Code != CodeUnauthorized || !strings.Contains(er.Message, c.want) {
			t.Errorf("%s: %+v, want %q", c.name, er, c.want)
		}
		if !strings.Contains(r.header.Get("WWW-Authenticate"), `error="invalid_token"`) {
			t.Errorf("%s: WWW-Authenticate %q", c.name, r.header.Get("WWW-Authenticate"))
		}
	}

	// Accepted: RS256 and ES256, with the leeway, and an API key still.
	e.do("GET", "/threads", nil, "Authorization", "Bearer "+valid).expect(t, http.StatusOK)
	e.do("GET", "/threads", nil, "Authorization", "Bearer "+sign(t, jwt.SigningMethodES256, "ec1", p.ec, claims())).expect(t, http.StatusOK)
	e.do("GET", "/threads", nil, "Authorization", "Bearer "+sign(t, jwt.SigningMethodRS256, "rsa1", p.rsa, claims("exp", time.Now().Add(-10*time.Second).Unix()))).expect(t, http.StatusOK)
	e.do("GET", "/threads", nil, "Authorization", "Bearer "+acmeKey).expect(t, http.StatusOK)
	// A JWT in X-Api-Key is an API key, and not a valid one.
	e.do("GET", "/threads", nil, "X-Api-Key", valid).expect(t, http.StatusUnauthorized)

	// The tenant comes from the token: another in X-Tenant is refused.
	r := e.do("GET", "/threads", nil, "Authorization", "Bearer "+valid, "X-Tenant", "globex").expect(t, http.StatusForbidden)
	if er := r.apiError(t); er.Field != "X-Tenant" || !strings.Contains(er.Message, `the bearer token acts for tenant "acme" only`) {
		t.Fatalf("X-Tenant: %+v", er)
	}
	rec := e.do("POST", "/threads/t1/runs/wait?format=natsagent", input("hi"), "Authorization", "Bearer "+valid).expect(t, http.StatusOK).run(t)
	if rec.Tenant != "acme" {
		t.Fatalf("run of tenant %s", rec.Tenant)
	}
}

func TestJWTRolesClaim(t *testing.T) {
	p := newIDP(t)
	cfg := p.jwtConfig(t)
	cfg.RolesClaim = "realm_access.roles"
	a, err := newAuthenticatorWith(nil, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		roles any
		want  []string
	}{
		{[]string{"member", "admin"}, []string{"member", "admin"}},
		{"member admin", []string{"member", "admin"}},
		{"member,admin", []string{"member", "admin"}},
		{"member", []string{"member"}},
		{nil, nil},
	} {
		cl := claims("realm_access", map[string]any{"roles": c.roles})
		pr, err := a.credential(context.Background(), sign(t, jwt.SigningMethodES256, "ec1", p.ec, cl), true)
		if err != nil {
			t.Fatalf("%v: %v", c.roles, err)
		}
		if pr.tenant != "acme" || pr.p.User != "alice" || !slices.Equal(pr.p.Roles, c.want) {
			t.Errorf("%v: principal %+v", c.roles, pr)
		}
	}
	// Only API keys are looked up when the bearer value is no JWT.
	if _, err := a.credential(context.Background(), acmeKey, true); err == nil || !strings.Contains(err.Error(), "not a JWT") {
		t.Fatalf("opaque bearer: %v", err)
	}
}

// TestJWKSRotation: a token signed by a key published after the start is
// accepted (an unknown kid refreshes the set), and a flood of unknown
// kids does not make the gateway fetch the set once per token, nor wait.
func TestJWKSRotation(t *testing.T) {
	p := newIDP(t)
	a, err := newAuthenticatorWith(nil, p.jwtConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	start := p.fetches()
	next, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	p.publish("rsa2", &next.PublicKey, jwkset.AlgRS256)
	if _, err := a.credential(t.Context(), sign(t, jwt.SigningMethodRS256, "rsa2", next, claims()), true); err != nil {
		t.Fatalf("rotated key: %v", err)
	}
	began := time.Now()
	for i := range 20 {
		_, err := a.credential(t.Context(), sign(t, jwt.SigningMethodRS256, "nope"+string(rune('a'+i)), next, claims()), true)
		if err == nil {
			t.Fatal("unknown kid accepted")
		}
	}
	if n := p.fetches() - start; n != 1 {
		t.Errorf("the key set was fetched %d times after the start, want 1", n)
	}
	if d := time.Since(began); d > 2*time.Second {
		t.Errorf("20 tokens with unknown kids took %v", d)
	}
}

// TestJWKSUnreachableDoesNotHang: a provider that cannot be reached
// neither stops nor stalls the start; its tokens are refused clearly.
func TestJWKSUnreachableDoesNotHang(t *testing.T) {
	ln := httptest.NewServer(http.NotFoundHandler())
	url := ln.URL + "/jwks"
	ln.Close() // nothing listens there now
	began := time.Now()
	keys, err := JWKS(t.Context(), url, time.Hour, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	d := time.Since(began)
	if d > 6*time.Second {
		t.Fatalf("start took %v", d)
	}
	t.Logf("start with an unreachable JWKS took %v", d)
	a, err := newAuthenticatorWith(nil, &JWT{Issuer: testIssuer, Audience: testAudience, Algorithms: []string{"RS256"}, Keys: keys,
		Tenant: "acme", UserClaim: "sub", RolesClaim: "roles"})
	if err != nil {
		t.Fatal(err)
	}
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.credential(t.Context(), sign(t, jwt.SigningMethodRS256, "rsa1", k, claims()), true)
	if err == nil || !strings.Contains(err.Error(), "bearer token") {
		t.Fatalf("token with no keys: %v", err)
	}
}

func TestJWTSharedKey(t *testing.T) {
	key := []byte(strings.Repeat("k", 32))
	a, err := newAuthenticatorWith(nil, &JWT{Issuer: testIssuer, Audience: testAudience, Algorithms: []string{"HS256"},
		Keys: SharedKey(key), Tenant: "acme", UserClaim: "sub", RolesClaim: "roles"})
	if err != nil {
		t.Fatal(err)
	}
	if pr, err := a.credential(t.Context(), sign(t, jwt.SigningMethodHS256, "", key, claims("org", nil, "roles", "member")), true); err != nil || pr.tenant != "acme" || pr.p.Roles[0] != "member" {
		t.Fatalf("shared key: %+v %v", pr, err)
	}
	if _, err := a.credential(t.Context(), sign(t, jwt.SigningMethodHS256, "", []byte(strings.Repeat("x", 32)), claims()), true); err == nil {
		t.Fatal("token of another key accepted")
	}
	if _, err := newAuthenticatorWith(nil, &JWT{Issuer: testIssuer, Audience: testAudience, Algorithms: []string{"HS256", "RS256"},
		Keys: SharedKey(key), Tenant: "acme", UserClaim: "sub", RolesClaim: "roles"}); err == nil {
		t.Fatal("HMAC and RSA algorithms mixed")
	}
}

// FuzzBearerClaims: whatever claims a correctly signed token carries, and
// whatever a bearer value is, the gateway either refuses it or yields a
// principal whose tenant, user and roles are valid ids.
func FuzzBearerClaims(f *testing.F) {
	f.Add(`{"sub":"alice","org":"acme","roles":["a","b"]}`, "")
	f.Add(`{"sub":"alice","org":"acme","roles":"a b,c"}`, "x.y.z")
	f.Add(`{"sub":"a.b","org":"acme>","roles":[1,null]}`, "eyJhbGciOiJub25lIn0.e30.")
	f.Add(`{"sub":"alice","org":{"x":1},"roles":{"r":"admin"},"exp":"soon"}`, "..")
	key := []byte(strings.Repeat("k", 32))
	a, err := newAuthenticatorWith(nil, &JWT{Issuer: testIssuer, Audience: testAudience, Algorithms: []string{"HS256"},
		Keys: SharedKey(key), TenantClaim: "org", UserClaim: "sub", RolesClaim: "roles"})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, payload, raw string) {
		var extra map[string]any
		if json.Unmarshal([]byte(payload), &extra) == nil {
			c := claims("org", nil, "sub", nil)
			for k, v := range extra {
				c[k] = v
			}
			tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(key)
			if err == nil {
				checkPrincipal(t, a, tok)
			}
		}
		checkPrincipal(t, a, raw)
	})
}

func checkPrincipal(t *testing.T, a *authenticator, cred string) {
	p, err := a.credential(context.Background(), cred, true)
	if err != nil {
		return
	}
	if !protocol.ValidToken(p.tenant) || !protocol.ValidToken(p.p.User) {
		t.Fatalf("principal %+v from %q", p, cred)
	}
	for _, r := range p.p.Roles {
		if !protocol.ValidToken(r) {
			t.Fatalf("role %q from %q", r, cred)
		}
	}
}

// BenchmarkCredential measures what authenticating one request costs:
// an RS256 and an ES256 token against a JWKS, and an API key.
func BenchmarkCredential(b *testing.B) {
	p := newIDP(b)
	a, err := newAuthenticatorWith([]APIKey{{Name: "acme-ci", Tenant: "acme", SHA256: sha256.Sum256([]byte(acmeKey))}}, p.jwtConfig(b))
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct{ name, cred string }{
		{"rs256", sign(b, jwt.SigningMethodRS256, "rsa1", p.rsa, claims())},
		{"es256", sign(b, jwt.SigningMethodES256, "ec1", p.ec, claims())},
		{"api-key", acmeKey},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := a.credential(b.Context(), c.cred, true); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestJWKSSilentDoesNotHang: a provider that accepts the connection and
// never answers holds the start for the fetch timeout (5s), no longer.
func TestJWKSSilentDoesNotHang(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer srv.Close()
	defer close(release)
	began := time.Now()
	if _, err := JWKS(t.Context(), srv.URL, time.Hour, zaptest.NewLogger(t)); err != nil {
		t.Fatal(err)
	}
	d := time.Since(began)
	if d > 7*time.Second {
		t.Fatalf("start took %v", d)
	}
	t.Logf("start with a silent JWKS took %v", d)
}
