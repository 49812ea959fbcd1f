package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/natsagent/natsagent"
	"github.com/natsagent/natsagent/internal/protocol"
)

// start says where a feed begins in the events stream.
type start struct {
	// all: from the first retained event; otherwise new events only,
	// unless since is set.
	all   bool
	since time.Time
}

// options are the public client's follow options for from. A follow's
// consumer exists on the server when Follow returns: an event published
// afterwards is never missed, so a submitter opens it before publishing.
// It recreates its consumer without bound, so a tail survives node
// restarts and reconnects, and its Close waits briefly for the consumer's
// deletion because the command exits right after. Events of a superseded
// attempt (a worker paused past its lease) are skipped.
func (from start) options() *natsagent.FollowOptions {
	switch {
	case !from.since.IsZero():
		return &natsagent.FollowOptions{Since: from.since}
	case !from.all:
		return &natsagent.FollowOptions{NewOnly: true}
	}
	return nil
}

// errDetached ends a follow the person stopped with Ctrl-C: the run goes
// on.
var errDetached = errors.New("detached")

// idleCheck is how long a run's feed may stay silent before its record is
// read: a run whose events expired, or whose worker died between its
// record and its run.finished, still ends the follow. A variable for
// tests.
var idleCheck = 3 * time.Second

// nextWithin is the next event of f, or context.DeadlineExceeded once
// wait passed without one; f stays usable.
func nextWithin(ctx context.Context, f *natsagent.Events, wait time.Duration) (*natsagent.Event, error) {
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	return f.Next(wctx)
}

// endedRecord is the run.finished event a terminal record stands for, or
// nil while the run goes on (or cannot be read).
func (c *client) endedRecord(ctx context.Context, thread, run string) (*natsagent.Event, error) {
	rec, err := c.api.RunOf(ctx, thread, run)
	if err != nil || !rec.Status.Terminal() {
		return nil, nil
	}
	return natsagent.FinishedEvent(rec)
}

// testHookRecordEnded, set by tests only, runs when a silent feed's run
// record was first seen ended.
var testHookRecordEnded func()

// followRun prints a run's events from f until its run.finished, and
// returns that event's data. ctx ending (Ctrl-C) returns errDetached.
//
// A terminal record seen while the feed is silent ends the follow only
// after the feed stayed silent for one more idleCheck: the record is
// written before the run's last events are, and under load those events
// can trail it by seconds (a worker whose lease fence paused holds its
// events until the lease is confirmed). Ending at once printed the answer
// without the tool calls that led to it.
func (c *client) followRun(ctx context.Context, f *natsagent.Events, r *renderer, thread, run string) (*protocol.FinishedData, error) {
	var ended *natsagent.Event
	for {
		ev, err := nextWithin(ctx, f, idleCheck)
		switch {
		case ctx.Err() != nil:
			return nil, errDetached
		case errors.Is(err, context.DeadlineExceeded):
			if ended == nil {
				if ended, err = c.endedRecord(ctx, thread, run); err != nil {
					return nil, err
				}
				if ended != nil && testHookRecordEnded != nil {
					testHookRecordEnded()
				}
				continue
			}
			if fin := r.event(ended.Raw()); fin != nil {
				return fin, nil
			}
			return ended.Finished(), nil
		case err != nil:
			return nil, fmt.Errorf("lost the run's events: %w; follow it again with `natsagent tail --run %s`", err, run)
		default:
			if fin := r.event(ev.Raw()); fin != nil {
				return fin, nil
			}
		}
	}
}

// followThread prints a thread's events until ctx ends.
func (c *client) followThread(ctx context.Context, f *natsagent.Events, r *renderer) error {
	for {
		ev, err := nextWithin(ctx, f, time.Minute)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, context.DeadlineExceeded) {
				continue
			}
			return err
		}
		r.event(ev.Raw())
	}
}
