package main

import (
	"fmt"
	"net"

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
		out = append(out, gateway.APIKey{Name: k.Name, Tenant: k.Tenant, SHA256: sum})
	}
	return out, nil
}

// warnIfOpen says loudly that an API without keys is reachable from other
// machines: anyone who can connect acts for any tenant.
func warnIfOpen(log *zap.Logger, addr net.Addr, keys []gateway.APIKey) {
	if len(keys) > 0 || gateway.Loopback(addr) {
		return
	}
	log.Warn("the HTTP API has no API keys and listens beyond this machine: anyone who reaches it acts for any tenant (X-Tenant); configure gateway.api_keys or listen on 127.0.0.1",
		zap.String("http", addr.String()))
}
