package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/metrics"
	"github.com/natsagent/natsagent/internal/metrics/prom"
	"github.com/natsagent/natsagent/internal/natstest"
)

// With metrics on, the health server serves /metrics beside the probes;
// without, /metrics is not there.
func TestHealthServerServesMetrics(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect()
	rec, err := prom.New(prom.Options{Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	untrack := rec.TrackWorker(func() metrics.WorkerStats { return metrics.WorkerStats{Slots: 8, BusySlots: 2, ActiveLeases: 2} })
	defer untrack()
	addr := freeAddr(t)
	stop, err := serveHealth(context.Background(), addr, nc, zap.NewNop(), rec.Handler())
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	get := func(path string) (int, string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			resp, err := http.Get("http://" + addr + path)
			if err == nil {
				b, _ := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				return resp.StatusCode, string(b)
			}
			if time.Now().After(deadline) {
				t.Fatalf("GET %s: %v", path, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	code, body := get("/metrics")
	if code != http.StatusOK || !strings.Contains(body, "natsagent_worker_slots 8") || !strings.Contains(body, "natsagent_worker_active_leases 2") {
		t.Fatalf("/metrics: %d\n%s", code, body)
	}
	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz beside /metrics: %d", code)
	}
	stop()

	addr = freeAddr(t)
	stop, err = serveHealth(context.Background(), addr, nc, zap.NewNop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if code, body := get("/metrics"); code == http.StatusOK {
		t.Fatalf("/metrics served with metrics off: %s", body)
	}
}
