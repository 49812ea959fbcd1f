package gateway

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/policy"
	"github.com/natsagent/natsagent/internal/protocol"
)

// APIKey is a credential of the HTTP API: the SHA-256 of a key (the key
// itself is never kept) and the principal requests made with it act as.
type APIKey struct {
	// Name identifies the key in logs.
	Name   string
	Tenant string
	// User is the user the key acts as ("": the key's name).
	User string
	// Roles name policy roles (none: the policy's default roles).
	Roles  []string
	SHA256 [sha256.Size]byte
}

// user is the user a key acts as.
func (k APIKey) user() string {
	if k.User != "" {
		return k.User
	}
	return k.Name
}

// Error codes of authentication (HTTP 401) and authorisation (HTTP 403).
const (
	CodeUnauthorized = "unauthorized"
	CodeForbidden    = "forbidden"
)

// Routes open without a key: orchestrators probe them.
var openRoutes = map[string]bool{"GET /healthz": true, "GET /readyz": true, "GET /metrics": true, "GET /info": true}

// authenticator checks API keys and bearer JWTs. Keys are compared as
// SHA-256 sums in constant time, and every configured key is compared, so
// neither the time nor the order of the keys tells anything about a
// presented key.
type authenticator struct {
	keys []APIKey
	jwt  *jwtValidator // nil: bearer JWTs are not accepted
}

func newAuthenticator(keys []APIKey) (*authenticator, error) {
	return newAuthenticatorWith(keys, nil)
}

// newAuthenticatorWith returns nil (an open API) when neither keys nor a
// JWT configuration are given.
func newAuthenticatorWith(keys []APIKey, jwtCfg *JWT) (*authenticator, error) {
	if len(keys) == 0 && jwtCfg == nil {
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
		if err := protocol.CheckToken(fmt.Sprintf("user of API key %q", k.Name), k.user()); err != nil {
			return nil, fmt.Errorf("gateway: %w (set the key's user)", err)
		}
		for _, r := range k.Roles {
			if err := protocol.CheckToken(fmt.Sprintf("role of API key %q", k.Name), r); err != nil {
				return nil, fmt.Errorf("gateway: %w", err)
			}
		}
		if other, dup := seen[k.SHA256]; dup {
			return nil, fmt.Errorf("gateway: API keys %q and %q are the same key", other, k.Name)
		}
		seen[k.SHA256] = k.Name
	}
	a := &authenticator{keys: append([]APIKey(nil), keys...)}
	if jwtCfg != nil {
		v, err := newJWTValidator(*jwtCfg)
		if err != nil {
			return nil, err
		}
		a.jwt = v
	}
	return a, nil
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

// principal is who a request acts as: a user of one tenant with roles,
// and the credential that says so (for logs and errors).
type principal struct {
	tenant string
	p      protocol.Principal
	via    string
}

// credential authenticates a presented credential: a bearer value shaped
// as a JWT is validated as one when JWTs are configured, anything else is
// looked up as an API key.
func (a *authenticator) credential(ctx context.Context, cred string, bearer bool) (principal, error) {
	if bearer && a.jwt != nil && looksLikeJWT(cred) {
		return a.jwt.principal(ctx, cred)
	}
	if len(a.keys) == 0 {
		return principal{}, errors.New("the bearer token is not a JWT: send an access or ID token of the configured identity provider")
	}
	k, ok := a.lookup(cred)
	if !ok {
		return principal{}, errors.New("the API key is not valid")
	}
	return principal{tenant: k.Tenant, p: protocol.Principal{User: k.user(), Roles: slices.Clone(k.Roles)},
		via: fmt.Sprintf("the API key %q", k.Name)}, nil
}

// looksLikeJWT reports a compact JWS: three non-empty dot-separated parts.
func looksLikeJWT(s string) bool {
	parts := strings.Split(s, ".")
	return len(parts) == 3 && parts[0] != "" && parts[1] != ""
}

// errNoKey and errBadScheme explain a request without a usable key.
var (
	errNoKey     = errors.New("this gateway requires a credential: send an API key or a bearer token as Authorization: Bearer <credential>, or an API key in X-Api-Key")
	errBadScheme = errors.New("the Authorization header must use the Bearer scheme: Authorization: Bearer <credential>")
	errTwoKeys   = errors.New("Authorization and X-Api-Key carry different credentials; send one")
)

// presentedKey returns the credential of a request, and whether it came
// as a bearer value (only those may be JWTs).
func presentedKey(r *http.Request) (string, bool, error) {
	var bearer string
	if h := r.Header.Get("Authorization"); h != "" {
		scheme, token, ok := strings.Cut(strings.TrimSpace(h), " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") {
			return "", false, errBadScheme
		}
		bearer = strings.TrimSpace(token)
	}
	header := strings.TrimSpace(r.Header.Get("X-Api-Key"))
	switch {
	case bearer != "" && header != "" && bearer != header:
		return "", false, errTwoKeys
	case header != "":
		return header, false, nil
	case bearer != "":
		return bearer, true, nil
	}
	return "", false, errNoKey
}

type principalKey struct{}

// authenticate checks the request's credential when keys or JWTs are
// configured, and answers 401 itself when it is missing or not valid. The
// returned request carries the principal for tenantOf and principalOf.
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request, pattern string) (*http.Request, bool) {
	if s.auth == nil || openRoutes[pattern] {
		return r, true
	}
	cred, bearer, err := presentedKey(r)
	if err == nil {
		var p principal
		p, err = s.auth.credential(r.Context(), cred, bearer)
		if err == nil {
			return r.WithContext(context.WithValue(r.Context(), principalKey{}, p)), true
		}
	}
	challenge := `Bearer realm="natsagent"`
	if !errors.Is(err, errNoKey) {
		challenge += `, error="invalid_token"`
	}
	w.Header().Set("WWW-Authenticate", challenge)
	writeError(w, &apiError{status: http.StatusUnauthorized, code: CodeUnauthorized, msg: err.Error()})
	s.log.Info("request refused: no valid credential",
		zap.String("method", r.Method), zap.String("path", r.URL.Path), zap.String("remote", r.RemoteAddr),
		zap.String("reason", err.Error()))
	return r, false
}

// principalOf returns the authenticated principal of a request; false on
// an open gateway.
func principalOf(r *http.Request) (principal, bool) {
	p, ok := r.Context().Value(principalKey{}).(principal)
	return p, ok
}

// credentialTenant returns the tenant of the request's credential. A
// request that also names a tenant in X-Tenant must name the same one
// (403 otherwise); the tenant never comes from a body.
func credentialTenant(r *http.Request) (string, bool, error) {
	p, ok := principalOf(r)
	if !ok {
		return "", false, nil
	}
	if t := r.Header.Get("X-Tenant"); t != "" && t != p.tenant {
		return "", true, &apiError{status: http.StatusForbidden, code: CodeForbidden, field: "X-Tenant",
			msg: fmt.Sprintf("X-Tenant: %s acts for tenant %q only", p.via, p.tenant)}
	}
	return p.tenant, true, nil
}

// authorize decides whether the request's principal may submit req, and
// stamps req with it (policy.Authorize): every run names who asked for it
// and, in config.user_id, whose data it uses. On an open gateway no one is
// authenticated: the run acts for the user it names (default "default")
// with the policy's default roles.
func (s *Server) authorize(r *http.Request, tenant string, req *protocol.RunRequest) error {
	p, ok := principalOf(r)
	if !ok {
		// Nobody was authenticated: the run has no principal (the worker
		// applies the default roles), so it claims no thread for a user,
		// and its config.user_id is what the caller said.
		req.Principal = nil
		return nil
	}
	pr := p.p
	err := s.cfg.Policy.Authorize(r.Context(), tenant, &pr, req)
	var pe *policy.Error
	if errors.As(err, &pe) {
		s.log.Info("run refused by policy", zap.String("tenant", tenant), zap.String("user", pr.User),
			zap.String("agent", req.Agent), zap.String("rule", pe.Rule))
		return &apiError{status: http.StatusForbidden, code: CodeForbidden, msg: pe.Error()}
	}
	return err
}

// Loopback reports whether addr only accepts connections from this
// machine, where a gateway without API keys may stay open.
func Loopback(addr net.Addr) bool {
	tcp, ok := addr.(*net.TCPAddr)
	return ok && tcp.IP.IsLoopback()
}

// ownerOf is the owner of a thread the request creates: its
// authenticated user ("" on an open gateway, where no one is known).
func ownerOf(r *http.Request) string {
	if p, ok := principalOf(r); ok {
		return p.p.User
	}
	return ""
}

// mayUse reports whether the request may see and use a thread: its own,
// one created unauthenticated, or any with a role that reads all threads.
// On an open gateway every thread of the tenant.
func (s *Server) mayUse(r *http.Request, th *protocol.Thread) bool {
	p, ok := principalOf(r)
	return !ok || s.cfg.Policy.MayUseThread(th, &p.p)
}

// checkOwner answers 404, as for another tenant's, a request naming a
// thread of another user (state, history, runs, files, usage, cancel,
// steer, resume, streams): its id tells nothing about it. A thread that
// does not exist is the handler's to answer.
func (s *Server) checkOwner(r *http.Request, tenant string) error {
	id := r.PathValue("thread_id")
	if _, ok := principalOf(r); !ok || id == "" || !protocol.ValidToken(id) {
		return nil
	}
	th, _, err := s.stores.Threads.Get(r.Context(), tenant, id)
	switch {
	case errors.Is(err, kv.ErrNotFound):
		return nil
	case err != nil:
		return err
	case !s.mayUse(r, th):
		return errNotFound(fmt.Sprintf("thread %s not found", id))
	}
	return nil
}

// claimThread creates the thread of a run, owned by the request's user,
// unless it exists; if another user created it meanwhile, it is not
// found. submit creates it too when missing (an open gateway).
func (s *Server) claimThread(r *http.Request, tenant, thread string) error {
	owner := ownerOf(r)
	if owner == "" {
		return nil
	}
	th := newThread(tenant, thread, nil)
	th.Owner = owner
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), s.submitTimeout)
	defer cancel()
	_, err := s.stores.Threads.Put(ctx, th, 0)
	if !errors.Is(err, kv.ErrExists) {
		return err
	}
	th, _, err = s.stores.Threads.GetLatest(ctx, tenant, thread)
	if err != nil {
		return err
	}
	if !s.mayUse(r, th) {
		return errNotFound(fmt.Sprintf("thread %s not found", thread))
	}
	return nil
}
