// Package telemetry owns how natsagent's traces cross process boundaries
// and how its spans are named: the W3C trace context carried in NATS
// headers (a run request carries its submitter's span, a subagent's
// request its parent's tool call span), the tracer name, and the span and
// attribute names (OpenTelemetry's gen_ai and messaging conventions where
// they exist). It uses the OpenTelemetry API only: which provider records
// and exports spans is decided by the process (internal/app), and with
// none every call here is a no-op. Spans never carry message content.
package telemetry

import (
	"context"
	"strings"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// TracerName names natsagent's tracer (the instrumentation scope).
const TracerName = "github.com/natsagent/natsagent"

// Attribute keys. The gen_ai and messaging ones follow OpenTelemetry's
// semantic conventions; the natsagent ones are this project's.
const (
	AttrAgent      = attribute.Key("natsagent.agent")
	AttrRunID      = attribute.Key("natsagent.run_id")
	AttrThreadID   = attribute.Key("natsagent.thread_id")
	AttrTenant     = attribute.Key("natsagent.tenant")
	AttrAttempt    = attribute.Key("natsagent.attempt")
	AttrStrategy   = attribute.Key("natsagent.multitask_strategy")
	AttrStatus     = attribute.Key("natsagent.status")
	AttrStopReason = attribute.Key("natsagent.stop_reason")
	AttrQueueWait  = attribute.Key("natsagent.queue_wait_seconds")
	AttrStep       = attribute.Key("natsagent.step")
	AttrWorker     = attribute.Key("natsagent.worker")
	AttrParentRun  = attribute.Key("natsagent.parent_run_id")
	AttrToolStatus = attribute.Key("natsagent.tool.status")
	AttrApprox     = attribute.Key("natsagent.usage.approximate")

	AttrGenAIOperation    = attribute.Key("gen_ai.operation.name")
	AttrGenAIRequestModel = attribute.Key("gen_ai.request.model")
	AttrGenAIResponseMod  = attribute.Key("gen_ai.response.model")
	AttrGenAIFinish       = attribute.Key("gen_ai.response.finish_reasons")
	AttrGenAIInputTokens  = attribute.Key("gen_ai.usage.input_tokens")
	AttrGenAIOutputTokens = attribute.Key("gen_ai.usage.output_tokens")
	AttrGenAIToolName     = attribute.Key("gen_ai.tool.name")
	AttrGenAIToolCallID   = attribute.Key("gen_ai.tool.call.id")

	AttrMessagingSystem      = attribute.Key("messaging.system")
	AttrMessagingDestination = attribute.Key("messaging.destination.name")
	AttrMessagingOperation   = attribute.Key("messaging.operation.type")
	AttrMessagingMessageID   = attribute.Key("messaging.message.id")
)

// propagator is the W3C trace context (traceparent, tracestate), used
// directly so propagation works whatever the process's global settings.
var propagator = propagation.TraceContext{}

// HeaderCarrier adapts NATS headers to the propagation carrier. NATS
// headers are case-sensitive; Get also finds a key written in another
// case by a client that canonicalizes (Traceparent).
type HeaderCarrier nats.Header

var _ propagation.TextMapCarrier = HeaderCarrier(nil)

// Get implements propagation.TextMapCarrier.
func (c HeaderCarrier) Get(key string) string {
	if v := c[key]; len(v) > 0 {
		return v[0]
	}
	for k, v := range c {
		if len(v) > 0 && strings.EqualFold(k, key) {
			return v[0]
		}
	}
	return ""
}

// Set implements propagation.TextMapCarrier.
func (c HeaderCarrier) Set(key, value string) { c[key] = []string{value} }

// Keys implements propagation.TextMapCarrier.
func (c HeaderCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// Inject writes the span context of ctx into h (nothing when ctx carries
// no valid span context).
func Inject(ctx context.Context, h nats.Header) {
	if h == nil || !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	propagator.Inject(ctx, HeaderCarrier(h))
}

// Extract returns ctx carrying the remote span context found in h, if any.
func Extract(ctx context.Context, h nats.Header) context.Context {
	if len(h) == 0 {
		return ctx
	}
	return propagator.Extract(ctx, HeaderCarrier(h))
}

// Tracer returns natsagent's tracer from tp (a no-op one when tp is nil).
func Tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	return tp.Tracer(TracerName)
}

// StartChild starts a span under the span of ctx, with the provider that
// recorded the parent. When the parent records nothing (tracing off, or
// not sampled) no span is made: it returns ctx and the parent's span,
// whose methods do nothing, so an untraced run allocates nothing here.
func StartChild(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return ctx, parent
	}
	return parent.TracerProvider().Tracer(TracerName).Start(ctx, name, opts...)
}

// TraceID returns the trace id of ctx's span, or "" when it has none.
func TraceID(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return ""
	}
	return sc.TraceID().String()
}
