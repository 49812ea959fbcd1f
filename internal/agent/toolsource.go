package agent

import (
	"fmt"
	"strings"

	"github.com/natsagent/natsagent/internal/tools"
)

// ToolSource supplies tools that come and go while a worker runs (remote
// tools served over NATS). A profile selects them with entries the source
// recognises ("remote:<name>", "remote:*"); they are resolved when a run is
// prepared, for the run's tenant, so a tool that appeared after the start
// is offered to the next run without a restart, and a run's tool list
// never changes under it.
type ToolSource interface {
	// Select returns the tool names a profile's tools entry selects, as a
	// name or a prefix ending in "*" ("remote:crm_*" → "remote__crm_*"),
	// and false for an entry that is not the source's.
	Select(entry string) (pattern string, ok bool)
	// Claims reports whether a tool name is in the source's namespace;
	// no registry tool may be.
	Claims(name string) bool
	// Tools lists the tenant's tools as they are known now, in a stable
	// order.
	Tools(tenant string) []tools.Tool
}

// toolSelection is a profile's tools entries, split between the registry's
// names (checked at start) and the patterns of the source's entries
// (resolved per run).
type toolSelection struct {
	static   []string
	patterns []string
}

func selectTools(names []string, src ToolSource) toolSelection {
	var s toolSelection
	for _, n := range names {
		if src == nil {
			s.static = append(s.static, n)
		} else if p, ok := src.Select(n); ok {
			s.patterns = append(s.patterns, p)
		} else {
			s.static = append(s.static, n)
		}
	}
	return s
}

// selects reports whether one of the source's patterns matches name.
func (s toolSelection) selects(name string) bool {
	for _, p := range s.patterns {
		if prefix, ok := strings.CutSuffix(p, "*"); ok && strings.HasPrefix(name, prefix) || p == name {
			return true
		}
	}
	return false
}

// checkNamespace refuses a registry tool whose name a source owns: the
// source's tools could never be told from it.
func checkNamespace(reg *tools.Registry, src ToolSource) error {
	if src == nil {
		return nil
	}
	for _, n := range reg.Names() {
		if src.Claims(n) {
			return fmt.Errorf("tool %q (built-in or MCP) has a name in the namespace of remote tools; rename it (an MCP server cannot be named \"remote\")", n)
		}
	}
	return nil
}

// toolSet resolves a profile's tools for a run of tenant: the registry's,
// in the profile's order, then the source's that the profile selects.
func (a *Agents) toolSet(profile, tenant string) (*tools.Set, error) {
	sel := a.selections[profile]
	set, err := a.tools.Select(sel.static)
	if err != nil || len(sel.patterns) == 0 || a.source == nil {
		return set, err
	}
	names := set.Names()
	ts := make([]tools.Tool, 0, len(names))
	for _, n := range names {
		ts = append(ts, set.Get(n))
	}
	for _, t := range a.source.Tools(tenant) {
		if n := t.Spec().Name; sel.selects(n) && set.Get(n) == nil {
			ts = append(ts, t)
		}
	}
	return tools.NewSet(ts...)
}
