package app

import (
	"context"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/mcptools"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/tools"
)

// MCP connects to the configured MCP servers (none: an empty manager).
// Close it after the workers that use its tools have stopped.
func MCP(ctx context.Context, cfg config.Config, log *zap.Logger) (*mcptools.Manager, error) {
	// Its errors name the server already.
	return mcptools.Start(ctx, cfg.MCP.Servers, mcptools.Options{Logger: log})
}

// AgentsOption adds to what Agents builds.
type AgentsOption func(*agentsBuild) error

// agentsBuild is what options of Agents may change before the agents are
// assembled.
type agentsBuild struct {
	registry *tools.Registry
	profiles []agent.Profile
	memory   middleware.MemoryStore // WithMemory
	source   agent.ToolSource       // WithRemoteTools
}

// WithMCP adds the tools of the deployment's MCP servers. Profiles select
// them by name ("<server>__<tool>") or all of a server's at once
// ("<server>__*"); the wildcard is expanded here, once, so the agents see
// plain names.
func WithMCP(m *mcptools.Manager) AgentsOption {
	return func(b *agentsBuild) error {
		if err := m.Register(b.registry); err != nil {
			return err
		}
		for i := range b.profiles {
			names, err := m.Expand(b.profiles[i].Tools)
			if err != nil {
				return &agent.ProfileError{Profile: b.profiles[i].Name, Path: "tools", Err: err}
			}
			b.profiles[i].Tools = names
		}
		return nil
	}
}
