package worker

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/subagents"
)

// workdirThread is the thread whose workdir a run uses: a subagent run
// shares its parent's files.
func workdirThread(req *protocol.RunRequest) string {
	if req.Parent != nil && protocol.ValidToken(req.Parent.ThreadID) {
		return req.Parent.ThreadID
	}
	return req.ThreadID
}

// childRun is a subagent run of an ending run, with its record (nil when
// the call that would have started it never did).
type childRun struct {
	ref middleware.ChildRun
	rec *protocol.Run
}

// children returns the subagent runs the ending run started, derived from
// its transcript, with their records as they are now.
func (j *job) children(ctx context.Context, host *runHost) []childRun {
	if host == nil || host.st == nil {
		return nil
	}
	refs := middleware.DelegatedRuns(host.st, j.req.ThreadID, j.req.RunID)
	if len(refs) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	out := make([]childRun, len(refs))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i, ref := range refs {
		out[i].ref = ref
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			rec, _, err := j.w.stores.RunView(ctx, j.req.Tenant, ref.ThreadID, ref.RunID)
			if err == nil && rec.Parent != nil && rec.Parent.RunID == j.req.RunID {
				out[i].rec = rec
			} else if err != nil && !errors.Is(err, kv.ErrNotFound) {
				j.log.Warn("could not read a subagent run", zap.String("child_run_id", ref.RunID), zap.Error(err))
			}
		}()
	}
	wg.Wait()
	return out
}

// withChildUsage adds every finished child's total to the run's usage,
// under its run id, so the parent's view counts each child once however
// often this run ends (a redelivery sets the same entries again).
// Children still running are left out: they are cancelled now, and their
// usage stays on their own run and thread.
func withChildUsage(u *protocol.RunUsage, kids []childRun) *protocol.RunUsage {
	if u == nil {
		return nil
	}
	for _, k := range kids {
		if k.rec != nil && k.rec.Status.Terminal() && k.rec.Usage != nil {
			u.SetChild(k.rec.RunID, k.rec.Usage.Total)
		}
	}
	return u
}

// cancelChildren cancels, without waiting, the children that may still
// run: a child's answer only goes to the run that started it, which has
// ended (done, cancelled or steered).
func (j *job) cancelChildren(kids []childRun) {
	var running []middleware.ChildRun
	for _, k := range kids {
		if k.rec != nil && !k.rec.Status.Terminal() {
			running = append(running, k.ref)
		}
	}
	if len(running) > 0 {
		subagents.CancelChildren(j.w.nc, j.w.names, j.req.Tenant, running, j.log)
	}
}

// cancelOrphans cancels the running children of a run that was cancelled
// while no worker ran it, derived from its thread's last checkpoint.
func (w *Worker) cancelOrphans(ctx context.Context, tenant, thread, run string) {
	th, _, err := w.stores.Threads.Get(ctx, tenant, thread)
	if err != nil || th.Head == "" {
		return
	}
	st, _, err := w.stores.Checkpoints.Load(ctx, tenant, thread, th.Head)
	if err != nil {
		return
	}
	refs := middleware.DelegatedRuns(st, thread, run)
	if len(refs) > 0 {
		subagents.CancelChildren(w.nc, w.names, tenant, refs, w.log.With(zap.String("tenant", tenant), zap.String("thread_id", thread), zap.String("run_id", run)))
	}
}
