package gateway

import (
	"context"
	"net/http"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/natsagent/natsagent/internal/metrics"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/telemetry"
)

// routeUnmatched is the route label of a request no route matched.
const routeUnmatched = "unmatched"

// observe starts measuring one request: done records its status code and
// latency by route pattern and, when the gateway traces, ends its span.
// The span continues a trace the client sent (traceparent) and is the
// parent of the run request's publish span. Health checks and scrapes are
// counted, not traced.
func (s *Server) observe(r *http.Request, pattern string) (*http.Request, func(code int)) {
	start := time.Now()
	route := pattern
	if route == "" {
		route = routeUnmatched
	}
	var span trace.Span
	if s.tracer != nil && !openRoutes[pattern] {
		ctx := propagation.TraceContext{}.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span = s.tracer.Start(ctx, route, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(
			attribute.String("http.request.method", r.Method),
			attribute.String("http.route", pattern),
			attribute.String("url.path", r.URL.Path),
		))
		r = r.WithContext(ctx)
	}
	return r, func(code int) {
		s.cfg.Metrics.HTTPRequest(route, code, time.Since(start))
		if span != nil {
			span.SetAttributes(attribute.Int("http.response.status_code", code))
			if code >= 500 {
				span.SetStatus(codes.Error, http.StatusText(code))
			}
			span.End()
		}
	}
}

// tracePublish starts the publish span of a run request; the context it
// returns carries the span, which submit.Queue writes into the request's
// headers (traceparent), so the worker's run span is its child: one trace
// from the HTTP request to the model calls.
// published ends the span and counts the run.
func (s *Server) tracePublish(ctx context.Context, req *protocol.RunRequest) (context.Context, func(*jetstream.PubAck, error)) {
	var span trace.Span
	if s.tracer != nil {
		ctx, span = s.tracer.Start(ctx, "publish "+s.names.RunsStream(), trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(
			telemetry.AttrMessagingSystem.String("nats"),
			telemetry.AttrMessagingOperation.String("send"),
			telemetry.AttrMessagingDestination.String(s.names.RunsStream()),
			telemetry.AttrMessagingMessageID.String(req.RunID),
			telemetry.AttrRunID.String(req.RunID),
			telemetry.AttrThreadID.String(req.ThreadID),
			telemetry.AttrTenant.String(req.Tenant),
			telemetry.AttrAgent.String(req.Agent),
			telemetry.AttrStrategy.String(metrics.StrategyLabel(req.MultitaskStrategy)),
		))
	}
	return ctx, func(ack *jetstream.PubAck, err error) {
		if err == nil && !ack.Duplicate {
			s.cfg.Metrics.RunSubmitted(metrics.StrategyLabel(req.MultitaskStrategy))
		}
		if span == nil {
			return
		}
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		} else {
			span.SetAttributes(attribute.Int64("natsagent.stream_seq", int64(ack.Sequence)), attribute.Bool("natsagent.duplicate", ack.Duplicate))
		}
		span.End()
	}
}
