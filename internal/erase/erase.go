// Package erase owns deletion: a thread and everything keyed by it, one
// finished run, and everything of one user of a tenant. It is the one place
// that knows every store a thread leaves data in, so the gateway, the
// delete service (service.go), the CLI and a retention sweeper all call
// the same functions of an Eraser:
//
//	DeleteThread(ctx, tenant, thread, ThreadOptions{Cancel: false})
//	DeleteThreads(ctx, tenant, threads, ThreadOptions{}) // many, one settle delay
//	DeleteRun(ctx, tenant, thread, run)
//	EraseUser(ctx, tenant, user, ThreadOptions{})
//
// A thread's data, for prefix P, tenant T, thread H:
//   - threads bucket: the record T.H, its run index T.H.run.<run> and its
//     file index T.H.file.<hash>;
//   - runs bucket T.<run> and usage bucket T.run.<run> of each of its
//     runs, and T.thread.H;
//   - checkpoints bucket T.H.<checkpoint>;
//   - memory bucket: the distillation cursors T.<user>.cursor.H;
//     (a user's store items, T.users.<user>.> and T.memories.<user>.>
//     in the store bucket, go with EraseUser);
//   - streams: events P.events.T.H.>, queued requests P.runs.T.H, dead
//     letters P.dlq.runs.T.H, compaction jobs P.jobs.compact.T.H, memory
//     jobs (scheduled: P.schedules.jobs.memory.T.<user>.H; due: on
//     P.jobs.memory.T.<user>, found by payload) and dead-lettered jobs
//     (P.dlq.jobs.<kind>, found by payload);
//   - object store: the workdir objects T/H/..., deleted ones included
//     (their meta records name the path);
//   - the subagent threads started from it (metadata parent_thread_id),
//     deleted the same way.
//
// Nothing is deleted with KV Delete or Purge: those leave a marker whose
// subject names the key, and a bucket with history keeps old values. Every
// key and message goes with a subject-filtered purge of its stream (or a
// secure delete of one message), which leaves nothing, not even the key's
// name. A deletion is idempotent: a deletion cut short (a crash, a NATS
// error) leaves the thread marked deleting, and the next DeleteThread
// finishes it.
//
// Races: the thread is first marked deleting with a compare-and-set, which
// fails if a run took the thread meanwhile; from then on the submitters
// (gateway, submit service) and the workers refuse new runs on it. After
// a settle delay that lets submissions already past their check reach the
// stream, the queued requests are purged, then everything else, and the
// record goes last: until then the mark keeps refusing runs.
//
// The package decides nothing about who may delete: the caller checks the
// principal (the gateway, service.go). It must not run agents or touch a
// thread it was not asked to delete.
package erase

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/crons"
	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/metrics"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/store"
)

// Errors callers test with errors.Is.
var (
	// ErrNotFound: no such thread (or run on that thread).
	ErrNotFound = errors.New("not found")
	// ErrBusy: the thread has an active run (pending or running), or the
	// run to delete has not finished. *BusyError says which.
	ErrBusy = errors.New("busy")
	// ErrInvalid: an id is not a valid token.
	ErrInvalid = errors.New("invalid")
)

// BusyError refuses to delete a thread with an active run, or a run that
// has not finished.
type BusyError struct {
	ThreadID string
	// RunID is the active run.
	RunID string
	Msg   string
}

func (e *BusyError) Error() string { return e.Msg }

// Is lets errors.Is(err, ErrBusy) match.
func (e *BusyError) Is(target error) bool { return target == ErrBusy }

// Config configures an Eraser. Zero values take defaults.
type Config struct {
	// NC sends cancel requests to the workers (ThreadOptions.Cancel).
	NC *nats.Conn
	JS jetstream.JetStream
	// Names must be the deployment's.
	Names bus.Names
	// Stores are the deployment's (nil: opened from JS).
	Stores *kv.Stores
	// Files opens a thread's workdir as the deployment does, with the
	// tenants' file quotas (app.QuotaFiles), so the deleted files are no
	// longer counted against the tenant, and the local backend's files
	// are removed too. The object store is always cleared as well (files
	// no index lists, removed files' meta records); nil: only that, and
	// the quota keeps counting the deleted files.
	Files func(tenant, thread string) files.Workdir
	// Logger logs each deletion (default: none).
	Logger *zap.Logger
	// Metrics counts the crons and assistants its listings leave out
	// because they do not decode (nil: none; they are logged to Logger).
	Metrics metrics.Recorder
	// Settle is how long a thread stays marked deleting before its queued
	// requests are purged, so a submission that checked the thread just
	// before the mark has published its request (default 1s).
	Settle time.Duration
	// StopWait bounds the wait for a cancelled active run to release the
	// thread (default 60s).
	StopWait time.Duration
}

// Eraser deletes threads, runs and users' data of one deployment. It keeps
// no state: any number of them may run at once, in any process of the
// service account.
type Eraser struct {
	cfg     Config
	nc      *nats.Conn
	js      jetstream.JetStream
	names   bus.Names
	stores  *kv.Stores
	log     *zap.Logger
	streams map[string]jetstream.Stream
	objects jetstream.ObjectStore // nil: the deployment has no object store
	// assistants is nil on a deployment without the assistants bucket.
	assistants *kv.Assistants
	crons      *crons.Store
	// items is nil on a deployment without the store bucket.
	items *store.Store
}

// New binds an Eraser to the deployment's streams and buckets, which must
// exist (bus.Provision).
func New(ctx context.Context, cfg Config) (*Eraser, error) {
	if cfg.JS == nil {
		return nil, errors.New("erase: a JetStream handle is required")
	}
	if cfg.Names.Prefix == "" {
		cfg.Names = bus.DefaultNames()
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Settle <= 0 {
		cfg.Settle = time.Second
	}
	if cfg.StopWait <= 0 {
		cfg.StopWait = time.Minute
	}
	e := &Eraser{cfg: cfg, nc: cfg.NC, js: cfg.JS, names: cfg.Names, stores: cfg.Stores, log: cfg.Logger, streams: map[string]jetstream.Stream{}}
	cs, err := crons.Open(ctx, cfg.JS, cfg.Names)
	if err != nil {
		return nil, fmt.Errorf("erase: %w", err)
	}
	cs.Observe(cfg.Logger, cfg.Metrics)
	e.crons = cs
	if e.stores == nil {
		s, err := kv.Open(ctx, cfg.JS, cfg.Names)
		if err != nil {
			return nil, err
		}
		e.stores = s
	}
	n := cfg.Names
	for _, name := range []string{n.RunsStream(), n.EventsStream(), n.DLQStream(), n.JobsStream(),
		kvStream(n.RunsBucket()), kvStream(n.ThreadsBucket()), kvStream(n.CheckpointsBucket()),
		kvStream(n.UsageBucket()), kvStream(n.MemoryBucket())} {
		st, err := cfg.JS.Stream(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("erase: open stream %s: %w", name, err)
		}
		e.streams[name] = st
	}
	if obj, err := cfg.JS.ObjectStore(ctx, n.FilesBucket()); err == nil {
		e.objects = obj
		st, err := cfg.JS.Stream(ctx, "OBJ_"+n.FilesBucket())
		if err != nil {
			return nil, fmt.Errorf("erase: open stream OBJ_%s: %w", n.FilesBucket(), err)
		}
		e.streams[st.CachedInfo().Config.Name] = st
	} else if !errors.Is(err, jetstream.ErrBucketNotFound) && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("erase: open object store %s: %w", n.FilesBucket(), err)
	}
	// The assistants bucket is absent on a deployment provisioned before
	// it: there is nothing of a user's to erase there.
	if st, err := cfg.JS.Stream(ctx, kvStream(n.AssistantsBucket())); err == nil {
		e.streams[kvStream(n.AssistantsBucket())] = st
		if e.assistants, err = kv.OpenAssistants(ctx, cfg.JS, n); err != nil {
			return nil, err
		}
		e.assistants.Observe(cfg.Logger, cfg.Metrics)
	} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("erase: open stream %s: %w", kvStream(n.AssistantsBucket()), err)
	}
	// The store bucket is absent on a deployment provisioned before it.
	if items, err := store.Open(ctx, cfg.JS, store.Config{Names: n}); err == nil {
		e.items = items
	} else if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("erase: %w", err)
	}
	return e, nil
}

func kvStream(bucket string) string { return "KV_" + bucket }

// ThreadOptions are the options of DeleteThread and EraseUser.
type ThreadOptions struct {
	// Cancel cancels the thread's active run and drops its queued runs,
	// waiting for the run to stop, instead of refusing with ErrBusy.
	Cancel bool
}

// DeleteThread deletes a thread and everything keyed by it (the package
// comment lists it), the subagent threads started from it included. It
// refuses with a *BusyError (errors.Is ErrBusy) while a run of the thread
// is pending or running, unless opts.Cancel; ErrNotFound if the thread
// does not exist. Once it returned nil, nothing of the thread is readable
// by any path; a run submitted afterwards with the same thread id starts a
// new, empty thread. It takes at least Config.Settle.
func (e *Eraser) DeleteThread(ctx context.Context, tenant, thread string, opts ThreadOptions) error {
	if err := checkIDs(tenant, thread); err != nil {
		return err
	}
	deleted, err := e.deleteThreads(ctx, tenant, []string{thread}, opts, 0)
	if err == nil && len(deleted) == 0 {
		return fmt.Errorf("thread %s: %w", thread, ErrNotFound)
	}
	return err
}

// DeleteThreads deletes several threads of a tenant as DeleteThread does,
// with one settle delay for all: what a sweeper of idle threads calls. A
// thread that does not exist is skipped; the threads deleted are returned.
// Without opts.Cancel, a busy thread refuses the whole call before any is
// touched.
func (e *Eraser) DeleteThreads(ctx context.Context, tenant string, threads []string, opts ThreadOptions) ([]string, error) {
	if err := checkIDs(append([]string{tenant}, threads...)...); err != nil {
		return nil, err
	}
	return e.deleteThreads(ctx, tenant, threads, opts, 0)
}

// maxDepth bounds the recursion into subagent threads (a subagent cannot
// start subagents: one level is all there is).
const maxDepth = 4

// deleteThreads marks the threads deleting, stops their runs (cancel),
// deletes their subagent threads, waits the settle delay once, and
// removes them.
func (e *Eraser) deleteThreads(ctx context.Context, tenant string, threads []string, opts ThreadOptions, depth int) ([]string, error) {
	type found struct {
		th   *protocol.Thread
		rev  uint64
		runs []*protocol.Run
	}
	var todo []found
	seen := map[string]bool{}
	for _, thread := range threads {
		if seen[thread] {
			continue
		}
		seen[thread] = true
		th, rev, err := e.stores.Threads.Get(ctx, tenant, thread)
		if errors.Is(err, kv.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		runs, err := e.threadRuns(ctx, tenant, thread)
		if err != nil {
			return nil, err
		}
		if th.Status != protocol.ThreadDeleting && !opts.Cancel {
			if err := busy(th, runs); err != nil {
				return nil, err
			}
		}
		todo = append(todo, found{th, rev, runs})
	}
	for i, f := range todo {
		th, err := e.markDeleting(ctx, f.th, f.rev, opts.Cancel)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		todo[i].th = th
	}
	if opts.Cancel {
		for _, f := range todo {
			if err := e.stopRuns(ctx, f.th, f.runs); err != nil {
				return nil, err
			}
		}
	}
	// The subagent threads first: found by their parent, they would be
	// lost for a retry once the parent is gone.
	if depth < maxDepth {
		for _, f := range todo {
			children, err := e.childThreads(ctx, tenant, f.th.ThreadID)
			if err != nil {
				return nil, err
			}
			if len(children) == 0 {
				continue
			}
			// A child's runs end with its parent's (the parent waits for
			// them, or its cancel cancels them); any left are cancelled.
			if _, err := e.deleteThreads(ctx, tenant, children, ThreadOptions{Cancel: true}, depth+1); err != nil {
				return nil, fmt.Errorf("delete the subagent threads of thread %s: %w", f.th.ThreadID, err)
			}
		}
	}
	// Submissions that read a thread before its mark reach the stream
	// within this delay; their requests are purged below, and a worker
	// that reads the mark drops them.
	if len(todo) > 0 {
		if err := sleep(ctx, e.cfg.Settle); err != nil {
			return nil, err
		}
	}
	// The threads' crons go first: no tick starts a run on a thread
	// being removed.
	if len(todo) > 0 {
		gone := map[string]bool{}
		for _, f := range todo {
			gone[f.th.ThreadID] = true
		}
		if err := e.deleteCrons(ctx, tenant, func(r *crons.Record) bool { return r.ThreadID != nil && gone[*r.ThreadID] }); err != nil {
			return nil, err
		}
	}
	var deleted []string
	for _, f := range todo {
		thread := f.th.ThreadID
		e.log.Info("deleting thread", zap.String("tenant", tenant), zap.String("thread_id", thread), zap.Int("runs", len(f.runs)))
		if err := e.removeThread(ctx, tenant, thread, f.runs); err != nil {
			return deleted, fmt.Errorf("delete thread %s (it stays marked deleting; delete it again to finish): %w", thread, err)
		}
		e.log.Info("thread deleted", zap.String("tenant", tenant), zap.String("thread_id", thread))
		deleted = append(deleted, thread)
	}
	return deleted, nil
}

// busy refuses a thread with an active run.
func busy(th *protocol.Thread, runs []*protocol.Run) error {
	if th.Lease != nil {
		return &BusyError{ThreadID: th.ThreadID, RunID: th.Lease.RunID,
			Msg: fmt.Sprintf("thread %s is busy with run %s: cancel it first, or delete with cancel", th.ThreadID, th.Lease.RunID)}
	}
	if len(th.Preempt) > 0 {
		return &BusyError{ThreadID: th.ThreadID, RunID: th.Preempt[0].RunID,
			Msg: fmt.Sprintf("thread %s has run %s about to start: cancel it first, or delete with cancel", th.ThreadID, th.Preempt[0].RunID)}
	}
	for _, r := range runs {
		if !r.Status.Terminal() {
			return &BusyError{ThreadID: th.ThreadID, RunID: r.RunID,
				Msg: fmt.Sprintf("thread %s has run %s %s: cancel it first, or delete with cancel", th.ThreadID, r.RunID, r.Status)}
		}
	}
	return nil
}

// markDeleting sets the thread's status to deleting with a
// compare-and-set. Without cancel it fails if a run took the thread since
// it was read.
func (e *Eraser) markDeleting(ctx context.Context, th *protocol.Thread, rev uint64, cancel bool) (*protocol.Thread, error) {
	for attempt := 0; ; attempt++ {
		if th.Status == protocol.ThreadDeleting {
			return th, nil
		}
		if !cancel && (th.Lease != nil || len(th.Preempt) > 0) {
			return nil, busy(th, nil)
		}
		next := *th
		next.Status = protocol.ThreadDeleting
		next.UpdatedAt = time.Now().UTC()
		_, err := e.stores.Threads.Put(ctx, &next, rev)
		if err == nil {
			return &next, nil
		}
		if !errors.Is(err, kv.ErrConflict) || attempt >= 50 {
			return nil, fmt.Errorf("mark thread %s deleting: %w", th.ThreadID, err)
		}
		th, rev, err = e.stores.Threads.GetLatest(ctx, th.Tenant, th.ThreadID)
		if errors.Is(err, kv.ErrNotFound) {
			return nil, fmt.Errorf("thread %s: %w", th.ThreadID, ErrNotFound)
		}
		if err != nil {
			return nil, err
		}
	}
}

// stopRuns cancels the thread's unfinished runs and waits for the thread's
// lease to be released.
func (e *Eraser) stopRuns(ctx context.Context, th *protocol.Thread, runs []*protocol.Run) error {
	active := map[string]bool{}
	if th.Lease != nil {
		active[th.Lease.RunID] = true
	}
	for _, p := range th.Preempt {
		active[p.RunID] = true
	}
	for _, r := range runs {
		if !r.Status.Terminal() {
			active[r.RunID] = true
		}
	}
	for run := range active {
		err := e.cancel(ctx, th.Tenant, th.ThreadID, run)
		if err != nil && th.Lease != nil && run == th.Lease.RunID {
			return fmt.Errorf("cancel run %s: %w", run, err)
		}
		// A pending run needs no cancel: its request is purged and its
		// record deleted with the thread. The cancel only ends it cleanly
		// for whoever is waiting on it.
	}
	deadline := time.Now().Add(e.cfg.StopWait)
	for {
		cur, _, err := e.stores.Threads.Get(ctx, th.Tenant, th.ThreadID)
		if errors.Is(err, kv.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if cur.Lease == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return &BusyError{ThreadID: th.ThreadID, RunID: cur.Lease.RunID,
				Msg: fmt.Sprintf("run %s of thread %s did not stop within %s; the thread stays marked deleting: delete it again", cur.Lease.RunID, th.ThreadID, e.cfg.StopWait)}
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

// cancel sends a cancel request and waits for its answer.
func (e *Eraser) cancel(ctx context.Context, tenant, thread, run string) error {
	if e.nc == nil {
		return errors.New("no NATS connection to send cancel requests with")
	}
	ctx, stop := context.WithTimeout(ctx, 30*time.Second)
	defer stop()
	m, err := e.nc.RequestWithContext(ctx, e.names.CancelSubject(tenant, thread, run), nil)
	if err != nil {
		return err
	}
	switch code := m.Header.Get("Nats-Service-Error-Code"); code {
	case "":
	case "409":
		// The run finished (or changed) while the cancel was on its way:
		// what counts is that it stops, which the caller waits for.
	default:
		return fmt.Errorf("cancel refused: %s", m.Header.Get("Nats-Service-Error"))
	}
	return nil
}

// threadRuns returns the records of the tenant's runs that name the
// thread: the thread's run index is written without waiting, so an entry
// may be missing. It reads every run record of the tenant, once per
// deletion; the removal adds the runs indexed since.
func (e *Eraser) threadRuns(ctx context.Context, tenant, thread string) ([]*protocol.Run, error) {
	return e.stores.Runs.List(ctx, tenant, func(r *protocol.Run) bool { return r.ThreadID == thread })
}

// childThreads lists the subagent threads started from thread.
func (e *Eraser) childThreads(ctx context.Context, tenant, thread string) ([]string, error) {
	all, err := e.stores.Threads.List(ctx, tenant)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, th := range all {
		if p, _ := th.Metadata[metaParentThread].(string); p == thread && th.ThreadID != thread {
			out = append(out, th.ThreadID)
		}
	}
	return out, nil
}

// metaParentThread is the thread metadata key naming a subagent thread's
// parent (subagents.MetaParentThread).
const metaParentThread = "parent_thread_id"

// removeThread removes every piece of a thread, the record last.
func (e *Eraser) removeThread(ctx context.Context, tenant, thread string, recs []*protocol.Run) error {
	n := e.names
	// Queued requests first: no worker picks one up after this.
	if err := e.purge(ctx, n.RunsStream(), n.RunSubject(tenant, thread)); err != nil {
		return err
	}
	// The runs read before the mark, and those indexed since (a run
	// submitted meanwhile is indexed right after its record is written,
	// well within the settle delay).
	ids, err := e.stores.Threads.RunIDs(ctx, tenant, thread)
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, r := range recs {
		ids = append(ids, r.RunID)
	}
	for _, run := range ids {
		if seen[run] || !protocol.ValidToken(run) {
			continue
		}
		seen[run] = true
		if err := e.purgeKV(ctx, n.RunsBucket(), bus.Key(tenant, run)); err != nil {
			return err
		}
		if err := e.purgeKV(ctx, n.UsageBucket(), bus.Key(tenant, "run", run)); err != nil {
			return err
		}
	}
	for _, step := range []struct{ stream, subject string }{
		{kvStream(n.UsageBucket()), kvSubject(n.UsageBucket(), bus.Key(tenant, "thread", thread))},
		{kvStream(n.CheckpointsBucket()), kvSubject(n.CheckpointsBucket(), bus.Key(tenant, thread, ">"))},
		{kvStream(n.MemoryBucket()), kvSubject(n.MemoryBucket(), bus.Key(tenant, "*", "cursor", thread))},
		{n.EventsStream(), n.ThreadEvents(tenant, thread)},
		{n.DLQStream(), n.DLQSubject(tenant, thread)},
		{n.JobsStream(), n.JobSubject(jobCompact, tenant, thread)},
		{n.JobsStream(), n.JobScheduleSubject(jobCompact, tenant, thread, "*")},
		{n.JobsStream(), n.JobScheduleSubject(jobMemory, tenant, "*", thread)},
	} {
		if err := e.purge(ctx, step.stream, step.subject); err != nil {
			return err
		}
	}
	// Due memory jobs are routed by user: find the thread's by payload.
	match := func(p jobPayload) bool { return p.Tenant == tenant && p.thread() == thread }
	if err := e.deleteMatching(ctx, n.JobsStream(), n.JobSubject(jobMemory, tenant, "*"), match); err != nil {
		return err
	}
	if err := e.deleteMatching(ctx, n.DLQStream(), n.Prefix+".dlq.jobs.>", match); err != nil {
		return err
	}
	if err := e.removeFiles(ctx, tenant, thread); err != nil {
		return err
	}
	// The run and file indexes, then the record: until it goes, the mark
	// refuses new runs.
	if err := e.purgeKV(ctx, n.ThreadsBucket(), bus.Key(tenant, thread, ">")); err != nil {
		return err
	}
	return e.purgeKV(ctx, n.ThreadsBucket(), bus.Key(tenant, thread))
}

// Job kinds whose jobs name a thread (compact.JobKind, memory.JobKind).
const (
	jobCompact = "compact"
	jobMemory  = "memory"
)

// jobPayload is what the deletion reads of a job's payload: memory jobs
// say thread and user, compaction jobs thread_id.
type jobPayload struct {
	Tenant   string `json:"tenant"`
	User     string `json:"user"`
	Thread   string `json:"thread"`
	ThreadID string `json:"thread_id"`
}

func (p jobPayload) thread() string {
	if p.Thread != "" {
		return p.Thread
	}
	return p.ThreadID
}

// removeFiles deletes a thread's workdir: through Config.Files (a local
// backend), and in the object store every object named T/H/..., deleted
// ones too, whose meta records would still name their paths.
func (e *Eraser) removeFiles(ctx context.Context, tenant, thread string) error {
	if e.cfg.Files != nil {
		wd := e.cfg.Files(tenant, thread)
		var paths []string
		err := wd.Walk(ctx, "/", func(i files.Info) error {
			paths = append(paths, i.Path)
			return nil
		})
		if err != nil && !errors.Is(err, files.ErrNotFound) {
			return fmt.Errorf("list the workdir: %w", err)
		}
		for _, p := range paths {
			if err := wd.Remove(ctx, p); err != nil && !errors.Is(err, files.ErrNotFound) {
				return fmt.Errorf("remove %s: %w", p, err)
			}
		}
	}
	if e.objects == nil {
		return nil
	}
	infos, err := e.objects.List(ctx, jetstream.ListObjectsShowDeleted())
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list the object store: %w", err)
	}
	prefix := tenant + "/" + thread + "/"
	stream := "OBJ_" + e.names.FilesBucket()
	for _, info := range infos {
		if !strings.HasPrefix(info.Name, prefix) {
			continue
		}
		if !info.Deleted {
			// Purges the object's chunks.
			if err := e.objects.Delete(ctx, info.Name); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
				return fmt.Errorf("delete object %s: %w", info.Name, err)
			}
		}
		// The meta record (deleted or not) still names the path.
		if err := e.purge(ctx, stream, objMetaSubject(e.names.FilesBucket(), info.Name)); err != nil {
			return err
		}
	}
	return nil
}

// objMetaSubject is the subject of an object's meta record (nats.go's
// object store layout).
func objMetaSubject(bucket, name string) string {
	return "$O." + bucket + ".M." + encodeName(name)
}

func kvSubject(bucket, key string) string { return "$KV." + bucket + "." + key }

// purgeKV removes every revision of the keys matching key (wildcards
// allowed), leaving no marker.
func (e *Eraser) purgeKV(ctx context.Context, bucket, key string) error {
	return e.purge(ctx, kvStream(bucket), kvSubject(bucket, key))
}

// purge removes every message of stream on subject (wildcards allowed).
func (e *Eraser) purge(ctx context.Context, stream, subject string) error {
	st := e.streams[stream]
	if st == nil {
		return fmt.Errorf("stream %s is not known", stream)
	}
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := st.Purge(pctx, jetstream.WithPurgeSubject(subject)); err != nil {
		return fmt.Errorf("purge %s from %s: %w", subject, stream, err)
	}
	return nil
}

// deleteMatching securely deletes (overwrites) every message of stream on
// subject whose JSON payload match accepts. It reads message by message
// (a work-queue stream takes no second consumer on the same subjects).
func (e *Eraser) deleteMatching(ctx context.Context, stream, subject string, match func(jobPayload) bool) error {
	st := e.streams[stream]
	for seq := uint64(1); ; {
		gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		m, err := st.GetMsg(gctx, seq, jetstream.WithGetMsgSubject(subject))
		cancel()
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read %s of %s: %w", subject, stream, err)
		}
		var p jobPayload
		if json.Unmarshal(m.Data, &p) == nil && match(p) {
			dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := st.SecureDeleteMsg(dctx, m.Sequence)
			cancel()
			if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) && !errors.Is(err, jetstream.ErrMsgDeleteUnsuccessful) {
				return fmt.Errorf("delete message %d of %s: %w", m.Sequence, stream, err)
			}
		}
		seq = m.Sequence + 1
	}
}

// DeleteRun deletes a finished run of a thread: its record, usage, index
// entry, events and dead letters. The thread's checkpoints stay (they are
// the thread's state, which later runs built on). ErrNotFound if the run
// is not on that thread; a *BusyError while it is pending or running.
func (e *Eraser) DeleteRun(ctx context.Context, tenant, thread, run string) error {
	if err := checkIDs(tenant, thread, run); err != nil {
		return err
	}
	// The view: a running run's record is pending or missing (v2).
	rec, _, err := e.stores.RunView(ctx, tenant, thread, run)
	if errors.Is(err, kv.ErrNotFound) || (err == nil && rec.ThreadID != thread) {
		return fmt.Errorf("run %s on thread %s: %w", run, thread, ErrNotFound)
	}
	if err != nil {
		return err
	}
	if !rec.Status.Terminal() {
		return &BusyError{ThreadID: thread, RunID: run, Msg: fmt.Sprintf("run %s is %s: cancel it first, then delete it", run, rec.Status)}
	}
	n := e.names
	for _, step := range []struct{ stream, subject string }{
		{n.EventsStream(), n.RunEvents(tenant, thread, run)},
		{kvStream(n.UsageBucket()), kvSubject(n.UsageBucket(), bus.Key(tenant, "run", run))},
		{kvStream(n.ThreadsBucket()), kvSubject(n.ThreadsBucket(), bus.Key(tenant, thread, "run", run))},
	} {
		if err := e.purge(ctx, step.stream, step.subject); err != nil {
			return err
		}
	}
	if err := e.deleteDeadRuns(ctx, tenant, thread, run); err != nil {
		return err
	}
	// The thread's pointer to its last run goes too.
	for attempt := 0; attempt < 50; attempt++ {
		th, rev, err := e.stores.Threads.Get(ctx, tenant, thread)
		if errors.Is(err, kv.ErrNotFound) {
			break
		}
		if err != nil {
			return err
		}
		namesRun := th.LastRun != nil && th.LastRun.RunID == run
		if th.LastRunID != run && !namesRun {
			break
		}
		next := *th
		if next.LastRunID == run {
			next.LastRunID = ""
		}
		if namesRun {
			// The run's terminal summary (protocol v2) holds its output.
			next.LastRun = nil
		}
		if _, err := e.stores.Threads.Put(ctx, &next, rev); err == nil {
			break
		} else if !errors.Is(err, kv.ErrConflict) {
			return err
		}
	}
	// The record last: while it exists, the deletion can be done again.
	if err := e.purgeKV(ctx, n.RunsBucket(), bus.Key(tenant, run)); err != nil {
		return err
	}
	e.log.Info("run deleted", zap.String("tenant", tenant), zap.String("thread_id", thread), zap.String("run_id", run))
	return nil
}

// deleteDeadRuns deletes the dead letters of one run of a thread.
func (e *Eraser) deleteDeadRuns(ctx context.Context, tenant, thread, run string) error {
	st := e.streams[e.names.DLQStream()]
	subject := e.names.DLQSubject(tenant, thread)
	for seq := uint64(1); ; {
		m, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read dead letters of thread %s: %w", thread, err)
		}
		var req struct {
			RunID string `json:"run_id"`
		}
		// A dead letter keeps only the first 4 KiB of a large request,
		// which is then not whole JSON: its run id is near the start.
		mine := json.Unmarshal(m.Data, &req) == nil && req.RunID == run ||
			bytes.Contains(m.Data, []byte(`"run_id":"`+run+`"`))
		if mine {
			if err := st.SecureDeleteMsg(ctx, m.Sequence); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
				return fmt.Errorf("delete dead letter %d: %w", m.Sequence, err)
			}
		}
		seq = m.Sequence + 1
	}
}

// UserErased reports what EraseUser removed.
type UserErased struct {
	// Threads are the user's threads deleted.
	Threads []string `json:"threads"`
}

// EraseUser removes everything of one user of a tenant: the threads the
// user owns (DeleteThreads, with opts), their memory (notes, facts,
// distillation cursors), their memory jobs, queued or dead-lettered, and
// their store items (namespaces ["users", user] and ["memories", user]).
// Threads created without an owner (an open gateway) are shared by the
// tenant and stay. Without opts.Cancel, a busy thread refuses the erasure
// with a *BusyError before anything is deleted; a failure half way is
// finished by calling it again.
func (e *Eraser) EraseUser(ctx context.Context, tenant, user string, opts ThreadOptions) (*UserErased, error) {
	if err := checkIDs(tenant, user); err != nil {
		return nil, err
	}
	out := &UserErased{Threads: []string{}}
	all, err := e.stores.Threads.List(ctx, tenant)
	if err != nil {
		return out, err
	}
	var owned []string
	for _, th := range all {
		if th.Owner == user {
			owned = append(owned, th.ThreadID)
		}
	}
	deleted, err := e.deleteThreads(ctx, tenant, owned, opts, 0)
	out.Threads = append(out.Threads, deleted...)
	if err != nil {
		return out, err
	}
	if err := e.deleteCrons(ctx, tenant, func(r *crons.Record) bool {
		return r.Owner == user || (r.UserID != nil && *r.UserID == user)
	}); err != nil {
		return out, err
	}
	n := e.names
	for _, step := range []struct{ stream, subject string }{
		{kvStream(n.MemoryBucket()), kvSubject(n.MemoryBucket(), bus.Key(tenant, user, ">"))},
		{n.JobsStream(), n.JobSubject(jobMemory, tenant, user)},
		{n.JobsStream(), n.JobScheduleSubject(jobMemory, tenant, user, "*")},
	} {
		if err := e.purge(ctx, step.stream, step.subject); err != nil {
			return out, err
		}
	}
	if err := e.deleteMatching(ctx, n.DLQStream(), n.Prefix+".dlq.jobs.>", func(p jobPayload) bool {
		return p.Tenant == tenant && p.User == user
	}); err != nil {
		return out, err
	}
	if err := e.eraseAssistants(ctx, tenant, user); err != nil {
		return out, err
	}
	if e.items != nil {
		// The user's own store namespaces (store.UserPrefixes), their
		// memory among them; items in shared namespaces stay, as threads
		// created without an owner do.
		for _, p := range store.UserPrefixes {
			if err := e.items.PurgePrefix(ctx, tenant, []string{p, user}); err != nil {
				return out, fmt.Errorf("erase store items under %s/%s: %w", p, user, err)
			}
		}
	}
	e.log.Info("user erased", zap.String("tenant", tenant), zap.String("user", user), zap.Int("threads", len(out.Threads)))
	return out, nil
}

// eraseAssistants removes the LangGraph assistants user created, every
// version, with subject purges (no marker is left).
func (e *Eraser) eraseAssistants(ctx context.Context, tenant, user string) error {
	if e.assistants == nil {
		return nil
	}
	owned, err := e.assistants.List(ctx, tenant)
	if err != nil {
		return err
	}
	b := e.names.AssistantsBucket()
	for _, a := range owned {
		if a.Owner != user {
			continue
		}
		for _, key := range []string{bus.Key(tenant, a.AssistantID, ">"), bus.Key(tenant, a.AssistantID)} {
			if err := e.purge(ctx, kvStream(b), kvSubject(b, key)); err != nil {
				return err
			}
		}
	}
	return nil
}

// deleteCrons deletes a tenant's crons that match (their schedules
// first, then their records).
func (e *Eraser) deleteCrons(ctx context.Context, tenant string, match func(*crons.Record) bool) error {
	list, err := e.crons.List(ctx, tenant)
	if err != nil {
		return fmt.Errorf("list crons: %w", err)
	}
	for _, r := range list {
		if match(r) {
			if err := e.crons.Delete(ctx, tenant, r.CronID); err != nil {
				return fmt.Errorf("delete cron %s: %w", r.CronID, err)
			}
			e.log.Info("cron deleted", zap.String("tenant", tenant), zap.String("cron_id", r.CronID))
		}
	}
	return nil
}

// checkIDs validates ids that become subject tokens: anything else (".",
// "*", ">") could name another thread's subjects in a purge.
func checkIDs(ids ...string) error {
	for _, id := range ids {
		if !protocol.ValidToken(id) {
			return fmt.Errorf("%w: id %q: use 1 to %d characters from A-Z, a-z, 0-9, '_' and '-'", ErrInvalid, clip(id), protocol.MaxTokenLen)
		}
	}
	return nil
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// encodeName is how the object store names an object's meta subject.
func encodeName(name string) string { return base64.URLEncoding.EncodeToString([]byte(name)) }
