package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/MicahParks/jwkset"
	"github.com/MicahParks/keyfunc/v3"
	"github.com/golang-jwt/jwt/v5"
	"go.uber.org/zap"
	"golang.org/x/time/rate"

	"github.com/natsagent/natsagent/internal/protocol"
)

// JWT configures bearer JWTs (OIDC access or ID tokens) as credentials.
// Tokens are verified by github.com/golang-jwt/jwt/v5 with the keys of
// Keys; every field but Tenant, TenantClaim and Leeway is required.
type JWT struct {
	// Issuer must equal the iss claim; Audience must be one of aud.
	Issuer   string
	Audience string
	// Algorithms are the accepted signature algorithms, of one kind
	// (asymmetric with a key set, HMAC with a shared key).
	Algorithms []string
	// Keys returns the key function of a request (JWKS or SharedKey).
	Keys func(ctx context.Context) jwt.Keyfunc
	// Tenant is the tenant of every token; else TenantClaim names the
	// claim holding it.
	Tenant      string
	TenantClaim string
	// UserClaim and RolesClaim name the claims of the user and the roles
	// (a dotted name reads a nested claim).
	UserClaim  string
	RolesClaim string
	// Leeway tolerates clock skew on exp, nbf and iat.
	Leeway time.Duration
}

// MaxRoles bounds the roles one token may carry.
const MaxRoles = 64

// JWKS returns the key function of a JSON Web Key Set served at url
// (github.com/MicahParks/keyfunc/v3). The set is fetched now, for at most
// five seconds: a provider that cannot be reached does not stop the
// gateway, whose tokens are refused until a fetch succeeds (logged). It is
// fetched again every refresh, and when a token names an unknown key id,
// at most once a minute; a token that would wait for that longer than
// five seconds is refused at once. ctx ends the refreshes.
func JWKS(ctx context.Context, url string, refresh time.Duration, log *zap.Logger) (func(context.Context) jwt.Keyfunc, error) {
	if log == nil {
		log = zap.NewNop()
	}
	timeout := 5 * time.Second
	k, err := keyfunc.NewDefaultOverrideCtx(ctx, []string{url}, keyfunc.Override{
		Client:            &http.Client{Timeout: timeout},
		HTTPTimeout:       timeout,
		RefreshInterval:   refresh,
		RefreshUnknownKID: rate.NewLimiter(rate.Every(time.Minute), 1),
		RateLimitWaitMax:  timeout,
		RefreshErrorHandlerFunc: func(u string) func(context.Context, error) {
			return func(_ context.Context, err error) {
				log.Warn("the JWT key set could not be fetched; bearer tokens are checked against the keys fetched before, if any",
					zap.String("jwks_url", u), zap.Error(err))
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("gateway.jwt.jwks_url: %w", err)
	}
	return k.KeyfuncCtx, nil
}

// SharedKey returns the key function of a shared HMAC key.
func SharedKey(key []byte) func(context.Context) jwt.Keyfunc {
	key = slices.Clone(key)
	return func(context.Context) jwt.Keyfunc {
		return func(*jwt.Token) (any, error) { return key, nil }
	}
}

type jwtValidator struct {
	cfg    JWT
	parser *jwt.Parser
}

func newJWTValidator(c JWT) (*jwtValidator, error) {
	switch {
	case c.Issuer == "" || c.Audience == "":
		return nil, errors.New("gateway: JWT needs an issuer and an audience")
	case c.Keys == nil:
		return nil, errors.New("gateway: JWT needs keys (JWKS or SharedKey)")
	case len(c.Algorithms) == 0:
		return nil, errors.New("gateway: JWT needs algorithms")
	case c.UserClaim == "" || c.RolesClaim == "":
		return nil, errors.New("gateway: JWT needs the user and roles claim names")
	case (c.Tenant == "") == (c.TenantClaim == ""):
		return nil, errors.New("gateway: JWT needs one of a tenant or a tenant claim")
	case c.Tenant != "" && !protocol.ValidToken(c.Tenant):
		return nil, fmt.Errorf("gateway: JWT tenant %q is not a valid tenant id", c.Tenant)
	}
	hmac, asym := false, false
	for _, a := range c.Algorithms {
		switch {
		case a == "none" || jwt.GetSigningMethod(a) == nil:
			return nil, fmt.Errorf("gateway: JWT algorithm %q is not supported", a)
		case strings.HasPrefix(a, "HS"):
			hmac = true
		default:
			asym = true
		}
	}
	if hmac && asym {
		return nil, errors.New("gateway: JWT algorithms mix HMAC and public-key ones; a token could pass a public key off as an HMAC secret")
	}
	c.Algorithms = slices.Clone(c.Algorithms)
	return &jwtValidator{cfg: c, parser: jwt.NewParser(
		jwt.WithValidMethods(c.Algorithms),
		jwt.WithIssuer(c.Issuer),
		jwt.WithAudience(c.Audience),
		jwt.WithLeeway(c.Leeway),
		jwt.WithExpirationRequired(),
		jwt.WithIssuedAt(),
	)}, nil
}

// principal verifies a token and reads its principal.
func (v *jwtValidator) principal(ctx context.Context, token string) (principal, error) {
	claims := jwt.MapClaims{}
	t, err := v.parser.ParseWithClaims(token, claims, v.cfg.Keys(ctx))
	if err != nil {
		return principal{}, v.explain(t, err)
	}
	p := principal{via: "the bearer token", tenant: v.cfg.Tenant}
	if v.cfg.TenantClaim != "" {
		if p.tenant, err = stringClaim(claims, v.cfg.TenantClaim, "tenant"); err != nil {
			return principal{}, err
		}
	}
	if p.p.User, err = stringClaim(claims, v.cfg.UserClaim, "user"); err != nil {
		return principal{}, err
	}
	if p.p.Roles, err = rolesClaim(claims, v.cfg.RolesClaim); err != nil {
		return principal{}, err
	}
	return p, nil
}

// explain turns a verification failure into what the caller should fix.
func (v *jwtValidator) explain(t *jwt.Token, err error) error {
	const prefix = "the bearer token "
	switch {
	case errors.Is(err, jwt.ErrTokenMalformed):
		return errors.New(prefix + "is not a well-formed JWT")
	case t != nil && t.Method != nil && !slices.Contains(v.cfg.Algorithms, t.Method.Alg()),
		t != nil && t.Method == nil:
		alg, _ := t.Header["alg"].(string)
		return fmt.Errorf(prefix+"is signed with algorithm %q; this gateway accepts %s", clip(alg), strings.Join(v.cfg.Algorithms, ", "))
	case errors.Is(err, jwkset.ErrKeyNotFound):
		kid, _ := t.Header["kid"].(string)
		return fmt.Errorf(prefix+"is signed with key %q, which is not in the identity provider's key set; get a new token", clip(kid))
	case errors.Is(err, jwt.ErrTokenUnverifiable):
		return errors.New(prefix + "cannot be verified: the identity provider's keys are not available (see the gateway's log)")
	case errors.Is(err, jwt.ErrTokenSignatureInvalid):
		return errors.New(prefix + "has a signature that is not valid")
	case errors.Is(err, jwt.ErrTokenRequiredClaimMissing):
		return errors.New(prefix + "has no expiry (exp claim); this gateway accepts only tokens that expire")
	case errors.Is(err, jwt.ErrTokenExpired):
		return errors.New(prefix + "has expired: get a new one from your identity provider")
	case errors.Is(err, jwt.ErrTokenNotValidYet), errors.Is(err, jwt.ErrTokenUsedBeforeIssued):
		return errors.New(prefix + "is not valid yet (nbf or iat is in the future): check the clocks of the gateway and the identity provider")
	case errors.Is(err, jwt.ErrTokenInvalidIssuer):
		return fmt.Errorf(prefix+"was not issued by %s", v.cfg.Issuer)
	case errors.Is(err, jwt.ErrTokenInvalidAudience):
		return fmt.Errorf(prefix+"is not meant for this API: its audience (aud) does not include %q", v.cfg.Audience)
	}
	return errors.New(prefix + "is not valid")
}

// claim reads a claim, a dotted name reading into nested objects.
func claim(claims jwt.MapClaims, name string) (any, bool) {
	var cur any = map[string]any(claims)
	for part := range strings.SplitSeq(name, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = m[part]; !ok {
			return nil, false
		}
	}
	return cur, true
}

// stringClaim reads a claim that must be a valid id.
func stringClaim(claims jwt.MapClaims, name, what string) (string, error) {
	raw, ok := claim(claims, name)
	if !ok {
		return "", fmt.Errorf("the bearer token has no %s claim (its %s)", name, what)
	}
	s, ok := raw.(string)
	if !ok || !protocol.ValidToken(s) {
		return "", fmt.Errorf("the bearer token's %s claim (its %s) must be 1 to 128 characters from A-Z, a-z, 0-9, '_' and '-'", name, what)
	}
	return s, nil
}

// rolesClaim reads the roles: absent, a list of names, or one string of
// names separated by spaces or commas.
func rolesClaim(claims jwt.MapClaims, name string) ([]string, error) {
	raw, ok := claim(claims, name)
	if !ok || raw == nil {
		return nil, nil
	}
	var names []string
	switch r := raw.(type) {
	case string:
		names = strings.FieldsFunc(r, func(c rune) bool { return c == ' ' || c == ',' })
	case []any:
		for _, e := range r {
			s, ok := e.(string)
			if !ok {
				return nil, fmt.Errorf("the bearer token's %s claim must list role names (strings)", name)
			}
			names = append(names, s)
		}
	default:
		return nil, fmt.Errorf("the bearer token's %s claim must be a list of role names or a string", name)
	}
	if len(names) > MaxRoles {
		return nil, fmt.Errorf("the bearer token's %s claim names %d roles; at most %d are accepted", name, len(names), MaxRoles)
	}
	for _, n := range names {
		if !protocol.ValidToken(n) {
			return nil, fmt.Errorf("the bearer token's %s claim names role %q: role names are 1 to 128 characters from A-Z, a-z, 0-9, '_' and '-'", name, clip(n))
		}
	}
	return names, nil
}
