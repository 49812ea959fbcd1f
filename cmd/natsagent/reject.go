package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/natsagent/natsagent/internal/protocol"
)

func runReject(ctx context.Context, args []string, std stdio) error {
	fs := newFlagSet("reject", "--thread <thread> [flags] [reason…]", `
Answers a thread that waits for approval by rejecting every waiting call; none of them runs. The
reason (--message, or the arguments) is given to the model with each rejected call, so it can
change course. To approve some calls and reject the others, use natsagent approve with their
numbers. The resumed run is followed like natsagent run.`, std)
	f := addResumeFlags(fs)
	reason := fs.String("message", "", "why the calls are rejected (also accepted as the arguments)")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return parseErr(err)
	}
	if err := f.requireThread(std, "reject"); err != nil {
		return err
	}
	if len(pos) > 0 {
		if *reason != "" {
			return usageErr(std, "reject", "give the reason with --message or as arguments, not both")
		}
		*reason = strings.Join(pos, " ")
	}
	c, err := f.connect(ctx)
	if err != nil {
		return err
	}
	defer c.close()
	w, err := c.pending(ctx, f.thread)
	if err != nil {
		return err
	}
	if w.open.Kind != protocol.InterruptApproval {
		return fmt.Errorf("thread %s waits for an answer to %q, not for an approval: answer it with natsagent answer --thread %s \"…\"", f.thread, w.open.Question, f.thread)
	}
	decisions := make([]protocol.Decision, len(w.open.ActionRequests))
	for i := range decisions {
		decisions[i] = protocol.Decision{Type: protocol.DecisionReject, Message: *reason}
	}
	return decide(ctx, c, std, f, w, decisions)
}
