package policy

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/protocol"
)

func testPolicy(t *testing.T) *Policy {
	t.Helper()
	p, err := New(config.Policy{
		DefaultRoles: []string{"member"},
		Roles: map[string]config.Role{
			"member":   {Agents: []string{"chatbot"}, Tools: config.ToolRule{Allow: []string{"*"}, Deny: []string{"execute", "mcp__github__*"}}},
			"coder":    {Agents: []string{"coder"}, Tools: config.ToolRule{Allow: []string{"execute", "read_file"}}},
			"approver": {AlwaysTrust: true},
			"admin":    {Agents: []string{"*"}, Tools: config.ToolRule{Allow: []string{"*"}}, AlwaysTrust: true, ActForOthers: true, ReadAllThreads: true},
		},
		NATSUsers: map[string][]string{"acme/bot": {"coder"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func req(agent, mode, user string) *protocol.RunRequest {
	return &protocol.RunRequest{RunID: "r1", ThreadID: "h1", Tenant: "acme", Agent: agent,
		Config: protocol.RunConfig{ToolApprovalMode: mode, UserID: user}}
}

func TestCheckNamesTheRule(t *testing.T) {
	p := testPolicy(t)
	alice := &protocol.Principal{User: "alice"} // default roles: member
	cases := []struct {
		name string
		pr   *protocol.Principal
		req  *protocol.RunRequest
		want string // "" = allowed
	}{
		{"member runs chatbot", alice, req("chatbot", "", ""), ""},
		{"member acts as herself", alice, req("chatbot", "", "alice"), ""},
		{"member runs coder", alice, req("coder", "", ""), "role member may not run agent coder: policy.roles.member.agents"},
		{"member always_trust", alice, req("chatbot", protocol.ApprovalAlwaysTrust, ""), "role member may not choose tool_approval_mode always_trust: policy.roles.member.always_trust"},
		{"member for bob", alice, req("chatbot", "", "bob"), "role member may not act for user bob (config.user_id); leave config.user_id out to act as alice: policy.roles.member.act_for_others"},
		{"two roles, union", &protocol.Principal{User: "alice", Roles: []string{"member", "approver"}}, req("chatbot", protocol.ApprovalAlwaysTrust, ""), ""},
		{"approver alone runs nothing", &protocol.Principal{User: "alice", Roles: []string{"approver"}}, req("chatbot", "", ""), "role approver may not run agent chatbot"},
		{"unknown role grants nothing", &protocol.Principal{User: "alice", Roles: []string{"idp-group"}}, req("chatbot", "", ""), "role idp-group may not run agent chatbot: policy.roles.idp-group.agents"},
		{"admin anything", &protocol.Principal{User: "root", Roles: []string{"admin"}}, req("coder", protocol.ApprovalAlwaysTrust, "bob"), ""},
		{"no principal", nil, req("chatbot", "", ""), "no authenticated user"},
		{"invalid user", &protocol.Principal{User: "a.b"}, req("chatbot", "", ""), "no authenticated user"},
	}
	for _, c := range cases {
		err := p.Check("acme", c.pr, c.req)
		var pe *Error
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: refused: %v", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) || !errors.As(err, &pe)):
			t.Errorf("%s: got %v, want %q", c.name, err, c.want)
		}
	}
}

func TestUnconfiguredPolicyAllowsAgentsButNotPrivileges(t *testing.T) {
	for _, p := range []*Policy{nil, must(New(config.Policy{}))} {
		alice := &protocol.Principal{User: "alice"}
		if err := p.Check("acme", alice, req("coder", "", "alice")); err != nil {
			t.Errorf("agent: %v", err)
		}
		if err := p.Check("acme", alice, req("chatbot", protocol.ApprovalAlwaysTrust, "")); err == nil {
			t.Error("always_trust allowed without a role granting it")
		}
		if err := p.Check("acme", alice, req("chatbot", "", "bob")); err == nil {
			t.Error("acting for bob allowed without a role granting it")
		}
		if p.ToolFilter("acme", alice) != nil || p.ReadAllThreads(alice) {
			t.Error("unconfigured policy restricts tools or grants reading all threads")
		}
	}
}

func must(p *Policy, err error) *Policy {
	if err != nil {
		panic(err)
	}
	return p
}

func TestAuthorizeStampsThePrincipal(t *testing.T) {
	p := testPolicy(t)
	r := req("chatbot", "", "")
	r.Principal = &protocol.Principal{User: "mallory", Roles: []string{"admin"}} // what a client wrote
	if err := p.Authorize(context.Background(), "acme", &protocol.Principal{User: "alice"}, r); err != nil {
		t.Fatal(err)
	}
	if r.Principal.User != "alice" || !slices.Equal(r.Principal.Roles, []string{"member"}) || r.Config.UserID != "alice" {
		t.Fatalf("stamped %+v, user_id %q", r.Principal, r.Config.UserID)
	}
	if err := p.Authorize(context.Background(), "globex", &protocol.Principal{User: "alice"}, req("chatbot", "", "")); err == nil {
		t.Fatal("a principal of globex authorised a run of acme")
	}
}

func TestToolFilter(t *testing.T) {
	p := testPolicy(t)
	member := p.ToolFilter("acme", &protocol.Principal{User: "alice"})
	coder := p.ToolFilter("acme", &protocol.Principal{User: "bob", Roles: []string{"coder"}})
	both := p.ToolFilter("acme", &protocol.Principal{User: "bob", Roles: []string{"coder", "member"}})
	none := p.ToolFilter("acme", &protocol.Principal{User: "bob", Roles: []string{"approver"}})
	for _, c := range []struct {
		f    func(string) bool
		tool string
		want bool
	}{
		{member, "read_file", true}, {member, "execute", false}, {member, "mcp__github__create_issue", false}, {member, "mcp__jira__x", true},
		{coder, "execute", true}, {coder, "read_file", true}, {coder, "write_file", false},
		{both, "execute", false}, // member's deny wins
		{both, "write_file", true},
		{none, "read_file", false},
	} {
		if got := c.f(c.tool); got != c.want {
			t.Errorf("%s: %v, want %v", c.tool, got, c.want)
		}
	}
}

func TestNATSRoles(t *testing.T) {
	p := testPolicy(t)
	if got := p.NATSRoles("acme", "bot", []string{"role:admin", "team:x", "role:bad.name"}); !slices.Equal(got, []string{"coder", "admin"}) {
		t.Errorf("bot: %v", got)
	}
	if got := p.NATSRoles("globex", "bot", nil); !slices.Equal(got, []string{"member"}) {
		t.Errorf("globex/bot has acme/bot's roles: %v", got)
	}
	if got := RolesFromTags([]string{" role:ops ", "role:", "role:ops", "ROLE:x"}); !slices.Equal(got, []string{"ops"}) {
		t.Errorf("tags: %v", got)
	}
}

func TestMayUseThread(t *testing.T) {
	p := testPolicy(t)
	alice, bob := &protocol.Principal{User: "alice"}, &protocol.Principal{User: "bob"}
	admin := &protocol.Principal{User: "root", Roles: []string{"admin"}}
	owned, open := &protocol.Thread{Owner: "alice"}, &protocol.Thread{}
	if !p.MayUseThread(owned, alice) || p.MayUseThread(owned, bob) || p.MayUseThread(owned, nil) || !p.MayUseThread(owned, admin) {
		t.Error("an owned thread")
	}
	if !p.MayUseThread(open, bob) || !p.MayUseThread(open, nil) {
		t.Error("a thread without owner")
	}
	var none *Policy
	if none.MayUseThread(owned, bob) || !none.MayUseThread(owned, alice) {
		t.Error("unconfigured policy")
	}
}
