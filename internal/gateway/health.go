package gateway

import (
	"context"
	"fmt"
	"net/http"
	"time"
)

// healthz answers while the process lives: it checks nothing else, so an
// orchestrator restarts the gateway only when it is truly stuck.
func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// readyz answers 200 while the gateway can submit runs: its NATS
// connection is up and the runs stream answers within 2s.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	if !s.nc.IsConnected() {
		writeError(w, errUnavailable(fmt.Sprintf("NATS connection is %s", s.nc.Status()), nil))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if _, err := s.runs.Info(ctx); err != nil {
		writeError(w, errUnavailable(fmt.Sprintf("stream %s did not answer", s.names.RunsStream()), err))
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}
