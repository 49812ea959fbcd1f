package config

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"
)

// TLS configures TLS to the NATS servers. Setting any field turns TLS on;
// a tls:// URL does too (then the system roots verify the server).
type TLS struct {
	// CAFile holds the PEM certificates that verify the servers (default:
	// the system roots).
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are this process's client certificate and key,
	// for servers that verify clients (mutual TLS).
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ServerName is the name the server's certificate must carry when it
	// differs from the URL's host.
	ServerName string `yaml:"server_name"`
}

// Enabled reports whether any TLS setting is present.
func (t TLS) Enabled() bool {
	return t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" || t.ServerName != ""
}

// Environment variables of the NATS credentials, named as the nats CLI
// names them (NATS_TLS_SERVER_NAME is natsagent's own). Each overrides its
// field of the nats section.
const (
	EnvNATSUser          = "NATS_USER"
	EnvNATSPassword      = "NATS_PASSWORD"
	EnvNATSToken         = "NATS_TOKEN"
	EnvNATSNkey          = "NATS_NKEY"
	EnvNATSCreds         = "NATS_CREDS"
	EnvNATSCA            = "NATS_CA"
	EnvNATSCert          = "NATS_CERT"
	EnvNATSKey           = "NATS_KEY"
	EnvNATSTLSServerName = "NATS_TLS_SERVER_NAME"
)

// NATSAuthEnv lists the environment variables of the NATS credentials.
func NATSAuthEnv() []string {
	return []string{EnvNATSUser, EnvNATSPassword, EnvNATSToken, EnvNATSNkey, EnvNATSCreds,
		EnvNATSCA, EnvNATSCert, EnvNATSKey, EnvNATSTLSServerName}
}

func (n *NATS) applyAuthEnv(get func(string) string) {
	for env, field := range map[string]*string{
		EnvNATSUser: &n.User, EnvNATSNkey: &n.NkeySeedFile, EnvNATSCreds: &n.CredsFile,
		EnvNATSCA: &n.TLS.CAFile, EnvNATSCert: &n.TLS.CertFile, EnvNATSKey: &n.TLS.KeyFile,
		EnvNATSTLSServerName: &n.TLS.ServerName,
	} {
		if v := get(env); v != "" {
			*field = v
		}
	}
	if v := get(EnvNATSPassword); v != "" {
		n.Password = Secret(v)
	}
	if v := get(EnvNATSToken); v != "" {
		n.Token = Secret(v)
	}
}

// validateAuth checks that the credentials name one way to authenticate.
// Files are read when connecting (internal/app), where a missing or
// unreadable one is reported with its field.
func (n *NATS) validateAuth(bad func(path, format string, args ...any)) {
	var kinds []string
	if n.User != "" || n.Password != "" {
		kinds = append(kinds, "nats.user")
		if n.User == "" {
			bad("nats.password", "is set but nats.user is not (env %s)", EnvNATSUser)
		}
		if n.Password == "" {
			bad("nats.user", "is set but nats.password is not (env %s)", EnvNATSPassword)
		}
	}
	if n.Token != "" {
		kinds = append(kinds, "nats.token")
	}
	if n.NkeySeedFile != "" {
		kinds = append(kinds, "nats.nkey_seed_file")
	}
	if n.CredsFile != "" {
		kinds = append(kinds, "nats.creds_file")
	}
	if len(kinds) > 1 {
		for _, k := range kinds[1:] {
			bad(k, "cannot be combined with %s: configure one way to authenticate (user and password, token, nkey seed file or creds file)", kinds[0])
		}
	}
	if (n.TLS.CertFile == "") != (n.TLS.KeyFile == "") {
		if n.TLS.CertFile == "" {
			bad("nats.tls.cert_file", "is required with nats.tls.key_file (env %s)", EnvNATSCert)
		} else {
			bad("nats.tls.key_file", "is required with nats.tls.cert_file (env %s)", EnvNATSKey)
		}
	}
}

// APIKey is a credential of the gateway's HTTP API, mapped to the one
// principal every request made with it acts as: a user of one tenant with
// roles. The key itself comes from exactly one of KeySHA256 (preferred:
// the file holds no secret), Key, KeyFile or KeyEnv.
type APIKey struct {
	// Name identifies the key in logs (never the key itself).
	Name   string `yaml:"name"`
	Tenant string `yaml:"tenant"`
	// User is the user the key acts as (default: the key's name); it
	// owns per-user data such as memory.
	User string `yaml:"user"`
	// Roles name policy.roles entries (default: policy.default_roles).
	Roles []string `yaml:"roles"`
	// KeySHA256 is the hex SHA-256 of the key, e.g. the output of
	// `printf %s "$KEY" | sha256sum`.
	KeySHA256 string `yaml:"key_sha256"`
	// Key is the key in clear text.
	Key Secret `yaml:"key"`
	// KeyFile is a file holding the key (surrounding white space is
	// ignored), such as a mounted secret.
	KeyFile string `yaml:"key_file"`
	// KeyEnv names an environment variable holding the key.
	KeyEnv string `yaml:"key_env"`
}

// MinAPIKeyLength bounds a key given in clear text from below; a hash is
// trusted to come from a long enough key.
const MinAPIKeyLength = 16

var (
	hexSHA256 = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)
	// tenantName is protocol.ValidToken's rule, repeated so that the
	// configuration depends on no other package.
	tenantName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)
)

// Hash returns the SHA-256 of the key, reading KeyFile or KeyEnv.
func (k APIKey) Hash() ([sha256.Size]byte, error) {
	var sum [sha256.Size]byte
	var key string
	switch {
	case k.KeySHA256 != "":
		if !hexSHA256.MatchString(k.KeySHA256) {
			return sum, errors.New("key_sha256: must be 64 hexadecimal characters (a SHA-256)")
		}
		_, _ = hex.Decode(sum[:], []byte(k.KeySHA256))
		return sum, nil
	case k.Key != "":
		key = string(k.Key)
	case k.KeyFile != "":
		data, err := os.ReadFile(k.KeyFile)
		if err != nil {
			return sum, fmt.Errorf("key_file: %w", err)
		}
		key = strings.TrimSpace(string(data))
		if key == "" {
			return sum, fmt.Errorf("key_file: %s is empty", k.KeyFile)
		}
	case k.KeyEnv != "":
		key = os.Getenv(k.KeyEnv)
		if key == "" {
			return sum, fmt.Errorf("key_env: the environment variable %s is not set", k.KeyEnv)
		}
	default:
		return sum, errors.New("key_sha256: one of key_sha256, key, key_file or key_env is required")
	}
	if len(key) < MinAPIKeyLength {
		return sum, fmt.Errorf("the key is %d characters long; use at least %d random ones", len(key), MinAPIKeyLength)
	}
	return sha256.Sum256([]byte(key)), nil
}

// UserOrName is the user a key acts as: User, else the key's name.
func (k APIKey) UserOrName() string {
	if k.User != "" {
		return k.User
	}
	return k.Name
}

func (g *Gateway) validateAPIKeys(bad func(path, format string, args ...any)) {
	names := make(map[string]bool)
	for i, k := range g.APIKeys {
		path := fmt.Sprintf("gateway.api_keys[%d]", i)
		switch {
		case k.Name == "":
			bad(path+".name", "is required (it names the key in logs)")
		case names[k.Name]:
			bad(path+".name", "%q is used by another key", k.Name)
		}
		names[k.Name] = true
		if !tenantName.MatchString(k.Tenant) {
			bad(path+".tenant", "%q is not a valid tenant id: use 1 to 128 characters from A-Z, a-z, 0-9, '_' and '-'", k.Tenant)
		}
		switch {
		case k.User != "" && !tenantName.MatchString(k.User):
			bad(path+".user", "%q is not a valid user id: use 1 to 128 characters from A-Z, a-z, 0-9, '_' and '-'", k.User)
		case k.User == "" && k.Name != "" && !tenantName.MatchString(k.Name):
			bad(path+".user", "is not set, and the key's name %q is not a valid user id: set user (1 to 128 characters from A-Z, a-z, 0-9, '_' and '-')", k.Name)
		}
		validateRoleNames(path+".roles", k.Roles, bad)
		sources := 0
		for _, s := range []string{k.KeySHA256, string(k.Key), k.KeyFile, k.KeyEnv} {
			if s != "" {
				sources++
			}
		}
		switch {
		case sources == 0:
			bad(path, "needs one of key_sha256, key, key_file or key_env")
		case sources > 1:
			bad(path, "sets %d of key_sha256, key, key_file and key_env; set one", sources)
		case k.KeySHA256 != "" && !hexSHA256.MatchString(k.KeySHA256):
			bad(path+".key_sha256", "must be 64 hexadecimal characters (a SHA-256)")
		case k.Key != "" && len(k.Key) < MinAPIKeyLength:
			bad(path+".key", "is %d characters long; use at least %d random ones", len(k.Key), MinAPIKeyLength)
		}
	}
}

// JWT configures bearer JWTs (OIDC access or ID tokens) as credentials of
// the HTTP API. Their keys come from exactly one of JWKSURL (public keys
// of an identity provider) or a shared HMAC key (KeyFile or KeyEnv); one
// configuration never accepts both kinds of algorithm, so a token cannot
// pass an RSA public key off as an HMAC secret.
type JWT struct {
	// Issuer must equal the token's iss claim.
	Issuer string `yaml:"issuer"`
	// Audience must be one of the token's aud claim.
	Audience string `yaml:"audience"`
	// JWKSURL serves the provider's JSON Web Key Set (https, or http on
	// a loopback host). It is fetched at start, refreshed every
	// JWKSRefresh, and again (at most once a minute) when a token names
	// an unknown key id.
	JWKSURL string `yaml:"jwks_url"`
	// KeyFile or KeyEnv hold a shared HMAC key of at least 32 bytes.
	KeyFile string `yaml:"key_file"`
	KeyEnv  string `yaml:"key_env"`
	// Algorithms are the accepted signature algorithms (default RS256 and
	// ES256 with a JWKS, HS256 with a shared key).
	Algorithms []string `yaml:"algorithms"`
	// Tenant is the one tenant every token acts for; else TenantClaim
	// names the claim holding it. One of them is required.
	Tenant      string `yaml:"tenant"`
	TenantClaim string `yaml:"tenant_claim"`
	// UserClaim names the claim of the user (default sub).
	UserClaim string `yaml:"user_claim"`
	// RolesClaim names the claim of the roles, a list or a string of
	// names separated by spaces or commas (default roles). A dotted name
	// reads a nested claim (realm_access.roles).
	RolesClaim string `yaml:"roles_claim"`
	// Leeway tolerates clock skew on exp, nbf and iat (default 30s).
	Leeway Duration `yaml:"leeway"`
	// JWKSRefresh is how often the key set is fetched again (default 1h).
	JWKSRefresh Duration `yaml:"jwks_refresh"`
}

// Signature algorithms of JWT.Algorithms, by kind of key.
var (
	JWKSAlgorithms   = []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
	SharedAlgorithms = []string{"HS256", "HS384", "HS512"}
)

// MinJWTKeyBytes bounds a shared HMAC key from below (RFC 7518 3.2: a key
// at least as long as the hash).
const MinJWTKeyBytes = 32

// Defaults of JWT.
const (
	DefaultJWTLeeway   = 30 * time.Second
	DefaultJWKSRefresh = time.Hour
	MaxJWTLeeway       = 5 * time.Minute
)

// WithDefaults fills the claim names, algorithms and durations left empty.
func (j JWT) WithDefaults() JWT {
	if j.UserClaim == "" {
		j.UserClaim = "sub"
	}
	if j.RolesClaim == "" {
		j.RolesClaim = "roles"
	}
	if len(j.Algorithms) == 0 {
		if j.JWKSURL != "" {
			j.Algorithms = []string{"RS256", "ES256"}
		} else {
			j.Algorithms = []string{"HS256"}
		}
	}
	if j.Leeway == 0 {
		j.Leeway = Duration(DefaultJWTLeeway)
	}
	if j.JWKSRefresh == 0 {
		j.JWKSRefresh = Duration(DefaultJWKSRefresh)
	}
	return j
}

// SharedKey reads the shared HMAC key from KeyFile or KeyEnv.
func (j JWT) SharedKey() ([]byte, error) {
	var key []byte
	switch {
	case j.KeyFile != "":
		data, err := os.ReadFile(j.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("gateway.jwt.key_file: %w", err)
		}
		key = []byte(strings.TrimSpace(string(data)))
	case j.KeyEnv != "":
		key = []byte(os.Getenv(j.KeyEnv))
		if len(key) == 0 {
			return nil, fmt.Errorf("gateway.jwt.key_env: the environment variable %s is not set", j.KeyEnv)
		}
	default:
		return nil, errors.New("gateway.jwt: no shared key: set key_file or key_env")
	}
	if len(key) < MinJWTKeyBytes {
		return nil, fmt.Errorf("gateway.jwt: the shared key is %d bytes long; use at least %d random bytes", len(key), MinJWTKeyBytes)
	}
	return key, nil
}

func (j *JWT) validate(bad func(path, format string, args ...any)) {
	if j == nil {
		return
	}
	const p = "gateway.jwt"
	if j.Issuer == "" {
		bad(p+".issuer", "is required: the iss claim of the tokens your identity provider issues")
	}
	if j.Audience == "" {
		bad(p+".audience", "is required: the aud claim your identity provider puts in tokens for this API")
	}
	sources := 0
	for _, s := range []string{j.JWKSURL, j.KeyFile, j.KeyEnv} {
		if s != "" {
			sources++
		}
	}
	if sources != 1 {
		bad(p, "set exactly one of jwks_url (public keys of an identity provider), key_file or key_env (a shared HMAC key), not %d", sources)
	}
	allowed := SharedAlgorithms
	if j.JWKSURL != "" {
		allowed = JWKSAlgorithms
		u, err := url.Parse(j.JWKSURL)
		switch {
		case err != nil || u.Host == "":
			bad(p+".jwks_url", "%q is not a URL", j.JWKSURL)
		case u.Scheme == "https":
		case u.Scheme == "http" && loopbackHost(u.Hostname()):
		default:
			bad(p+".jwks_url", "must use https (http only on a loopback host): whoever can change the key set in transit can sign tokens")
		}
	}
	for i, a := range j.Algorithms {
		if !slices.Contains(allowed, a) {
			kind := "a shared key (key_file, key_env)"
			if j.JWKSURL != "" {
				kind = "jwks_url"
			}
			bad(fmt.Sprintf("%s.algorithms[%d]", p, i), "%q cannot be used with %s: use one of %s", a, kind, strings.Join(allowed, ", "))
		}
	}
	switch {
	case j.Tenant == "" && j.TenantClaim == "":
		bad(p, "set tenant (every token acts for one tenant) or tenant_claim (the claim naming the tenant)")
	case j.Tenant != "" && j.TenantClaim != "":
		bad(p+".tenant_claim", "cannot be combined with tenant; set one")
	case j.Tenant != "" && !tenantName.MatchString(j.Tenant):
		bad(p+".tenant", "%q is not a valid tenant id: use 1 to 128 characters from A-Z, a-z, 0-9, '_' and '-'", j.Tenant)
	}
	if l := time.Duration(j.Leeway); l < 0 || l > MaxJWTLeeway {
		bad(p+".leeway", "must be between 0s and %s", MaxJWTLeeway)
	}
	if r := time.Duration(j.JWKSRefresh); r != 0 && r < time.Minute {
		bad(p+".jwks_refresh", "must be at least 1m")
	}
}

// loopbackHost reports whether host names this machine.
func loopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
