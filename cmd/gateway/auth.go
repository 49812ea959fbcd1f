package main

import (
	"context"
	"fmt"
	"net"
	"time"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/gateway"
)

// apiKeys resolves the configured API keys to their hashes, reading the
// key files and variables now, so a missing one stops the start with its
// field.
func apiKeys(cfg config.Config) ([]gateway.APIKey, error) {
	var out []gateway.APIKey
	for i, k := range cfg.Gateway.APIKeys {
		sum, err := k.Hash()
		if err != nil {
			return nil, fmt.Errorf("gateway.api_keys[%d] (%s): %w", i, k.Name, err)
		}
		out = append(out, gateway.APIKey{Name: k.Name, Tenant: k.Tenant, User: k.UserOrName(), Roles: k.Roles, SHA256: sum})
	}
	return out, nil
}

// bearerJWT resolves gateway.jwt: the shared key is read now, and a JWKS
// is fetched now (bounded; a provider that cannot be reached is logged and
// retried, it does not stop the start) and refreshed until ctx ends. Nil
// when JWTs are not configured.
func bearerJWT(ctx context.Context, cfg config.Config, log *zap.Logger) (*gateway.JWT, error) {
	if cfg.Gateway.JWT == nil {
		return nil, nil
	}
	j := cfg.Gateway.JWT.WithDefaults()
	out := &gateway.JWT{Issuer: j.Issuer, Audience: j.Audience, Algorithms: j.Algorithms, Tenant: j.Tenant,
		TenantClaim: j.TenantClaim, UserClaim: j.UserClaim, RolesClaim: j.RolesClaim, Leeway: time.Duration(j.Leeway)}
	if j.JWKSURL != "" {
		keys, err := gateway.JWKS(ctx, j.JWKSURL, time.Duration(j.JWKSRefresh), log)
		if err != nil {
			return nil, err
		}
		out.Keys = keys
		return out, nil
	}
	key, err := j.SharedKey()
	if err != nil {
		return nil, err
	}
	out.Keys = gateway.SharedKey(key)
	return out, nil
}

// warnIfOpen says loudly that an API without credentials is reachable
// from other machines: anyone who can connect acts for any tenant.
func warnIfOpen(log *zap.Logger, addr net.Addr, authenticated bool) {
	if authenticated || gateway.Loopback(addr) {
		return
	}
	log.Warn("the HTTP API has no API keys or JWT configuration and listens beyond this machine: anyone who reaches it acts for any tenant (X-Tenant) and any user (config.user_id); configure gateway.api_keys or gateway.jwt, or listen on 127.0.0.1",
		zap.String("http", addr.String()))
}
