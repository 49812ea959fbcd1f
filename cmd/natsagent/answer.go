package main

import (
	"context"
	"fmt"

	"github.com/natsagent/natsagent/internal/protocol"
)

func runAnswer(ctx context.Context, args []string, std stdio) error {
	fs := newFlagSet("answer", "--thread <thread> [flags] [answer…]", `
Answers the question a thread waits on (the agent asked for a clarification). The answer is the
arguments joined by spaces, or stdin when there are none. The resumed run is followed like
natsagent run.`, std)
	f := addResumeFlags(fs)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return parseErr(err)
	}
	if err := f.requireThread(std, "answer"); err != nil {
		return err
	}
	text, err := message(pos, std)
	if err != nil {
		return usageErr(std, "answer", "no answer: give it as arguments or on stdin")
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
	if w.open.Kind != protocol.InterruptClarification {
		return fmt.Errorf("thread %s waits for approval of %s, not for an answer: decide with natsagent approve or natsagent reject --thread %s", f.thread, plural(len(w.open.ActionRequests), "tool call"), f.thread)
	}
	if !f.json {
		fmt.Fprintf(std.err, "answering %q\n", w.open.Question)
	}
	return resume(ctx, c, std, f, w, protocol.Resume{Answer: text})
}
