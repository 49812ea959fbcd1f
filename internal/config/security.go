package config

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
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
// tenant every request made with it acts for. The key itself comes from
// exactly one of KeySHA256 (preferred: the file holds no secret), Key,
// KeyFile or KeyEnv.
type APIKey struct {
	// Name identifies the key in logs (never the key itself).
	Name   string `yaml:"name"`
	Tenant string `yaml:"tenant"`
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
