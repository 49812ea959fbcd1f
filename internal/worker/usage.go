package worker

import (
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/protocol"
)

// runUsage is a run's token usage as its terminal record keeps it (and
// the release adds to its thread's totals), derived from the state the run ended with (its checkpoints and its
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
