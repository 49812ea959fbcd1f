package config

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func clearNATSAuthEnv(t *testing.T) {
	t.Helper()
	for _, env := range NATSAuthEnv() {
		t.Setenv(env, "")
	}
}

func TestNATSAuthFromFileAndEnvironment(t *testing.T) {
	clearNATSAuthEnv(t)
	p := writeConfig(t, `
nats:
  user: svc
  password: from-the-file
  tls:
    ca_file: /etc/nats/ca.pem
    server_name: nats.internal
`)
	t.Setenv(EnvNATSPassword, "from-the-env")
	t.Setenv(EnvNATSCert, "/etc/nats/client.pem")
	t.Setenv(EnvNATSKey, "/etc/nats/client-key.pem")
	cfg, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	n := cfg.NATS
	if n.User != "svc" || n.Password != "from-the-env" || n.TLS.CAFile != "/etc/nats/ca.pem" ||
		n.TLS.CertFile != "/etc/nats/client.pem" || n.TLS.KeyFile != "/etc/nats/client-key.pem" || n.TLS.ServerName != "nats.internal" {
		t.Fatalf("nats section %+v", n)
	}
	out := cfg.String()
	if strings.Contains(out, "from-the-env") || strings.Contains(out, "from-the-file") || !strings.Contains(out, "password: '****'") {
		t.Fatalf("password not masked:\n%s", out)
	}

	t.Setenv(EnvNATSPassword, "")
	t.Setenv(EnvNATSToken, "a-token-from-env")
	if _, err := Load(p); err == nil || !strings.Contains(err.Error(), "nats.token: cannot be combined with nats.user") {
		t.Fatalf("token and user: %v", err)
	}
}

func TestNATSAuthValidationNamesTheField(t *testing.T) {
	clearNATSAuthEnv(t)
	cases := map[string]string{
		"nats:\n  password: x\n":                                                                                  "nats.password: is set but nats.user is not",
		"nats:\n  user: x\n":                                                                                      "nats.user: is set but nats.password is not",
		"nats:\n  token: t\n  creds_file: /c\n":                                                                   "nats.creds_file: cannot be combined with nats.token",
		"nats:\n  nkey_seed_file: /n\n  creds_file: /c\n":                                                         "nats.creds_file: cannot be combined with nats.nkey_seed_file",
		"nats:\n  tls:\n    cert_file: /c\n":                                                                      "nats.tls.key_file: is required",
		"nats:\n  tls:\n    key_file: /k\n":                                                                       "nats.tls.cert_file: is required",
		"nats:\n  tls:\n    ca_flie: /k\n":                                                                        "ca_flie",
		"gateway:\n  api_keys:\n    - {tenant: a, key_env: K}\n":                                                  "gateway.api_keys[0].name: is required",
		"gateway:\n  api_keys:\n    - {name: a, tenant: a.b, key_env: K}\n":                                       "gateway.api_keys[0].tenant",
		"gateway:\n  api_keys:\n    - {name: a, tenant: a}\n":                                                     "gateway.api_keys[0]: needs one of",
		"gateway:\n  api_keys:\n    - {name: a, tenant: a, key_env: K, key_file: /f}\n":                           "gateway.api_keys[0]: sets 2",
		"gateway:\n  api_keys:\n    - {name: a, tenant: a, key: short}\n":                                         "gateway.api_keys[0].key: is 5 characters",
		"gateway:\n  api_keys:\n    - {name: a, tenant: a, key_sha256: abc}\n":                                    "gateway.api_keys[0].key_sha256",
		"gateway:\n  api_keys:\n    - {name: a, tenant: a, key_env: K}\n    - {name: a, tenant: b, key_env: L}\n": "gateway.api_keys[1].name",
	}
	loadRefuses(t, cases)
}

func TestAPIKeyHashFromEachSource(t *testing.T) {
	const key = "0123456789abcdef-key"
	want := sha256.Sum256([]byte(key))
	file := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(file, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TEST_GATEWAY_KEY", key)
	for _, k := range []APIKey{
		{KeySHA256: hex.EncodeToString(want[:])},
		{Key: key},
		{KeyFile: file},
		{KeyEnv: "TEST_GATEWAY_KEY"},
	} {
		got, err := k.Hash()
		if err != nil || got != want {
			t.Errorf("%+v: %x, %v", k, got, err)
		}
	}
	t.Setenv("TEST_GATEWAY_KEY", "")
	if _, err := (APIKey{KeyEnv: "TEST_GATEWAY_KEY"}).Hash(); err == nil || !strings.Contains(err.Error(), "key_env") {
		t.Errorf("unset env: %v", err)
	}
	if _, err := (APIKey{KeyFile: file + ".missing"}).Hash(); err == nil || !strings.Contains(err.Error(), "key_file") {
		t.Errorf("missing file: %v", err)
	}

	cfg := Default()
	cfg.Gateway.APIKeys = []APIKey{{Name: "ci", Tenant: "acme", Key: key}}
	if out := cfg.String(); strings.Contains(out, key) || !strings.Contains(out, "key: '****'") {
		t.Fatalf("key not masked:\n%s", out)
	}
}
