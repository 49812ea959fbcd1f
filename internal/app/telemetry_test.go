package app

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/telemetry"
)

// Where /metrics is served: inline (the API or health server) by
// default, on telemetry.metrics.listen alone when set, nowhere when off.
func TestMetricsPlacement(t *testing.T) {
	tel, stop, err := StartTelemetry(context.Background(), config.Default().Telemetry, ServiceGateway, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	if tel.Metrics == nil || tel.InlineMetrics() == nil || tel.TracerProvider != nil {
		t.Fatalf("defaults: metrics %v inline %v traces %v", tel.Metrics, tel.InlineMetrics(), tel.TracerProvider)
	}
	stop()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	cfg := config.Default().Telemetry
	cfg.Metrics.Listen = addr
	tel, stop, err = StartTelemetry(context.Background(), cfg, ServiceWorker, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	if tel.InlineMetrics() != nil {
		t.Error("metrics with an address of their own are served inline too")
	}
	tel.Metrics.ModelRetry("network")
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `natsagent_model_retries_total{kind="network"} 1`) {
		t.Fatalf("GET /metrics on %s: %d\n%s", addr, resp.StatusCode, body)
	}
	stop()
	if _, err := http.Get("http://" + addr + "/metrics"); err == nil {
		t.Error("the metrics endpoint still answers after stop")
	}

	cfg = config.Default().Telemetry
	cfg.Metrics.Enabled = false
	tel, stop, err = StartTelemetry(context.Background(), cfg, ServiceWorker, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if tel.Metrics != nil || tel.MetricsHandler != nil || tel.InlineMetrics() != nil {
		t.Fatal("metrics off but a recorder or handler exists")
	}
}

// insecure with a host:port endpoint exports over plain HTTP to
// /v1/traces; stop flushes what is buffered.
func TestInsecureHostPortEndpoint(t *testing.T) {
	var got atomic.Int32
	var path atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path.Store(r.URL.Path)
		got.Add(1)
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer srv.Close()
	cfg := config.Default().Telemetry
	cfg.Traces = config.Traces{Enabled: true, Endpoint: strings.TrimPrefix(srv.URL, "http://"), Insecure: true, SampleRatio: 1}
	tel, stop, err := StartTelemetry(context.Background(), cfg, ServiceWorker, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	_, span := telemetry.Tracer(tel.TracerProvider).Start(context.Background(), "run chatbot")
	span.End()
	stop()
	if got.Load() == 0 || path.Load() != "/v1/traces" {
		t.Fatalf("%d export requests (path %v), want the span exported to /v1/traces", got.Load(), path.Load())
	}
}

// A worker's metrics built on the registry of another part of the process
// (gateway --dev) count into that registry; the worker neither serves
// them inline nor on telemetry.metrics.listen, which the owner serves.
func TestMetricsOnASharedRegistry(t *testing.T) {
	cfg := config.Default().Telemetry
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Metrics.Listen = ln.Addr().String()
	_ = ln.Close()
	owner, stopOwner, err := StartTelemetry(context.Background(), cfg, ServiceGateway, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer stopOwner()
	w, err := NewMetrics(cfg, owner.Registry())
	if err != nil {
		t.Fatal(err)
	}
	// The owner holds the address: a worker serving it too would fail.
	stopWorker, err := w.Start(context.Background(), ServiceWorker, zap.NewNop())
	if err != nil {
		t.Fatalf("the worker's telemetry on a shared registry: %v", err)
	}
	defer stopWorker()
	if w.InlineMetrics() != nil {
		t.Error("metrics on a shared registry are served inline by the worker")
	}
	w.Metrics.ModelRetry("network")
	resp, err := http.Get("http://" + cfg.Metrics.Listen + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if !strings.Contains(string(body), `natsagent_model_retries_total{kind="network"} 1`) {
		t.Fatalf("the owner's /metrics lacks the worker's series:\n%s", body)
	}
}
