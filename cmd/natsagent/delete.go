package main

// threads delete and runs delete: NATS requests to the delete service the
// workers serve (as cancel is), sent through the public client, so any
// client of the deployment can send them. Erasing a user (users.go) is an
// administrator's command.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsagent/natsagent"
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
	dctx, cancel := context.WithTimeout(ctx, deleteTimeout)
	defer cancel()
	reply, err := c.api.DeleteThread(dctx, thread, &natsagent.DeleteOptions{Cancel: *cancelFirst})
	if err != nil {
		return deleteError(err)
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
	dctx, cancel := context.WithTimeout(ctx, deleteTimeout)
	defer cancel()
	reply, err := c.api.DeleteRun(dctx, *thread, *run)
	if err != nil {
		return deleteError(err)
	}
	if f.json {
		return writeJSON(std.out, reply)
	}
	fmt.Fprintf(std.out, "run %s deleted\n", *run)
	return nil
}

// deleteRequest says what to do when a delete request through the
// client fails.
func deleteError(err error) error {
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
		return fmt.Errorf("no worker answered the delete request within %s; a deletion cut short leaves the thread marked deleting: run the command again", deleteTimeout)
	case errors.Is(err, natsagent.ErrNotFound):
		return errors.New(strings.TrimPrefix(err.Error(), natsagent.ErrNotFound.Error()+": "))
	}
	return err
}
