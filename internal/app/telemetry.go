package app

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/metrics"
	"github.com/natsagent/natsagent/internal/metrics/prom"
)

// Service names of the spans, unless telemetry.traces.service_name (or
// OTEL_SERVICE_NAME) names one.
const (
	ServiceGateway = "natsagent-gateway"
	ServiceWorker  = "natsagent-worker"
)

// Telemetry is a process's metrics and traces as the configuration asks.
// Give Metrics and TracerProvider to gateway.Config and worker.Config;
// both are nil when off.
type Telemetry struct {
	cfg config.Telemetry
	// Metrics records the process's metrics; nil when metrics are off.
	Metrics metrics.Recorder
	// MetricsHandler serves them at /metrics; nil when metrics are off.
	MetricsHandler http.Handler
	// TracerProvider records and exports spans; nil when traces are off
	// (or, after NewMetrics, until Start).
	TracerProvider trace.TracerProvider
	reg            *prometheus.Registry
	// shared: the registry is someone else's, who serves it.
	shared   bool
	shutdown func(context.Context) error
}

// NewTelemetry builds the metrics registry and, with traces enabled, the
// OTLP/HTTP exporter and the tracer provider of a process; service names
// its spans when the configuration does not.
func NewTelemetry(ctx context.Context, cfg config.Telemetry, service string) (*Telemetry, error) {
	t, err := NewMetrics(cfg, nil)
	if err != nil {
		return nil, err
	}
	if err := t.startTraces(ctx, service); err != nil {
		return nil, err
	}
	return t, nil
}

// NewMetrics builds the metrics only, on reg (nil: a registry of the
// Telemetry's own, with the Go runtime and process collectors); Start
// adds the traces and the metrics address. A worker builds its metrics
// first so its program can serve them before the worker starts. With a
// registry given, its owner serves it: InlineMetrics is nil and Start
// serves no telemetry.metrics.listen.
func NewMetrics(cfg config.Telemetry, reg *prometheus.Registry) (*Telemetry, error) {
	t := &Telemetry{cfg: cfg, shared: reg != nil, shutdown: func(context.Context) error { return nil }}
	if cfg.Metrics.Enabled {
		rec, err := prom.New(prom.Options{Registry: reg, TenantLabel: cfg.Metrics.TenantLabel})
		if err != nil {
			return nil, fmt.Errorf("telemetry.metrics: %w", err)
		}
		t.Metrics, t.MetricsHandler, t.reg = rec, rec.Handler(), rec.Registry()
	}
	return t, nil
}

// Registry is the registry the metrics are in, for another part of the
// process to share (NewMetrics); nil when metrics are off.
func (t *Telemetry) Registry() *prometheus.Registry { return t.reg }

// startTraces builds the tracer provider when traces are on and it is not
// built yet.
func (t *Telemetry) startTraces(ctx context.Context, service string) error {
	if !t.cfg.Traces.Enabled || t.TracerProvider != nil {
		return nil
	}
	tp, err := TracerProvider(ctx, t.cfg.Traces, service)
	if err != nil {
		return fmt.Errorf("telemetry.traces: %w", err)
	}
	t.TracerProvider, t.shutdown = tp, tp.Shutdown
	return nil
}

// TracerProvider builds a tracer provider exporting over OTLP/HTTP
// (protobuf) in batches, sampling new traces at cfg.SampleRatio and
// following the decision a request's trace carries.
func TracerProvider(ctx context.Context, cfg config.Traces, service string) (*sdktrace.TracerProvider, error) {
	var opts []otlptracehttp.Option
	if cfg.Endpoint != "" {
		u, err := config.ParseOTLPEndpoint(cfg.Endpoint)
		if err != nil {
			return nil, err
		}
		if cfg.Insecure && !strings.Contains(cfg.Endpoint, "://") {
			u.Scheme = "http"
		}
		opts = append(opts, otlptracehttp.WithEndpointURL(u.String()))
	} else if cfg.Insecure {
		opts = append(opts, otlptracehttp.WithInsecure())
	}
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, err
	}
	if cfg.ServiceName != "" {
		service = cfg.ServiceName
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attribute.String("service.name", service)))
	if err != nil {
		return nil, err
	}
	return sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.SampleRatio))),
	), nil
}

// StartTelemetry builds the telemetry and starts it (Start).
func StartTelemetry(ctx context.Context, cfg config.Telemetry, service string, log *zap.Logger) (*Telemetry, func(), error) {
	t, err := NewMetrics(cfg, nil)
	if err != nil {
		return nil, nil, err
	}
	stop, err := t.Start(ctx, service, log)
	if err != nil {
		return nil, nil, err
	}
	return t, stop, nil
}

// Start builds the tracer provider when traces are on (service names its
// spans when the configuration does not), serves /metrics on
// telemetry.metrics.listen when set and the registry is the Telemetry's
// own, and returns stop, which closes that server and exports the spans
// still buffered: call it once the runs ended. A stopped Telemetry may be
// started again.
func (t *Telemetry) Start(ctx context.Context, service string, log *zap.Logger) (stop func(), err error) {
	if err := t.startTraces(ctx, service); err != nil {
		return nil, err
	}
	stopMetrics, err := t.serveMetrics(log)
	if err != nil {
		_ = t.Shutdown(ctx)
		return nil, err
	}
	if t.TracerProvider != nil {
		log.Info("traces exported over OTLP/HTTP", zap.String("endpoint", cmp.Or(t.cfg.Traces.Endpoint, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or localhost:4318")),
			zap.Float64("sample_ratio", t.cfg.Traces.SampleRatio))
	}
	return func() {
		stopMetrics()
		shutCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := t.Shutdown(shutCtx); err != nil {
			log.Warn("some spans were not exported", zap.Error(err))
		}
	}, nil
}

// InlineMetrics is the /metrics handler for the process's own HTTP server
// (the gateway's API, the worker's health server): nil when metrics are
// off, have an address of their own, or are in a registry another part
// of the process serves.
func (t *Telemetry) InlineMetrics() http.Handler {
	if t.cfg.Metrics.Listen != "" || t.shared {
		return nil
	}
	return t.MetricsHandler
}

// serveMetrics serves /metrics on telemetry.metrics.listen until stop is
// called; it does nothing without that address.
func (t *Telemetry) serveMetrics(log *zap.Logger) (stop func(), err error) {
	if t.MetricsHandler == nil || t.cfg.Metrics.Listen == "" || t.shared {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", t.cfg.Metrics.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w (change telemetry.metrics.listen)", t.cfg.Metrics.Listen, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", t.MetricsHandler)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics endpoint stopped", zap.Error(err))
		}
	}()
	log.Info("metrics endpoint", zap.String("http", "http://"+ln.Addr().String()+"/metrics"))
	return func() { _ = hs.Close() }, nil
}

// Shutdown exports the spans still buffered and stops the tracer
// provider; Start builds a new one.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	shutdown := t.shutdown
	if t.TracerProvider != nil {
		t.TracerProvider, t.shutdown = nil, func(context.Context) error { return nil }
	}
	return shutdown(ctx)
}
