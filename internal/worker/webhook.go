package worker

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/webhook"
)

// enqueueWebhook schedules the delivery of an ended run's webhook as a
// job (internal/webhook). Every path that ends a run passes here (ended);
// the job id dedupes one that ends twice (a redelivered request).
func (w *Worker) enqueueWebhook(rec *protocol.Run) {
	if rec.Webhook == nil || rec.Webhook.Status != protocol.WebhookPending {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := webhook.Enqueue(ctx, w.js, w.names, rec); err != nil {
		w.log.Warn("could not enqueue the run's webhook", zap.String("tenant", rec.Tenant), zap.String("run_id", rec.RunID), zap.Error(err))
	}
}
