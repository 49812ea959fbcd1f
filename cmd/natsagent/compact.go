package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/natsagent/natsagent"
	"github.com/natsagent/natsagent/internal/compact"
	"github.com/natsagent/natsagent/internal/protocol"
)

// compactWait bounds how long compact waits for the job's result.
const compactWait = 10 * time.Minute

func runCompact(ctx context.Context, args []string, std stdio) error {
	fs := newFlagSet("compact", "--thread <thread> [flags]", `
Compacts an idle thread: a job on the jobs queue summarizes its older messages with its agent's
context_compression settings and model, so its next run starts from the summary (docs/protocol.md
2.19). The thread's messages stay stored. Waits for the result and prints the context size before
and after; --detach prints the job id only.`, std)
	f := addClientFlags(fs)
	thread := fs.String("thread", "", "the thread to compact (also accepted as the only argument)")
	agentName := fs.String("agent", "", "the agent whose settings and model summarize (default: the agent of the thread's last run)")
	jobID := fs.String("job-id", "", "the job's id; the same id within the jobs stream's duplicate window is one job (default: a new id)")
	detach := fs.Bool("detach", false, "queue the job and print its id without waiting")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return parseErr(err)
	}
	if *thread == "" && len(pos) == 1 {
		*thread, pos = pos[0], nil
	}
	if len(pos) > 0 {
		return usageErr(std, "compact", "unexpected argument %q", pos[0])
	}
	if *thread == "" {
		return usageErr(std, "compact", "name the thread to compact with --thread")
	}
	if *jobID == "" {
		*jobID = newID()
	}
	c, err := f.connect(ctx)
	if err != nil {
		return err
	}
	defer c.close()
	req := compact.Request{JobID: *jobID, Tenant: c.tenant, ThreadID: *thread, Agent: *agentName}
	if err := req.Validate(); err != nil {
		return err
	}
	th, err := c.thread(ctx, *thread)
	if err != nil {
		return err
	}
	if th.Lease != nil {
		return fmt.Errorf("thread %s is busy with run %s: compact it when it is idle", th.ThreadID, th.Lease.RunID)
	}

	var fd *natsagent.Events
	if !*detach {
		// Opened before the job is queued, so its result cannot be missed.
		if fd, err = c.api.Follow(ctx, *thread, *jobID, start{}.options()); err != nil {
			return err
		}
		defer fd.Close()
	}
	if _, err := c.api.Compact(ctx, *thread, &natsagent.CompactOptions{Agent: *agentName, JobID: *jobID}); err != nil {
		return err
	}
	if *detach {
		if f.json {
			return writeJSON(std.out, map[string]string{"job_id": *jobID, "thread_id": *thread, "status": "queued"})
		}
		fmt.Fprintln(std.out, *jobID)
		return nil
	}
	d, err := awaitCompaction(ctx, fd)
	if err != nil {
		return err
	}
	if f.json {
		return writeJSON(std.out, d)
	}
	if d.Phase == protocol.CompressionFailed {
		return fmt.Errorf("compaction of thread %s failed (%s): %s", *thread, d.Code, d.Error)
	}
	if d.Summarized == 0 {
		fmt.Fprintf(std.out, "thread %s: nothing old enough to summarize (%d tokens)\n", *thread, d.TokensBefore)
		return nil
	}
	fmt.Fprintf(std.out, "thread %s compacted: %d → %d tokens, %d messages summarized; the cut messages are in %s\n",
		*thread, d.TokensBefore, d.TokensAfter, d.Summarized, d.HistoryPath)
	return nil
}

// awaitCompaction reads a compaction job's events until its result.
func awaitCompaction(ctx context.Context, fd *natsagent.Events) (*protocol.CompressionData, error) {
	deadline := time.Now().Add(compactWait)
	for time.Now().Before(deadline) {
		ev, err := nextWithin(ctx, fd, time.Until(deadline))
		if err != nil {
			if ctx.Err() != nil {
				return nil, errDetached
			}
			if errors.Is(err, context.DeadlineExceeded) {
				break
			}
			return nil, fmt.Errorf("read the compaction job's events: %w", err)
		}
		if d, ok := compact.Result(ev.Raw()); ok {
			return d, nil
		}
	}
	return nil, fmt.Errorf("no result from the compaction job within %s: is a worker running?", compactWait)
}
