package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/protocol"
)

// The workdir follows the thread's checkpoints (files.Versioned, the
// object store backend): time travel moves the head and then checks the
// head's files out here; a run that starts first does it itself
// (worker.followFiles). ?checkpoint_id= on the file routes reads the files
// as a checkpoint of the history had them.

// errFilesMoved: the thread changed while its files were checked out.
var errFilesMoved = errors.New("thread moved")

// syncFiles checks the head's files out in the workdir of a thread that
// shows another checkpoint's (th.FilesAt), and records it, only while no
// run holds the thread: each path is a compare-and-set, so a run that
// started meanwhile and wrote a file keeps its write. Failures are
// logged: the next run on the thread checks the files out.
func (s *Server) syncFiles(ctx context.Context, tenant, thread string) {
	if s.cfg.Files == nil {
		return
	}
	v, ok := files.VersionedOf(s.cfg.Files(tenant, thread))
	if !ok {
		return
	}
	th, _, err := s.stores.Threads.Get(ctx, tenant, thread)
	if err != nil || th.FilesAt == "" || th.FilesAt == th.Head || th.Lease != nil {
		return
	}
	log := s.log.With(zap.String("tenant", tenant), zap.String("thread_id", thread), zap.String("from", th.FilesAt), zap.String("head", th.Head))
	_, chain, err := s.stores.Checkpoints.Load(ctx, tenant, thread, th.Head)
	var n int
	if err == nil {
		n, err = s.stores.Checkpoints.CheckoutFiles(ctx, v, tenant, thread, chain, th.FilesAt, th.Head)
	}
	if err != nil && !kv.ContentMissing(err) {
		log.Warn("the workdir was not checked out at the thread's new head; its next run does it", zap.Error(err))
		return
	}
	if err != nil {
		log.Warn("some files of the head were not checked out: their content is gone", zap.Error(err))
	}
	head, filesAt := th.Head, th.FilesAt
	_, _, err = s.stores.Threads.Mutate(ctx, tenant, thread, func(t *protocol.Thread) error {
		if t.Head != head || t.FilesAt != filesAt || t.Lease != nil {
			return errFilesMoved
		}
		t.FilesAt = head
		return nil
	})
	if err != nil && !errors.Is(err, errFilesMoved) {
		log.Warn("could not record the workdir's checkout; the next run looks again", zap.Error(err))
		return
	}
	log.Debug("workdir checked out at the head", zap.Int("files", n))
}

// filesAtCheckpoint returns the files at the checkpoint a file request
// names (?checkpoint_id=), and the workdir to read their content from;
// ok is false when it names none.
func (s *Server) filesAtCheckpoint(r *http.Request, tenant string) (m files.Manifest, v files.Versioned, ok bool, err error) {
	id := r.URL.Query().Get("checkpoint_id")
	if id == "" {
		return nil, nil, false, nil
	}
	wd, err := s.workdir(r, tenant)
	if err != nil {
		return nil, nil, true, err
	}
	v, versioned := files.VersionedOf(wd)
	if !versioned {
		return nil, nil, true, errInvalid("checkpoint_id", "this deployment's files backend keeps one tree (files.backend local): files have no versions by checkpoint")
	}
	th, err := s.thread(r, tenant)
	if err != nil {
		return nil, nil, true, err
	}
	g, err := s.loadGraph(r.Context(), th)
	if err != nil {
		return nil, nil, true, err
	}
	if id == inputCheckpoint {
		return files.Manifest{}, v, true, nil
	}
	if id, err = g.resolve("checkpoint_id", checkpointRef{id: id}); err != nil {
		return nil, nil, true, err
	}
	m, whole := kv.FilesAt(g.byID, id)
	if !whole {
		return nil, nil, true, errNotFound(fmt.Sprintf("the files of checkpoint %s are not known: a checkpoint before it was removed", id))
	}
	return m, v, true, nil
}
