package worker

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/protocol"
)

// runUsage is a run's token usage as its record and the usage bucket keep
// it, derived from the state the run ended with (its checkpoints and its
// last step), so a redelivered run counts every call once. Nil when the
// run made no model call.
func runUsage(host *runHost, req *protocol.RunRequest) *protocol.RunUsage {
	if host == nil || host.st == nil {
		return nil
	}
	own := middleware.RunTotals(host.st, req.RunID)
	if own.Calls == 0 {
		return nil
	}
	u := &protocol.RunUsage{RunID: req.RunID, ThreadID: req.ThreadID, Tenant: req.Tenant, Own: own, Final: true}
	u.Recompute()
	return u
}

// usageWriteTimeout bounds the usage write of a finished run.
const usageWriteTimeout = 5 * time.Second

// saveUsage writes a finished run's usage, as its record holds it, to the
// usage bucket: the run's totals and its thread's. It runs in the
// background once run.finished is out, so it holds neither the run's slot
// nor its thread, and it never fails the run: the record keeps the
// figures whatever happens here. Shutdown waits for it like for the
// worker's other background work.
func (j *job) saveUsage(ctx context.Context, rec *protocol.Run) {
	if rec == nil || rec.Usage == nil {
		return
	}
	w, log := j.w, j.log
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), usageWriteTimeout+w.roomWait())
		defer cancel()
		// A full usage bucket is waited for like the run's own writes.
		if err := w.untilRoom(ctx, log, w.roomWait(), nil, func() error { return w.stores.Usage.Record(ctx, rec.Usage) }); err != nil {
			log.Warn("could not record the run's token usage", zap.Error(err))
		}
	}()
}
