// Package events owns publishing run events: the envelope, the numbering
// within a run, and the lifecycle events whose count the protocol
// guarantees (at most one run.queued, exactly one run.finished per run,
// one run.started per attempt), made idempotent with Nats-Msg-Id so a
// redelivered or repeated step never stores them twice; the live events
// (token deltas: core NATS, not stored, unless the run is resumable);
// and reading them back, in stream order (Feed) or merged with the live
// ones as a person sees them (Follow), for the gateway and the CLI. It
// knows subjects and envelopes, not how runs execute.
package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/protocol"
)

// Publisher publishes run events: to the events stream, and live ones
// on core NATS.
type Publisher struct {
	js     jetstream.JetStream
	nc     *nats.Conn // live events
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
	return &Publisher{js: js, nc: js.Conn(), names: names, stream: st, log: log}, nil
}

// Msg builds the NATS message of one event. msgID, when set, makes the
// publish idempotent within the stream's duplicate window; it is stored
// as "<tenant>.<msgID>" because the stream dedupes over every tenant and
// run ids are only unique within one (another tenant's run.finished of
// the same run id must not make this one a duplicate).
func (p *Publisher) Msg(tenant, thread, run string, attempt int, seq uint64, eventType string, data any, msgID string) (*nats.Msg, error) {
	raw, err := encodeData(data)
	if err != nil {
		return nil, err
	}
	env := protocol.Event{Type: eventType, Seq: seq, RunID: run, ThreadID: thread, Tenant: tenant, Attempt: attempt, Time: time.Now().UTC(), Data: raw}
	m := nats.NewMsg(p.names.EventSubject(tenant, thread, run, protocol.KindOf(eventType)))
	m.Data = AppendEnvelope(make([]byte, 0, 160+len(raw)), &env)
	if msgID != "" {
		m.Header.Set(jetstream.MsgIDHeader, tenant+"."+msgID)
	}
	return m, nil
}

// AppendEnvelope appends the JSON of an event envelope to b, at
// protocol.EnvelopeVersion whatever e.V says. It is the hottest encoding
// of a run (every token delta goes through it), so it is written out by
// hand: the data, already JSON, is copied as it is instead of being
// re-validated, and the strings are escaped by strconv only when they
// hold something beyond the id alphabet. A live event (e.Live) carries
// live, after and index instead of seq.
func AppendEnvelope(b []byte, e *protocol.Event) []byte {
	b = append(b, `{"v":2,"type":`...)
	b = appendString(b, e.Type)
	if e.Live {
		b = append(b, `,"live":true,"after":`...)
		b = strconv.AppendUint(b, e.After, 10)
		b = append(b, `,"index":`...)
		b = strconv.AppendUint(b, e.Index, 10)
	} else {
		b = append(b, `,"seq":`...)
		b = strconv.AppendUint(b, e.Seq, 10)
	}
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

// encodeData is the JSON of an event's data. The lifecycle events' data,
// written at least twice a run, is encoded by hand
// (protocol.AppendEventDataJSON, the bytes encoding/json writes).
func encodeData(data any) (json.RawMessage, error) {
	switch d := data.(type) {
	case nil:
		return nil, nil
	case json.RawMessage:
		return d, nil
	}
	if b, ok := protocol.AppendEventDataJSON(make([]byte, 0, 128), data); ok {
		return b, nil
	}
	return json.Marshal(data)
}

// Publish publishes one event and waits for the stream to store it. An
// event with a message id (the lifecycle events) is sent again through a
// leader election or a node loss, and when a concurrent publish of the
// same event is still being stored (bus.PublishMsg): the stream keeps one.
func (p *Publisher) Publish(ctx context.Context, m *nats.Msg) error {
	_, err := bus.PublishMsg(ctx, p.js, m)
	return bus.MarkStoreFull(p.names.EventsStream(), err)
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
	// The worker that finished the run stopped before run.finished; the
	// events a node loss swallowed just before are gone with it.
	if r.Seq > 1 {
		if _, n, err := p.FillGaps(ctx, r.Tenant, r.ThreadID, r.RunID, r.Attempt, r.Seq-1); err != nil {
			p.log.Warn("could not look for a finished run's lost events", zap.String("tenant", r.Tenant), zap.String("run_id", r.RunID), zap.Error(err))
		} else if n > 0 {
			p.log.Warn("a finished run's last events were lost with its worker; marked them", zap.String("tenant", r.Tenant), zap.String("run_id", r.RunID), zap.Int("events", n))
		}
	}
	return p.PublishFinished(ctx, r)
}

// FinishedData is the data of a terminal record's run.finished event.
func FinishedData(r *protocol.Run) protocol.FinishedData {
	return protocol.FinishedData{Status: r.Status, StopReason: r.StopReason, IncompleteDetails: r.IncompleteDetails, Error: r.Error, Output: r.Output, SupersededBy: r.SupersededBy, Interrupt: r.Interrupt}
}

// LastSeq returns the highest seq of a run's stored events (0 if none),
// read through the stream's leader: a replica behind it would make a
// takeover number its events again from an older seq. It is the seq of
// the last event stored, unless that one was sent again after a node
// loss or is an event.lost marker (stored after higher seqs): then it is
// read from all of the run's events.
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
	if id := m.Header.Get(jetstream.MsgIDHeader); strings.Contains(id, resentMark) || strings.Contains(id, lostMark) {
		// Sent again after a node loss, or a marker: stored after events
		// with higher seqs, so the highest is read from them all.
		_, _, top, err := p.readSeqs(ctx, tenant, thread, run)
		return top, err
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
	// bytes counts the event bytes (subject and body) handed to the
	// stream, for the tenants' event quota (internal/limits).
	bytes int64

	// unsure holds the events without a message id whose publish failed
	// the way a leader election or a node loss fails it: the stream may
	// hold them or not, and Flush finds out before sending them again.
	unsure []*nats.Msg
	// again holds the events with a message id whose publish failed that
	// way: Flush sends them again, and the stream keeps one copy.
	again []*nats.Msg
	// lastAck is the stream sequence of the last event seen stored, in
	// emission order, before the first unsure one; scanFrom is where
	// Flush looks for the unsure events (lastAck+1 when the first failed).
	lastAck, scanFrom uint64

	// live, when set, is asked before every event is published; once it
	// says false the attempt has lost its right to the run (another
	// worker may have taken it over) and its events are dropped.
	live    func() bool
	dropped int
	// hold, when set, is asked after live: while it says true the
	// attempt may still hold its right to the run but cannot show it (its
	// lease's renewal is late). Its events are numbered and kept in held,
	// published once hold says false (Resume, the next event, Flush) and
	// dropped if live says false first.
	hold func() bool
	held []*nats.Msg

	// resumable stores the live events too (SetResumable); index counts
	// the live events published.
	resumable bool
	index     uint64
	// Reused by emitLive: the envelope, a delta's data, the subjects.
	liveBuf, liveData []byte
	// liveSubjects holds the run's live subjects built so far, one per
	// kind: a run publishes live events of a kind or two.
	liveSubjects []liveSubject
}

// liveSubject is a run's live subject of one event kind.
type liveSubject struct{ kind, subject string }

// SetResumable makes the stream store the events that otherwise go out
// live (protocol.LiveEvent), for a run that asked for a resumable stream
// (protocol.RunRequest.StreamResumable).
func (s *Stream) SetResumable(resumable bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.resumable = resumable
}

// SetFence makes the stream drop the events emitted once live reports
// false: an attempt that lost its lease publishes nothing a client
// would read as the run's (its seqs may be the next attempt's by then).
// live is called before each event, outside the stream's lock.
func (s *Stream) SetFence(live func() bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.live = live
}

// SetHold makes the stream keep, instead of publishing, the events
// emitted while held reports true (see Stream.hold); Resume publishes
// them. held is called before each event, after live, outside the
// stream's lock.
func (s *Stream) SetHold(held func() bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hold = held
}

// Resume publishes the events kept while the stream was held, once it
// no longer is (its lease's renewal was confirmed); it drops them if the
// stream's fence closed meanwhile.
func (s *Stream) Resume() {
	s.mu.Lock()
	live, hold := s.live, s.hold
	s.mu.Unlock()
	ok, held := s.gate(live, hold)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settleHeld(ok, held)
}

// gate asks the fence (live) and the hold, outside the stream's lock.
func (s *Stream) gate(live, hold func() bool) (ok, held bool) {
	ok = live == nil || live()
	held = ok && hold != nil && hold()
	return ok, held
}

// settleHeld publishes the kept events when the stream is open again,
// drops them when its fence closed, with s.mu held.
func (s *Stream) settleHeld(ok, held bool) {
	if len(s.held) == 0 || held {
		return
	}
	kept := s.held
	s.held = nil
	if !ok {
		s.dropped += len(kept)
		return
	}
	for _, m := range kept {
		s.publish(m)
	}
}

// publish sends a numbered event, with s.mu held.
func (s *Stream) publish(m *nats.Msg) {
	f, err := s.p.js.PublishMsgAsync(m)
	if err == nil {
		s.bytes += int64(len(m.Subject) + len(m.Data))
		s.futures = append(s.futures, f)
		s.trim()
		return
	}
	if s.failed(m, err) {
		return
	}
	s.p.log.Warn("publish run event failed", zap.String("tenant", s.tenant), zap.String("thread_id", s.thread), zap.String("run_id", s.run),
		zap.String("subject", m.Subject), zap.Error(err))
}

// NewStream starts numbering after lastSeq, for one attempt of a run.
func (p *Publisher) NewStream(tenant, thread, run string, attempt int, lastSeq uint64) *Stream {
	return &Stream{p: p, tenant: tenant, thread: thread, run: run, attempt: attempt, seq: lastSeq}
}

// Emit publishes an event with the next seq. msgID may be empty. An
// event emitted once the stream's fence (SetFence) reports false is
// dropped.
func (s *Stream) Emit(eventType string, data any, msgID string) {
	s.mu.Lock()
	live, hold := s.live, s.hold
	s.mu.Unlock()
	ok, held := s.gate(live, hold)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settleHeld(ok, held)
	if !ok {
		if s.dropped++; s.dropped == 1 {
			s.p.log.Warn("the run's lease lapsed: its events are dropped from now on", zap.String("tenant", s.tenant), zap.String("thread_id", s.thread),
				zap.String("run_id", s.run), zap.Int("attempt", s.attempt), zap.String("type", eventType))
		}
		return
	}
	if !s.resumable && msgID == "" && protocol.LiveEvent(eventType) {
		if !held {
			// A live event is never sent again: one that would wait
			// for the hold is dropped (its stored successor carries it).
			s.emitLive(eventType, data)
		}
		return
	}
	s.seq++
	m, err := s.p.Msg(s.tenant, s.thread, s.run, s.attempt, s.seq, eventType, data, msgID)
	if err != nil {
		if s.firstErr == nil {
			s.firstErr = err
		}
		s.p.log.Warn("publish run event failed", zap.String("tenant", s.tenant), zap.String("thread_id", s.thread), zap.String("run_id", s.run),
			zap.String("type", eventType), zap.Error(err))
		return
	}
	if held {
		s.held = append(s.held, m)
		return
	}
	s.publish(m)
}

// emitLive publishes a live event on core NATS, with s.mu held: after
// the last stored event emitted (s.seq), numbered by s.index. A live
// event is never sent again: a reader that missed it gets its content
// from the stored event that makes it redundant. It runs once per token
// delta, so it reuses its buffers (Publish copies the data before it
// returns) and writes a delta's data by hand.
func (s *Stream) emitLive(eventType string, data any) {
	var raw json.RawMessage
	var err error
	if d, ok := data.(protocol.DeltaData); ok {
		s.liveData = appendDelta(s.liveData[:0], &d)
		raw = s.liveData
	} else {
		raw, err = encodeData(data)
	}
	if err == nil {
		s.index++
		env := protocol.Event{Type: eventType, Live: true, After: s.seq, Index: s.index, RunID: s.run, ThreadID: s.thread, Tenant: s.tenant,
			Attempt: s.attempt, Time: time.Now().UTC(), Data: raw}
		s.liveBuf = AppendEnvelope(s.liveBuf[:0], &env)
		err = s.p.nc.Publish(s.liveSubject(protocol.KindOf(eventType)), s.liveBuf)
	}
	if err != nil {
		s.p.log.Debug("publish live run event failed", zap.String("tenant", s.tenant), zap.String("thread_id", s.thread), zap.String("run_id", s.run),
			zap.String("type", eventType), zap.Error(err))
	}
}

// liveSubject is the run's live subject of kind, built once per kind.
func (s *Stream) liveSubject(kind string) string {
	for _, l := range s.liveSubjects {
		if l.kind == kind {
			return l.subject
		}
	}
	subject := s.p.names.LiveSubject(s.tenant, s.thread, s.run, kind)
	s.liveSubjects = append(s.liveSubjects, liveSubject{kind: kind, subject: subject})
	return subject
}

// appendDelta appends the JSON of a delta's data, as encoding/json
// writes it.
func appendDelta(b []byte, d *protocol.DeltaData) []byte {
	b = append(b, `{"message_id":`...)
	b = appendString(b, d.MessageID)
	b = append(b, `,"delta":`...)
	b = appendString(b, d.Delta)
	return append(b, '}')
}

// failed notes an event whose publish failed, with s.mu held. One that
// failed the way a leader election or a node loss fails a publish (the
// stream may hold it or not) is kept for Flush, and failed reports true:
// with a message id it is sent again, without one it is looked for first.
// Any other failure becomes the stream's error.
func (s *Stream) failed(m *nats.Msg, err error) bool {
	if m != nil && bus.IsStoreFullErr(err) {
		// Refused for lack of room: surely not stored, so sent again as
		// it is by Flush, which comes after the run waited for room.
		s.again = append(s.again, m)
		return true
	}
	if m != nil && bus.Transient(err) {
		if m.Header.Get(jetstream.MsgIDHeader) != "" {
			s.again = append(s.again, m)
			return true
		}
		if len(s.unsure) == 0 {
			s.scanFrom = s.lastAck + 1
		}
		s.unsure = append(s.unsure, m)
		return true
	}
	if s.firstErr == nil {
		s.firstErr = err
	}
	return false
}

// stored notes an event seen stored, with s.mu held.
func (s *Stream) stored(ack *jetstream.PubAck) {
	if ack != nil && len(s.unsure) == 0 {
		s.lastAck = max(s.lastAck, ack.Sequence)
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
		case ack := <-f.Ok():
			s.stored(ack)
		case err := <-f.Err():
			s.failed(f.Msg(), err)
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

// Bytes returns the bytes (subject and body) of the events emitted.
func (s *Stream) Bytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bytes
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
// first publish error. An event whose publish failed the way a leader
// election or a node loss fails it is sent again: one with a message id
// at once (the stream keeps one copy), one without after reading back,
// through the stream's leader, whether the stream holds it. An event sent
// again is stored after the events that followed it, still before
// run.finished; readers order a run's events by seq.
func (s *Stream) Flush(ctx context.Context) error {
	s.mu.Lock()
	live, hold := s.live, s.hold
	s.mu.Unlock()
	ok, held := s.gate(live, hold)
	s.mu.Lock()
	if held {
		// Still held when the attempt stops (handed back): the next
		// attempt does that work again.
		s.dropped += len(s.held)
		s.held = nil
	}
	s.settleHeld(ok, held)
	futures, queued := s.futures, s.queued
	s.futures, s.queued = nil, nil
	s.mu.Unlock()
	// An acknowledgement lost with a node that went down never arrives,
	// and nats.go does not time a future out: after ackWait the event
	// counts as failed that way.
	timeout := time.NewTimer(ackWait)
	defer timeout.Stop()
	if queued != nil {
		var err error
		select {
		case <-queued.Ok():
		case <-timeout.C:
			timeout.Reset(ackWait)
			err = nats.ErrTimeout
		case err = <-queued.Err():
		case <-ctx.Done():
			return ctx.Err()
		}
		if err != nil {
			// run.queued carries an id and is refused once the run has
			// events: that refusal is no failure.
			if _, err = bus.PublishMsg(ctx, s.p.js, queued.Msg()); err != nil && !runHasEvents(err) {
				s.fail(err)
			}
		}
	}
	expired := false
	for _, f := range futures {
		var ack *jetstream.PubAck
		var err error
		if expired {
			// Past the wait: what has not answered by now failed.
			select {
			case ack = <-f.Ok():
			case err = <-f.Err():
			default:
				err = nats.ErrTimeout
			}
		} else {
			select {
			case ack = <-f.Ok():
			case err = <-f.Err():
			case <-timeout.C:
				expired, err = true, nats.ErrTimeout
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		s.mu.Lock()
		if err == nil {
			s.stored(ack)
		} else {
			s.failed(f.Msg(), err)
		}
		s.mu.Unlock()
	}
	s.mu.Lock()
	again, unsure, from := s.again, s.unsure, s.scanFrom
	s.again, s.unsure = nil, nil
	s.mu.Unlock()
	for _, m := range again {
		if _, err := bus.PublishMsg(ctx, s.p.js, m); err != nil {
			s.fail(err)
		}
	}
	if len(unsure) > 0 {
		if err := s.restore(ctx, unsure, from); err != nil {
			s.fail(err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.firstErr
}

// fail records err as the stream's error unless it has one.
func (s *Stream) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.firstErr == nil {
		s.firstErr = err
	}
}

// restore stores the events of unsure (without message ids, in emission
// order) that the stream does not hold. It reads the run's events stored
// from stream sequence from on, through the stream's leader (a replica
// may not have applied the last writes), until one of this attempt
// emitted after the last unsure event: the stream stores a connection's
// publishes in order, so an unsure event not found by then was lost. The
// missing ones are sent again with a message id of their own, so that a
// retry of that send stores them once.
func (s *Stream) restore(ctx context.Context, unsure []*nats.Msg, from uint64) error {
	want := make(map[uint64]*nats.Msg, len(unsure))
	var last uint64
	for _, m := range unsure {
		seq, _, err := envelopeSeq(m.Data)
		if err != nil {
			return err
		}
		want[seq] = m
		last = max(last, seq)
	}
	subject := s.p.names.RunEvents(s.tenant, s.thread, s.run)
	for len(want) > 0 {
		sm, err := bus.GetMsgFromLeader(ctx, s.p.js, s.p.names.EventsStream(), bus.MsgQuery{NextBySubject: subject, Seq: from})
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return fmt.Errorf("look for %d run events not acknowledged: %w", len(want), err)
		}
		from = sm.Sequence + 1
		seq, attempt, err := envelopeSeq(sm.Data)
		if err != nil || attempt != s.attempt {
			continue
		}
		delete(want, seq)
		if seq > last {
			break
		}
	}
	missing := slices.Sorted(maps.Keys(want))
	for _, seq := range missing {
		m := want[seq]
		m.Header.Set(jetstream.MsgIDHeader, s.tenant+"."+resentID(s.run, s.attempt, seq))
		if _, err := bus.PublishMsg(ctx, s.p.js, m); err != nil {
			return fmt.Errorf("send run event %d again: %w", seq, err)
		}
	}
	if len(missing) > 0 {
		s.p.log.Info("run events lost in flight sent again", zap.String("tenant", s.tenant), zap.String("thread_id", s.thread),
			zap.String("run_id", s.run), zap.Int("attempt", s.attempt), zap.Int("events", len(missing)), zap.Int("unacknowledged", len(unsure)))
	}
	return nil
}

// resentID is the message id of an event without one of its own, sent
// again because its first publish was lost.
func resentID(run string, attempt int, seq uint64) string {
	return run + resentMark + strconv.Itoa(attempt) + "." + strconv.FormatUint(seq, 10)
}

// The message ids of events stored out of seq order: sent again
// (resentID) and event.lost markers (lostID).
const (
	resentMark = ".resent."
	lostMark   = ".lost."
)

// lostID is the message id of the event.lost marker of a seq.
func lostID(run string, seq uint64) string {
	return run + lostMark + strconv.FormatUint(seq, 10)
}

// envelopeSeq reads the seq and attempt of an event envelope.
func envelopeSeq(data []byte) (seq uint64, attempt int, err error) {
	var e struct {
		Seq     uint64 `json:"seq"`
		Attempt int    `json:"attempt"`
	}
	if err := json.Unmarshal(data, &e); err != nil {
		return 0, 0, fmt.Errorf("decode run event: %w", err)
	}
	return e.Seq, e.Attempt, nil
}

// lostReason is the data of the event.lost events MarkLost publishes.
const lostReason = "the worker that published this event died before the events stream stored it (a NATS node was lost at the same time); its content is gone"

// FillGaps reads a run's stored events and publishes an event.lost event,
// under attempt, for every seq the stream skips: from the lowest seq
// stored (below it, events may have expired) up to upTo, or to the
// highest seq stored when that is higher. A worker that died right after
// a NATS node loss swallowed some of its events could not send them
// again, and their content is gone with it; the markers keep seq without
// gaps. They carry message ids, so two workers filling the same run store
// each once. It returns the highest seq stored (0 when the run has no
// stored event: nothing is read then) and how many seqs it marked.
//
// The highest seq is not always the last event stored: an event sent
// again after a node loss is stored after events with higher seqs, so a
// worker taking a run over numbers on from FillGaps's figure, not from
// LastSeq's.
func (p *Publisher) FillGaps(ctx context.Context, tenant, thread, run string, attempt int, upTo uint64) (top uint64, marked int, err error) {
	seen, low, top, err := p.readSeqs(ctx, tenant, thread, run)
	if err != nil || top == 0 {
		return 0, 0, err
	}
	for seq := low + 1; seq <= max(top, upTo); seq++ {
		if seen[seq] {
			continue
		}
		m, err := p.Msg(tenant, thread, run, attempt, seq, protocol.EventLost, protocol.LostData{Reason: lostReason}, lostID(run, seq))
		if err != nil {
			return top, marked, err
		}
		if _, err := bus.PublishMsg(ctx, p.js, m); err != nil {
			return top, marked, fmt.Errorf("mark event %d of run %s lost: %w", seq, run, err)
		}
		marked++
	}
	return top, marked, nil
}

// readSeqs reads the seqs of a run's stored events, in stream order
// through an ordered consumer, and returns them with the lowest and the
// highest (0 and 0 when the run has no stored event: then nothing is
// read).
func (p *Publisher) readSeqs(ctx context.Context, tenant, thread, run string) (seen map[uint64]bool, low, top uint64, err error) {
	subject := p.names.RunEvents(tenant, thread, run)
	_, err = bus.GetMsgFromLeader(ctx, p.js, p.names.EventsStream(), bus.MsgQuery{LastBySubject: subject})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, 0, 0, nil
	}
	if err != nil {
		return nil, 0, 0, err
	}
	f, err := OpenFeed(ctx, p.js, p.names, subject, FeedConfig{DeleteInBackground: true})
	if err != nil {
		return nil, 0, 0, err
	}
	defer f.Close()
	seen = map[uint64]bool{}
	for {
		m, err := f.NextWithin(ctx, 5*time.Second)
		if err != nil {
			return nil, 0, 0, fmt.Errorf("read the events of run %s: %w", run, err)
		}
		if seq, _, err := envelopeSeq(m.Data()); err == nil {
			seen[seq] = true
			top = max(top, seq)
			if low == 0 || seq < low {
				low = seq
			}
		}
		md, err := m.Metadata()
		if err != nil {
			return nil, 0, 0, err
		}
		if md.NumPending == 0 {
			return seen, low, top, nil
		}
	}
}
