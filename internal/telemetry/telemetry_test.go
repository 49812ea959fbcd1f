package telemetry

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// A span context survives a trip through NATS headers, and a header
// written by a client that canonicalizes its keys is found too.
func TestHeadersCarryTheSpanContext(t *testing.T) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tracetest.NewSpanRecorder()))
	ctx, span := tp.Tracer("test").Start(context.Background(), "publish")
	defer span.End()

	h := nats.Header{}
	Inject(ctx, h)
	if h.Get("traceparent") == "" {
		t.Fatalf("no traceparent in %v", h)
	}
	got := trace.SpanContextFromContext(Extract(context.Background(), h))
	if !got.IsRemote() || got.TraceID() != span.SpanContext().TraceID() || got.SpanID() != span.SpanContext().SpanID() {
		t.Fatalf("extracted %v, want the remote form of %v", got, span.SpanContext())
	}

	canonical := nats.Header{"Traceparent": h["traceparent"]}
	if got := trace.SpanContextFromContext(Extract(context.Background(), canonical)); got.SpanID() != span.SpanContext().SpanID() {
		t.Fatalf("Traceparent not found: %v", got)
	}
}

// Without a span (traces off) nothing is written, and nothing is read
// from headers without one.
func TestNoSpanNoHeader(t *testing.T) {
	h := nats.Header{}
	Inject(context.Background(), h)
	if len(h) != 0 {
		t.Fatalf("headers written without a span: %v", h)
	}
	ctx := context.Background()
	if Extract(ctx, nil) != ctx || Extract(ctx, nats.Header{"Nats-Msg-Id": {"r1"}}) == nil {
		t.Fatal("extract changed a context without trace headers")
	}
	if trace.SpanContextFromContext(Extract(ctx, nats.Header{"Nats-Msg-Id": {"r1"}})).IsValid() {
		t.Fatal("a span context out of nothing")
	}
}

// Untraced runs pay nothing for their model and tool spans: no span is
// made and nothing is allocated when the run's span records nothing (no
// provider, the no-op one, or a request sampled out).
func TestStartChildIsFreeWhenNotRecording(t *testing.T) {
	for name, ctx := range map[string]context.Context{
		"no span": context.Background(),
		"noop tracer": func() context.Context {
			c, _ := noop.NewTracerProvider().Tracer("x").Start(context.Background(), "run")
			return c
		}(),
		"sampled out": func() context.Context {
			tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
			c, _ := tp.Tracer("x").Start(context.Background(), "run")
			return c
		}(),
	} {
		allocs := testing.AllocsPerRun(100, func() {
			c, span := StartChild(ctx, "chat")
			span.End()
			if c != ctx {
				t.Fatal("a new context for an untraced call")
			}
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocations per untraced child span", name, allocs)
		}
	}
}

// A recording parent gets a real child from its own provider.
func TestStartChildUnderRecordingParent(t *testing.T) {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	ctx, run := tp.Tracer("x").Start(context.Background(), "run")
	_, chat := StartChild(ctx, "chat")
	chat.End()
	run.End()
	ended := sr.Ended()
	if len(ended) != 2 || ended[0].Name() != "chat" || ended[0].Parent().SpanID() != run.SpanContext().SpanID() {
		t.Fatalf("spans %v", ended)
	}
	if ended[0].InstrumentationScope().Name != TracerName {
		t.Errorf("scope %q, want %q", ended[0].InstrumentationScope().Name, TracerName)
	}
	if TraceID(ctx) != run.SpanContext().TraceID().String() || TraceID(context.Background()) != "" {
		t.Error("TraceID")
	}
}
