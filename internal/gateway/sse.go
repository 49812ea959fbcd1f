package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/events"
	"github.com/natsagent/natsagent/internal/langgraph"
	"github.com/natsagent/natsagent/internal/protocol"
)

// openFeed starts reading the events matching subject with stream
// sequence above after (0: from the first one). The consumer exists on the
// server when openFeed returns, so an event published afterwards is never
// missed. Its recreation is bounded: a consumer that cannot be recreated
// ends the stream, and the client resumes with Last-Event-ID. Close
// deletes the consumer in the background, so a finished response is not
// held for a round trip. Events of a superseded attempt (a worker paused
// past its lease) are not sent (events.FeedConfig.DropStale).
func (s *Server) openFeed(ctx context.Context, subject string, after uint64) (*events.Feed, error) {
	return events.OpenFeed(ctx, s.js, s.names, subject, events.FeedConfig{
		After:              after,
		DropStale:          true,
		MaxResets:          3,
		DeleteInBackground: true,
		Log:                s.log,
	})
}

// openFollow is openFeed for a stream a person reads: the stored events
// of subject merged with the live ones (token deltas, events.Follow).
func (s *Server) openFollow(ctx context.Context, subject string, after uint64) (*events.Follow, error) {
	return events.OpenFollow(ctx, s.js, s.names, subject, events.FeedConfig{
		After:              after,
		DropStale:          true,
		MaxResets:          3,
		DeleteInBackground: true,
		Log:                s.log,
	})
}

// envelopeType reads an event's type without decoding its data.
func envelopeType(data []byte) string {
	var env struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal(data, &env)
	return env.Type
}

// resumeAttempt tells f, which resumes rec's events after stream
// sequence after, the newest run.started the client had by then, so the
// events of older attempts stored later are dropped as in a stream read
// from the start, and the run's seq of the event at after, so the live
// events that follow it go out at once and later ones wait for their
// stored event. It reads the run's lifecycle events up to after (a
// few: run.queued and a run.started per attempt); if that fails, the
// feed drops what follows a newer run.started only.
func (s *Server) resumeAttempt(ctx context.Context, f *events.Follow, rec *protocol.Run, after uint64) {
	runEvents := strings.TrimSuffix(s.names.RunEvents(rec.Tenant, rec.ThreadID, rec.RunID), ">")
	if m, err := s.events.GetMsg(ctx, after); err == nil && strings.HasPrefix(m.Subject, runEvents) {
		var env struct {
			Seq uint64 `json:"seq"`
		}
		if json.Unmarshal(m.Data, &env) == nil {
			f.SawSeq(rec.Tenant, rec.RunID, env.Seq)
		}
	}
	subject := s.names.EventSubject(rec.Tenant, rec.ThreadID, rec.RunID, protocol.KindLifecycle)
	newest := 0
	for seq := uint64(1); seq <= after; {
		m, err := s.events.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if err != nil || m.Sequence > after {
			break
		}
		var env struct {
			Type    string `json:"type"`
			Attempt int    `json:"attempt"`
		}
		if json.Unmarshal(m.Data, &env) == nil && env.Type == protocol.EventRunStarted {
			newest = max(newest, env.Attempt)
		}
		seq = m.Sequence + 1
	}
	f.SawStarted(rec.Tenant, rec.RunID, newest)
}

// sse writes a text/event-stream response.
type sse struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

// startSSE sends the headers of an event stream. A server write timeout
// would cut a long stream, so it is lifted for this response.
func startSSE(w http.ResponseWriter) *sse {
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Time{})
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	_ = rc.Flush()
	return &sse{w: w, rc: rc}
}

// event writes one event and flushes it. id is "" for an event that has no
// stream sequence (a synthesized run.finished).
func (e *sse) event(id, eventType string, data []byte) error {
	var b bytes.Buffer
	if id != "" {
		b.WriteString("id: " + id + "\n")
	}
	if t := oneLine(eventType); t != "" {
		b.WriteString("event: " + t + "\n")
	}
	// A data line ends at a line break; JSON from encoding/json has none,
	// but nothing else may break the framing either.
	for _, line := range bytes.Split(bytes.ReplaceAll(bytes.ReplaceAll(data, []byte("\r\n"), []byte("\n")), []byte("\r"), []byte("\n")), []byte("\n")) {
		b.WriteString("data: ")
		b.Write(line)
		b.WriteByte('\n')
	}
	b.WriteByte('\n')
	if _, err := e.w.Write(b.Bytes()); err != nil {
		return err
	}
	return e.rc.Flush()
}

func (e *sse) comment(text string) error {
	if _, err := e.w.Write([]byte(": " + oneLine(text) + "\n\n")); err != nil {
		return err
	}
	return e.rc.Flush()
}

func oneLine(s string) string {
	return strings.NewReplacer("\r", "", "\n", "").Replace(s)
}

// streamRun answers with the events of rec's run stored after stream
// sequence after, then live ones, until run.finished. f must read the
// run's events from after (from the first one when tr is set). tr, when
// set, translates them to LangGraph's stream modes; a resumed
// translation reads the run's events from the start and sends what
// follows after.
//
// A finished run with no stored event gets one run.finished built from
// its record, unless the client resumes after the stored run.finished
// (the record's finished_event_id): then the stream is empty, as it was
// before the events expired. When the record finished longer ago than the
// events stream keeps events, they expired and the record's run.finished
// goes out at once. Otherwise the events may not be stored yet: the
// record is written before the run's last events, and a worker whose
// lease fence paused holds them until its lease is confirmed. The record
// then ends the stream only once the feed stayed silent for trailWait;
// a stored run.finished that comes first ends it instead, so the stream
// has exactly one.
func (s *Server) streamRun(w http.ResponseWriter, r *http.Request, f *events.Follow, rec *protocol.Run, after uint64, tr *langgraph.Stream) {
	log := s.log.With(zap.String("tenant", rec.Tenant), zap.String("thread_id", rec.ThreadID), zap.String("run_id", rec.RunID))
	var ended []byte // the record's run.finished, sent if the feed stays silent
	trailing := false
	if rec.Status.Terminal() {
		last, err := s.events.GetLastMsgForSubject(r.Context(), s.names.RunEvents(rec.Tenant, rec.ThreadID, rec.RunID))
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound) && after > 0 && rec.FinishedEventID > 0 && after >= rec.FinishedEventID:
			// Expired, and the client had run.finished.
			startSSE(w)
			return
		case errors.Is(err, jetstream.ErrMsgNotFound):
			ended, err = events.FinishedEnvelope(rec)
			if err != nil {
				log.Error("encode run.finished", zap.Error(err))
			}
			trailing = ended != nil && !s.eventsExpired(rec)
		case err != nil:
			log.Warn("read the last event of a finished run", zap.Error(err))
		case last.Sequence <= after && envelopeType(last.Data) == protocol.EventRunFinished:
			// The client already has every event.
			s.noteFinishedEventID(rec, last.Sequence)
			startSSE(w)
			return
		}
	}
	out := startSSE(w)
	if trailing && s.testHookTrailing != nil {
		s.testHookTrailing()
	}
	if tr != nil {
		s.streamTranslated(r.Context(), out, f, rec, after, tr, log, ended, trailing)
		return
	}
	if ended != nil && !trailing {
		_ = out.event("", protocol.EventRunFinished, ended)
		return
	}
	// silentUntil is when ended goes out if no event came since.
	var silentUntil time.Time
	if trailing {
		silentUntil = time.Now().Add(s.trailWait)
	}
	for {
		wait := s.keepAlive
		if trailing {
			wait = max(min(wait, time.Until(silentUntil)), time.Millisecond)
		}
		m, err := f.NextWithin(r.Context(), wait)
		if err != nil {
			if r.Context().Err() != nil {
				log.Debug("event stream client left")
				return
			}
			if errors.Is(err, context.DeadlineExceeded) {
				if trailing && !time.Now().Before(silentUntil) {
					_ = out.event("", protocol.EventRunFinished, ended)
					return
				}
				if out.comment("keep-alive") != nil {
					return
				}
				continue
			}
			log.Warn("event stream ended early; the client resumes with Last-Event-ID", zap.Error(err))
			return
		}
		if trailing {
			silentUntil = time.Now().Add(s.trailWait)
		}
		// A live event has no id: Last-Event-ID stays a stream sequence.
		id := ""
		if !m.Live {
			id = strconv.FormatUint(m.StreamSeq, 10)
		}
		if err := out.event(id, m.Type, m.Data); err != nil {
			log.Debug("event stream write failed", zap.Error(err))
			return
		}
		if m.Type == protocol.EventRunFinished && !m.Live {
			s.noteFinishedEventID(rec, m.StreamSeq)
			return
		}
	}
}

// eventsExpired reports whether a finished run's events must have
// expired: the record finished longer ago than the events stream keeps
// an event (its max_age; none: they never expire by age).
func (s *Server) eventsExpired(rec *protocol.Run) bool {
	info := s.events.CachedInfo()
	if info == nil || info.Config.MaxAge <= 0 {
		return false
	}
	at := rec.CreatedAt
	if rec.FinishedAt != nil {
		at = *rec.FinishedAt
	}
	return time.Since(at) > info.Config.MaxAge
}

// noteFinishedEventID records the stream sequence of the run.finished a
// client was sent (its SSE id) in the run's record (finished_event_id),
// once: when the run's events have expired, a client resuming with that
// id still gets an empty stream rather than run.finished again (an
// EventSource reconnects after every stream end). It runs after the
// event was flushed to the client, so it delays only the end of the
// response. A record that has one already is left alone.
func (s *Server) noteFinishedEventID(rec *protocol.Run, seq uint64) {
	if rec.FinishedEventID != 0 || seq == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, _, err := s.stores.Runs.Mutate(ctx, rec.Tenant, rec.RunID, func(r *protocol.Run) error {
		if r.FinishedEventID != 0 || !r.Status.Terminal() {
			return errNoteUnchanged
		}
		r.FinishedEventID = seq
		return nil
	})
	if err != nil && !errors.Is(err, errNoteUnchanged) {
		s.log.Debug("could not note the run's run.finished event id", zap.String("tenant", rec.Tenant), zap.String("run_id", rec.RunID), zap.Error(err))
	}
}

var errNoteUnchanged = errors.New("unchanged")

// awaitFinished blocks until rec's run has finished and returns its final
// record. f reads the run's lifecycle events. The record is checked now and
// then as well, so a run whose events expired still returns.
func (s *Server) awaitFinished(ctx context.Context, f *events.Feed, tenant, thread, run string) (*protocol.Run, error) {
	for {
		rec, err := s.runView(ctx, tenant, thread, run)
		if err != nil {
			return nil, err
		}
		if rec.Status.Terminal() {
			return rec, nil
		}
		for {
			m, err := f.NextWithin(ctx, 10*time.Second)
			if err != nil {
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				if errors.Is(err, context.DeadlineExceeded) {
					break // check the record
				}
				return nil, errUnavailable("lost the run's events while waiting; join the run again", err)
			}
			if envelopeType(m.Data()) == protocol.EventRunFinished {
				break
			}
		}
	}
}
