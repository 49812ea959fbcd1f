package middleware

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/natsagent/natsagent/internal/telemetry"
)

// traceRetry marks a retry on the span of the model call in progress (the
// loop's "chat" span), so a trace shows why a call took long. Nothing
// happens when the call is not traced.
func traceRetry(ctx context.Context, kind string, attempt int, modelName string) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.AddEvent(EventModelRetry, trace.WithAttributes(
		attribute.String("kind", kind),
		attribute.Int("attempt", attempt),
		telemetry.AttrGenAIRequestModel.String(modelName),
	))
}
