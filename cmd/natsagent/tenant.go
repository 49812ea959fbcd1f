package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/natsagent/natsagent/internal/tenancy"
)

// runTenant manages the tenants of a static NATS accounts configuration
// (internal/tenancy): `tenant add NAME` and `tenant list`.
func runTenant(_ context.Context, args []string, std stdio) error {
	usage := func() {
		fmt.Fprintln(std.err, "Usage: natsagent tenant add NAME [--conf FILE] [--user U] [--password-env VAR] [--prefix P]")
		fmt.Fprintln(std.err, "       natsagent tenant list [--conf FILE]")
		fmt.Fprintln(std.err)
		fmt.Fprintln(std.err, "Edits the nats-server accounts file that every node includes (deploy/nats/tenants.conf is one):")
		fmt.Fprintln(std.err, "add gives tenant NAME its own NATS account, importing its submit and cancel services and its")
		fmt.Fprintln(std.err, "live events from the service account AGENT, with one user whose password nats-server reads from")
		fmt.Fprintln(std.err, "the environment; adding a tenant that is there changes nothing. Reload nats-server afterwards")
		fmt.Fprintln(std.err, "(nats-server --signal reload). docs/operations.md, \"Security\", describes the layout.")
		writeExamples(std.err, "tenant")
	}
	if len(args) == 0 {
		usage()
		return errUsage
	}
	switch args[0] {
	case "add":
		return tenantAdd(args[1:], std, usage)
	case "list":
		return tenantList(args[1:], std, usage)
	case "-h", "-help", "--help", "help":
		usage()
		return flag.ErrHelp
	}
	fmt.Fprintf(std.err, "natsagent tenant: unknown subcommand %q (add or list)\n\n", args[0])
	usage()
	return errUsage
}

// parseWithName parses flags before and after one positional argument.
func parseWithName(fset *flag.FlagSet, args []string) (string, error) {
	var name string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	if err := fset.Parse(args); err != nil {
		return "", err
	}
	if name == "" && fset.NArg() > 0 {
		name = fset.Arg(0)
		if err := fset.Parse(fset.Args()[1:]); err != nil {
			return "", err
		}
	}
	if fset.NArg() > 0 {
		return "", fmt.Errorf("unexpected argument %q", fset.Arg(0))
	}
	return name, nil
}

func tenantAdd(args []string, std stdio, usage func()) error {
	fset := flag.NewFlagSet("tenant add", flag.ContinueOnError)
	fset.SetOutput(std.err)
	fset.Usage = func() { usage(); fmt.Fprintln(std.err, "\nFlags:"); fset.PrintDefaults() }
	conf := fset.String("conf", "tenants.conf", "the accounts file to edit (created when missing)")
	user := fset.String("user", "", "the tenant's NATS user (default: the tenant's name); user names are unique over all accounts")
	passwordEnv := fset.String("password-env", "", "the environment variable of nats-server holding the user's password (default NATSAGENT_<NAME>_PASSWORD)")
	prefix := fset.String("prefix", "", "the deployment's subject prefix (default: the file's, or agent)")
	name, err := parseWithName(fset, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		fmt.Fprintf(std.err, "natsagent tenant add: %v\n", err)
		return errUsage
	}
	if name == "" {
		fmt.Fprintln(std.err, "natsagent tenant add: name the tenant: natsagent tenant add NAME")
		return errUsage
	}
	if err := tenancy.CheckTenant(name); err != nil {
		return err
	}
	cfg, exists, err := readTenants(*conf)
	if err != nil {
		return err
	}
	switch {
	case !exists && *prefix != "":
		cfg.Prefix = *prefix
	case !exists:
		cfg.Prefix = "agent"
	case *prefix != "" && *prefix != cfg.Prefix:
		return fmt.Errorf("%s is for prefix %q, not %q; a file serves one prefix: use another file for that deployment", *conf, cfg.Prefix, *prefix)
	}
	cfg, added, err := cfg.Add(tenancy.StaticTenant{Name: name, User: *user, PasswordEnv: *passwordEnv})
	if err != nil {
		return err
	}
	if !added {
		fmt.Fprintf(std.out, "tenant %s is already in %s; nothing changed\n", name, *conf)
		return nil
	}
	data, err := tenancy.RenderStatic(cfg)
	if err != nil {
		return err
	}
	if err := writeAtomic(*conf, data); err != nil {
		return err
	}
	t := cfg.Tenants[len(cfg.Tenants)-1]
	fmt.Fprintf(std.out, "tenant %s added to %s: account %s, user %s, password from $%s\n", name, *conf, name, t.User, t.PasswordEnv)
	fmt.Fprintf(std.out, "set %s in nats-server's environment and reload it (nats-server --signal reload)\n", t.PasswordEnv)
	return nil
}

func tenantList(args []string, std stdio, usage func()) error {
	fset := flag.NewFlagSet("tenant list", flag.ContinueOnError)
	fset.SetOutput(std.err)
	fset.Usage = func() { usage(); fmt.Fprintln(std.err, "\nFlags:"); fset.PrintDefaults() }
	conf := fset.String("conf", "tenants.conf", "the accounts file to read")
	if err := fset.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if fset.NArg() > 0 {
		fmt.Fprintf(std.err, "natsagent tenant list: unexpected argument %q\n", fset.Arg(0))
		return errUsage
	}
	cfg, exists, err := readTenants(*conf)
	if err != nil {
		return err
	}
	if !exists {
		return fmt.Errorf("%s does not exist; create it with natsagent tenant add NAME --conf %s", *conf, *conf)
	}
	tw := tabwriter.NewWriter(std.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tUSER\tPASSWORD ENV")
	for _, t := range cfg.Tenants {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", t.Name, t.User, t.PasswordEnv)
	}
	return tw.Flush()
}

// readTenants reads a file tenant add wrote; a missing file is an empty
// configuration.
func readTenants(path string) (tenancy.StaticConfig, bool, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return tenancy.StaticConfig{}, false, nil
	}
	if err != nil {
		return tenancy.StaticConfig{}, false, err
	}
	cfg, err := tenancy.ParseStatic(data)
	if err != nil {
		return cfg, true, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, true, nil
}

// writeAtomic replaces path with data, so a node reloading meanwhile never
// reads half a file.
func writeAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".tenants-*.conf")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
