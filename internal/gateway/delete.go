package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/erase"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/protocol"
)

// deleteTimeout bounds one deletion: a cancelled run's stop, the settle
// delay and the purges. The deletion goes on when the client goes away: a
// half-deleted thread stays marked deleting until it is deleted again.
const deleteTimeout = 2 * time.Minute

// deleteThread serves DELETE /threads/{thread_id}[?cancel=true], as the
// LangGraph Agent Server: 204 without a body. A thread with a pending or
// running run is refused 409 busy unless cancel=true, which cancels it
// first. Who may use the thread may delete it (checkOwner: another user's
// thread is not found).
func (s *Server) deleteThread(w http.ResponseWriter, r *http.Request, tenant string) error {
	thread, err := pathToken(r, "thread_id")
	if err != nil {
		return err
	}
	cancelFirst, err := boolQuery(r, "cancel")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), deleteTimeout)
	defer cancel()
	if err := s.eraser.DeleteThread(ctx, tenant, thread, erase.ThreadOptions{Cancel: cancelFirst}); err != nil {
		return deleteError(err)
	}
	s.log.Info("thread deleted", zap.String("tenant", tenant), zap.String("thread_id", thread), zap.String("user", ownerOf(r)))
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// deleteRun serves DELETE /threads/{thread_id}/runs/{run_id}: a finished
// run's record, usage and events go (204); an active one is 409 busy.
func (s *Server) deleteRun(w http.ResponseWriter, r *http.Request, tenant string) error {
	thread, err := pathToken(r, "thread_id")
	if err != nil {
		return err
	}
	run, err := pathToken(r, "run_id")
	if err != nil {
		return err
	}
	if _, _, err := s.stores.Threads.Get(r.Context(), tenant, thread); errors.Is(err, kv.ErrNotFound) {
		return errNotFound(fmt.Sprintf("thread %s not found", thread))
	} else if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), deleteTimeout)
	defer cancel()
	if err := s.eraser.DeleteRun(ctx, tenant, thread, run); err != nil {
		return deleteError(err)
	}
	s.log.Info("run deleted", zap.String("tenant", tenant), zap.String("thread_id", thread), zap.String("run_id", run), zap.String("user", ownerOf(r)))
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// eraseUser serves DELETE /users/{user_id}[?cancel=true]: every thread the
// user owns in the request's tenant, and the user's memory. It needs a
// role with erase_users (an open gateway, where no one is authenticated,
// allows it as it allows deleting any thread). 200 with the deleted
// threads.
func (s *Server) eraseUser(w http.ResponseWriter, r *http.Request, tenant string) error {
	user, err := pathToken(r, "user_id")
	if err != nil {
		return err
	}
	if p, ok := principalOf(r); ok && !s.cfg.Policy.MayEraseUsers(&p.p) {
		return &apiError{status: http.StatusForbidden, code: CodeForbidden,
			msg: fmt.Sprintf("user %s may not erase users: it takes a role with erase_users (policy.roles)", p.p.User)}
	}
	cancelFirst, err := boolQuery(r, "cancel")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 4*deleteTimeout)
	defer cancel()
	out, err := s.eraser.EraseUser(ctx, tenant, user, erase.ThreadOptions{Cancel: cancelFirst})
	if err != nil {
		return deleteError(err)
	}
	s.log.Info("user erased", zap.String("tenant", tenant), zap.String("erased_user", user), zap.String("user", ownerOf(r)),
		zap.Int("threads", len(out.Threads)))
	writeJSON(w, http.StatusOK, map[string]any{"user_id": user, "threads": out.Threads})
	return nil
}

func boolQuery(r *http.Request, name string) (bool, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, errInvalid(name, fmt.Sprintf("%s=%q is not true or false", name, v))
	}
	return b, nil
}

// deleteError maps the erase package's errors to the API's.
func deleteError(err error) error {
	switch {
	case errors.Is(err, erase.ErrInvalid):
		return errInvalid("", err.Error())
	case errors.Is(err, erase.ErrNotFound):
		return errNotFound(err.Error())
	case errors.Is(err, erase.ErrBusy):
		return &apiError{status: http.StatusConflict, code: protocol.CodeBusy, msg: err.Error()}
	}
	return err
}
