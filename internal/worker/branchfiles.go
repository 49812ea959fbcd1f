package worker

import (
	"context"
	"slices"
	"sync"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/state"
)

// runFiles makes a run's workdir follow its thread's checkpoints, when the
// workdir is versioned (files.Versioned: the object store backend). A
// checkpoint records the files the run changed since the one before
// (kv.Delta Files): the paths its own writes and removes touched, compared
// with the files at the run's head, or, after a step that ran a subagent
// (which writes the same workdir from its own run), every path. A
// checkpoint that changed no file costs nothing more. Files a person
// uploaded between runs are not the run's: they are recorded only when a
// subagent's step sweeps them in, and a rollback leaves them. A rollback
// checks the files the run changed out again as the checkpoint it returns
// to had them.
type runFiles struct {
	v   files.Versioned
	log *zap.Logger

	mu sync.Mutex
	at files.Manifest // the files at the run's head, as recorded
	// touched are the paths changed since the last checkpoint; all, every
	// path the run changed; full asks the next checkpoint to compare
	// every path (an earlier attempt's unknown changes).
	touched, all map[string]bool
	full         bool
}

// trackedWorkdir is a run's workdir: every change is noted in its runFiles
// (before the change: one that fails half way is looked at too).
type trackedWorkdir struct {
	files.Workdir
	rf *runFiles
}

func (t trackedWorkdir) Write(ctx context.Context, p string, data []byte) error {
	t.rf.touch(p)
	return t.Workdir.Write(ctx, p, data)
}

func (t trackedWorkdir) Remove(ctx context.Context, p string) error {
	t.rf.touch(p)
	return t.Workdir.Remove(ctx, p)
}

// Unwrap lets files.VersionedOf see the backend.
func (t trackedWorkdir) Unwrap() files.Workdir { return t.Workdir }

func (rf *runFiles) touch(p string) {
	p, err := files.Clean(p)
	if err != nil {
		return // refused by the workdir too
	}
	rf.mu.Lock()
	rf.touched[p], rf.all[p] = true, true
	rf.mu.Unlock()
}

// filesAt is the checkpoint whose files the thread's workdir shows.
func (l *leaseHandle) filesAt() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.th.FilesAt
}

// followFiles prepares the files of a run whose state was loaded from
// chain: when the thread's workdir shows another checkpoint's files than
// the head's (time travel, or a rollback whose checkout did not finish),
// it checks the head's out first. It returns the workdir the run uses
// and, for a versioned one, its runFiles; a subagent's runs change their
// parent's workdir, which its parent's checkpoints record.
func (j *job) followFiles(ctx context.Context, wd files.Workdir, head, filesAt string, chain []*kv.Delta) (files.Workdir, *runFiles, error) {
	v, ok := files.VersionedOf(wd)
	if !ok || j.req.Parent != nil {
		return wd, nil, nil
	}
	rf := &runFiles{v: v, at: kv.FilesOf(chain), log: j.log, touched: map[string]bool{}, all: map[string]bool{}}
	if filesAt != "" && filesAt != head {
		n, err := j.w.stores.Checkpoints.CheckoutFiles(ctx, v, j.req.Tenant, j.req.ThreadID, chain, filesAt, head)
		switch {
		case kv.ContentMissing(err):
			j.log.Warn("some files of the thread's head were not checked out: their content is gone", zap.Error(err))
		case err != nil:
			return nil, nil, err
		case n > 0:
			j.log.Debug("workdir checked out at the head", zap.String("from", filesAt), zap.String("head", head), zap.Int("files", n))
		}
	}
	for _, d := range chain {
		if d.RunID == j.req.RunID {
			// An earlier attempt's recorded changes are the run's too,
			// and it may have changed files after its last checkpoint.
			rf.full = true
			for _, c := range d.Files {
				rf.all[c.Path] = true
			}
		}
	}
	if j.rec != nil && j.rec.Attempt > 1 {
		rf.full = true
	}
	return trackedWorkdir{Workdir: wd, rf: rf}, rf, nil
}

// changes returns the file changes the checkpoint of u records. A workdir
// that cannot be read now is looked at again at the next checkpoint.
func (rf *runFiles) changes(ctx context.Context, u state.Update) []files.Change {
	if rf == nil {
		return nil
	}
	rf.mu.Lock()
	touched, full := rf.touched, rf.full || delegated(u)
	rf.touched, rf.full = map[string]bool{}, false
	rf.mu.Unlock()
	if len(touched) == 0 && !full {
		return nil
	}
	now, err := rf.v.Snapshot(ctx)
	rf.mu.Lock()
	defer rf.mu.Unlock()
	if err != nil {
		rf.retry(touched, full)
		rf.log.Warn("could not read the workdir for the checkpoint; its file changes go with a later one", zap.Error(err))
		return nil
	}
	all := files.Diff(rf.at, now)
	if full {
		for _, c := range all {
			rf.all[c.Path] = true
		}
		return all
	}
	return slices.DeleteFunc(all, func(c files.Change) bool { return !touched[c.Path] })
}

// retry gives paths back to the next checkpoint; rf.mu is held.
func (rf *runFiles) retry(touched map[string]bool, full bool) {
	for p := range touched {
		rf.touched[p] = true
	}
	rf.full = rf.full || full
}

// recorded takes the changes a written checkpoint holds; failed gives
// them back for the next.
func (rf *runFiles) recorded(changes []files.Change) {
	if rf == nil || len(changes) == 0 {
		return
	}
	rf.mu.Lock()
	rf.at.Apply(changes)
	rf.mu.Unlock()
}

func (rf *runFiles) failed(changes []files.Change) {
	if rf == nil || len(changes) == 0 {
		return
	}
	rf.mu.Lock()
	defer rf.mu.Unlock()
	paths := map[string]bool{}
	for _, c := range changes {
		paths[c.Path] = true
	}
	rf.retry(paths, false)
}

// rollback checks the paths the run changed, recorded or not, out as
// checkpoint base (on chain, the run's chain) had them. It reports
// whether the workdir now shows base's files; if not, the next run on the
// thread checks them out.
func (rf *runFiles) rollback(ctx context.Context, chain []*kv.Delta, base string) bool {
	if rf == nil {
		return false
	}
	to := files.Manifest{}
	if base != "" {
		i := slices.IndexFunc(chain, func(d *kv.Delta) bool { return d.ID == base })
		if i < 0 {
			return false
		}
		to = kv.FilesOf(chain[:i+1])
	}
	now, err := rf.v.Snapshot(ctx)
	if err == nil {
		rf.mu.Lock()
		from, target := files.Manifest{}, files.Manifest{}
		for p := range rf.all {
			if i, ok := now[p]; ok {
				from[p] = i
			}
			if i, ok := to[p]; ok {
				target[p] = i
			}
		}
		rf.mu.Unlock()
		_, err = rf.v.Checkout(ctx, from, target)
	}
	if err != nil && !kv.ContentMissing(err) {
		rf.log.Warn("the rolled back run's files were not all undone; the next run on the thread does it", zap.Error(err))
		return false
	}
	return true
}

// delegated reports whether u holds a delegation tool's call or result:
// a subagent wrote the workdir, perhaps.
func delegated(u state.Update) bool {
	for _, m := range u.Messages {
		if m.Role == model.RoleTool && slices.Contains(middleware.SubagentTools, m.Name) {
			return true
		}
		for _, c := range m.ToolCalls {
			if slices.Contains(middleware.SubagentTools, c.Name) {
				return true
			}
		}
	}
	return false
}
