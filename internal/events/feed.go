package events

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/protocol"
)

// Feed reads the events matching one subject in stream order, with an
// ordered consumer: ephemeral, flow-controlled, and recreated from the
// last delivered sequence when the server loses it (a node restart, a
// reconnect). The gateway's SSE streams and waits and the CLI's run, tail
// and compact read run events through it.
type Feed struct {
	js     jetstream.JetStream
	stream string
	cons   jetstream.Consumer
	it     jetstream.MessagesContext
	cfg    FeedConfig
	// attempts is the newest run.started attempt seen per run, for
	// DropStale.
	attempts map[string]int
}

// FeedConfig says where a feed starts, how hard it holds on to its
// consumer, and how Close removes it. The zero value reads from the first
// retained event, recreates its consumer without bound and waits up to
// DefaultDeleteTimeout for its deletion on Close.
type FeedConfig struct {
	// Where the feed starts; at most one of NewOnly, After and Since is
	// set. None: at the first retained event.
	//
	// NewOnly: only events stored after OpenFeed returns.
	NewOnly bool
	// After: events whose stream sequence is above it (an SSE
	// Last-Event-ID).
	After uint64
	// Since: events stored at or after this time.
	Since time.Time

	// DropStale skips the events of an attempt older than the newest
	// run.started the feed delivered for their run (or SawStarted): a
	// worker that was paused past its lease may have published some
	// after another worker took the run over. run.finished is never
	// skipped.
	DropStale bool

	// MaxResets bounds the attempts to recreate the consumer after the
	// server lost it; once they fail, Next returns an error. 0: no bound.
	MaxResets int

	// DeleteTimeout bounds the deletion of the consumer on Close;
	// 0: DefaultDeleteTimeout.
	DeleteTimeout time.Duration
	// DeleteInBackground makes Close return at once and delete the
	// consumer from a goroutine. Without it Close waits for the deletion.
	DeleteInBackground bool
	// Log gets the failures to delete the consumer (at debug level), other
	// than a consumer the server dropped already. nil: not logged.
	Log *zap.Logger
}

// DefaultDeleteTimeout bounds the deletion of a feed's consumer when
// FeedConfig.DeleteTimeout is 0.
const DefaultDeleteTimeout = 5 * time.Second

// feedInactiveThreshold is how long the server keeps a consumer nobody
// reads: a reader that died without closing its feed (a killed CLI, a
// gateway that lost its NATS connection) leaves it for the server to drop.
const feedInactiveThreshold = time.Minute

// ErrFeedStart reports a FeedConfig with more than one starting point.
var ErrFeedStart = errors.New("a feed starts at one point: set at most one of NewOnly, After and Since")

// OpenFeed starts reading the events matching subject from the deployment's
// events stream. The consumer exists on the server when OpenFeed returns,
// so an event published afterwards is never missed: open the feed before
// publishing what will emit the events.
func OpenFeed(ctx context.Context, js jetstream.JetStream, names bus.Names, subject string, cfg FeedConfig) (*Feed, error) {
	occ := jetstream.OrderedConsumerConfig{
		FilterSubjects:    []string{subject},
		MaxResetAttempts:  cfg.MaxResets,
		InactiveThreshold: feedInactiveThreshold,
	}
	starts := 0
	if cfg.NewOnly {
		starts++
		occ.DeliverPolicy = jetstream.DeliverNewPolicy
	}
	if cfg.After > 0 {
		starts++
		occ.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
		occ.OptStartSeq = cfg.After + 1
	}
	if !cfg.Since.IsZero() {
		starts++
		since := cfg.Since
		occ.DeliverPolicy = jetstream.DeliverByStartTimePolicy
		occ.OptStartTime = &since
	}
	if starts > 1 {
		return nil, ErrFeedStart
	}
	f := &Feed{js: js, stream: names.EventsStream(), cfg: cfg}
	cons, err := js.OrderedConsumer(ctx, f.stream, occ)
	if err != nil {
		return nil, err
	}
	f.cons = cons
	if f.it, err = cons.Messages(); err != nil {
		f.deleteConsumer()
		return nil, err
	}
	return f, nil
}

// Next returns the next event's message, or ctx's error.
func (f *Feed) Next(ctx context.Context) (jetstream.Msg, error) {
	for {
		m, err := f.it.Next(jetstream.NextContext(ctx))
		if err != nil || !f.cfg.DropStale {
			return m, err
		}
		if f.attempts == nil {
			f.attempts = map[string]int{}
		}
		if !staleEvent(f.attempts, m.Data()) {
			return m, nil
		}
	}
}

// SawStarted tells a DropStale feed that the reader already had run's
// run.started of attempt (a reader resuming after it), so that the
// events of older attempts that follow are dropped too.
func (f *Feed) SawStarted(tenant, run string, attempt int) {
	if f.attempts == nil {
		f.attempts = map[string]int{}
	}
	if key := tenant + "." + run; attempt > f.attempts[key] {
		f.attempts[key] = attempt
	}
}

// staleEvent reports whether an event (an envelope) is of a superseded
// attempt, the rule docs/protocol.md (2.10.5) gives readers: per run, an
// event whose attempt is older than the newest run.started seen is
// stale; run.queued and run.finished never are. newest holds the newest
// run.started attempt seen per tenant and run, and is updated.
func staleEvent(newest map[string]int, data []byte) bool {
	var env struct {
		Type    string `json:"type"`
		Tenant  string `json:"tenant"`
		RunID   string `json:"run_id"`
		Attempt int    `json:"attempt"`
	}
	if json.Unmarshal(data, &env) != nil {
		return false
	}
	key := env.Tenant + "." + env.RunID
	switch {
	case env.Type == protocol.EventRunStarted:
		if env.Attempt < newest[key] {
			return true
		}
		newest[key] = env.Attempt
		return false
	case env.Type == protocol.EventRunFinished, env.Type == protocol.EventRunQueued:
		return false
	}
	return env.Attempt < newest[key]
}

// NextWithin returns the next event's message, or
// context.DeadlineExceeded once wait has passed without one, so the
// caller can look elsewhere (the run's record) or keep a connection alive.
func (f *Feed) NextWithin(ctx context.Context, wait time.Duration) (jetstream.Msg, error) {
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	return f.Next(wctx)
}

// Close stops reading and deletes the consumer on the server rather than
// leaving it to expire.
func (f *Feed) Close() {
	f.it.Stop()
	f.deleteConsumer()
}

func (f *Feed) deleteConsumer() {
	info := f.cons.CachedInfo()
	if info == nil {
		return
	}
	if f.cfg.DeleteInBackground {
		go f.delete(info.Name)
		return
	}
	f.delete(info.Name)
}

func (f *Feed) delete(name string) {
	timeout := f.cfg.DeleteTimeout
	if timeout <= 0 {
		timeout = DefaultDeleteTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := f.js.DeleteConsumer(ctx, f.stream, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) && f.cfg.Log != nil {
		f.cfg.Log.Debug("delete event consumer", zap.String("consumer", name), zap.Error(err))
	}
}

// FinishedEnvelope is the run.finished event of a terminal record, for a
// reader that finds no stored run.finished because the run's events
// expired: the envelope PublishFinished stores, timed at the record's
// finished_at (created_at if it has none). It has no stream sequence.
func FinishedEnvelope(rec *protocol.Run) ([]byte, error) {
	data, err := json.Marshal(FinishedData(rec))
	if err != nil {
		return nil, err
	}
	at := rec.CreatedAt
	if rec.FinishedAt != nil {
		at = *rec.FinishedAt
	}
	return AppendEnvelope(nil, &protocol.Event{
		Type: protocol.EventRunFinished, Seq: rec.Seq, RunID: rec.RunID, ThreadID: rec.ThreadID,
		Tenant: rec.Tenant, Attempt: rec.Attempt, Time: at, Data: data,
	}), nil
}
