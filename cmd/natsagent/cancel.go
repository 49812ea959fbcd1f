package main

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

// cancelTimeout bounds a cancel request: a running run is answered when
// it has stopped (docs/protocol.md 2.12).
const cancelTimeout = 30 * time.Second

func runCancel(ctx context.Context, args []string, std stdio) error {
	fs := newFlagSet("cancel", "--run <run> | --thread <thread> [flags]", `
Cancels a run, pending or running, the way the gateway does: a NATS request to the run's cancel
subject, served by the workers. A pending run is recorded cancelled at once; a running one is
stopped (its model and tool calls too) and the answer comes when it has ended. A finished run
cannot be cancelled. With --thread alone it cancels the thread's active run (the one holding
the thread now); runs queued behind it keep their place.`, std)
	f := addClientFlags(fs)
	run := fs.String("run", "", "the run to cancel (also accepted as the only argument)")
	thread := fs.String("thread", "", "the run's thread; alone, cancel the thread's active run")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return parseErr(err)
	}
	if *run == "" && len(pos) == 1 {
		*run, pos = pos[0], nil
	}
	if len(pos) > 0 {
		return usageErr(std, "cancel", "unexpected argument %q", pos[0])
	}
	if *run == "" && *thread == "" {
		return usageErr(std, "cancel", "name the run to cancel with --run, or its thread with --thread")
	}
	c, err := f.connect(ctx)
	if err != nil {
		return err
	}
	defer c.close()
	switch {
	case *run == "":
		th, err := c.thread(ctx, *thread)
		if err != nil {
			return err
		}
		if th.Lease == nil || th.Lease.RunID == "" {
			return fmt.Errorf("thread %s has no active run (status %s): list its runs with natsagent runs --thread %s%s", *thread, th.Status, *thread, tenantFlag(c))
		}
		*run = th.Lease.RunID
	case *thread == "":
		rec, err := c.run(ctx, "", *run)
		if err != nil {
			return err
		}
		*thread = rec.ThreadID
	default:
		if err := protocol.CheckToken("--thread", *thread); err != nil {
			return err
		}
	}
	reply, err := c.cancel(ctx, *thread, *run)
	if err != nil {
		return err
	}
	if f.json {
		return writeJSON(std.out, reply)
	}
	switch reply.Status {
	case protocol.StatusCancelled:
		fmt.Fprintf(std.out, "run %s cancelled\n", reply.RunID)
	default:
		// The worker could not stop it in time; the cancel still applies.
		fmt.Fprintf(std.out, "run %s is %s: the cancel applies when it reaches a safe boundary; watch it with natsagent tail --run %s%s\n",
			reply.RunID, reply.Status, reply.RunID, tenantFlag(c))
	}
	return nil
}

// cancel sends a cancel request through the client and says what to do
// when it fails.
func (c *client) cancel(ctx context.Context, thread, run string) (*protocol.CancelReply, error) {
	ctx, cancel := context.WithTimeout(ctx, cancelTimeout)
	defer cancel()
	status, err := c.api.Cancel(ctx, thread, run)
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
		return nil, fmt.Errorf("no worker answered the cancel request within %s; the run may still stop: check it with natsagent runs --thread %s", cancelTimeout, thread)
	case errors.Is(err, natsagent.ErrNotFound):
		text := strings.TrimPrefix(err.Error(), natsagent.ErrNotFound.Error()+": ")
		return nil, fmt.Errorf("%s: check the run and thread ids with natsagent runs --thread %s", text, thread)
	case err != nil:
		return nil, err
	}
	return &protocol.CancelReply{RunID: run, Status: status}, nil
}
