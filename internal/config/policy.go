package config

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"unicode"
)

// Policy gives roles their permissions. A principal (an API key's, a
// bearer token's or a NATS user's) holds roles; what it may do is the
// union of what its roles grant, less the tools any of them denies. A
// role grants nothing it does not name: a role with no agents runs no
// agent. Without any role configured, every principal may run every agent
// with every tool, and none may choose always_trust, act for another user
// or read another user's threads (internal/policy).
type Policy struct {
	// DefaultRoles are the roles of a principal that has none.
	DefaultRoles []string `yaml:"default_roles"`
	// Roles maps a role name to its permissions.
	Roles map[string]Role `yaml:"roles"`
	// NATSUsers gives roles to the NATS users that submit runs, keyed
	// "<tenant>/<user>"; a NATS user's role:<name> tags add to them.
	NATSUsers map[string][]string `yaml:"nats_users"`
}

// Role is what a role permits.
type Role struct {
	// Agents the role may run: names, or "*" for every one.
	Agents []string `yaml:"agents"`
	// Tools the role's runs may be offered.
	Tools ToolRule `yaml:"tools"`
	// AlwaysTrust lets the role choose tool_approval_mode always_trust
	// (tools that need approval run without asking).
	AlwaysTrust bool `yaml:"always_trust"`
	// ActForOthers lets the role set config.user_id to another user (and
	// so read and write that user's memory).
	ActForOthers bool `yaml:"act_for_others"`
	// ReadAllThreads lets the role use the threads other users of its
	// tenant created.
	ReadAllThreads bool `yaml:"read_all_threads"`
	// EraseUsers lets the role erase a user of its tenant: every thread
	// the user owns and their memory (DELETE /users/{user_id}).
	EraseUsers bool `yaml:"erase_users"`
}

// ToolRule selects tools by name; a name ending in "*" selects every tool
// whose name starts with what precedes it ("mcp__github__*").
type ToolRule struct {
	// Allow lists the tools the role grants ("*": every one).
	Allow []string `yaml:"allow"`
	// Deny lists tools no run of a principal holding the role is
	// offered, whatever its other roles allow.
	Deny []string `yaml:"deny"`
}

// Configured reports whether any role is configured.
func (p Policy) Configured() bool { return len(p.Roles) > 0 }

const roleRule = "use 1 to 128 characters from A-Z, a-z, 0-9, '_' and '-'"

func validateRoleNames(path string, roles []string, bad func(path, format string, args ...any)) {
	for i, r := range roles {
		if !tenantName.MatchString(r) {
			bad(fmt.Sprintf("%s[%d]", path, i), "%q is not a valid role name: %s", r, roleRule)
		}
	}
}

// validate checks the policy, and that the roles API keys name exist.
func (p *Policy) validate(keys []APIKey, bad func(path, format string, args ...any)) {
	validateRoleNames("policy.default_roles", p.DefaultRoles, bad)
	for _, n := range slices.Sorted(maps.Keys(p.Roles)) {
		path := "policy.roles." + n
		if !tenantName.MatchString(n) {
			bad(path, "%q is not a valid role name: %s", n, roleRule)
			continue
		}
		r := p.Roles[n]
		for i, a := range r.Agents {
			if a != "*" && !tenantName.MatchString(a) {
				bad(fmt.Sprintf("%s.agents[%d]", path, i), "%q is not an agent name or \"*\"", a)
			}
		}
		validateToolPatterns(path+".tools.allow", r.Tools.Allow, bad)
		validateToolPatterns(path+".tools.deny", r.Tools.Deny, bad)
	}
	if p.Configured() {
		for i, r := range p.DefaultRoles {
			if _, ok := p.Roles[r]; !ok {
				bad(fmt.Sprintf("policy.default_roles[%d]", i), "%q is not in policy.roles", r)
			}
		}
		for i, k := range keys {
			for j, r := range k.Roles {
				if _, ok := p.Roles[r]; !ok {
					bad(fmt.Sprintf("gateway.api_keys[%d].roles[%d]", i, j), "%q is not in policy.roles", r)
				}
			}
		}
	}
	for _, u := range slices.Sorted(maps.Keys(p.NATSUsers)) {
		path := fmt.Sprintf("policy.nats_users[%q]", u)
		tenant, user, ok := strings.Cut(u, "/")
		if !ok || !tenantName.MatchString(tenant) || !tenantName.MatchString(user) {
			bad(path, "must be \"<tenant>/<user>\", each %s", strings.TrimPrefix(roleRule, "use "))
		}
		validateRoleNames(path, p.NATSUsers[u], bad)
		for j, r := range p.NATSUsers[u] {
			if _, ok := p.Roles[r]; p.Configured() && !ok {
				bad(fmt.Sprintf("%s[%d]", path, j), "%q is not in policy.roles", r)
			}
		}
	}
}

// validateToolPatterns accepts tool names and prefixes ending in "*":
// printable, no white space, "*" only at the end.
func validateToolPatterns(path string, pats []string, bad func(path, format string, args ...any)) {
	for i, t := range pats {
		body := strings.TrimSuffix(t, "*")
		ok := t != "" && len(t) <= 256 && !strings.Contains(body, "*")
		for _, c := range body {
			if !unicode.IsPrint(c) || unicode.IsSpace(c) {
				ok = false
			}
		}
		if !ok {
			bad(fmt.Sprintf("%s[%d]", path, i), "%q is not a tool name, or a prefix ending in \"*\"", t)
		}
	}
}
