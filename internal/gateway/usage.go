package gateway

import (
	"net/http"
)

// runUsage: GET /threads/{thread_id}/runs/{run_id}/usage, the run's token
// usage (own calls, subagents, total; per purpose and model). Its terminal
// record holds it (the usage bucket, for runs that ended before protocol
// v2); before the run ends the answer has zero totals and "final": false,
// and the run's message.completed events carry each call as it happens.
func (s *Server) runUsage(w http.ResponseWriter, r *http.Request, tenant string) error {
	rec, err := s.runOf(r, tenant)
	if err != nil {
		return err
	}
	u, err := s.stores.Usage.RunOf(r.Context(), rec)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, u)
	return nil
}

// threadUsage: GET /threads/{thread_id}/usage, the sum of the thread's
// ended runs, with the entries of the last few: its record's totals plus
// the usage bucket's for runs that ended before protocol v2.
func (s *Server) threadUsage(w http.ResponseWriter, r *http.Request, tenant string) error {
	th, err := s.thread(r, tenant)
	if err != nil {
		return err
	}
	u, err := s.stores.Usage.ThreadOf(r.Context(), th)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, u)
	return nil
}
