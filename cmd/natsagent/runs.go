package main

import (
	"context"
	"fmt"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/natsagent/natsagent/internal/protocol"
)

func runRuns(ctx context.Context, args []string, std stdio) error {
	if len(args) > 0 && args[0] == "delete" {
		return runRunsDelete(ctx, args[1:], std)
	}
	fs := newFlagSet("runs", "--thread <thread> [flags]", `
Lists a thread's runs, newest first: status, stop reason, when each was created, how long it
waited for a worker and its thread, and how long it ran. --json prints the run records.`, std)
	f := addClientFlags(fs)
	thread := fs.String("thread", "", "the thread (required)")
	limit := fs.Int("limit", 20, "show at most this many runs")
	status := fs.String("status", "", "only runs with this status")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return parseErr(err)
	}
	if len(pos) > 0 {
		return usageErr(std, "runs", "unexpected argument %q: name the thread with --thread", pos[0])
	}
	if *thread == "" {
		return usageErr(std, "runs", "name the thread with --thread (natsagent threads lists them)")
	}
	if *limit < 1 {
		return usageErr(std, "runs", "--limit must be at least 1")
	}
	if *status != "" && !knownStatus(protocol.Status(*status)) {
		return usageErr(std, "runs", "--status %q is not a run status (pending, running, success, error, cancelled, interrupted, steered, rejected, timeout)", *status)
	}
	c, err := f.connect(ctx)
	if err != nil {
		return err
	}
	defer c.close()
	if _, err := c.thread(ctx, *thread); err != nil {
		return err
	}
	all, err := c.api.Runs(ctx, *thread)
	if err != nil {
		return err
	}
	runs := []*protocol.Run{}
	for _, rec := range all {
		if *status == "" || rec.Status == protocol.Status(*status) {
			runs = append(runs, rec)
		}
	}
	sort.SliceStable(runs, func(i, j int) bool {
		if !runs[i].CreatedAt.Equal(runs[j].CreatedAt) {
			return runs[i].CreatedAt.After(runs[j].CreatedAt)
		}
		return runs[i].RunID > runs[j].RunID
	})
	if len(runs) > *limit {
		runs = runs[:*limit]
	}
	if f.json {
		return writeJSON(std.out, runs)
	}
	if len(runs) == 0 {
		if *status != "" {
			fmt.Fprintf(std.err, "thread %s has no %s runs\n", *thread, *status)
		} else {
			fmt.Fprintf(std.err, "thread %s has no runs\n", *thread)
		}
		return nil
	}
	st := styleFor(std)
	now := time.Now()
	tw := tabwriter.NewWriter(std.out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tSTATUS\tSTOP REASON\tCREATED\tWAITED\tRAN\tAGENT\tNOTE")
	for _, r := range runs {
		waited := "-"
		if r.StartedAt != nil {
			waited = span(&r.CreatedAt, r.StartedAt)
		} else if !r.Status.Terminal() {
			waited = roundDuration(now.Sub(r.CreatedAt)) + "…"
		}
		ran := span(r.StartedAt, r.FinishedAt)
		if r.StartedAt != nil && r.FinishedAt == nil {
			ran = roundDuration(now.Sub(*r.StartedAt)) + "…"
		}
		// Every status is wrapped in codes of one length, so tabwriter
		// still aligns the column.
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.RunID, st.status(r.Status), orDefault(r.StopReason, "-"),
			ago(r.CreatedAt, now), waited, ran, r.Agent, note(r))
	}
	return tw.Flush()
}

// note is the one thing worth knowing about a run beyond its status.
func note(r *protocol.Run) string {
	switch {
	case r.Error != "":
		return oneLine(r.Error, 70)
	case r.SupersededBy != "":
		return "superseded by " + r.SupersededBy
	case r.Interrupt != nil && r.Interrupt.Kind == protocol.InterruptApproval:
		return fmt.Sprintf("waits for approval of %s", plural(len(r.Interrupt.ActionRequests), "tool call"))
	case r.Interrupt != nil:
		return "asks: " + oneLine(r.Interrupt.Question, 60)
	case r.Attempt > 1:
		return fmt.Sprintf("%d attempts", r.Attempt)
	}
	return ""
}

func knownStatus(s protocol.Status) bool {
	switch s {
	case protocol.StatusPending, protocol.StatusRunning, protocol.StatusSuccess, protocol.StatusError,
		protocol.StatusCancelled, protocol.StatusInterrupted, protocol.StatusSteered, protocol.StatusRejected,
		protocol.StatusTimeout, protocol.StatusIncomplete:
		return true
	}
	return false
}
