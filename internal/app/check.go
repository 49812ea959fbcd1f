package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/mcptools"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/remotetools"
	"github.com/natsagent/natsagent/internal/skills"
	"github.com/natsagent/natsagent/internal/tools"
)

// CheckProfiles assembles every agent profile of cfg as a worker does
// (Agents with WithMCP, WithMemory and WithRemoteTools) and returns the
// error the worker would return, in the same words. It connects to
// nothing: no NATS server, MCP server or model provider. Processes run it
// right after the YAML validates (Flags.Load), so a typo in a profile stops
// the start, and --print-config, before any connection.
//
// What needs a connection is stood in for:
//   - the configured model provider is built, never called;
//   - the memory store refuses every call (workers always have one, so a
//     profile may enable memory);
//   - remote tools are the catalog without discovery: entries are checked
//     as WithRemoteTools checks them, and the tools a run gets are resolved
//     per run anyway;
//   - the tools of an MCP server with an allow-list (mcp.servers[].tools)
//     are known by name, so they are checked as the worker checks them;
//   - an MCP server without one offers tools known only once the worker
//     connected to it: its entries ("<server>__<tool>", "<server>__*") are
//     selected like remote tools, and the tools shared skills depend on
//     are taken as offered. A name such a server does not offer is found at
//     the worker's start, after it connected.
func CheckProfiles(cfg config.Config) error {
	m, _, err := Model(cfg)
	if err != nil {
		return err
	}
	_, err = Agents(cfg, m, offline(cfg))
	return err
}

// ProfileProblems is CheckProfiles in a person's words: every mistake the
// assembly finds, each with its YAML path (agents[0].tools[1],
// agents[2].middleware.settings.loop_detection) and its line when the file
// holds it, to be reported with the rest of the configuration's. A
// profile whose name or kind the configuration already refused
// (config.Validate says why) is left out, so it is not reported twice.
// other holds what has no place in a profile (a model that cannot be
// built, say), in the worker's words.
func ProfileProblems(cfg config.Config) (located, other []string) {
	index := make(map[string]int)
	var keep []config.Agent
	for i, a := range cfg.Agents {
		if _, dup := index[a.Name]; dup || !protocol.ValidToken(a.Name) {
			continue
		}
		if a.Kind != "" && a.Kind != middleware.KindLead && a.Kind != middleware.KindSubagent {
			continue
		}
		index[a.Name] = i
		keep = append(keep, a)
	}
	cfg.Agents = keep
	err := CheckProfiles(cfg)
	if err == nil {
		return nil, nil
	}
	for _, e := range flatten(err) {
		var pe *agent.ProfileError
		if errors.As(e, &pe) {
			if i, ok := index[pe.Profile]; ok {
				located = append(located, fmt.Sprintf("%s: %v", cfg.Where(fmt.Sprintf("agents[%d].%s", i, pe.Path)), pe.Err))
				continue
			}
		}
		other = append(other, e.Error())
	}
	return located, other
}

// flatten lists the errors of an errors.Join, and of the joins it holds.
func flatten(err error) []error {
	j, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return []error{err}
	}
	var out []error
	for _, e := range j.Unwrap() {
		out = append(out, flatten(e)...)
	}
	return out
}

// offline is WithMCP, WithMemory and WithRemoteTools, in the worker's
// order, without their connections (CheckProfiles).
func offline(cfg config.Config) AgentsOption {
	return func(b *agentsBuild) error {
		mcp := newOfflineMCP(cfg.MCP.Servers)
		// No built-in tool holds "__", so none collides with these.
		for _, n := range mcp.known {
			b.registry.Register(placeholder(n))
		}
		var errs []error
		for i := range b.profiles {
			names, err := mcp.expand(b.profiles[i].Tools)
			if err != nil {
				errs = append(errs, &agent.ProfileError{Profile: b.profiles[i].Name, Path: "tools", Err: err})
				continue
			}
			b.profiles[i].Tools = names
		}
		if len(errs) > 0 {
			return errors.Join(errs...)
		}
		for _, n := range skillTools(cfg) {
			if mcp.unlisted(n) && b.registry.Get(n) == nil {
				b.registry.Register(placeholder(n))
			}
		}
		b.memory = offlineMemory{}
		if err := WithRemoteTools(remotetools.New(nil, remotetools.Options{}))(b); err != nil {
			return err
		}
		b.source = offlineSource{remote: b.source, mcp: mcp}
		return nil
	}
}

// offlineMCP is what the configuration tells of the MCP servers' tools.
type offlineMCP struct {
	servers []string            // every configured server
	listed  map[string][]string // tool names of the servers with an allow-list
	known   []string            // all of listed's names, in configuration order
}

func newOfflineMCP(servers []config.MCPServer) offlineMCP {
	o := offlineMCP{listed: make(map[string][]string)}
	for _, s := range servers {
		o.servers = append(o.servers, s.Name)
		if len(s.Tools) == 0 {
			continue
		}
		names := []string{}
		for _, t := range s.Tools {
			n := mcptools.Name(s.Name, t)
			if slices.Contains(o.known, n) {
				// Two tools with one name fail the MCP start, which says
				// which; the profiles can be checked with one of them.
				continue
			}
			o.known = append(o.known, n)
			names = append(names, n)
		}
		o.listed[s.Name] = names
	}
	return o
}

// unlisted reports whether name is a tool name of a configured server
// without an allow-list.
func (o offlineMCP) unlisted(name string) bool {
	for _, s := range o.servers {
		// A prefix, not a cut at the first "__": a server may end in "_".
		if _, listed := o.listed[s]; !listed && strings.HasPrefix(name, s+mcptools.Separator) {
			return true
		}
	}
	return false
}

// expand is mcptools.Manager.Expand: "<server>__*" becomes the allow-list
// of its server, and stays for a server without one (offlineSource selects
// it); a wildcard naming no configured server is an error.
func (o offlineMCP) expand(names []string) ([]string, error) {
	return mcptools.ExpandNames(names, o.servers, func(server string) ([]string, bool) {
		list, listed := o.listed[server]
		return list, listed
	})
}

// offlineSource is the remote tool catalog, plus the entries of the MCP
// servers whose tools are unknown until a worker connects to them.
type offlineSource struct {
	remote agent.ToolSource
	mcp    offlineMCP
}

func (s offlineSource) Select(entry string) (string, bool) {
	if p, ok := s.remote.Select(entry); ok {
		return p, true
	}
	if s.mcp.unlisted(entry) {
		return entry, true
	}
	return "", false
}

func (s offlineSource) Claims(name string) bool { return s.remote.Claims(name) }

func (offlineSource) Tools(string) []tools.Tool { return nil }

// skillTools lists the tools the shared skills of the profiles depend on
// (settings.skills.dir, or a skills entry of the user segment). A
// directory that does not load is left to Assemble, which says why.
func skillTools(cfg config.Config) []string {
	var dirs []string
	addDir := func(settings map[string]any) {
		if d, ok := settings["dir"].(string); ok && d != "" && !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	for _, a := range cfg.Agents {
		addDir(a.Middleware.Settings["skills"])
		for _, u := range a.Middleware.User {
			if u.Use == "skills" {
				addDir(u.Settings)
			}
		}
	}
	var out []string
	for _, d := range dirs {
		shared, err := skills.LoadDir(d)
		if err != nil {
			continue
		}
		for _, sk := range shared {
			out = append(out, sk.Tools...)
		}
	}
	return out
}

// errOffline is what the stand-ins of CheckProfiles answer; the agents it
// builds are never run.
var errOffline = errors.New("a configuration check connects to nothing")

func placeholder(name string) tools.Tool {
	return tools.Func(model.ToolSpec{Name: name, Description: "checked by name only"},
		func(context.Context, json.RawMessage) (string, error) { return "", errOffline })
}

type offlineMemory struct{}

func (offlineMemory) Notes(context.Context, string, string) (string, error) { return "", errOffline }

func (offlineMemory) AppendNote(context.Context, string, string, string) (middleware.NoteAppend, error) {
	return middleware.NoteAppend{}, errOffline
}

func (offlineMemory) Facts(context.Context, string, string) ([]middleware.MemoryFact, error) {
	return nil, errOffline
}

func (offlineMemory) EnqueueMemoryJob(context.Context, middleware.MemoryJob) error {
	return errOffline
}
