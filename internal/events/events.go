// Package events owns publishing run events: the envelope, the numbering
// within a run, and the lifecycle events whose count the protocol
// guarantees (at most one run.queued, exactly one run.finished per run,
// one run.started per attempt), made idempotent with Nats-Msg-Id so a
// redelivered or repeated step never stores them twice; and reading them
// back in stream order (Feed), for the gateway and the CLI. It knows
// subjects and envelopes, not how runs execute.
package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/protocol"
)

// Publisher publishes run events to the events stream.
type Publisher struct {
	js     jetstream.JetStream
	names  bus.Names
	stream jetstream.Stream
	log    *zap.Logger
}

// NewPublisher binds a publisher to the events stream, which must exist.
func NewPublisher(ctx context.Context, js jetstream.JetStream, names bus.Names, log *zap.Logger) (*Publisher, error) {
	st, err := js.Stream(ctx, names.EventsStream())
	if err != nil {
		return nil, fmt.Errorf("open stream %s: %w", names.EventsStream(), err)
	}
	if log == nil {
		log = zap.NewNop()
	}
	return &Publisher{js: js, names: names, stream: st, log: log}, nil
}

// Msg builds the NATS message of one event. msgID, when set, makes the
// publish idempotent within the stream's duplicate window.
func (p *Publisher) Msg(tenant, thread, run string, attempt int, seq uint64, eventType string, data any, msgID string) (*nats.Msg, error) {
	raw, err := encodeData(data)
	if err != nil {
		return nil, err
	}
	env := protocol.Event{Type: eventType, Seq: seq, RunID: run, ThreadID: thread, Tenant: tenant, Attempt: attempt, Time: time.Now().UTC(), Data: raw}
	m := nats.NewMsg(p.names.EventSubject(tenant, thread, run, protocol.KindOf(eventType)))
	m.Data = AppendEnvelope(make([]byte, 0, 160+len(raw)), &env)
	if msgID != "" {
		m.Header.Set(jetstream.MsgIDHeader, msgID)
	}
	return m, nil
}

// AppendEnvelope appends the JSON of an event envelope to b. It is the
// hottest encoding of a run (every token delta goes through it), so it is
// written out by hand: the data, already JSON, is copied as it is instead
// of being re-validated, and the strings are escaped by strconv only when
// they hold something beyond the id alphabet.
func AppendEnvelope(b []byte, e *protocol.Event) []byte {
	b = append(b, `{"type":`...)
	b = appendString(b, e.Type)
	b = append(b, `,"seq":`...)
	b = strconv.AppendUint(b, e.Seq, 10)
	b = append(b, `,"run_id":`...)
	b = appendString(b, e.RunID)
	b = append(b, `,"thread_id":`...)
	b = appendString(b, e.ThreadID)
	b = append(b, `,"tenant":`...)
	b = appendString(b, e.Tenant)
	if e.Attempt != 0 {
		b = append(b, `,"attempt":`...)
		b = strconv.AppendInt(b, int64(e.Attempt), 10)
	}
	b = append(b, `,"time":"`...)
	b = e.Time.AppendFormat(b, time.RFC3339Nano)
	b = append(b, '"')
	if len(e.Data) > 0 {
		b = append(b, `,"data":`...)
		b = append(b, e.Data...)
	}
	return append(b, '}')
}

// appendString appends s as a JSON string. Ids and event types are plain
// ASCII; anything else goes through encoding/json.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

func encodeData(data any) (json.RawMessage, error) {
	switch d := data.(type) {
	case nil:
		return nil, nil
	case json.RawMessage:
		return d, nil
	}
	return json.Marshal(data)
}

// Publish publishes one event and waits for the stream to store it. An
// event with a message id (the lifecycle events) is sent again through a
// leader election or a node loss, and when a concurrent publish of the
// same event is still being stored (bus.PublishMsg): the stream keeps one.
func (p *Publisher) Publish(ctx context.Context, m *nats.Msg) error {
	_, err := bus.PublishMsg(ctx, p.js, m)
	return err
}

// QueuedID, StartedID and FinishedID are the Nats-Msg-Id of the lifecycle
// events, so each is stored once however often it is published.
func QueuedID(run string) string { return run + ".queued" }

// StartedID is the message id of run.started for one attempt.
func StartedID(run string, attempt int) string {
	return run + ".started." + strconv.Itoa(attempt)
}

// FinishedID is the message id of run.finished.
func FinishedID(run string) string { return run + ".finished" }

// PublishQueued publishes a run's run.queued event (always seq 1).
func (p *Publisher) PublishQueued(ctx context.Context, req *protocol.RunRequest) error {
	m, err := p.queuedMsg(req)
	if err != nil {
		return err
	}
	if err := p.Publish(ctx, m); err != nil && !runHasEvents(err) {
		return err
	}
	return nil
}

// queuedMsg builds run.queued. It is only stored while the run has no
// lifecycle event at all: a request published again long after its run
// finished (beyond the duplicate window) must not queue it again.
func (p *Publisher) queuedMsg(req *protocol.RunRequest) (*nats.Msg, error) {
	m, err := p.Msg(req.Tenant, req.ThreadID, req.RunID, 0, 1, protocol.EventRunQueued,
		protocol.QueuedData{Agent: req.Agent, MultitaskStrategy: req.MultitaskStrategy}, QueuedID(req.RunID))
	if err != nil {
		return nil, err
	}
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "0")
	return m, nil
}

// runHasEvents reports a publish refused because the run's lifecycle
// subject holds events already.
func runHasEvents(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// PublishFinished publishes the run.finished event of a terminal record
// with the seq the record reserved for it. Publishing it again (after a
// crash, by another process) stores nothing new.
func (p *Publisher) PublishFinished(ctx context.Context, r *protocol.Run) error {
	if !r.Status.Terminal() {
		return fmt.Errorf("run %s is %s, not finished", r.RunID, r.Status)
	}
	m, err := p.Msg(r.Tenant, r.ThreadID, r.RunID, r.Attempt, r.Seq, protocol.EventRunFinished, FinishedData(r), FinishedID(r.RunID))
	if err != nil {
		return err
	}
	return p.Publish(ctx, m)
}

// EnsureFinished publishes a terminal record's run.finished unless the
// stream holds it already. Recovery paths (a redelivered request of a
// finished run, a crash between finishing and acking) use it: beyond the
// duplicate window the message id alone would not stop a second copy, and
// live subscribers would see every re-publish.
//
// The stream is read through its leader: a replica may not have stored
// the run.finished that another worker just published.
func (p *Publisher) EnsureFinished(ctx context.Context, r *protocol.Run) error {
	m, err := bus.GetMsgFromLeader(ctx, p.js, p.names.EventsStream(), bus.MsgQuery{LastBySubject: p.names.EventSubject(r.Tenant, r.ThreadID, r.RunID, protocol.KindLifecycle)})
	if err == nil {
		var env protocol.Event
		if json.Unmarshal(m.Data, &env) == nil && env.Type == protocol.EventRunFinished {
			return nil
		}
	} else if !errors.Is(err, jetstream.ErrMsgNotFound) {
		return err
	}
	return p.PublishFinished(ctx, r)
}

// FinishedData is the data of a terminal record's run.finished event.
func FinishedData(r *protocol.Run) protocol.FinishedData {
	return protocol.FinishedData{Status: r.Status, StopReason: r.StopReason, Error: r.Error, Output: r.Output, SupersededBy: r.SupersededBy, Interrupt: r.Interrupt}
}

// LastSeq returns the seq of the last stored event of a run (0 if none),
// read through the stream's leader: a replica behind it would make a
// takeover number its events again from an older seq.
func (p *Publisher) LastSeq(ctx context.Context, tenant, thread, run string) (uint64, error) {
	m, err := bus.GetMsgFromLeader(ctx, p.js, p.names.EventsStream(), bus.MsgQuery{LastBySubject: p.names.RunEvents(tenant, thread, run)})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	var env protocol.Event
	if err := json.Unmarshal(m.Data, &env); err != nil {
		return 0, fmt.Errorf("decode last event of run %s: %w", run, err)
	}
	return env.Seq, nil
}

// Stream publishes the events of one run attempt in order, numbering them.
// Events are published asynchronously (token deltas must not wait for a
// round trip each); Flush waits until every one is stored.
type Stream struct {
	p                   *Publisher
	tenant, thread, run string
	attempt             int
	mu                  sync.Mutex
	seq                 uint64
	futures             []jetstream.PubAckFuture
	queued              jetstream.PubAckFuture // run.queued, refused when the run has events
	firstErr            error
}

// NewStream starts numbering after lastSeq, for one attempt of a run.
func (p *Publisher) NewStream(tenant, thread, run string, attempt int, lastSeq uint64) *Stream {
	return &Stream{p: p, tenant: tenant, thread: thread, run: run, attempt: attempt, seq: lastSeq}
}

// Emit publishes an event with the next seq. msgID may be empty.
func (s *Stream) Emit(eventType string, data any, msgID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	m, err := s.p.Msg(s.tenant, s.thread, s.run, s.attempt, s.seq, eventType, data, msgID)
	if err == nil {
		var f jetstream.PubAckFuture
		f, err = s.p.js.PublishMsgAsync(m)
		if err == nil {
			s.futures = append(s.futures, f)
			s.trim()
		}
	}
	if err != nil && s.firstErr == nil {
		s.firstErr = err
		s.p.log.Warn("publish run event failed", zap.String("tenant", s.tenant), zap.String("thread_id", s.thread), zap.String("run_id", s.run),
			zap.String("type", eventType), zap.Error(err))
	}
}

// trim drops futures already acknowledged, so a long stream of deltas
// does not keep every future alive.
func (s *Stream) trim() {
	if len(s.futures) < 256 {
		return
	}
	kept := s.futures[:0]
	for _, f := range s.futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			if s.firstErr == nil {
				s.firstErr = err
			}
		default:
			kept = append(kept, f)
		}
	}
	s.futures = kept
}

// EmitQueued publishes run.queued as the stream's first event (seq 1,
// attempt 0), for a run whose record this worker is about to create.
func (s *Stream) EmitQueued(req *protocol.RunRequest) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	m, err := s.p.queuedMsg(req)
	if err == nil {
		s.queued, err = s.p.js.PublishMsgAsync(m)
	}
	if err != nil && s.firstErr == nil {
		s.firstErr = err
	}
}

// Seq returns the seq of the last event emitted.
func (s *Stream) Seq() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seq
}

// Reserve takes the next seq without publishing, for an event published
// later from a record (run.finished).
func (s *Stream) Reserve() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	return s.seq
}

// ackWait is how long Flush waits for the acknowledgements of the events
// emitted so far before it sends the unanswered ones again.
const ackWait = 5 * time.Second

// Flush waits until every event emitted so far is stored, and returns the
// first publish error.
func (s *Stream) Flush(ctx context.Context) error {
	s.mu.Lock()
	futures, queued := s.futures, s.queued
	s.futures, s.queued = nil, nil
	s.mu.Unlock()
	// An acknowledgement lost with a node that went down never arrives,
	// and nats.go does not time a future out: after ackWait the event is
	// sent again (resend) or reported not stored.
	timeout := time.NewTimer(ackWait)
	defer timeout.Stop()
	if queued != nil {
		select {
		case <-queued.Ok():
		case <-timeout.C:
			timeout.Reset(ackWait)
			if err := s.resend(ctx, queued.Msg(), nats.ErrTimeout); err != nil && !runHasEvents(err) {
				s.mu.Lock()
				if s.firstErr == nil {
					s.firstErr = err
				}
				s.mu.Unlock()
			}
		case err := <-queued.Err():
			if err = s.resend(ctx, queued.Msg(), err); err != nil && !runHasEvents(err) {
				s.mu.Lock()
				if s.firstErr == nil {
					s.firstErr = err
				}
				s.mu.Unlock()
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	expired := false
	for _, f := range futures {
		var err error
		if expired {
			// Past the wait: what has not answered by now is sent again.
			select {
			case <-f.Ok():
				continue
			case err = <-f.Err():
			default:
				err = nats.ErrTimeout
			}
		} else {
			select {
			case <-f.Ok():
				continue
			case <-timeout.C:
				expired, err = true, nats.ErrTimeout
			case err = <-f.Err():
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if err = s.resend(ctx, f.Msg(), err); err != nil {
			s.mu.Lock()
			if s.firstErr == nil {
				s.firstErr = err
			}
			s.mu.Unlock()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.firstErr
}

// resend publishes again, and waits for, an event whose asynchronous
// publish failed the way a leader election or a node loss fails it (no
// responders, a timeout, or its message id still being stored by the
// first attempt, which nats.go's own resend on no responders provokes),
// when the event carries a message id: the stream keeps one copy. An
// event without an id is not sent twice; err is returned as it was.
func (s *Stream) resend(ctx context.Context, m *nats.Msg, err error) error {
	if m == nil || m.Header.Get(jetstream.MsgIDHeader) == "" || !bus.Transient(err) {
		return err
	}
	if _, rerr := bus.PublishMsg(ctx, s.p.js, m); rerr != nil {
		return rerr
	}
	return nil
}
