package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

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

// feed reads events in stream order with an ordered consumer, the way the
// gateway's SSE join does (internal/gateway/sse.go): ephemeral,
// flow-controlled, recreated from the last delivered sequence when the
// server loses it (a node restart, a reconnect), so a tail survives them.
type feed struct {
	c    *client
	cons jetstream.Consumer
	it   jetstream.MessagesContext
}

// openFeed starts reading the events matching subject. The consumer
// exists on the server when it returns: an event published afterwards is
// never missed, so a submitter opens it before publishing.
func (c *client) openFeed(ctx context.Context, subject string, from start) (*feed, error) {
	cfg := jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{subject},
		// A CLI killed without its deferred cleanup leaves the consumer
		// for the server to drop.
		InactiveThreshold: time.Minute,
		DeliverPolicy:     jetstream.DeliverNewPolicy,
	}
	switch {
	case !from.since.IsZero():
		cfg.DeliverPolicy = jetstream.DeliverByStartTimePolicy
		cfg.OptStartTime = &from.since
	case from.all:
		cfg.DeliverPolicy = jetstream.DeliverAllPolicy
	}
	cons, err := c.js.OrderedConsumer(ctx, c.names.EventsStream(), cfg)
	if err != nil {
		return nil, err
	}
	it, err := cons.Messages()
	if err != nil {
		c.deleteConsumer(cons)
		return nil, err
	}
	return &feed{c: c, cons: cons, it: it}, nil
}

// next returns the next event's message; it gives up after wait (a
// context.DeadlineExceeded) so the caller can look at the record.
func (f *feed) next(ctx context.Context, wait time.Duration) (jetstream.Msg, error) {
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	return f.it.Next(jetstream.NextContext(wctx))
}

// close stops the consumer and deletes it rather than leaving it to
// expire.
func (f *feed) close() {
	f.it.Stop()
	f.c.deleteConsumer(f.cons)
}

func (c *client) deleteConsumer(cons jetstream.Consumer) {
	info := cons.CachedInfo()
	if info == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = c.js.DeleteConsumer(ctx, c.names.EventsStream(), info.Name)
}

// finishedEnvelope is the run.finished event of a terminal record, for a
// run whose stored events expired (as the gateway builds it).
func finishedEnvelope(rec *protocol.Run) ([]byte, error) {
	data, err := json.Marshal(events.FinishedData(rec))
	if err != nil {
		return nil, err
	}
	at := rec.CreatedAt
	if rec.FinishedAt != nil {
		at = *rec.FinishedAt
	}
	return json.Marshal(protocol.Event{
		Type: protocol.EventRunFinished, Seq: rec.Seq, RunID: rec.RunID, ThreadID: rec.ThreadID,
		Tenant: rec.Tenant, Attempt: rec.Attempt, Time: at, Data: data,
	})
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
func (c *client) followRun(ctx context.Context, f *feed, r *renderer, run string) (*protocol.FinishedData, error) {
	for {
		m, err := f.next(ctx, idleCheck)
		switch {
		case ctx.Err() != nil:
			return nil, errDetached
		case errors.Is(err, context.DeadlineExceeded):
			rec, _, err := c.stores.Runs.Get(ctx, c.tenant, run)
			if err != nil || !rec.Status.Terminal() {
				continue
			}
			raw, err := finishedEnvelope(rec)
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
			if fin := r.event(m.Data()); fin != nil {
				return fin, nil
			}
		}
	}
}

// followThread prints a thread's events until ctx ends.
func (c *client) followThread(ctx context.Context, f *feed, r *renderer) error {
	for {
		m, err := f.next(ctx, time.Minute)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, context.DeadlineExceeded) {
				continue
			}
			return err
		}
		r.event(m.Data())
	}
}
