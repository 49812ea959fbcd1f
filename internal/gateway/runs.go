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
	"github.com/natsagent/natsagent/internal/submit"
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
		read := &countingBody{ReadCloser: r.Body}
		r.Body = read
		if err := decodeBody(r, &body); err != nil {
			return err
		}
		// A run without input or command goes on from its checkpoint
		// (continueRun decides where once the thread may be read).
		cont := body.Input == nil && body.Command == nil
		if cont {
			body.Command = &runCommand{Goto: json.RawMessage(`"` + protocol.GotoModel + `"`)}
		}
		assistantID := body.AssistantID
		asst, err := s.runAssistant(r.Context(), tenant, &body)
		if err != nil {
			return err
		}
		req, err := s.request(&body, tenant, thread)
		if err != nil {
			return err
		}
		if err := s.checkBodyBesideImages(read.n, body.images); err != nil {
			return err
		}
		tagged := threadTags(req.Agent, assistantID)
		if asst != nil {
			underRun(&req.Config, *asst)
			if err := req.Validate(); err != nil {
				return err
			}
		}
		var modes langgraph.Modes
		if mode == modeStream || !isNull(body.StreamMode) {
			if modes, err = body.modes(); err != nil {
				return err
			}
		}
		if !isNull(body.StreamMode) {
			// A join that names no stream mode streams these.
			req.StreamMode = modes.List()
		}
		if mode == modeStream {
			nameInput(req)
		}
		if err := s.authorize(r, tenant, req); err != nil {
			return err
		}
		if err := s.checkWebhook(r.Context(), req); err != nil {
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
		// Images go to the thread's files once the caller may use it.
		if err := s.storeImages(r.Context(), tenant, thread, ifNotExists == ifNotExistsReject, body.images); err != nil {
			return err
		}
		forkCtx, cancelFork := context.WithTimeout(context.WithoutCancel(r.Context()), s.submitTimeout)
		if cont {
			err = s.continueRun(forkCtx, tenant, thread, req, &body.forkFields)
		}
		if err == nil {
			err = s.forkForRun(forkCtx, tenant, thread, body.RunID, &body.forkFields)
		}
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
		var due time.Time
		if after, _ := afterSeconds(&body); after > 0 {
			// A message schedule fires at whole seconds: round up, so the
			// run never starts before its after_seconds.
			due = time.Now().Add(time.Duration(after * float64(time.Second)))
			if t := due.Truncate(time.Second); !t.Equal(due) {
				due = t.Add(time.Second)
			}
		}
		rec, err := s.submit(ctx, req, ifNotExists, due, tagged)
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
			s.cancelOnDisconnect(r, rec, body.OnDisconnect == onDisconnectCancel)
		case modeWait:
			err := s.writeFinal(w, r, f, rec)
			s.cancelOnDisconnect(r, rec, body.OnDisconnect == onDisconnectCancel)
			return err
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
	final, err := s.awaitFinished(r.Context(), f, rec.Tenant, rec.ThreadID, rec.RunID)
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
	rec, err := s.runView(r.Context(), tenant, thread, run)
	if errors.Is(err, kv.ErrNotFound) {
		return nil, errNotFound(fmt.Sprintf("run %s not found on thread %s", run, thread))
	}
	return rec, err
}

// runView reads run of thread as clients see it (protocol.RunView): since
// protocol v2 a running run's record stays pending, or is missing until
// the run ends, and its thread's lease says it runs. A run without a
// record that no lease or last_run names is pending while its request
// waits in the stream (a plain publish not taken yet, or a run handed
// back between workers). A run of another thread is not found.
func (s *Server) runView(ctx context.Context, tenant, thread, run string) (*protocol.Run, error) {
	rec, err := s.stores.RunOfThread(ctx, tenant, thread, run)
	if errors.Is(err, kv.ErrNotFound) {
		queued, qerr := submit.QueuedRun(ctx, s.js, s.names, tenant, thread, run)
		if qerr != nil || queued == nil {
			return nil, err
		}
		return queued, nil
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
// events after Last-Event-ID (or ?last_event_id=), then live ones, in the
// stream modes asked for, else those the run was created with, else
// values.
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
	if _, named := r.URL.Query()["stream_mode"]; !named && len(rec.StreamMode) > 0 {
		// LangGraph streams what the run was created to stream.
		if m, err := langgraph.ParseModes(rec.StreamMode, modes.Subgraphs); err == nil {
			modes = m
		}
	}
	cancelOnLeave, err := boolQuery(r, "cancel_on_disconnect")
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
	s.cancelOnDisconnect(r, rec, cancelOnLeave)
	return nil
}

// cancelOnDisconnect cancels a run whose client went away before it
// ended, when the client asked for it (on_disconnect: cancel on a stream
// or wait, cancel_on_disconnect=1 on a join stream), through the same
// cancel request as POST .../cancel.
func (s *Server) cancelOnDisconnect(r *http.Request, rec *protocol.Run, asked bool) {
	if !asked || r.Context().Err() == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), s.cancelTimeout)
	defer cancel()
	log := s.log.With(zap.String("tenant", rec.Tenant), zap.String("thread_id", rec.ThreadID), zap.String("run_id", rec.RunID))
	cur, _, err := s.stores.Runs.Get(ctx, rec.Tenant, rec.RunID)
	if err == nil && cur.Status.Terminal() {
		return
	}
	if _, err := s.cancel(ctx, rec.Tenant, rec.ThreadID, rec.RunID, protocol.CancelInterrupt); err != nil {
		var ae *apiError
		if errors.As(err, &ae) && ae.code == protocol.CodeConflict {
			return // it ended meanwhile
		}
		log.Warn("the client left; cancelling its run failed", zap.Error(err))
		return
	}
	log.Info("the client left; its run was cancelled (on_disconnect cancel)")
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
	all, err := s.stores.ThreadRuns(r.Context(), tenant, th.ThreadID, th)
	if err != nil {
		return err
	}
	runs := []*protocol.Run{}
	for _, rec := range all {
		if status == "" || rec.Status == status {
			runs = append(runs, rec)
		}
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
		protocol.StatusTimeout, protocol.StatusIncomplete:
		return true
	}
	return false
}

// cancelRun: POST /threads/{thread_id}/runs/{run_id}/cancel, with
// LangGraph's ?action=interrupt|rollback and ?wait=. The workers serve
// cancel requests; the gateway relays the answer. A rollback returns the
// thread to the checkpoint before the run (the worker does it as the run
// stops) and then deletes the run, as LangGraph does.
func (s *Server) cancelRun(w http.ResponseWriter, r *http.Request, tenant string) error {
	thread, err := pathToken(r, "thread_id")
	if err != nil {
		return err
	}
	run, err := pathToken(r, "run_id")
	if err != nil {
		return err
	}
	action := r.URL.Query().Get("action")
	switch action {
	case "", protocol.CancelInterrupt, protocol.CancelRollback:
	default:
		return errInvalid("action", fmt.Sprintf("action=%q is not one of interrupt, rollback", clip(action)))
	}
	switch r.URL.Query().Get("wait") {
	// The answer always comes once the run stopped (or after 15 s): wait
	// changes nothing, but anything else is refused.
	case "", "0", "1", "true", "false":
	default:
		return errInvalid("wait", "wait must be 0, 1, true or false")
	}
	reply, err := s.cancel(r.Context(), tenant, thread, run, action)
	if err != nil {
		return err
	}
	if action == protocol.CancelRollback {
		if !reply.Status.Terminal() {
			return errConflict(fmt.Sprintf("run %s was asked to stop and roll back but is still %s; it will be rolled back when it stops: delete it then with DELETE /threads/%s/runs/%s", run, reply.Status, thread, run))
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), deleteTimeout)
		defer cancel()
		if err := s.eraser.DeleteRun(ctx, tenant, thread, run); err != nil {
			return deleteError(err)
		}
		s.log.Info("run rolled back and deleted", zap.String("tenant", tenant), zap.String("thread_id", thread), zap.String("run_id", run))
	}
	writeJSON(w, http.StatusOK, reply)
	return nil
}

// cancel sends the NATS cancel request (2.12) of a run and reads the
// answer; action rollback asks the worker to return the thread to the
// checkpoint before the run.
func (s *Server) cancel(ctx context.Context, tenant, thread, run, action string) (*protocol.CancelReply, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cancelTimeout)
	defer cancel()
	var body []byte
	if action == protocol.CancelRollback {
		body = []byte(`{"action":"rollback"}`)
	}
	msg, err := s.nc.RequestWithContext(ctx, s.names.CancelSubject(tenant, thread, run), body)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return nil, errUnavailable("no worker is serving cancel requests", nil)
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout):
		return nil, errUnavailable(fmt.Sprintf("no worker answered the cancel request within %s", s.cancelTimeout), nil)
	case err != nil:
		return nil, err
	}
	if msg.Header.Get("Nats-Service-Error-Code") != "" {
		return nil, replyError(msg)
	}
	var reply protocol.CancelReply
	if err := json.Unmarshal(msg.Data, &reply); err != nil {
		return nil, fmt.Errorf("decode cancel reply: %w", err)
	}
	s.log.Info("run cancel requested", zap.String("tenant", tenant), zap.String("thread_id", thread),
		zap.String("run_id", run), zap.String("action", action), zap.String("status", string(reply.Status)))
	return &reply, nil
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
