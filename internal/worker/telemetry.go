package worker

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/metrics"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/telemetry"
)

// observe adds the worker's gauges and the runs consumer's lag to the
// metrics until the returned function is called.
func (w *Worker) observe() func() {
	untrackWorker := w.cfg.Metrics.TrackWorker(w.stats)
	untrackLag := w.cfg.Metrics.TrackConsumer(w.names.RunsStream()+"/"+bus.RunsConsumer, w.consumerLag)
	return func() {
		untrackWorker()
		untrackLag()
	}
}

// stats is the worker's state for the gauges.
func (w *Worker) stats() metrics.WorkerStats {
	w.mu.Lock()
	defer w.mu.Unlock()
	return metrics.WorkerStats{
		Slots:        w.cfg.Concurrency,
		BusySlots:    max(len(w.held)-w.waiting, 0),
		ActiveLeases: len(w.running),
		WaitingRuns:  w.waiting,
	}
}

// consumerLag is what the workers still have to finish: requests not yet
// delivered plus requests delivered and not acked.
func (w *Worker) consumerLag(ctx context.Context) (uint64, error) {
	info, err := w.consumer.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.NumPending + uint64(max(info.NumAckPending, 0)), nil
}

// agentLabel is an agent's name as a metric label: only the deployment's
// agents, so a request naming anything else cannot add series.
func (w *Worker) agentLabel(name string) string {
	if w.cfg.Agents.Has(name) {
		return name
	}
	return "unknown"
}

// ended counts a run whose terminal record this worker just wrote.
func (w *Worker) ended(rec *protocol.Run) {
	if rec == nil || !rec.Status.Terminal() {
		return
	}
	ran := time.Duration(-1)
	if rec.StartedAt != nil && rec.FinishedAt != nil {
		ran = rec.FinishedAt.Sub(*rec.StartedAt)
	}
	w.cfg.Metrics.RunFinished(rec.Tenant, w.agentLabel(rec.Agent), string(rec.Status), ran)
	w.enqueueWebhook(rec)
}

// cancelOutcome is a cancel request's outcome as a metric label.
func cancelOutcome(err error) string {
	if err == nil {
		return metrics.OutcomeOK
	}
	var ce *codedError
	if errors.As(err, &ce) {
		return ce.code
	}
	return protocol.CodeUnavailable
}

// started records a run's start: its queue wait and, when the process
// traces, the run's span under the span its request carries (the
// submitter's), which the loop's model and tool spans hang under. It
// returns ctx with the span.
func (j *job) started(ctx context.Context, meta *jetstream.MsgMetadata, rec *protocol.Run) context.Context {
	w := j.w
	agent := w.agentLabel(j.req.Agent)
	var wait time.Duration
	if rec.StartedAt != nil {
		// A record this worker created as it started has no earlier
		// creation time than the request's enqueue time.
		created := rec.CreatedAt
		if !created.Before(*rec.StartedAt) {
			created = meta.Timestamp
		}
		wait = rec.StartedAt.Sub(created)
	}
	if rec.Attempt == 1 {
		w.cfg.Metrics.RunStarted(agent, metrics.StrategyLabel(j.req.MultitaskStrategy), wait)
	}
	if w.tracer == nil {
		return ctx
	}
	ctx = telemetry.Extract(ctx, j.msg.Headers())
	ctx, span := w.tracer.Start(ctx, "run "+agent, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(
		telemetry.AttrAgent.String(j.req.Agent),
		telemetry.AttrRunID.String(j.req.RunID),
		telemetry.AttrThreadID.String(j.req.ThreadID),
		telemetry.AttrTenant.String(j.req.Tenant),
		telemetry.AttrAttempt.Int(rec.Attempt),
		telemetry.AttrStrategy.String(metrics.StrategyLabel(j.req.MultitaskStrategy)),
		telemetry.AttrQueueWait.Float64(max(wait, 0).Seconds()),
		telemetry.AttrWorker.String(w.cfg.ID),
		telemetry.AttrMessagingSystem.String("nats"),
		telemetry.AttrMessagingOperation.String("process"),
		telemetry.AttrMessagingDestination.String(w.names.RunsStream()),
	))
	if j.req.Parent != nil {
		span.SetAttributes(telemetry.AttrParentRun.String(j.req.Parent.RunID))
	}
	j.span = span
	if sc := span.SpanContext(); sc.IsSampled() {
		j.log = j.log.WithLazy(zap.String("trace_id", sc.TraceID().String()))
	}
	return ctx
}

// traced puts a finished run's outcome on its span.
func (j *job) traced(rec *protocol.Run) {
	if j.span == nil || rec == nil || !j.span.IsRecording() {
		return
	}
	j.span.SetAttributes(telemetry.AttrStatus.String(string(rec.Status)))
	if rec.StopReason != "" {
		j.span.SetAttributes(telemetry.AttrStopReason.String(rec.StopReason))
	}
	if u := rec.Usage; u != nil {
		j.span.SetAttributes(telemetry.AttrGenAIInputTokens.Int(u.Own.Input), telemetry.AttrGenAIOutputTokens.Int(u.Own.Output))
	}
	if rec.Status == protocol.StatusError || rec.Status == protocol.StatusTimeout {
		j.span.SetStatus(codes.Error, clipReason(rec.Error))
	}
}

// endSpan ends the run's span, if it has one.
func (j *job) endSpan() {
	if j.span != nil {
		j.span.End()
	}
}

func tracerOf(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		return nil
	}
	return telemetry.Tracer(tp)
}
