package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/events"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/langgraph"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
)

// runMode is what a run creation answers with.
type runMode int

const (
	modeBackground runMode = iota // the pending record
	modeStream                    // the run's events over SSE
	modeWait                      // the final record
)

// createRun serves POST /threads/{thread_id}/runs[/stream|/wait] and, when
// stateless, POST /runs[/stream|/wait] on a new thread.
func (s *Server) createRun(mode runMode, stateless bool) tenantHandler {
	return func(w http.ResponseWriter, r *http.Request, tenant string) error {
		var thread string
		if stateless {
			thread = newID()
		} else {
			var err error
			if thread, err = pathToken(r, "thread_id"); err != nil {
				return err
			}
		}
		if _, err := nativeFormat(r); err != nil {
			return err
		}
		var body runBody
		if err := decodeBody(r, &body); err != nil {
			return err
		}
		req, err := s.request(&body, tenant, thread)
		if err != nil {
			return err
		}
		var modes langgraph.Modes
		if mode == modeStream {
			if modes, err = body.modes(); err != nil {
				return err
			}
			nameInput(req)
		}
		if err := s.authorize(r, tenant, req); err != nil {
			return err
		}
		if err := s.admitRun(r.Context(), w, req); err != nil {
			return err
		}
		ifNotExists := body.IfNotExists
		if stateless {
			ifNotExists = ifNotExistsCreate
		}
		if ifNotExists != ifNotExistsReject {
			if err := s.claimThread(r, tenant, thread); err != nil {
				return err
			}
		}
		forkCtx, cancelFork := context.WithTimeout(context.WithoutCancel(r.Context()), s.submitTimeout)
		err = s.forkForRun(forkCtx, tenant, thread, body.RunID, &body.forkFields)
		cancelFork()
		if err != nil {
			return err
		}

		// The feed exists before the request is published: nothing the
		// run emits can be missed.
		var f *events.Feed
		var fw *events.Follow
		switch mode {
		case modeStream:
			fw, err = s.openFollow(r.Context(), s.names.RunEvents(tenant, thread, req.RunID), 0)
		case modeWait:
			f, err = s.openFeed(r.Context(), s.names.EventSubject(tenant, thread, req.RunID, protocol.KindLifecycle), 0)
		}
		if err != nil {
			return fmt.Errorf("read run events: %w", err)
		}
		if f != nil {
			defer f.Close()
		}
		if fw != nil {
			defer fw.Close()
		}

		// A client that disconnects mid-submission must not leave it half
		// done.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), s.submitTimeout)
		rec, err := s.submit(ctx, req, ifNotExists)
		cancel()
		if err != nil {
			return err
		}
		w.Header().Set("Content-Location", runLocation(rec.ThreadID, rec.RunID))
		switch mode {
		case modeStream:
			w.Header().Set("Location", streamLocation(rec.ThreadID, rec.RunID, modes))
			var input []model.Message
			if req.Input != nil {
				input = req.Input.Messages
			}
			s.streamRun(w, r, fw, rec, 0, s.translator(rec, modes, input))
		case modeWait:
			return s.writeFinal(w, r, f, rec)
		default:
			writeJSON(w, http.StatusOK, rec)
		}
		return nil
	}
}

// writeFinal waits for a run to finish and answers with the thread's
// values, or its record with ?format=natsagent (runResult). A client that
// leaves stops the wait, not the run.
func (s *Server) writeFinal(w http.ResponseWriter, r *http.Request, f *events.Feed, rec *protocol.Run) error {
	// A server write timeout must not cut a long wait.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Time{})
	final, err := s.awaitFinished(r.Context(), f, rec.Tenant, rec.RunID)
	if err != nil {
		if r.Context().Err() != nil {
			s.log.Debug("client left while waiting; the run goes on",
				zap.String("tenant", rec.Tenant), zap.String("thread_id", rec.ThreadID), zap.String("run_id", rec.RunID))
			return nil
		}
		return err
	}
	return s.writeRunResult(w, r, final)
}

// runOf reads the run named in the path; a run of another thread is not
// found.
func (s *Server) runOf(r *http.Request, tenant string) (*protocol.Run, error) {
	thread, err := pathToken(r, "thread_id")
	if err != nil {
		return nil, err
	}
	run, err := pathToken(r, "run_id")
	if err != nil {
		return nil, err
	}
	rec, _, err := s.stores.Runs.Get(r.Context(), tenant, run)
	if errors.Is(err, kv.ErrNotFound) || (err == nil && rec.ThreadID != thread) {
		return nil, errNotFound(fmt.Sprintf("run %s not found on thread %s", run, thread))
	}
	return rec, err
}

// getRun: GET /threads/{thread_id}/runs/{run_id}.
func (s *Server) getRun(w http.ResponseWriter, r *http.Request, tenant string) error {
	rec, err := s.runOf(r, tenant)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, rec)
	return nil
}

// joinRun: GET /threads/{thread_id}/runs/{run_id}/join, wait for an
// existing run.
func (s *Server) joinRun(w http.ResponseWriter, r *http.Request, tenant string) error {
	rec, err := s.runOf(r, tenant)
	if err != nil {
		return err
	}
	if _, err := nativeFormat(r); err != nil {
		return err
	}
	if rec.Status.Terminal() {
		return s.writeRunResult(w, r, rec)
	}
	f, err := s.openFeed(r.Context(), s.names.EventSubject(tenant, rec.ThreadID, rec.RunID, protocol.KindLifecycle), 0)
	if err != nil {
		return fmt.Errorf("read run events: %w", err)
	}
	defer f.Close()
	return s.writeFinal(w, r, f, rec)
}

// joinStream: GET /threads/{thread_id}/runs/{run_id}/stream, the run's
// events after Last-Event-ID (or ?last_event_id=), then live ones.
func (s *Server) joinStream(w http.ResponseWriter, r *http.Request, tenant string) error {
	rec, err := s.runOf(r, tenant)
	if err != nil {
		return err
	}
	after, err := lastEventID(r)
	if err != nil {
		return err
	}
	modes, err := queryModes(r)
	if err != nil {
		return err
	}
	tr := s.translator(rec, modes, nil)
	from := after
	if tr != nil {
		// A translation needs the run's events from the start (the values
		// they build); streamRun sends what follows after.
		from = 0
	}
	f, err := s.openFollow(r.Context(), s.names.RunEvents(tenant, rec.ThreadID, rec.RunID), from)
	if err != nil {
		return fmt.Errorf("read run events: %w", err)
	}
	defer f.Close()
	if from > 0 {
		s.resumeAttempt(r.Context(), f, rec, from)
	}
	s.streamRun(w, r, f, rec, after, tr)
	return nil
}

// lastEventID is the events-stream sequence of the last event a client
// got (0: none).
func lastEventID(r *http.Request) (uint64, error) {
	v := r.Header.Get("Last-Event-ID")
	if v == "" {
		v = r.URL.Query().Get("last_event_id")
	}
	if v == "" || v == "-1" {
		// -1 is LangGraph's "from the start" (useStream's joinStream).
		return 0, nil
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, errInvalid("last_event_id", fmt.Sprintf("Last-Event-ID %q is not an event id: send the id of the last event received", clip(v)))
	}
	return n, nil
}

// listRuns: GET /threads/{thread_id}/runs, newest first, with ?status=,
// ?limit= and ?offset=.
func (s *Server) listRuns(w http.ResponseWriter, r *http.Request, tenant string) error {
	th, err := s.thread(r, tenant)
	if err != nil {
		return err
	}
	page, err := pageOf(r)
	if err != nil {
		return err
	}
	status := protocol.Status(r.URL.Query().Get("status"))
	if status != "" && !knownStatus(status) {
		return errInvalid("status", fmt.Sprintf("%q is not a run status", clip(string(status))))
	}
	ids, err := s.stores.Threads.RunIDs(r.Context(), tenant, th.ThreadID)
	if err != nil {
		return err
	}
	runs := []*protocol.Run{}
	for _, id := range ids {
		rec, _, err := s.stores.Runs.Get(r.Context(), tenant, id)
		if errors.Is(err, kv.ErrNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		if rec.ThreadID != th.ThreadID || (status != "" && rec.Status != status) {
			continue
		}
		runs = append(runs, rec)
	}
	sort.SliceStable(runs, func(i, j int) bool {
		if !runs[i].CreatedAt.Equal(runs[j].CreatedAt) {
			return runs[i].CreatedAt.After(runs[j].CreatedAt)
		}
		return runs[i].RunID > runs[j].RunID
	})
	writeJSON(w, http.StatusOK, paginate(page, runs))
	return nil
}

func knownStatus(s protocol.Status) bool {
	switch s {
	case protocol.StatusPending, protocol.StatusRunning, protocol.StatusSuccess, protocol.StatusError,
		protocol.StatusCancelled, protocol.StatusInterrupted, protocol.StatusSteered, protocol.StatusRejected,
		protocol.StatusTimeout:
		return true
	}
	return false
}

// cancelRun: POST /threads/{thread_id}/runs/{run_id}/cancel. The workers
// serve cancel requests; the gateway relays the answer.
func (s *Server) cancelRun(w http.ResponseWriter, r *http.Request, tenant string) error {
	thread, err := pathToken(r, "thread_id")
	if err != nil {
		return err
	}
	run, err := pathToken(r, "run_id")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cancelTimeout)
	defer cancel()
	msg, err := s.nc.RequestWithContext(ctx, s.names.CancelSubject(tenant, thread, run), nil)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return errUnavailable("no worker is serving cancel requests", nil)
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout):
		return errUnavailable(fmt.Sprintf("no worker answered the cancel request within %s", s.cancelTimeout), nil)
	case err != nil:
		return err
	}
	if msg.Header.Get("Nats-Service-Error-Code") != "" {
		return replyError(msg)
	}
	var reply protocol.CancelReply
	if err := json.Unmarshal(msg.Data, &reply); err != nil {
		return fmt.Errorf("decode cancel reply: %w", err)
	}
	s.log.Info("run cancel requested", zap.String("tenant", tenant), zap.String("thread_id", thread),
		zap.String("run_id", run), zap.String("status", string(reply.Status)))
	writeJSON(w, http.StatusOK, reply)
	return nil
}

// replyError maps a NATS error reply to the HTTP error with the same code.
func replyError(msg *nats.Msg) *apiError {
	var er protocol.ErrorReply
	_ = json.Unmarshal(msg.Data, &er)
	text := er.Error.Message
	if text == "" {
		text = msg.Header.Get("Nats-Service-Error")
	}
	e := &apiError{code: er.Error.Code, msg: text, field: er.Error.Field}
	switch e.code {
	case protocol.CodeInvalid:
		e.status = http.StatusBadRequest
	case protocol.CodeNotFound:
		e.status = http.StatusNotFound
	case protocol.CodeConflict:
		e.status = http.StatusConflict
	case protocol.CodeUnavailable:
		e.status = http.StatusServiceUnavailable
	default:
		e.code, e.status = protocol.CodeInternal, http.StatusInternalServerError
		if n, err := strconv.Atoi(msg.Header.Get("Nats-Service-Error-Code")); err == nil && n >= 400 && n < 600 {
			e.status = n
		}
	}
	return e
}
