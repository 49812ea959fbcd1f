package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
)

// healthHandler answers the orchestrator's probes. The worker has no other
// HTTP surface: work arrives over NATS, so these only say whether the
// process should be restarted (/healthz) and whether it is taking work
// (/readyz).
//
// /healthz answers 200 while the process serves HTTP, including during
// the shutdown grace: a liveness failure then would kill runs that are
// reaching a safe boundary. /readyz answers 200 while the NATS connection
// is up and the worker is not shutting down.
func healthHandler(nc *nats.Conn, stopping <-chan struct{}) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeStatus(w, http.StatusOK, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-stopping:
			writeStatus(w, http.StatusServiceUnavailable, "shutting down")
			return
		default:
		}
		if !nc.IsConnected() {
			writeStatus(w, http.StatusServiceUnavailable, fmt.Sprintf("NATS connection is %s", nc.Status()))
			return
		}
		writeStatus(w, http.StatusOK, "ok")
	})
	return mux
}

func writeStatus(w http.ResponseWriter, code int, status string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]string{"status": status})
}

// serveHealth serves healthHandler on addr, and metrics at /metrics when
// not nil; /readyz turns unready when ctx ends (shutdown began). The
// returned stop closes the listener.
func serveHealth(ctx context.Context, addr string, nc *nats.Conn, log *zap.Logger, metrics http.Handler) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w (change it with --listen)", addr, err)
	}
	h := healthHandler(nc, ctx.Done())
	if metrics != nil {
		mux := http.NewServeMux()
		mux.Handle("/", h)
		mux.Handle("GET /metrics", metrics)
		h = mux
	}
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := hs.Serve(ln); err != nil && err != http.ErrServerClosed {
			log.Error("health endpoint stopped", zap.Error(err))
		}
	}()
	log.Info("health endpoints", zap.String("http", "http://"+ln.Addr().String()))
	return func() { _ = hs.Close() }, nil
}
