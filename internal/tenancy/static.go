package tenancy

import (
	"bufio"
	"bytes"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/natsagent/natsagent/internal/protocol"
)

// StaticTenant is one tenant of a static configuration.
type StaticTenant struct {
	Name string
	// User is the tenant account's one user (default: the tenant's name).
	User string
	// PasswordEnv is the environment variable of nats-server that holds
	// the user's password (default: NATSAGENT_<NAME>_PASSWORD).
	PasswordEnv string
}

// StaticConfig is a static nats-server accounts configuration.
type StaticConfig struct {
	Prefix  string
	Tenants []StaticTenant
}

// The service users and their password variables.
const (
	GatewayUser        = "gateway"
	WorkerUser         = "worker"
	GatewayPasswordEnv = "NATSAGENT_GATEWAY_PASSWORD"
	WorkerPasswordEnv  = "NATSAGENT_WORKER_PASSWORD"
)

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)

// PasswordEnv is a tenant's default password variable.
func PasswordEnv(tenant string) string {
	return "NATSAGENT_" + strings.ToUpper(strings.ReplaceAll(tenant, "-", "_")) + "_PASSWORD"
}

// withDefaults fills in defaults and checks the configuration: valid
// names, no user or variable used twice.
func (c StaticConfig) withDefaults() (StaticConfig, error) {
	if c.Prefix == "" {
		c.Prefix = "agent"
	}
	if err := CheckPrefix(c.Prefix); err != nil {
		return c, err
	}
	users := map[string]string{GatewayUser: "the gateway", WorkerUser: "the workers"}
	envs := map[string]string{GatewayPasswordEnv: "the gateway", WorkerPasswordEnv: "the workers"}
	accounts := map[string]bool{}
	tenants := make([]StaticTenant, 0, len(c.Tenants))
	for _, t := range c.Tenants {
		if err := CheckTenant(t.Name); err != nil {
			return c, err
		}
		if accounts[t.Name] {
			return c, fmt.Errorf("tenant %s is listed twice", t.Name)
		}
		accounts[t.Name] = true
		if t.User == "" {
			t.User = t.Name
		}
		if t.PasswordEnv == "" {
			t.PasswordEnv = PasswordEnv(t.Name)
		}
		if !protocol.ValidToken(t.User) {
			return c, fmt.Errorf("user %q of tenant %s is not valid: use 1 to 128 characters from A-Z, a-z, 0-9, '_' and '-'", clip(t.User), t.Name)
		}
		if !envName.MatchString(t.PasswordEnv) {
			return c, fmt.Errorf("password variable %q of tenant %s is not valid: use letters, digits and '_', not starting with a digit", clip(t.PasswordEnv), t.Name)
		}
		if who, ok := users[t.User]; ok {
			return c, fmt.Errorf("user %s of tenant %s is already the user of %s; NATS user names are unique over all accounts: choose another with --user", t.User, t.Name, who)
		}
		users[t.User] = "tenant " + t.Name
		if who, ok := envs[t.PasswordEnv]; ok {
			return c, fmt.Errorf("password variable %s of tenant %s is already the password of %s; choose another with --password-env", t.PasswordEnv, t.Name, who)
		}
		envs[t.PasswordEnv] = "tenant " + t.Name
		tenants = append(tenants, t)
	}
	c.Tenants = tenants
	return c, nil
}

// RenderStatic renders c as a nats-server configuration file, to be
// included by every node's configuration (`include tenants.conf`). The
// file starts with a manifest (comment lines) that ParseStatic reads back.
func RenderStatic(c StaticConfig) ([]byte, error) {
	c, err := c.withDefaults()
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("%s", header)
	w("# natsagent-prefix: %s\n", c.Prefix)
	for _, t := range c.Tenants {
		w("# natsagent-tenant: %s user=%s password-env=%s\n", t.Name, t.User, t.PasswordEnv)
	}
	w("\n# What the gateway and the workers publish and subscribe to.\nNATSAGENT_SERVICE = {\n  publish: [\n")
	pub, sub := ServicePermissions(c.Prefix)
	for _, s := range pub {
		w("    %-24s # %s\n", strconv.Quote(s.Subject), s.Why)
	}
	w("  ]\n  subscribe: [\n")
	for _, s := range sub {
		w("    %-24s # %s\n", strconv.Quote(s.Subject), s.Why)
	}
	w("  ]\n}\n\naccounts {\n")
	w("  # The service account: every stream, bucket and object store, and the\n")
	w("  # trusted services. Each tenant's exports are usable by its account alone.\n")
	w("  %s {\n    jetstream: enabled\n", ServiceAccount)
	w("    # A user listed without permissions may do nothing.\n")
	w("    default_permissions: { publish: { deny: \">\" }, subscribe: { deny: \">\" } }\n")
	w("    users: [\n")
	w("      {user: %s, password: $%s, permissions: $NATSAGENT_SERVICE}\n", GatewayUser, GatewayPasswordEnv)
	w("      {user: %s, password: $%s, permissions: $NATSAGENT_SERVICE}\n", WorkerUser, WorkerPasswordEnv)
	w("    ]\n    exports: [\n")
	if len(c.Tenants) == 0 {
		w("      # natsagent tenant add NAME adds a tenant's exports here.\n")
	}
	for i, t := range c.Tenants {
		l, _ := Layout(c.Prefix, t.Name)
		if i > 0 {
			w("\n")
		}
		w("      # Tenant %s: submit (run requests), cancel, delete, live events.\n", t.Name)
		for _, e := range l.Exports {
			w("      {%s: %s, accounts: [%s]", e.Kind, strconv.Quote(e.Subject), quoteAll(e.Accounts))
			if e.ResponseType != "" {
				w(", response_type: %s", e.ResponseType)
			}
			w("}\n")
		}
	}
	w("    ]\n  }\n")
	for _, t := range c.Tenants {
		l, _ := Layout(c.Prefix, t.Name)
		w("\n  # Tenant %s: no JetStream; its clients publish run requests to\n", t.Name)
		w("  # %s.runs.%s.<thread>, cancels to %s.ctl.%s.<thread>.<run>.cancel and\n", c.Prefix, t.Name, c.Prefix, t.Name)
		w("  # deletes to %s.ctl.%s.<thread>.delete and %s.ctl.%s.<thread>.<run>.delete\n", c.Prefix, t.Name, c.Prefix, t.Name)
		w("  # (answered to the requester alone) and receive %s.events.%s.> and\n", c.Prefix, t.Name)
		w("  # %s.live.%s.> (token deltas).\n", c.Prefix, t.Name)
		w("  %s {\n    users: [\n", strconv.Quote(t.Name))
		w("      {\n        user: %s, password: $%s\n", strconv.Quote(t.User), t.PasswordEnv)
		w("        permissions: {\n")
		w("          publish: { allow: [%s], deny: [%s] }\n", quoteAll(l.User.PublishAllow), quoteAll(l.User.PublishDeny))
		w("          subscribe: { allow: [%s], deny: [%s] }\n", quoteAll(l.User.SubscribeAllow), quoteAll(l.User.SubscribeDeny))
		w("        }\n      }\n    ]\n    imports: [\n")
		for _, im := range l.Imports {
			w("      {%s: {account: %s, subject: %s}", im.Kind, im.Account, strconv.Quote(im.Subject))
			if im.LocalSubject != im.Subject {
				w(", to: %s", strconv.Quote(im.LocalSubject))
			}
			if im.Share {
				w(", share: true")
			}
			w("}\n")
		}
		w("    ]\n  }\n")
	}
	w("}\n")
	return b.Bytes(), nil
}

const header = `# natsagent's NATS accounts: one account per tenant. Include this file in
# every node's configuration (` + "`include tenants.conf`" + `).
#
# Generated by "natsagent tenant add"; edit it with that command (it
# refuses a file edited by hand). The layout (docs/operations.md,
# "Security"):
# - account AGENT holds every stream, bucket and object store; its users
#   gateway and worker are the trusted services;
# - each tenant has an account of its own name, without JetStream, and one
#   user, who may publish run requests (new runs, steer, resume), cancel
#   and delete requests of its tenant and receive its tenant's live events,
#   nothing else; replies reach the requester alone;
# - AGENT exports to each tenant alone its submit service (run by the
#   workers, which stamp the authenticated user on every run), its cancel
#   and delete services and its live events; the tenant imports them.
# Replay of stored events, run records, thread state and files are served
# by the gateway (HTTP, with an API key of the tenant).
#
# Passwords come from the environment of nats-server ($NAME below); an
# unset variable stops the server at start.
#
`

func quoteAll(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = strconv.Quote(s)
	}
	return strings.Join(q, ", ")
}

// ParseStatic reads a configuration RenderStatic wrote back from its
// manifest, and refuses one edited by hand (it would not render the same):
// a tenant added to it would silently drop the edit.
func ParseStatic(data []byte) (StaticConfig, error) {
	var c StaticConfig
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "# natsagent-prefix: "); ok {
			c.Prefix = strings.TrimSpace(v)
			continue
		}
		v, ok := strings.CutPrefix(line, "# natsagent-tenant: ")
		if !ok {
			continue
		}
		fields := strings.Fields(v)
		if len(fields) == 0 {
			return c, fmt.Errorf("manifest line %q names no tenant", line)
		}
		t := StaticTenant{Name: fields[0]}
		for _, f := range fields[1:] {
			k, val, _ := strings.Cut(f, "=")
			switch k {
			case "user":
				t.User = val
			case "password-env":
				t.PasswordEnv = val
			default:
				return c, fmt.Errorf("manifest line %q: unknown field %q", line, k)
			}
		}
		c.Tenants = append(c.Tenants, t)
	}
	if err := sc.Err(); err != nil {
		return c, err
	}
	if c.Prefix == "" {
		return c, fmt.Errorf("no natsagent manifest (a line \"# natsagent-prefix: ...\"): the file was not written by natsagent tenant add")
	}
	again, err := RenderStatic(c)
	if err != nil {
		return c, err
	}
	if !bytes.Equal(again, data) {
		return c, fmt.Errorf("the file was edited by hand (it differs from what its manifest renders); move the edits to another included file, or render it again by removing everything but its manifest lines")
	}
	return c, nil
}

// Add adds tenant t to c. Adding a tenant that is there with the same
// settings changes nothing (added is false); with other settings it is an
// error.
func (c StaticConfig) Add(t StaticTenant) (StaticConfig, bool, error) {
	if err := CheckTenant(t.Name); err != nil {
		return c, false, err
	}
	if t.User == "" {
		t.User = t.Name
	}
	if t.PasswordEnv == "" {
		t.PasswordEnv = PasswordEnv(t.Name)
	}
	for _, old := range c.Tenants {
		if old.Name != t.Name {
			continue
		}
		if old.User == t.User && old.PasswordEnv == t.PasswordEnv {
			return c, false, nil
		}
		return c, false, fmt.Errorf("tenant %s is already configured with user %s and password variable %s; it is left as it is", t.Name, old.User, old.PasswordEnv)
	}
	c.Tenants = append(slices.Clone(c.Tenants), t)
	if _, err := c.withDefaults(); err != nil {
		return c, false, err
	}
	return c, true, nil
}
