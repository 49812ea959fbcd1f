// Package policy decides what an authenticated principal may do: which
// agents it may run, which tools its runs are offered, and whether it may
// choose tool_approval_mode always_trust, act for another user or use
// another user's threads. It owns the rules (config.Policy compiled) and
// the checks; it authenticates no one (the gateway and the submit service
// do) and enforces nothing itself: the gateway and the submit service call
// Authorize on every submission, the worker trims a run's tools with
// ToolFilter before the run's chain is built.
package policy

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/protocol"
)

// Policy is a compiled config.Policy. The zero of *Policy (nil) is the
// policy of a deployment that configures no role: every agent and tool,
// no always_trust, no acting for others, no reading others' threads.
type Policy struct {
	defaults  []string
	roles     map[string]*role
	natsUsers map[string][]string
}

type role struct {
	name                      string
	allAgents                 bool
	agents                    map[string]bool
	allow, deny               patterns
	alwaysTrust, actForOthers bool
	readAllThreads            bool
	eraseUsers                bool
}

// New compiles a validated configuration (config.Load validated it).
func New(c config.Policy) (*Policy, error) {
	p := &Policy{roles: make(map[string]*role), natsUsers: make(map[string][]string)}
	var errs []string
	bad := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	for _, r := range c.DefaultRoles {
		if !protocol.ValidToken(r) {
			bad("policy.default_roles: %q is not a valid role name", r)
		}
	}
	p.defaults = slices.Clone(c.DefaultRoles)
	for name, rc := range c.Roles {
		if !protocol.ValidToken(name) {
			bad("policy.roles: %q is not a valid role name", name)
			continue
		}
		r := &role{name: name, agents: make(map[string]bool), alwaysTrust: rc.AlwaysTrust,
			actForOthers: rc.ActForOthers, readAllThreads: rc.ReadAllThreads, eraseUsers: rc.EraseUsers}
		for _, a := range rc.Agents {
			switch {
			case a == "*":
				r.allAgents = true
			case protocol.ValidToken(a):
				r.agents[a] = true
			default:
				bad("policy.roles.%s.agents: %q is not an agent name or \"*\"", name, a)
			}
		}
		var err error
		if r.allow, err = compile(rc.Tools.Allow); err != nil {
			bad("policy.roles.%s.tools.allow: %v", name, err)
		}
		if r.deny, err = compile(rc.Tools.Deny); err != nil {
			bad("policy.roles.%s.tools.deny: %v", name, err)
		}
		p.roles[name] = r
	}
	for key, roles := range c.NATSUsers {
		tenant, user, ok := strings.Cut(key, "/")
		if !ok || !protocol.ValidToken(tenant) || !protocol.ValidToken(user) {
			bad("policy.nats_users: %q is not \"<tenant>/<user>\"", key)
			continue
		}
		p.natsUsers[key] = slices.Clone(roles)
	}
	if len(errs) > 0 {
		sort.Strings(errs)
		return nil, fmt.Errorf("invalid policy: %s", strings.Join(errs, "; "))
	}
	if len(p.roles) == 0 {
		// Default roles and NATS users name roles; without roles they
		// grant the unconfigured policy's permissions, as nil does.
		p.roles = nil
	}
	return p, nil
}

// configured reports whether roles decide (nil or no role: they do not).
func (p *Policy) configured() bool { return p != nil && p.roles != nil }

// DefaultRoles returns the roles of a principal configured with none.
func (p *Policy) DefaultRoles() []string {
	if p == nil {
		return nil
	}
	return slices.Clone(p.defaults)
}

// Roles returns the roles a principal acts with: its own, else the
// default ones.
func (p *Policy) Roles(pr *protocol.Principal) []string {
	if pr != nil && len(pr.Roles) > 0 {
		return pr.Roles
	}
	return p.DefaultRoles()
}

// held returns the configured roles among names, in order; unknown names
// (an identity provider's other groups) grant nothing.
func (p *Policy) held(names []string) []*role {
	var out []*role
	for _, n := range names {
		if r := p.roles[n]; r != nil && !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	return out
}

// Error is a refusal; Rule names the configuration that decided it.
type Error struct {
	Msg  string
	Rule string
}

func (e *Error) Error() string { return e.Msg + ": " + e.Rule }

// describe names a principal's roles for a refusal: "role member",
// "roles member, viewer" or "user bob (no roles)".
func describe(user string, roles []string) (who, rule string) {
	switch len(roles) {
	case 0:
		return fmt.Sprintf("user %s has no roles and", user), "policy.default_roles"
	case 1:
		return "role " + roles[0], "policy.roles." + roles[0]
	}
	return "roles " + strings.Join(roles, ", "), "policy.roles.{" + strings.Join(roles, ",") + "}"
}

// Check decides whether principal pr of tenant may submit req as it is:
// run its agent, choose its approval mode and act for its config.user_id.
// Tools are not checked here: a run is offered only those its principal's
// roles allow (ToolFilter). A nil principal is refused.
func (p *Policy) Check(tenant string, pr *protocol.Principal, req *protocol.RunRequest) error {
	if pr == nil || !protocol.ValidToken(pr.User) {
		return &Error{Msg: "the run has no authenticated user", Rule: "an authenticated principal is required"}
	}
	if !p.configured() {
		return p.checkUnconfigured(pr, req)
	}
	names := p.Roles(pr)
	roles := p.held(names)
	who, rule := describe(pr.User, names)
	grants := func(f func(*role) bool) bool { return slices.ContainsFunc(roles, f) }
	if !grants(func(r *role) bool { return r.allAgents || r.agents[req.Agent] }) {
		return &Error{Msg: fmt.Sprintf("%s may not run agent %s", who, req.Agent), Rule: rule + ".agents"}
	}
	allow := p.ToolFilter(tenant, pr)
	for _, sw := range req.Config.Switches() {
		if sw.Value != nil && *sw.Value && !allow(sw.Tool) {
			return &Error{Msg: fmt.Sprintf("%s may not turn on config.%s: its tools do not include %s; leave config.%s out or false", who, sw.Key, sw.Tool, sw.Key), Rule: rule + ".tools"}
		}
	}
	if req.Config.ToolApprovalMode == protocol.ApprovalAlwaysTrust && !grants(func(r *role) bool { return r.alwaysTrust }) {
		return &Error{Msg: fmt.Sprintf("%s may not choose tool_approval_mode always_trust", who), Rule: rule + ".always_trust"}
	}
	if u := req.Config.UserID; u != "" && u != pr.User && !grants(func(r *role) bool { return r.actForOthers }) {
		return &Error{Msg: fmt.Sprintf("%s may not act for user %s (config.user_id); leave config.user_id out to act as %s", who, u, pr.User), Rule: rule + ".act_for_others"}
	}
	return nil
}

func (p *Policy) checkUnconfigured(pr *protocol.Principal, req *protocol.RunRequest) error {
	const rule = "policy.roles (none is configured; give a role this permission)"
	if req.Config.ToolApprovalMode == protocol.ApprovalAlwaysTrust {
		return &Error{Msg: fmt.Sprintf("user %s may not choose tool_approval_mode always_trust", pr.User), Rule: rule}
	}
	if u := req.Config.UserID; u != "" && u != pr.User {
		return &Error{Msg: fmt.Sprintf("user %s may not act for user %s (config.user_id); leave config.user_id out to act as %s", pr.User, u, pr.User), Rule: rule}
	}
	return nil
}

// Authorize is the hook every trusted submitter calls on a run request
// before it writes the runs stream: it checks req as the client sent it
// (Check), then stamps it with the principal: req.Principal is a copy of
// pr (the default roles filled in) and config.user_id, when empty, is the
// principal's user. tenant is the tenant the submitter authenticated, and
// must be req's.
func (p *Policy) Authorize(_ context.Context, tenant string, pr *protocol.Principal, req *protocol.RunRequest) error {
	if req.Tenant != tenant {
		return &Error{Msg: fmt.Sprintf("the run is for tenant %s, not the submitter's %s", req.Tenant, tenant), Rule: "a principal acts for its own tenant only"}
	}
	if err := p.Check(tenant, pr, req); err != nil {
		return err
	}
	req.Principal = &protocol.Principal{User: pr.User, Roles: slices.Clone(p.Roles(pr))}
	if req.Config.UserID == "" {
		req.Config.UserID = pr.User
	}
	return nil
}

// ReadAllThreads reports whether the principal may use threads other
// users of its tenant created.
func (p *Policy) ReadAllThreads(pr *protocol.Principal) bool {
	if !p.configured() || pr == nil {
		return false
	}
	return slices.ContainsFunc(p.held(p.Roles(pr)), func(r *role) bool { return r.readAllThreads })
}

// MayEraseUsers reports whether the principal may erase a user of its
// tenant (a role with erase_users); no one may without a configured role.
func (p *Policy) MayEraseUsers(pr *protocol.Principal) bool {
	if !p.configured() || pr == nil {
		return false
	}
	return slices.ContainsFunc(p.held(p.Roles(pr)), func(r *role) bool { return r.eraseUsers })
}

// MayUseThread reports whether principal pr may use thread th: its own,
// one created unauthenticated (no owner), or any when a role of pr has
// read_all_threads. The gateway and the submit service decide with it.
func (p *Policy) MayUseThread(th *protocol.Thread, pr *protocol.Principal) bool {
	if th.Owner == "" || pr != nil && th.Owner == pr.User {
		return true
	}
	return p.ReadAllThreads(pr)
}

// ToolFilter returns which tools a run of principal pr may be offered, or
// nil when every tool may: a tool is offered when one of the principal's
// roles allows it and none denies it. A run without a principal (from a
// submitter that sets none) has the default roles.
func (p *Policy) ToolFilter(tenant string, pr *protocol.Principal) func(name string) bool {
	if !p.configured() {
		return nil
	}
	roles := p.held(p.Roles(pr))
	return func(name string) bool {
		allowed := false
		for _, r := range roles {
			if r.deny.match(name) {
				return false
			}
			allowed = allowed || r.allow.match(name)
		}
		return allowed
	}
}

// NATSRoles returns the roles of a NATS user of tenant: those
// policy.nats_users gives "<tenant>/<user>", and those its JWT tags give
// (RolesFromTags); the default roles when neither gives any.
func (p *Policy) NATSRoles(tenant, user string, tags []string) []string {
	var out []string
	if p != nil {
		out = slices.Clone(p.natsUsers[tenant+"/"+user])
	}
	for _, r := range RolesFromTags(tags) {
		if !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	if len(out) == 0 {
		return p.DefaultRoles()
	}
	return out
}

// RoleTagPrefix marks a NATS user JWT tag that names a role
// ("role:admin"); the server reports a user's tags in its client info.
const RoleTagPrefix = "role:"

// RolesFromTags returns the roles named by role:<name> tags. NATS
// lower-cases tags; a tag naming an invalid role is ignored.
func RolesFromTags(tags []string) []string {
	var out []string
	for _, t := range tags {
		name, ok := strings.CutPrefix(strings.TrimSpace(t), RoleTagPrefix)
		if ok && protocol.ValidToken(name) && !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	return out
}

// patterns match tool names: exact names, or prefixes ending in "*".
type patterns struct {
	all      bool
	names    map[string]bool
	prefixes []string
}

func compile(pats []string) (patterns, error) {
	ps := patterns{names: make(map[string]bool)}
	for _, s := range pats {
		body, wild := strings.CutSuffix(s, "*")
		switch {
		case s == "" || strings.Contains(body, "*"):
			return ps, fmt.Errorf("%q is not a tool name, or a prefix ending in \"*\"", s)
		case s == "*":
			ps.all = true
		case wild:
			ps.prefixes = append(ps.prefixes, body)
		default:
			ps.names[s] = true
		}
	}
	return ps, nil
}

func (ps patterns) match(name string) bool {
	if ps.all || ps.names[name] {
		return true
	}
	for _, p := range ps.prefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}
