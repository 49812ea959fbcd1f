package main

// users erase: an administrator's command. Erasing a user has no NATS
// subject (tenants may not): the command does it itself with the service
// account's JetStream access, through internal/erase and the stores, not
// through the public client (operator commands, like bench and jwt, may
// import the engine; TestClientsDependOnTheWireOnly lists them).

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/app"
	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/erase"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/protocol"
)

func runUsers(ctx context.Context, args []string, std stdio) error {
	if len(args) == 0 || args[0] != "erase" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			return runUsers(ctx, []string{"erase", "-h"}, std)
		}
		return usageErr(std, "users", "the only subcommand is erase: natsagent users erase --tenant <tenant> --user <user>")
	}
	fs := newFlagSet("users erase", "--tenant <tenant> --user <user> [flags]", `
Erases one user of a tenant: every thread the user owns (as threads delete) and their memory
(notes, facts, memory jobs). For administrators: it uses the service account's JetStream access
directly, and --cancel cancels the user's active runs first (workers must be running to stop
them). With files.backend local (--config), it removes the workdirs under files.local_dir on this
machine. Threads created without an owner are the tenant's and stay.`, std)
	f := addClientFlags(fs)
	user := fs.String("user", "", "the user to erase (required)")
	cancelFirst := fs.Bool("cancel", false, "cancel the user's active runs first instead of stopping at a busy thread")
	pos, err := parseArgs(fs, args[1:])
	if err != nil {
		return parseErr(err)
	}
	if len(pos) > 0 {
		return usageErr(std, "users erase", "unexpected argument %q", pos[0])
	}
	if *user == "" {
		return usageErr(std, "users erase", "name the user with --user")
	}
	if err := protocol.CheckToken("--user", *user); err != nil {
		return err
	}
	c, err := f.connect(ctx)
	if err != nil {
		return err
	}
	defer c.close()
	// Workdirs are opened as the workers open them, with the tenants' file
	// quotas, so the erased files are no longer counted; with the local
	// backend, those on this machine's disk.
	cfg, err := f.settings()
	if err != nil {
		return err
	}
	names, err := bus.NewNames(cfg.NATS.Prefix)
	if err != nil {
		return err
	}
	js, err := jetstream.New(c.nc)
	if err != nil {
		return err
	}
	stores, err := kv.Open(ctx, js, names)
	if err != nil {
		return c.missing(err)
	}
	settings := bus.Settings{Names: names}
	open, err := app.Files(ctx, cfg, c.nc, settings)
	if err != nil {
		return err
	}
	lim, err := app.Limiter(ctx, js, cfg, settings)
	if err != nil {
		return c.missing(err)
	}
	e, err := erase.New(ctx, erase.Config{NC: c.nc, JS: js, Names: names, Stores: stores, Files: app.QuotaFiles(open, lim)})
	if err != nil {
		return c.missing(err)
	}
	out, err := e.EraseUser(ctx, c.tenant, *user, erase.ThreadOptions{Cancel: *cancelFirst})
	if err != nil {
		return err
	}
	if f.json {
		return writeJSON(std.out, map[string]any{"tenant": c.tenant, "user_id": *user, "threads": out.Threads})
	}
	fmt.Fprintf(std.out, "user %s of tenant %s erased: %d threads deleted, memory removed\n", *user, c.tenant, len(out.Threads))
	return nil
}
