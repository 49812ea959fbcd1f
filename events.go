package natsagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/natsagent/natsagent/internal/events"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/submit"
)

// Event is one run event: the envelope of docs/protocol.md 2.10 and where
// it came from.
type Event struct {
	protocol.Event
	// StreamSeq is a stored event's sequence in the events stream (0 for
	// a live event): follow again after it to resume.
	StreamSeq uint64
	raw       []byte
}

// Raw is the event's envelope as the worker published it (JSON).
func (e *Event) Raw() []byte { return e.raw }

// Finished decodes the data of a run.finished event (nil for any other).
func (e *Event) Finished() *FinishedData {
	if e.Type != protocol.EventRunFinished {
		return nil
	}
	var d FinishedData
	if json.Unmarshal(e.Data, &d) != nil {
		return nil
	}
	return &d
}

// Delta returns the text of a message.delta event ("" for any other).
func (e *Event) Delta() string {
	if e.Type != protocol.EventMessageDelta {
		return ""
	}
	var d protocol.DeltaData
	_ = json.Unmarshal(e.Data, &d)
	return d.Delta
}

// Events is a run's event stream, stored and live events merged in the
// order the worker emitted them (token deltas included). Close it when
// done.
type Events struct {
	fw *events.Follow
}

// FollowOptions say where a follow starts.
type FollowOptions struct {
	// After resumes after this events-stream sequence (an Event's
	// StreamSeq); 0 starts at the first retained event.
	After uint64
	// NewOnly starts with the events stored after the follow opened.
	NewOnly bool
	// Since starts with the events stored at or after this time.
	Since time.Time
}

func (o *FollowOptions) feed() events.FeedConfig {
	// Close waits briefly for the consumer's deletion: a process that
	// exits right after would leave it to expire.
	cfg := events.FeedConfig{DropStale: true, DeleteTimeout: 2 * time.Second}
	if o == nil {
		return cfg
	}
	switch {
	case o.After > 0:
		cfg.After = o.After
	case !o.Since.IsZero():
		cfg.Since = o.Since
	case o.NewOnly:
		cfg.NewOnly = true
	}
	return cfg
}

// Follow streams a run's events from its first retained one (or after
// opts.After). Open it before or after submitting: nothing stored is
// missed either way; live deltas published before Follow returned are.
func (c *Client) Follow(ctx context.Context, thread, run string, opts *FollowOptions) (*Events, error) {
	if err := checkIDs(thread, run); err != nil {
		return nil, err
	}
	fw, err := events.OpenFollow(ctx, c.js, c.names, c.names.RunEvents(c.tenant, thread, run), opts.feed())
	if err != nil {
		return nil, fmt.Errorf("natsagent: follow run %s: %w", run, err)
	}
	return &Events{fw: fw}, nil
}

// FollowThread streams the events of every run of a thread, in the order
// they were stored (live deltas merged in), from where opts says (nil:
// the first retained event).
func (c *Client) FollowThread(ctx context.Context, thread string, opts *FollowOptions) (*Events, error) {
	if err := protocol.CheckToken("thread id", thread); err != nil {
		return nil, err
	}
	fw, err := events.OpenFollow(ctx, c.js, c.names, c.names.ThreadEvents(c.tenant, thread), opts.feed())
	if err != nil {
		return nil, fmt.Errorf("natsagent: follow thread %s: %w", thread, err)
	}
	return &Events{fw: fw}, nil
}

// Next returns the next event, waiting for it until ctx is done. A ctx
// that ends (a timeout to look elsewhere now and then) leaves the stream
// usable: call Next again.
func (s *Events) Next(ctx context.Context) (*Event, error) {
	it, err := s.fw.Next(ctx)
	if err != nil {
		return nil, err
	}
	ev := &Event{StreamSeq: it.StreamSeq, raw: it.Data}
	if err := json.Unmarshal(it.Data, &ev.Event); err != nil {
		return nil, fmt.Errorf("natsagent: undecodable event: %w", err)
	}
	return ev, nil
}

// Close stops the stream.
func (s *Events) Close() { s.fw.Close() }

// Wait waits until a run ended and returns its final record. It reads the
// record first (a run that ended long ago, whose events expired, is
// answered at once), then follows the run's events to its run.finished.
func (c *Client) Wait(ctx context.Context, thread, run string) (*Run, error) {
	if err := checkIDs(thread, run); err != nil {
		return nil, err
	}
	if rec, err := c.RunOf(ctx, thread, run); err == nil && rec.Status.Terminal() {
		return rec, nil
	} else if err != nil && !errors.Is(err, ErrNotFound) {
		return nil, err
	}
	s, err := c.Follow(ctx, thread, run, nil)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	for {
		// The record is read again now and then: a terminal record with
		// no run.finished in sight means its events expired.
		ev, err := s.fw.NextWithin(ctx, 5*time.Second)
		if err != nil && ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("natsagent: wait for run %s: %w", run, err)
		}
		if err == nil {
			var env protocol.Event
			if json.Unmarshal(ev.Data, &env) == nil && env.Type == protocol.EventRunFinished {
				return c.finalRecord(ctx, thread, run)
			}
			continue
		}
		if rec, rerr := c.RunOf(ctx, thread, run); rerr == nil && rec.Status.Terminal() {
			return rec, nil
		}
	}
}

// RunOf is [Client.Run] for a caller that knows the run's thread: it
// reads the run's record and that thread's record only, never a search of
// the tenant's threads; a run of another thread is [ErrNotFound].
func (c *Client) RunOf(ctx context.Context, thread, run string) (*Run, error) {
	if err := checkIDs(thread, run); err != nil {
		return nil, err
	}
	rec, err := c.stores.RunOfThread(ctx, c.tenant, thread, run)
	if errors.Is(err, kv.ErrNotFound) {
		// No record, lease or last_run names it: its request may wait in
		// the stream (not taken yet, or handed back between workers).
		if rec, err = submit.QueuedRun(ctx, c.js, c.names, c.tenant, thread, run); err == nil && rec == nil {
			err = fmt.Errorf("%w: run %s of thread %s in tenant %s", ErrNotFound, run, thread, c.tenant)
		}
	}
	return rec, err
}

// finalRecord reads a finished run's record; the record is written before
// run.finished is published, so it is terminal already.
func (c *Client) finalRecord(ctx context.Context, thread, run string) (*Run, error) {
	for {
		rec, err := c.RunOf(ctx, thread, run)
		if err != nil {
			return nil, err
		}
		if rec.Status.Terminal() {
			return rec, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
