package main

import (
	"context"
	"fmt"
	"time"

	"github.com/natsagent/natsagent/internal/langgraph"
)

func runTail(ctx context.Context, args []string, std stdio) error {
	fs := newFlagSet("tail", "--run <run> | --thread <thread> [flags]", `
Prints a run's or a thread's events as they arrive, rendered like natsagent run (raw envelopes,
one per line, with --json).

A run is shown from its first event (or from --since) until it finishes; the exit status then
says how it ended, as for natsagent run. A thread is followed until Ctrl-C: new events only, or
every retained event with --from-start, or those since --since. Events are kept for the
deployment's nats.events_max_age (24 h by default); a finished run whose events expired is shown
from its record.

With --stream-mode (and --run) the run is printed from its start as the gateway streams it to a
LangGraph client: its SSE events, or one {"event","data"} line each with --json.`, std)
	f := addClientFlags(fs)
	run := fs.String("run", "", "the run to follow")
	thread := fs.String("thread", "", "the thread to follow (with --run: the run's thread, checked)")
	fromStart := fs.Bool("from-start", false, "a thread: replay every retained event first")
	since := fs.String("since", "", "start with the events since a duration ago (10m) or a time (RFC 3339)")
	sm := addModesFlag(fs)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return parseErr(err)
	}
	if len(pos) > 0 {
		return usageErr(std, "tail", "unexpected argument %q: name the run with --run or the thread with --thread", pos[0])
	}
	if *run == "" && *thread == "" {
		return usageErr(std, "tail", "name the run to follow with --run or the thread with --thread")
	}
	modes, translate, err := sm.modes()
	if err != nil {
		return usageErr(std, "tail", "%v", err)
	}
	if translate && (*run == "" || *since != "") {
		return usageErr(std, "tail", "--stream-mode translates one run from its start: name it with --run, without --since")
	}
	from := start{all: *fromStart}
	if *since != "" {
		if from.since, err = parseSince(*since, time.Now()); err != nil {
			return usageErr(std, "tail", "--since: %v", err)
		}
	}
	c, err := f.connect(ctx)
	if err != nil {
		return err
	}
	defer c.close()
	if *run != "" {
		return tailRun(ctx, c, std, f, *run, *thread, from, modes, translate)
	}
	if _, err := c.thread(ctx, *thread); err != nil {
		return err
	}
	fd, err := c.api.FollowThread(ctx, *thread, from.options())
	if err != nil {
		return fmt.Errorf("read the thread's events: %w", err)
	}
	defer fd.Close()
	if !f.json {
		fmt.Fprintf(std.err, "following thread %s%s (Ctrl-C stops)\n", *thread, tenantOf(c))
	}
	return c.followThread(ctx, fd, newRenderer(std.out, styleFor(std), f.json, true))
}

func tailRun(ctx context.Context, c *client, std stdio, f *clientFlags, run, thread string, from start, modes langgraph.Modes, translate bool) error {
	// A run of another thread than --thread is refused (c.run).
	rec, err := c.run(ctx, thread, run)
	if err != nil {
		return err
	}
	if from.since.IsZero() {
		from.all = true
	}
	// A finished run whose events expired ends when the feed stays
	// silent: its record tells how it ended (followRun).
	fd, err := c.api.Follow(ctx, rec.ThreadID, run, from.options())
	if err != nil {
		return fmt.Errorf("read the run's events: %w", err)
	}
	defer fd.Close()
	if translate {
		return followModes(ctx, c, std, f, fd, rec, modes, nil)
	}
	return follow(ctx, c, std, f, fd, rec)
}

// parseSince reads a duration before now or a point in time.
func parseSince(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return time.Time{}, fmt.Errorf("%q is negative", s)
		}
		return now.Add(-d), nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02 15:04:05", "2006-01-02 15:04", "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, s, time.Local); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%q is neither a duration (10m, 2h) nor a time (2026-01-02T15:04:05Z)", s)
}
