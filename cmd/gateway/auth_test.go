package main

import (
	"crypto/sha256"
	"net"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/gateway"
)

func TestAPIKeysResolved(t *testing.T) {
	t.Setenv("TEST_ACME_KEY", "acme-key-from-the-env")
	cfg := config.Default()
	cfg.Gateway.APIKeys = []config.APIKey{{Name: "acme", Tenant: "acme", KeyEnv: "TEST_ACME_KEY"}}
	keys, err := apiKeys(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 || keys[0].Tenant != "acme" || keys[0].SHA256 != sha256.Sum256([]byte("acme-key-from-the-env")) {
		t.Fatalf("keys %+v", keys)
	}
	cfg.Gateway.APIKeys[0].KeyEnv = "TEST_UNSET_KEY"
	if _, err := apiKeys(cfg); err == nil || !strings.Contains(err.Error(), "gateway.api_keys[0] (acme): key_env") {
		t.Fatalf("unset variable: %v", err)
	}
}

func TestWarnIfOpen(t *testing.T) {
	key := []gateway.APIKey{{Name: "k", Tenant: "t"}}
	for _, c := range []struct {
		addr string
		keys []gateway.APIKey
		warn bool
	}{
		{"127.0.0.1:8080", nil, false},
		{"[::1]:8080", nil, false},
		{"0.0.0.0:8080", nil, true},
		{"10.1.2.3:8080", nil, true},
		{"0.0.0.0:8080", key, false},
	} {
		core, logs := observer.New(zapcore.WarnLevel)
		addr, err := net.ResolveTCPAddr("tcp", c.addr)
		if err != nil {
			t.Fatal(err)
		}
		warnIfOpen(zap.New(core), addr, c.keys)
		if got := logs.Len() == 1; got != c.warn {
			t.Errorf("%s with %d keys: warned %v", c.addr, len(c.keys), got)
		}
	}
}
