package config

import (
	"strings"
	"testing"
)

func TestPolicyAndJWTLoad(t *testing.T) {
	clearNATSAuthEnv(t)
	cfg, err := Load(writeConfig(t, `
gateway:
  api_keys:
    - {name: ci, tenant: acme, key_env: K, roles: [member]}
    - {name: ops, tenant: acme, user: alice, key_env: L, roles: [admin]}
  jwt:
    issuer: https://id.example.com/
    audience: natsagent
    jwks_url: https://id.example.com/jwks.json
    tenant_claim: org
policy:
  default_roles: [member]
  roles:
    member:
      agents: [chatbot]
      tools: {allow: ["*"], deny: [execute, "mcp__github__*"]}
    admin: {agents: ["*"], always_trust: true, act_for_others: true, read_all_threads: true}
  nats_users:
    acme/bot: [admin]
`))
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Gateway.Authenticated() || cfg.Gateway.APIKeys[0].UserOrName() != "ci" || cfg.Gateway.APIKeys[1].UserOrName() != "alice" {
		t.Fatalf("gateway %+v", cfg.Gateway)
	}
	j := cfg.Gateway.JWT.WithDefaults()
	if j.UserClaim != "sub" || j.RolesClaim != "roles" || strings.Join(j.Algorithms, ",") != "RS256,ES256" || j.Leeway != Duration(DefaultJWTLeeway) {
		t.Fatalf("jwt defaults %+v", j)
	}
	if !cfg.Policy.Roles["admin"].AlwaysTrust || cfg.Policy.Roles["member"].Tools.Deny[1] != "mcp__github__*" || cfg.Policy.NATSUsers["acme/bot"][0] != "admin" {
		t.Fatalf("policy %+v", cfg.Policy)
	}
	if h := (JWT{KeyEnv: "X"}).WithDefaults().Algorithms; len(h) != 1 || h[0] != "HS256" {
		t.Fatalf("shared key default algorithms %v", h)
	}
}

func TestPolicyAndJWTValidationNamesTheField(t *testing.T) {
	clearNATSAuthEnv(t)
	const jwt = "gateway:\n  jwt:\n    issuer: i\n    audience: a\n    tenant: acme\n"
	cases := map[string]string{
		"gateway:\n  jwt:\n    audience: a\n    tenant: t\n    key_env: K\n": "gateway.jwt.issuer: is required",
		"gateway:\n  jwt:\n    issuer: i\n    tenant: t\n    key_env: K\n":   "gateway.jwt.audience: is required",
		jwt: "gateway.jwt: set exactly one of jwks_url",
		jwt + "    key_env: K\n    jwks_url: https://x/j\n":                                                         "gateway.jwt: set exactly one of jwks_url",
		jwt + "    jwks_url: http://id.example.com/j\n":                                                             "gateway.jwt.jwks_url: must use https",
		jwt + "    key_env: K\n    algorithms: [RS256]\n":                                                           `gateway.jwt.algorithms[0]: "RS256" cannot be used with a shared key`,
		jwt + "    jwks_url: https://x/j\n    algorithms: [HS256]\n":                                                `gateway.jwt.algorithms[0]: "HS256" cannot be used with jwks_url`,
		jwt + "    jwks_url: https://x/j\n    algorithms: [none]\n":                                                 `gateway.jwt.algorithms[0]: "none"`,
		jwt + "    key_env: K\n    tenant_claim: org\n":                                                             "gateway.jwt.tenant_claim: cannot be combined with tenant",
		"gateway:\n  jwt:\n    issuer: i\n    audience: a\n    key_env: K\n":                                        "gateway.jwt: set tenant",
		"gateway:\n  jwt:\n    issuer: i\n    audience: a\n    key_env: K\n    tenant: a.b\n":                       "gateway.jwt.tenant",
		jwt + "    key_env: K\n    leeway: 1h\n":                                                                    "gateway.jwt.leeway",
		"gateway:\n  api_keys:\n    - {name: a, tenant: a, key_env: K, user: a.b}\n":                                "gateway.api_keys[0].user",
		"gateway:\n  api_keys:\n    - {name: a.b, tenant: a, key_env: K}\n":                                         "gateway.api_keys[0].user: is not set",
		"gateway:\n  api_keys:\n    - {name: a, tenant: a, key_env: K, roles: [x*]}\n":                              "gateway.api_keys[0].roles[0]",
		"gateway:\n  api_keys:\n    - {name: a, tenant: a, key_env: K, roles: [x]}\npolicy:\n  roles:\n    y: {}\n": "gateway.api_keys[0].roles[0]: \"x\" is not in policy.roles",
		"policy:\n  roles:\n    a.b: {}\n":                                                                          "policy.roles.a.b",
		"policy:\n  roles:\n    a: {agents: [x.y]}\n":                                                               "policy.roles.a.agents[0]",
		"policy:\n  roles:\n    a: {tools: {allow: [\"a*b\"]}}\n":                                                   "policy.roles.a.tools.allow[0]",
		"policy:\n  roles:\n    a: {tools: {deny: [\"a b\"]}}\n":                                                    "policy.roles.a.tools.deny[0]",
		"policy:\n  default_roles: [b]\n  roles:\n    a: {}\n":                                                      "policy.default_roles[0]: \"b\" is not in policy.roles",
		"policy:\n  nats_users:\n    alice: [a]\n":                                                                  "policy.nats_users[\"alice\"]",
		"policy:\n  nats_users:\n    acme/al.ice: [a]\n":                                                            "policy.nats_users[\"acme/al.ice\"]",
		"policy:\n  roles:\n    a: {always_trsut: true}\n":                                                          "always_trsut",
		"policy:\n  roles:\n    a: {}\n  nats_users:\n    acme/bot: [b]\n":                                          "policy.nats_users[\"acme/bot\"][0]: \"b\" is not in policy.roles",
	}
	loadRefuses(t, cases)
}

func TestJWTSharedKey(t *testing.T) {
	t.Setenv("TEST_JWT_KEY", "short")
	if _, err := (JWT{KeyEnv: "TEST_JWT_KEY"}).SharedKey(); err == nil || !strings.Contains(err.Error(), "at least 32") {
		t.Fatalf("short key: %v", err)
	}
	t.Setenv("TEST_JWT_KEY", strings.Repeat("k", 32))
	if k, err := (JWT{KeyEnv: "TEST_JWT_KEY"}).SharedKey(); err != nil || len(k) != 32 {
		t.Fatalf("key: %v", err)
	}
}

// The errors about map entries (tenants' limits, roles, NATS users) come
// in name order, so one configuration always gets the same message.
func TestValidateListsMapEntriesInNameOrder(t *testing.T) {
	clearModelEnv(t)
	text := "limits:\n  tenants:\n"
	for _, n := range []string{"t.5", "t.1", "t.4", "t.2", "t.3"} {
		text += "    " + n + ": {}\n"
	}
	text += "policy:\n  roles:\n"
	for _, n := range []string{"r.5", "r.1", "r.4", "r.2", "r.3"} {
		text += "    " + n + ": {}\n"
	}
	text += "  nats_users:\n"
	for _, n := range []string{"u5", "u1", "u4", "u2", "u3"} {
		text += "    " + n + ": []\n"
	}
	_, err := Load(writeConfig(t, text))
	if err == nil {
		t.Fatal("a configuration with bad names loaded")
	}
	for _, paths := range [][]string{
		{"limits.tenants.t.1:", "limits.tenants.t.2:", "limits.tenants.t.3:", "limits.tenants.t.4:", "limits.tenants.t.5:"},
		{"policy.roles.r.1:", "policy.roles.r.2:", "policy.roles.r.3:", "policy.roles.r.4:", "policy.roles.r.5:"},
		{`policy.nats_users["u1"]:`, `policy.nats_users["u2"]:`, `policy.nats_users["u3"]:`, `policy.nats_users["u4"]:`, `policy.nats_users["u5"]:`},
	} {
		last := -1
		for _, p := range paths {
			i := strings.Index(err.Error(), p)
			if i <= last {
				t.Fatalf("%s is missing or out of name order in:\n%v", p, err)
			}
			last = i
		}
	}
}
