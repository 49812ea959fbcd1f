package app

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/remotetools"
)

// RemoteTools builds the catalog of the tools NATS clients serve as micro
// endpoints, called over nc. Discovery starts only when a configured
// profile selects remote tools (a first look before it returns, then every
// remote_tools.refresh_interval); otherwise the catalog stays empty. Stop it
// after the workers that use it stopped.
func RemoteTools(ctx context.Context, cfg config.Config, nc *nats.Conn, settings bus.Settings, log *zap.Logger) (*remotetools.Catalog, error) {
	c := remotetools.New(nc, remotetools.Options{
		Names:           settings.Names,
		Logger:          log,
		RefreshInterval: time.Duration(cfg.RemoteTools.RefreshInterval),
		Window:          time.Duration(cfg.RemoteTools.DiscoveryWindow),
		CallTimeout:     time.Duration(cfg.RemoteTools.CallTimeout),
	})
	profiles, err := Profiles(cfg)
	if err != nil {
		return nil, err
	}
	used := slices.ContainsFunc(profiles, func(p agent.Profile) bool {
		return slices.ContainsFunc(p.Tools, func(e string) bool { return strings.HasPrefix(e, remotetools.EntryPrefix) })
	})
	if !used {
		return c, nil
	}
	if err := c.Start(ctx); err != nil {
		return nil, fmt.Errorf("remote tools: %w", err)
	}
	return c, nil
}

// WithRemoteTools offers the catalog's tools to the profiles that select
// them: "remote:<name>", "remote:<prefix>*" or "remote:*" (the model sees
// "remote__<name>"). They are
// resolved when a run is prepared, for its tenant, so tools served after
// the start reach the next runs; a tool a profile does not select is not in
// the run's tool set and is refused when called by name.
func WithRemoteTools(c *remotetools.Catalog) AgentsOption {
	return func(b *agentsBuild) error {
		if c == nil {
			return nil
		}
		var errs []error
		for _, p := range b.profiles {
			for i, e := range p.Tools {
				if !strings.HasPrefix(e, remotetools.EntryPrefix) {
					continue
				}
				if err := remotetools.CheckEntry(e); err != nil {
					errs = append(errs, &agent.ProfileError{Profile: p.Name, Path: fmt.Sprintf("tools[%d]", i), Err: err})
				}
			}
		}
		if len(errs) > 0 {
			return errors.Join(errs...)
		}
		b.source = c
		return nil
	}
}
