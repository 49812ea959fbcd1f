package main

import (
	"context"
	"fmt"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
)

func runSteer(ctx context.Context, args []string, std stdio) error {
	fs := newFlagSet("steer", "--thread <thread> [flags] [message…]", `
Redirects a thread's active run: the message is sent as a run with multitask strategy steer, the
active run ends "steered" at its next safe boundary (keeping what it did), and the new run goes
first with the thread's whole history. The new run is followed like natsagent run. On a thread
with no active run the message simply runs next.`, std)
	f := addRunFlags(fs)
	thread := fs.String("thread", "", "the thread whose active run to steer (required)")
	agentName := fs.String("agent", "", "agent profile of the new run (default: the deployment's default)")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return parseErr(err)
	}
	if *thread == "" {
		return usageErr(std, "steer", "name the thread to steer with --thread")
	}
	text, err := message(pos, std)
	if err != nil {
		return usageErr(std, "steer", "%v", err)
	}
	c, err := f.connect(ctx)
	if err != nil {
		return err
	}
	defer c.close()
	th, err := c.thread(ctx, *thread)
	if err != nil {
		return err
	}
	if th.Lease == nil && !f.json {
		fmt.Fprintf(std.err, "thread %s has no active run: the message runs as the thread's next run\n", *thread)
	}
	req := &protocol.RunRequest{
		ThreadID:          *thread,
		Agent:             *agentName,
		MultitaskStrategy: protocol.StrategySteer,
		Input:             &protocol.Input{Messages: []model.Message{{Role: model.RoleUser, Content: text}}},
	}
	return launch(ctx, c, std, f, req)
}
