package main

import (
	"context"
	"fmt"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/natsagent/natsagent/internal/protocol"
)

func runThreads(ctx context.Context, args []string, std stdio) error {
	if len(args) > 0 && args[0] == "delete" {
		return runThreadsDelete(ctx, args[1:], std)
	}
	fs := newFlagSet("threads", "[flags]", `
Lists the tenant's threads, most recently active first, with their status, the run holding them
(or the last one) and their title. --json prints the thread records.`, std)
	f := addClientFlags(fs)
	limit := fs.Int("limit", 20, "show at most this many threads")
	status := fs.String("status", "", "only threads with this status: idle, busy, interrupted, error or deleting")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return parseErr(err)
	}
	if len(pos) > 0 {
		return usageErr(std, "threads", "unexpected argument %q", pos[0])
	}
	if *limit < 1 {
		return usageErr(std, "threads", "--limit must be at least 1")
	}
	switch *status {
	case "", protocol.ThreadIdle, protocol.ThreadBusy, protocol.ThreadInterrupted, protocol.ThreadError, protocol.ThreadDeleting:
	default:
		return usageErr(std, "threads", "--status %q is not a thread status (idle, busy, interrupted, error, deleting)", *status)
	}
	c, err := f.connect(ctx)
	if err != nil {
		return err
	}
	defer c.close()
	all, err := c.api.Threads(ctx)
	if err != nil {
		return err
	}
	out := []*protocol.Thread{}
	for _, th := range all {
		if th.Status == "" {
			th.Status = protocol.ThreadIdle
		}
		if *status == "" || th.Status == *status {
			out = append(out, th)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if !out[i].UpdatedAt.Equal(out[j].UpdatedAt) {
			return out[i].UpdatedAt.After(out[j].UpdatedAt)
		}
		return out[i].ThreadID < out[j].ThreadID
	})
	total := len(out)
	if len(out) > *limit {
		out = out[:*limit]
	}
	if f.json {
		return writeJSON(std.out, out)
	}
	if len(out) == 0 {
		fmt.Fprintf(std.err, "no threads in tenant %s\n", c.tenant)
		return nil
	}
	now := time.Now()
	tw := tabwriter.NewWriter(std.out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "THREAD\tSTATUS\tUPDATED\tRUN\tTITLE")
	for _, th := range out {
		run := "-"
		switch {
		case th.Lease != nil:
			run = th.Lease.RunID + " (active)"
		case th.LastRunID != "":
			run = th.LastRunID
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", th.ThreadID, th.Status, ago(th.UpdatedAt, now), run, oneLine(th.Title, 60))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if total > len(out) {
		fmt.Fprintf(std.err, "%d more: raise --limit to see them\n", total-len(out))
	}
	return nil
}
