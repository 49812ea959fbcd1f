package policy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/protocol"
)

// FuzzPolicy: any policy section the configuration accepts compiles, and
// deciding on any principal and request never panics; a tool a role
// denies is never offered.
func FuzzPolicy(f *testing.F) {
	f.Add("policy:\n  default_roles: [m]\n  roles:\n    m: {agents: [chatbot], tools: {allow: [\"*\"], deny: [execute]}}\n", "alice", "m", "chatbot", "execute", "bob")
	f.Add("policy:\n  roles:\n    a: {agents: [\"*\"], always_trust: true, act_for_others: true, tools: {allow: [\"mcp__*\"]}}\n  nats_users:\n    acme/bot: [a]\n", "bot", "a", "coder", "mcp__x", "")
	f.Add("policy: {}\n", "u", "", "chatbot", "*", "u")
	f.Fuzz(func(t *testing.T, text, user, roles, agent, tool, userID string) {
		path := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := config.Load(path)
		if err != nil {
			return
		}
		p, err := New(cfg.Policy)
		if err != nil {
			t.Fatalf("config accepted a policy New refuses: %v", err)
		}
		pr := &protocol.Principal{User: user, Roles: strings.Fields(roles)}
		r := &protocol.RunRequest{Tenant: "acme", Agent: agent, Config: protocol.RunConfig{UserID: userID, ToolApprovalMode: protocol.ApprovalAlwaysTrust}}
		_ = p.Check("acme", pr, r)
		_ = p.NATSRoles("acme", user, strings.Fields(roles))
		if allow := p.ToolFilter("acme", pr); allow != nil && allow(tool) {
			for _, name := range p.Roles(pr) {
				if rc, ok := cfg.Policy.Roles[name]; ok {
					for _, d := range rc.Tools.Deny {
						if d == tool {
							t.Fatalf("tool %q denied by role %s is offered", tool, name)
						}
					}
				}
			}
		}
	})
}
