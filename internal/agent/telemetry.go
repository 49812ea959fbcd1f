package agent

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/natsagent/natsagent/internal/metrics"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/telemetry"
)

// modelStep is one model call of the loop through the chain, in a "chat"
// span under the run's span, with its usage settled: the usage goes on the
// span and into the token counters. Without a recording run span no span
// is made.
func (l *loop) modelStep(ctx context.Context, chain middleware.ModelHandler, msgID string, req *middleware.ModelRequest) (*middleware.ModelResponse, middleware.Usage, error) {
	// The span's work is in startModelSpan and endModelSpan: this frame
	// stays on the stack while the model answers, so it is kept small.
	span := trace.SpanFromContext(ctx)
	if span.IsRecording() {
		ctx, span = l.startModelSpan(ctx, req)
		defer span.End()
	}
	resp, err := l.callChain(ctx, chain, msgID, req)
	var u middleware.Usage
	if err == nil && resp != nil && resp.Response != nil {
		u = l.callUsage(req, resp)
		if m := l.rt.Metrics; m != nil {
			m.Tokens(l.rt.Tenant, usageModel(u, req), u.Purpose, u.Input, u.Output)
		}
	}
	if span.IsRecording() {
		endModelSpan(span, resp, &u, err)
	}
	return resp, u, err
}

// startModelSpan starts a model call's "chat" span under the run's.
func (l *loop) startModelSpan(ctx context.Context, req *middleware.ModelRequest) (context.Context, trace.Span) {
	return telemetry.StartChild(ctx, "chat "+req.ModelName, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(
			telemetry.AttrGenAIOperation.String("chat"),
			telemetry.AttrGenAIRequestModel.String(req.ModelName),
			telemetry.AttrAgent.String(l.rt.Agent),
			telemetry.AttrStep.Int(l.rt.Step),
		))
}

// endModelSpan records a model call's outcome on its span.
func endModelSpan(span trace.Span, resp *middleware.ModelResponse, u *middleware.Usage, err error) {
	switch {
	case err != nil:
		span.SetStatus(codes.Error, clip(err.Error(), 500))
	case resp == nil || resp.Response == nil:
		span.SetStatus(codes.Error, "no response")
	default:
		attrs := []attribute.KeyValue{
			telemetry.AttrGenAIInputTokens.Int(u.Input),
			telemetry.AttrGenAIOutputTokens.Int(u.Output),
			telemetry.AttrApprox.Bool(u.Approximate),
		}
		if r := resp.Response; r.Model != "" {
			attrs = append(attrs, telemetry.AttrGenAIResponseMod.String(r.Model))
		}
		if r := resp.Response; r.FinishReason != "" {
			attrs = append(attrs, telemetry.AttrGenAIFinish.StringSlice([]string{r.FinishReason}))
		}
		span.SetAttributes(attrs...)
	}
}

// usageModel is the model a call's tokens are counted under: the one its
// usage is booked under (the provider's name for it), else the requested.
func usageModel(u middleware.Usage, req *middleware.ModelRequest) string {
	if u.Model != "" {
		return u.Model
	}
	return req.ModelName
}

// observeModelCall records one provider call's latency.
func (l *loop) observeModelCall(ctx context.Context, req *middleware.ModelRequest, start time.Time, err error) {
	m := l.rt.Metrics
	if m == nil {
		return
	}
	outcome := metrics.OutcomeOK
	switch {
	case err == nil:
	case ctx.Err() != nil:
		outcome = metrics.OutcomeCancelled
	default:
		outcome = metrics.OutcomeError
	}
	m.ModelCall(req.ModelName, outcome, time.Since(start))
}

// toolStep runs one tool call through the chain in an "execute_tool" span
// under the run's span (none when the run's span records nothing), and
// records its latency by tool and status. The span carries the tool's
// name, call id and result status, never the arguments or the result.
func toolStep(ctx context.Context, handler middleware.ToolHandler, call *middleware.ToolCall, rec metrics.Recorder) (*middleware.ToolResult, error) {
	start := time.Now()
	if !trace.SpanFromContext(ctx).IsRecording() {
		res, err := handler(ctx, call)
		observeToolCall(ctx, rec, call, res, err, start)
		return res, err
	}
	name := "execute_tool"
	if protocol.ValidToken(call.Call.Name) && len(call.Call.Name) <= 64 {
		// Anything else a model made up stays out of the span name.
		name += " " + call.Call.Name
	}
	ctx, span := telemetry.StartChild(ctx, name, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(
			telemetry.AttrGenAIOperation.String("execute_tool"),
			telemetry.AttrGenAIToolName.String(call.Call.Name),
			telemetry.AttrGenAIToolCallID.String(call.Call.ID),
		))
	defer span.End()
	res, err := handler(ctx, call)
	observeToolCall(ctx, rec, call, res, err, start)
	switch {
	case err != nil:
		span.SetStatus(codes.Error, clip(err.Error(), 500))
	case res != nil:
		status := toolStatus(res)
		span.SetAttributes(telemetry.AttrToolStatus.String(status))
		if status == model.ToolStatusError {
			span.SetStatus(codes.Error, "tool returned an error result")
		}
	}
	return res, err
}

// Tool call statuses of the tool_call metric beyond a result's own
// (success, error): the call ended without a result.
const (
	toolStatusCancelled = "cancelled" // the run's context ended (cancel, steer, timeout)
	toolStatusFailed    = "failed"    // the chain failed the call (a panic, a lost lease)
	toolUnknown         = "unknown"   // a tool the run does not have (a name the model made up)
)

// toolStatus is a tool result's status.
func toolStatus(res *middleware.ToolResult) string {
	if s := res.Message.Status; s != "" {
		return s
	}
	return model.ToolStatusSuccess
}

// observeToolCall records one tool call: by the tool's name when it is
// one of the run's tools, else as unknown, so a model cannot add series.
func observeToolCall(ctx context.Context, rec metrics.Recorder, call *middleware.ToolCall, res *middleware.ToolResult, err error, start time.Time) {
	if rec == nil {
		return
	}
	tool := toolUnknown
	if call.Tool != nil {
		tool = call.Call.Name
	}
	status := toolStatusFailed
	switch {
	case err != nil && ctx.Err() != nil:
		status = toolStatusCancelled
	case err == nil && res != nil:
		status = toolStatus(res)
	}
	rec.ToolCall(tool, status, time.Since(start))
}
