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
	for _, c := range []struct {
		addr string
		keys bool
		warn bool
	}{
		{"127.0.0.1:8080", false, false},
		{"[::1]:8080", false, false},
		{"0.0.0.0:8080", false, true},
		{"10.1.2.3:8080", false, true},
		{"0.0.0.0:8080", true, false},
	} {
		core, logs := observer.New(zapcore.WarnLevel)
		addr, err := net.ResolveTCPAddr("tcp", c.addr)
		if err != nil {
			t.Fatal(err)
		}
		warnIfOpen(zap.New(core), addr, c.keys)
		if got := logs.Len() == 1; got != c.warn {
			t.Errorf("%s authenticated %v: warned %v", c.addr, c.keys, got)
		}
	}
}

func TestBearerJWTResolved(t *testing.T) {
	cfg := config.Default()
	if j, err := bearerJWT(t.Context(), cfg, zap.NewNop()); j != nil || err != nil {
		t.Fatalf("no jwt section: %v %v", j, err)
	}
	cfg.Gateway.JWT = &config.JWT{Issuer: "https://id.example.com/", Audience: "natsagent", KeyEnv: "TEST_JWT_KEY", Tenant: "acme"}
	t.Setenv("TEST_JWT_KEY", "")
	if _, err := bearerJWT(t.Context(), cfg, zap.NewNop()); err == nil || !strings.Contains(err.Error(), "gateway.jwt.key_env") {
		t.Fatalf("unset key: %v", err)
	}
	t.Setenv("TEST_JWT_KEY", strings.Repeat("s", 32))
	var j *gateway.JWT
	j, err := bearerJWT(t.Context(), cfg, zap.NewNop())
	if err != nil || j.Keys == nil || strings.Join(j.Algorithms, ",") != "HS256" || j.UserClaim != "sub" || j.Leeway != config.DefaultJWTLeeway {
		t.Fatalf("resolved %+v, %v", j, err)
	}
}
