package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/natsagent/natsagent/internal/events"
	"github.com/natsagent/natsagent/internal/protocol"
)

// start says where a feed begins in the events stream.
type start struct {
	// all: from the first retained event; otherwise new events only,
	// unless since is set.
	all   bool
	since time.Time
}

// openFeed starts reading the events matching subject (events.OpenFeed).
// The consumer exists on the server when it returns: an event published
// afterwards is never missed, so a submitter opens it before publishing.
// Unlike the gateway's, a CLI feed recreates its consumer without bound,
// so a tail survives node restarts and reconnects, and Close waits for the
// consumer's deletion, briefly, because the command exits right after (a
// goroutine would die with it; a consumer left behind expires within a
// minute). Events of a superseded attempt (a worker paused past its
// lease) are skipped, as the gateway skips them.
func (c *client) openFeed(ctx context.Context, subject string, from start) (*events.Feed, error) {
	return events.OpenFeed(ctx, c.js, c.names, subject, feedConfig(from))
}

func feedConfig(from start) events.FeedConfig {
	cfg := events.FeedConfig{DeleteTimeout: 2 * time.Second, DropStale: true}
	switch {
	case !from.since.IsZero():
		cfg.Since = from.since
	case !from.all:
		cfg.NewOnly = true
	}
	return cfg
}

// openFollow is openFeed for events a person reads: the stored events
// of subject merged with the live ones (token deltas, events.Follow).
func (c *client) openFollow(ctx context.Context, subject string, from start) (*events.Follow, error) {
	return events.OpenFollow(ctx, c.js, c.names, subject, feedConfig(from))
}

// errDetached ends a follow the person stopped with Ctrl-C: the run goes
// on.
var errDetached = errors.New("detached")

// idleCheck is how long a run's feed may stay silent before its record is
// read: a run whose events expired, or whose worker died between its
// record and its run.finished, still ends the follow. A variable for
// tests.
var idleCheck = 3 * time.Second

// followRun prints a run's events from f until its run.finished, and
// returns that event's data. ctx ending (Ctrl-C) returns errDetached.
func (c *client) followRun(ctx context.Context, f *events.Follow, r *renderer, run string) (*protocol.FinishedData, error) {
	for {
		m, err := f.NextWithin(ctx, idleCheck)
		switch {
		case ctx.Err() != nil:
			return nil, errDetached
		case errors.Is(err, context.DeadlineExceeded):
			rec, _, err := c.stores.RunView(ctx, c.tenant, "", run)
			if err != nil || !rec.Status.Terminal() {
				continue
			}
			raw, err := events.FinishedEnvelope(rec)
			if err != nil {
				return nil, err
			}
			if fin := r.event(raw); fin != nil {
				return fin, nil
			}
			d := events.FinishedData(rec)
			return &d, nil
		case err != nil:
			return nil, fmt.Errorf("lost the run's events: %w; follow it again with `natsagent tail --run %s`", err, run)
		default:
			if fin := r.event(m.Data); fin != nil {
				return fin, nil
			}
		}
	}
}

// followThread prints a thread's events until ctx ends.
func (c *client) followThread(ctx context.Context, f *events.Follow, r *renderer) error {
	for {
		m, err := f.NextWithin(ctx, time.Minute)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, context.DeadlineExceeded) {
				continue
			}
			return err
		}
		r.event(m.Data)
	}
}
