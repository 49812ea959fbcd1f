// Package mcptools connects a deployment to its MCP servers (Model Context
// Protocol, through the official Go SDK) and exposes their tools as
// tools.Tool, named "<server>__<tool>". It owns the client sessions and the
// stdio subprocesses: it starts them with the worker, reconnects a server
// that went away at its next call, and stops them on Close. It does not
// decide which agent gets which tool (profiles do), and knows nothing of a
// run beyond the context a call carries.
package mcptools

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/tools"
)

// Separator joins a server's name and its tool's name.
const Separator = "__"

// Wildcard after "<server>__" selects every tool of that server.
const Wildcard = Separator + "*"

// Options are the optional settings of Start; the zero value works.
type Options struct {
	Logger *zap.Logger
	// LookupEnv resolves ${VAR} in env and header values (default
	// os.LookupEnv).
	LookupEnv func(string) (string, bool)
}

// Manager holds the connections to a deployment's MCP servers and their
// tools. A nil *Manager has no servers.
type Manager struct {
	servers  []*server
	tools    []*Tool
	byServer map[string][]string
}

// Start connects to every server, lists its tools and builds them. A
// server that cannot be started or listed, an allow-listed tool a server
// does not have, or two tools with one name, fail the whole start with an
// error naming the server; nothing stays running then.
func Start(ctx context.Context, servers []config.MCPServer, opts Options) (*Manager, error) {
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.LookupEnv == nil {
		opts.LookupEnv = os.LookupEnv
	}
	m := &Manager{byServer: make(map[string][]string)}
	lists := make([][]*Tool, len(servers))
	errs := make([]error, len(servers))
	var wg sync.WaitGroup
	for i, cfg := range servers {
		s, err := newServer(cfg, opts)
		if err != nil {
			errs[i] = err
			continue
		}
		m.servers = append(m.servers, s)
		// Servers start side by side: a worker with several slow ones
		// (npx fetching a package) starts in the time of the slowest.
		wg.Go(func() { lists[i], errs[i] = s.start(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		_ = m.Close()
		return nil, err
	}
	owner := make(map[string]*Tool)
	for i, list := range lists {
		names := []string{}
		for _, t := range list {
			if prev := owner[t.name]; prev != nil {
				_ = m.Close()
				return nil, fmt.Errorf("mcp server %q: tools %q and %q (of server %q) both become %q: list only one of them in mcp.servers[%d].tools",
					t.server.cfg.Name, t.remote, prev.remote, prev.server.cfg.Name, t.name, i)
			}
			owner[t.name] = t
			names = append(names, t.name)
			m.tools = append(m.tools, t)
		}
		m.byServer[servers[i].Name] = names
	}
	return m, nil
}

// Tools lists every tool of every server, in configuration order.
func (m *Manager) Tools() []tools.Tool {
	if m == nil {
		return nil
	}
	out := make([]tools.Tool, len(m.tools))
	for i, t := range m.tools {
		out[i] = t
	}
	return out
}

// Register adds every tool to reg; a name reg already holds is an error
// rather than a silent replacement.
func (m *Manager) Register(reg *tools.Registry) error {
	if m == nil {
		return nil
	}
	for _, t := range m.tools {
		if reg.Get(t.name) != nil {
			return fmt.Errorf("mcp server %q: tool %q has the name of a built-in tool", t.server.cfg.Name, t.name)
		}
	}
	for _, t := range m.tools {
		reg.Register(t)
	}
	return nil
}

// Expand replaces every "<server>__*" in names with the names of that
// server's tools; other names pass unchanged. A name listed twice is kept
// once. A wildcard naming a server that is not configured is an error.
func (m *Manager) Expand(names []string) ([]string, error) {
	var servers []string
	if m != nil {
		for _, s := range m.servers {
			servers = append(servers, s.cfg.Name)
		}
	}
	return ExpandNames(names, servers, func(server string) ([]string, bool) {
		list, ok := m.byServer[server]
		return list, ok
	})
}

// ExpandNames is Expand over configured server names, with toolsOf giving
// the tool names a server offers. A server whose tools are not known
// (toolsOf says false) keeps its wildcard, for a caller that resolves it
// later (a configuration checked without connecting).
func ExpandNames(names, servers []string, toolsOf func(server string) ([]string, bool)) ([]string, error) {
	out := make([]string, 0, len(names))
	seen := make(map[string]bool, len(names))
	add := func(n string) {
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	for _, n := range names {
		server, ok := strings.CutSuffix(n, Wildcard)
		if !ok {
			add(n)
			continue
		}
		if !slices.Contains(servers, server) {
			configured := "none"
			if len(servers) > 0 {
				configured = strings.Join(slices.Sorted(slices.Values(servers)), ", ")
			}
			return nil, fmt.Errorf("%q selects the tools of MCP server %q, which is not configured (configured: %s)", n, server, configured)
		}
		list, known := toolsOf(server)
		if !known {
			add(n)
			continue
		}
		for _, t := range list {
			add(t)
		}
	}
	return out, nil
}

// Close ends every session and stops every stdio server (closing its
// input, then signalling it and its process group). Calls still running
// end with an error result. Call it after the workers using the tools
// stopped.
func (m *Manager) Close() error {
	if m == nil {
		return nil
	}
	var wg sync.WaitGroup
	for _, s := range m.servers {
		wg.Go(s.close)
	}
	wg.Wait()
	return nil
}
