package main

// threads delete, runs delete and users erase. Thread and run deletions
// are NATS requests to the delete service the workers serve (as cancel
// is), so any client of the deployment can send them; erasing a user has
// no NATS subject (tenants may not): the command does it itself with the
// service account's JetStream access, as an administrator.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsagent/natsagent/internal/app"
	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/erase"
	"github.com/natsagent/natsagent/internal/protocol"
)

// deleteTimeout bounds a delete request: a cancelled run's stop and the
// deletion's settle delay fit in it.
const deleteTimeout = 2 * time.Minute

func runThreadsDelete(ctx context.Context, args []string, std stdio) error {
	fs := newFlagSet("threads delete", "<thread> [flags]", `
Deletes a thread and everything keyed by it: its runs, checkpoints, events, files, usage, dead
letters and queued memory jobs (docs/operations.md, "Deleting data"). A thread with a pending
or running run is refused unless --cancel, which cancels it first. A NATS request to the
delete service the workers serve; nothing of the thread can be read afterwards.`, std)
	f := addClientFlags(fs)
	cancelFirst := fs.Bool("cancel", false, "cancel the thread's active run first instead of refusing")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return parseErr(err)
	}
	if len(pos) != 1 {
		return usageErr(std, "threads delete", "name one thread to delete")
	}
	thread := pos[0]
	if err := protocol.CheckToken("thread", thread); err != nil {
		return err
	}
	c, err := f.connect(ctx)
	if err != nil {
		return err
	}
	defer c.close()
	reply, err := c.deleteRequest(ctx, c.names.ThreadDeleteSubject(c.tenant, thread), *cancelFirst)
	if err != nil {
		return err
	}
	if f.json {
		return writeJSON(std.out, reply)
	}
	fmt.Fprintf(std.out, "thread %s deleted\n", thread)
	return nil
}

func runRunsDelete(ctx context.Context, args []string, std stdio) error {
	fs := newFlagSet("runs delete", "--thread <thread> --run <run> [flags]", `
Deletes a finished run: its record, events, usage and dead letters. The thread keeps its state.
A pending or running run is refused: cancel it first.`, std)
	f := addClientFlags(fs)
	thread := fs.String("thread", "", "the run's thread (required)")
	run := fs.String("run", "", "the run to delete (also accepted as the only argument)")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return parseErr(err)
	}
	if *run == "" && len(pos) == 1 {
		*run, pos = pos[0], nil
	}
	if len(pos) > 0 {
		return usageErr(std, "runs delete", "unexpected argument %q", pos[0])
	}
	if *thread == "" || *run == "" {
		return usageErr(std, "runs delete", "name the run with --thread and --run")
	}
	for _, id := range [][2]string{{"--thread", *thread}, {"--run", *run}} {
		if err := protocol.CheckToken(id[0], id[1]); err != nil {
			return err
		}
	}
	c, err := f.connect(ctx)
	if err != nil {
		return err
	}
	defer c.close()
	reply, err := c.deleteRequest(ctx, c.names.RunDeleteSubject(c.tenant, *thread, *run), false)
	if err != nil {
		return err
	}
	if f.json {
		return writeJSON(std.out, reply)
	}
	fmt.Fprintf(std.out, "run %s deleted\n", *run)
	return nil
}

// deleteRequest sends a delete request and reads its answer.
func (c *client) deleteRequest(ctx context.Context, subject string, cancelFirst bool) (*protocol.DeleteReply, error) {
	ctx, cancel := context.WithTimeout(ctx, deleteTimeout)
	defer cancel()
	m := nats.NewMsg(subject)
	if cancelFirst {
		m.Header.Set(erase.HeaderCancel, "true")
	}
	msg, err := c.nc.RequestMsgWithContext(ctx, m)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return nil, fmt.Errorf("no worker serves delete requests on %s: start a worker of this deployment", subject)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
		return nil, fmt.Errorf("no worker answered the delete request within %s; a deletion cut short leaves the thread marked deleting: run the command again", deleteTimeout)
	case err != nil:
		return nil, err
	}
	if _, text, ok := serviceError(msg); ok {
		return nil, errors.New(text)
	}
	var reply protocol.DeleteReply
	if err := json.Unmarshal(msg.Data, &reply); err != nil {
		return nil, fmt.Errorf("decode the delete reply: %w", err)
	}
	return &reply, nil
}

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
	settings := bus.Settings{Names: c.names}
	open, err := app.Files(ctx, cfg, c.nc, settings)
	if err != nil {
		return err
	}
	lim, err := app.Limiter(ctx, c.js, cfg, settings)
	if err != nil {
		return c.missing(err)
	}
	e, err := erase.New(ctx, erase.Config{NC: c.nc, JS: c.js, Names: c.names, Stores: c.stores, Files: app.QuotaFiles(open, lim)})
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
