package gateway

import (
	"errors"
	"net/http"

	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/protocol"
)

// runUsage: GET /threads/{thread_id}/runs/{run_id}/usage, the run's token
// usage (own calls, subagents, total; per purpose and model). Written when
// the run ends; before that the answer has zero totals and "final":
// false, and the run's usage.model events carry each call as it happens.
func (s *Server) runUsage(w http.ResponseWriter, r *http.Request, tenant string) error {
	rec, err := s.runOf(r, tenant)
	if err != nil {
		return err
	}
	u, _, err := s.stores.Usage.Run(r.Context(), tenant, rec.RunID)
	switch {
	case err == nil:
	case errors.Is(err, kv.ErrNotFound):
		// Not in the usage bucket: a run that has not ended, made no
		// model call, or whose aggregate write failed (its record keeps
		// the figures).
		if rec.Usage != nil {
			u = rec.Usage
		} else {
			u = &protocol.RunUsage{RunID: rec.RunID, ThreadID: rec.ThreadID, Tenant: rec.Tenant, Final: rec.Status.Terminal()}
		}
	default:
		return err
	}
	writeJSON(w, http.StatusOK, u)
	return nil
}

// threadUsage: GET /threads/{thread_id}/usage, the sum of the thread's
// ended runs, with each run's entry.
func (s *Server) threadUsage(w http.ResponseWriter, r *http.Request, tenant string) error {
	th, err := s.thread(r, tenant)
	if err != nil {
		return err
	}
	u, _, err := s.stores.Usage.Thread(r.Context(), tenant, th.ThreadID)
	if errors.Is(err, kv.ErrNotFound) {
		u, err = &protocol.ThreadUsage{ThreadID: th.ThreadID, Tenant: tenant}, nil
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, u)
	return nil
}
