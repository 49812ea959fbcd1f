package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsagent/natsagent/internal/natsjwt"
	"github.com/natsagent/natsagent/internal/protocol"
)

// envJWTDir names the default of --dir.
const envJWTDir = "NATSAGENT_JWT_DIR"

type jwtCommand struct {
	name, synopsis, summary string
	run                     func(ctx context.Context, store *natsjwt.Store, f *jwtFlags, std stdio) error
}

func jwtCommands() []jwtCommand {
	return []jwtCommand{
		{"tenant-add", "--tenant <tenant> [--user <user>]", "create a tenant's account (imports of its runs, cancels and events) and, with --user, its first user", jwtTenantAdd},
		{"user-add", "--account <tenant|AGENT> --user <user>", "issue a user of a tenant (or a service user of AGENT) and write its creds file", jwtUserAdd},
		{"user-rotate", "--account <tenant|AGENT|SYS> --user <user>", "give a user a new key and creds, and revoke the old key", jwtUserRotate},
		{"user-revoke", "--account <tenant|AGENT> --user <user>", "revoke a user's key and delete its creds; its connections are closed once pushed", jwtUserRevoke},
		{"tenant-remove", "--tenant <tenant>", "remove a tenant: AGENT's exports to it, its keys and creds; push revokes and deletes it", jwtTenantRemove},
		{"server-config", "[--resolver-dir <dir>] [--out <file>]", "print the nats-server config fragment that trusts the operator", jwtServerConfig},
		{"push", "--server <url>", "send every account JWT (and removals) to servers with the full resolver", jwtPushCmd},
	}
}

func jwtUsage(w io.Writer) {
	fmt.Fprintln(w, "Usage: natsagent jwt <command> --dir <dir> [flags]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "NATS decentralized auth (operator mode) for a multi-tenant deployment: an operator, the system account")
	fmt.Fprintln(w, "SYS, the service account AGENT (JetStream, the gateway's and workers' users) and one account per tenant,")
	fmt.Fprintln(w, "kept as keys, JWTs and creds files in --dir (env "+envJWTDir+"; keep it secret: it holds every seed).")
	fmt.Fprintln(w, "Changes are written to --dir; a server sees them once pushed (push, or --server on the command) when its")
	fmt.Fprintln(w, "resolver is full, or after server-config is rendered again and the server reloaded when it is MEMORY.")
	fmt.Fprintln(w, "docs/operations.md, \"NATS JWT mode\", walks through it.")
	writeExamples(w, "jwt")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Commands:")
	fmt.Fprintf(w, "  %-14s %s\n", "init", "create the operator, SYS with user sys, AGENT with users gateway and worker")
	for _, c := range jwtCommands() {
		fmt.Fprintf(w, "  %-14s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run `natsagent jwt <command> -h` for a command's flags.")
}

// jwtFlags are the flags of every jwt command; each command reads those
// it documents.
type jwtFlags struct {
	dir, prefix, tenant, account, user string
	resolverDir, out                   string
	server, ca                         string
	timeout                            time.Duration
}

func runJWT(ctx context.Context, args []string, std stdio) error {
	if len(args) == 0 {
		jwtUsage(std.err)
		return errUsage
	}
	name, rest := args[0], args[1:]
	switch name {
	case "-h", "-help", "--help", "help":
		jwtUsage(std.err)
		return flag.ErrHelp
	case "init":
		return jwtInit(rest, std)
	}
	for _, c := range jwtCommands() {
		if c.name != name {
			continue
		}
		fs := newFlagSet("jwt "+c.name, "--dir <dir> "+c.synopsis, c.summary+".", std)
		f := &jwtFlags{}
		fs.StringVar(&f.dir, "dir", os.Getenv(envJWTDir), "the directory of keys, JWTs and creds made by natsagent jwt init (env "+envJWTDir+")")
		switch c.name {
		case "tenant-add", "tenant-remove":
			fs.StringVar(&f.tenant, "tenant", "", "the tenant (its account's name)")
		case "user-add", "user-rotate", "user-revoke":
			fs.StringVar(&f.account, "account", "", "the user's account: a tenant, "+natsjwt.ServiceAccount+" (service users) or "+natsjwt.SystemAccount)
		}
		switch c.name {
		case "tenant-add", "user-add", "user-rotate", "user-revoke":
			fs.StringVar(&f.user, "user", "", "the user's name")
		case "server-config":
			fs.StringVar(&f.resolverDir, "resolver-dir", "", "use the full resolver, storing account JWTs in this directory of the server (default: resolver MEMORY, every account preloaded)")
			fs.StringVar(&f.out, "out", "", "write the fragment to this file (mode 0600) instead of stdout")
		}
		if c.name != "server-config" {
			usage := "push the change to this NATS server as the system user"
			if c.name == "push" {
				usage = "NATS server URLs, comma-separated"
			}
			fs.StringVar(&f.server, "server", "", usage)
			fs.StringVar(&f.ca, "ca", "", "PEM certificates that verify the server's TLS certificate (default: the system roots)")
			fs.DurationVar(&f.timeout, "timeout", 10*time.Second, "bound on the push")
		}
		pos, err := parseArgs(fs, rest)
		if err != nil {
			return parseErr(err)
		}
		if len(pos) > 0 {
			return usageErr(std, "jwt "+c.name, "unexpected argument %q", pos[0])
		}
		if f.dir == "" {
			return usageErr(std, "jwt "+c.name, "name the directory made by `natsagent jwt init` with --dir or %s", envJWTDir)
		}
		if c.name == "push" && f.server == "" {
			return usageErr(std, "jwt push", "name the server with --server")
		}
		store, err := natsjwt.Open(f.dir)
		if err != nil {
			return err
		}
		return c.run(ctx, store, f, std)
	}
	fmt.Fprintf(std.err, "natsagent jwt: unknown command %q\n\n", name)
	jwtUsage(std.err)
	return errUsage
}

func jwtInit(args []string, std stdio) error {
	fs := newFlagSet("jwt init", "--dir <dir> [--prefix agent]", `
Creates the operator, the system account SYS with its user sys (it pushes account JWTs), and the service
account AGENT (JetStream enabled) with its users gateway and worker, in --dir (created 0700; refused if it
already holds an operator). Give the gateway and the workers their creds files (nats.creds_file).`, std)
	dir := fs.String("dir", os.Getenv(envJWTDir), "the directory to create (env "+envJWTDir+")")
	prefix := fs.String("prefix", "", "the deployment's subject prefix (default agent)")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return parseErr(err)
	}
	if len(pos) > 0 {
		return usageErr(std, "jwt init", "unexpected argument %q", pos[0])
	}
	if *dir == "" {
		return usageErr(std, "jwt init", "name the directory to create with --dir or %s", envJWTDir)
	}
	store, err := natsjwt.Init(*dir, *prefix)
	if err != nil {
		return err
	}
	fmt.Fprintf(std.out, "operator made in %s (prefix %s)\n", store.Dir(), store.Prefix())
	if agent, err := store.Account(natsjwt.ServiceAccount); err == nil {
		fmt.Fprintf(std.out, "service account %s: %s (the account of the streams: KEDA's and monitoring's account)\n", natsjwt.ServiceAccount, agent.Subject)
	}
	for _, u := range natsjwt.ServiceUsers {
		fmt.Fprintf(std.out, "service user %s: %s\n", u, store.CredsPath(natsjwt.ServiceAccount, u))
	}
	fmt.Fprintf(std.out, "system user %s: %s\n", natsjwt.SystemUser, store.CredsPath(natsjwt.SystemAccount, natsjwt.SystemUser))
	fmt.Fprintf(std.out, "next: natsagent jwt server-config --dir %s --resolver-dir <server's jwt dir> --out natsjwt.conf\n", store.Dir())
	return nil
}

func jwtTenantAdd(ctx context.Context, store *natsjwt.Store, f *jwtFlags, std stdio) error {
	if f.user != "" {
		if err := protocol.CheckToken("--user", f.user); err != nil {
			return err
		}
	}
	if err := store.AddTenant(f.tenant); err != nil {
		return err
	}
	acc, err := store.Account(f.tenant)
	if err != nil {
		return err
	}
	fmt.Fprintf(std.out, "tenant %s added: account %s\n", f.tenant, acc.Subject)
	if f.user != "" {
		path, err := store.AddUser(f.tenant, f.user)
		if err != nil {
			return err
		}
		fmt.Fprintf(std.out, "user %s of %s: %s\n", f.user, f.tenant, path)
	}
	return jwtAfterChange(ctx, store, f, std)
}

func jwtUserAdd(ctx context.Context, store *natsjwt.Store, f *jwtFlags, std stdio) error {
	path, err := store.AddUser(f.account, f.user)
	if err != nil {
		return err
	}
	fmt.Fprintf(std.out, "user %s of %s: %s\n", f.user, f.account, path)
	// A new user changes no account JWT: nothing to push.
	return nil
}

func jwtUserRotate(ctx context.Context, store *natsjwt.Store, f *jwtFlags, std stdio) error {
	path, err := store.RotateUser(f.account, f.user)
	if err != nil {
		return err
	}
	fmt.Fprintf(std.out, "user %s of %s has a new key: %s (the old key is revoked)\n", f.user, f.account, path)
	return jwtAfterChange(ctx, store, f, std)
}

func jwtUserRevoke(ctx context.Context, store *natsjwt.Store, f *jwtFlags, std stdio) error {
	if err := store.RevokeUser(f.account, f.user); err != nil {
		return err
	}
	fmt.Fprintf(std.out, "user %s of %s revoked\n", f.user, f.account)
	return jwtAfterChange(ctx, store, f, std)
}

func jwtTenantRemove(ctx context.Context, store *natsjwt.Store, f *jwtFlags, std stdio) error {
	pub, err := store.RemoveTenant(f.tenant)
	if err != nil {
		return err
	}
	fmt.Fprintf(std.out, "tenant %s (%s) removed\n", f.tenant, pub)
	return jwtAfterChange(ctx, store, f, std)
}

func jwtServerConfig(_ context.Context, store *natsjwt.Store, f *jwtFlags, std stdio) error {
	conf, err := store.ServerConfig(f.resolverDir)
	if err != nil {
		return err
	}
	if f.out == "" {
		_, err := io.WriteString(std.out, conf)
		return err
	}
	return os.WriteFile(f.out, []byte(conf), 0o600)
}

func jwtPushCmd(ctx context.Context, store *natsjwt.Store, f *jwtFlags, std stdio) error {
	return jwtPush(ctx, store, f, std)
}

// jwtAfterChange pushes when --server is given, and otherwise says how
// the change reaches the servers.
func jwtAfterChange(ctx context.Context, store *natsjwt.Store, f *jwtFlags, std stdio) error {
	if f.server == "" {
		fmt.Fprintf(std.out, "not pushed: run `natsagent jwt push --dir %s --server <url>` (full resolver), or render server-config again and reload (MEMORY)\n", store.Dir())
		return nil
	}
	return jwtPush(ctx, store, f, std)
}

func jwtPush(ctx context.Context, store *natsjwt.Store, f *jwtFlags, std stdio) error {
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	opts := []nats.Option{nats.Name("natsagent jwt push"), nats.UserCredentials(store.CredsPath(natsjwt.SystemAccount, natsjwt.SystemUser)), nats.NoReconnect()}
	if f.ca != "" {
		opts = append(opts, nats.RootCAs(f.ca))
	}
	nc, err := nats.Connect(f.server, opts...)
	if err != nil {
		if errors.Is(err, nats.ErrAuthorization) {
			return fmt.Errorf("connect to %s as the system user: %w (does the server trust this operator? include the output of `natsagent jwt server-config --dir %s`)", f.server, err, store.Dir())
		}
		return fmt.Errorf("connect to %s as the system user: %w", f.server, err)
	}
	defer nc.Close()
	res, err := store.Push(ctx, nc)
	if len(res.Updated) > 0 {
		fmt.Fprintf(std.out, "pushed %d accounts: %v\n", len(res.Updated), res.Updated)
	}
	if len(res.Deleted) > 0 {
		fmt.Fprintf(std.out, "deleted removed accounts: %v\n", res.Deleted)
	}
	return err
}
