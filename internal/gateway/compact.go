package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/compact"
	"github.com/natsagent/natsagent/internal/events"
	"github.com/natsagent/natsagent/internal/protocol"
)

// compactWait bounds how long ?wait=true waits for a compaction job.
const compactWait = 10 * time.Minute

type compactBody struct {
	// Agent whose context_compression settings and model summarize the
	// thread (default: the agent of its last run).
	Agent string `json:"agent"`
	// JobID makes a retried request one job (default: a new id).
	JobID string `json:"job_id"`
}

// compactReply answers POST /threads/{thread_id}/compact.
type compactReply struct {
	JobID    string `json:"job_id"`
	ThreadID string `json:"thread_id"`
	// Status is queued (the job waits or runs: follow Events), completed
	// or failed.
	Status string `json:"status"`
	// Events is the subject the job reports on.
	Events string                    `json:"events"`
	Result *protocol.CompressionData `json:"result,omitempty"`
}

// compactThread: POST /threads/{thread_id}/compact. A busy thread is
// refused (409); otherwise a compaction job is queued (202), or with
// ?wait=true the job's result is the answer.
func (s *Server) compactThread(w http.ResponseWriter, r *http.Request, tenant string) error {
	th, err := s.thread(r, tenant)
	if err != nil {
		return err
	}
	wait := false
	if v := r.URL.Query().Get("wait"); v != "" {
		if wait, err = strconv.ParseBool(v); err != nil {
			return errInvalid("wait", fmt.Sprintf("wait must be true or false, not %q", v))
		}
	}
	var body compactBody
	if err := decodeBody(r, &body); err != nil {
		return err
	}
	if body.JobID == "" {
		body.JobID = newID()
	}
	req := compact.Request{JobID: body.JobID, Tenant: tenant, ThreadID: th.ThreadID, Agent: body.Agent}
	if err := req.Validate(); err != nil {
		return err
	}
	ctx := r.Context()
	busy, holder, err := s.busy(ctx, th)
	if err != nil {
		return err
	}
	if busy {
		msg := fmt.Sprintf("thread %s is busy", th.ThreadID)
		if holder != "" {
			msg += " with run " + holder
		}
		return errConflict(msg + "; compact it when it is idle")
	}
	subject := s.names.EventSubject(tenant, th.ThreadID, req.JobID, protocol.KindCustom)
	reply := compactReply{JobID: req.JobID, ThreadID: th.ThreadID, Status: "queued", Events: subject}
	var f *events.Feed
	if wait {
		// Subscribed before the job is queued: its result cannot be missed.
		if f, err = s.openFeed(ctx, subject, 0); err != nil {
			return err
		}
		defer f.Close()
	}
	if _, err := compact.Enqueue(ctx, s.js, s.names, req); err != nil {
		return fmt.Errorf("queue the compaction job: %w", err)
	}
	s.log.Info("thread compaction queued", zap.String("tenant", tenant), zap.String("thread_id", th.ThreadID), zap.String("job_id", req.JobID))
	if !wait {
		writeJSON(w, http.StatusAccepted, reply)
		return nil
	}
	d, err := s.awaitCompaction(ctx, f)
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		writeJSON(w, http.StatusAccepted, reply) // still running: follow the events
		return nil
	}
	if err != nil {
		return err
	}
	reply.Result = d
	reply.Status = d.Phase
	if d.Phase == protocol.CompressionFailed {
		switch d.Code {
		case protocol.CodeBusy:
			return errConflict(d.Error)
		case protocol.CodeNotFound:
			return errNotFound(d.Error)
		case protocol.CodeDisabled, protocol.CodeUnknownAgent:
			return errInvalid("agent", d.Error)
		}
		return &apiError{status: http.StatusBadGateway, code: protocol.CodeUnavailable, msg: "compaction failed: " + d.Error}
	}
	writeJSON(w, http.StatusOK, reply)
	return nil
}

// awaitCompaction reads a job's events until its result.
func (s *Server) awaitCompaction(ctx context.Context, f *events.Feed) (*protocol.CompressionData, error) {
	ctx, cancel := context.WithTimeout(ctx, compactWait)
	defer cancel()
	for {
		m, err := f.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, errUnavailable("lost the compaction job's events while waiting; follow its events subject", err)
		}
		if d, ok := compact.Result(m.Data()); ok {
			return d, nil
		}
	}
}
