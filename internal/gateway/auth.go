package gateway

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/protocol"
)

// APIKey is a credential of the HTTP API: the SHA-256 of a key (the key
// itself is never kept) and the one tenant requests made with it act for.
type APIKey struct {
	// Name identifies the key in logs.
	Name   string
	Tenant string
	SHA256 [sha256.Size]byte
}

// Error codes of authentication (HTTP 401) and authorisation (HTTP 403).
const (
	CodeUnauthorized = "unauthorized"
	CodeForbidden    = "forbidden"
)

// Routes open without a key: orchestrators probe them.
var openRoutes = map[string]bool{"GET /healthz": true, "GET /readyz": true, "GET /metrics": true}

// authenticator checks API keys. Keys are compared as SHA-256 sums in
// constant time, and every configured key is compared, so neither the time
// nor the order of the keys tells anything about a presented key.
type authenticator struct {
	keys []APIKey
}

func newAuthenticator(keys []APIKey) (*authenticator, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	seen := make(map[[sha256.Size]byte]string, len(keys))
	for i, k := range keys {
		if k.Name == "" {
			return nil, fmt.Errorf("gateway: API key %d has no name", i)
		}
		if err := protocol.CheckToken(fmt.Sprintf("tenant of API key %q", k.Name), k.Tenant); err != nil {
			return nil, fmt.Errorf("gateway: %w", err)
		}
		if other, dup := seen[k.SHA256]; dup {
			return nil, fmt.Errorf("gateway: API keys %q and %q are the same key", other, k.Name)
		}
		seen[k.SHA256] = k.Name
	}
	return &authenticator{keys: append([]APIKey(nil), keys...)}, nil
}

func (a *authenticator) lookup(key string) (APIKey, bool) {
	sum := sha256.Sum256([]byte(key))
	var found APIKey
	match := 0
	for _, k := range a.keys {
		eq := subtle.ConstantTimeCompare(sum[:], k.SHA256[:])
		if eq == 1 {
			found = k
		}
		match |= eq
	}
	return found, match == 1
}

// errNoKey and errBadScheme explain a request without a usable key.
var (
	errNoKey     = errors.New("this gateway requires an API key: send it as Authorization: Bearer <key> or in X-Api-Key")
	errBadScheme = errors.New("the Authorization header must use the Bearer scheme: Authorization: Bearer <key>")
	errTwoKeys   = errors.New("Authorization and X-Api-Key carry different keys; send one")
)

// presentedKey returns the key of a request.
func presentedKey(r *http.Request) (string, error) {
	var bearer string
	if h := r.Header.Get("Authorization"); h != "" {
		scheme, token, ok := strings.Cut(strings.TrimSpace(h), " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") {
			return "", errBadScheme
		}
		bearer = strings.TrimSpace(token)
	}
	header := strings.TrimSpace(r.Header.Get("X-Api-Key"))
	switch {
	case bearer != "" && header != "" && bearer != header:
		return "", errTwoKeys
	case bearer != "":
		return bearer, nil
	case header != "":
		return header, nil
	}
	return "", errNoKey
}

type principalKey struct{}

// authenticate checks the request's key when keys are configured, and
// answers 401 itself when it is missing or unknown. The returned request
// carries the key's tenant for tenantOf.
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request, pattern string) (*http.Request, bool) {
	if s.auth == nil || openRoutes[pattern] {
		return r, true
	}
	key, err := presentedKey(r)
	if err == nil {
		k, ok := s.auth.lookup(key)
		if ok {
			return r.WithContext(context.WithValue(r.Context(), principalKey{}, k)), true
		}
		err = errors.New("the API key is not valid")
	}
	challenge := `Bearer realm="natsagent"`
	if !errors.Is(err, errNoKey) {
		challenge += `, error="invalid_token"`
	}
	w.Header().Set("WWW-Authenticate", challenge)
	writeError(w, &apiError{status: http.StatusUnauthorized, code: CodeUnauthorized, msg: err.Error()})
	s.log.Info("request refused: no valid API key",
		zap.String("method", r.Method), zap.String("path", r.URL.Path), zap.String("remote", r.RemoteAddr),
		zap.String("reason", err.Error()))
	return r, false
}

// credentialTenant returns the tenant of the request's API key. A request
// that also names a tenant in X-Tenant must name the same one (403
// otherwise); the tenant never comes from a body.
func credentialTenant(r *http.Request) (string, bool, error) {
	k, ok := r.Context().Value(principalKey{}).(APIKey)
	if !ok {
		return "", false, nil
	}
	if t := r.Header.Get("X-Tenant"); t != "" && t != k.Tenant {
		return "", true, &apiError{status: http.StatusForbidden, code: CodeForbidden, field: "X-Tenant",
			msg: fmt.Sprintf("X-Tenant: the API key %q acts for tenant %q only", k.Name, k.Tenant)}
	}
	return k.Tenant, true, nil
}

// Loopback reports whether addr only accepts connections from this
// machine, where a gateway without API keys may stay open.
func Loopback(addr net.Addr) bool {
	tcp, ok := addr.(*net.TCPAddr)
	return ok && tcp.IP.IsLoopback()
}
