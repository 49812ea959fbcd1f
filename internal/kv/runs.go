package kv

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
)

// Runs stores run records under "<tenant>.<run>".
type Runs struct {
	kv     jetstream.KeyValue
	js     jetstream.JetStream
	bucket string
	// ttl is the key TTL of a tenant's finished runs (SetTTLs).
	ttl func(tenant string) time.Duration
	// skips reports the records that do not decode (Stores.Observe).
	skips *Skips
}

// Get reads a run record.
func (s *Runs) Get(ctx context.Context, tenant, run string) (*protocol.Run, uint64, error) {
	return get[protocol.Run](ctx, s.js, s.kv, bus.Key(tenant, run))
}

// GetLatest reads a run record through the bucket's leader, for the read
// after a Create refused with ErrExists: it waits for the write that
// refused the create to be stored (a replicated bucket refuses a create
// while another write of the key is still being replicated), which Get,
// answered by any replica, may not show yet.
func (s *Runs) GetLatest(ctx context.Context, tenant, run string) (*protocol.Run, uint64, error) {
	return getAfter[protocol.Run](ctx, s.js, s.bucket, bus.Key(tenant, run), 0)
}

// GetFromLeader reads a run record through the bucket's leader, at once:
// unlike GetLatest it does not wait for a write in flight, so a missing
// record answers ErrNotFound in one round trip.
func (s *Runs) GetFromLeader(ctx context.Context, tenant, run string) (*protocol.Run, uint64, error) {
	return getLatest[protocol.Run](ctx, s.js, s.bucket, bus.Key(tenant, run))
}

// Create writes a new run record; ErrExists if the run id is taken.
func (s *Runs) Create(ctx context.Context, r *protocol.Run) (uint64, error) {
	return putTTL(ctx, s.js, s.kv, bus.Key(r.Tenant, r.RunID), r, 0, s.finishedTTL(r))
}

// Update compare-and-sets a run record at revision rev; ErrConflict if it
// changed since.
func (s *Runs) Update(ctx context.Context, r *protocol.Run, rev uint64) (uint64, error) {
	return putTTL(ctx, s.js, s.kv, bus.Key(r.Tenant, r.RunID), r, rev, s.finishedTTL(r))
}

// finishedTTL is the key TTL of r: its tenant's retention of finished
// runs once it finished, none before.
func (s *Runs) finishedTTL(r *protocol.Run) time.Duration {
	if !r.Status.Terminal() {
		return 0
	}
	return ttlOf(s.ttl, r.Tenant)
}

// Mutate applies fn to the current record and writes it with CAS,
// re-reading and re-applying on conflict. fn may return an error to give
// up; it is returned unchanged.
func (s *Runs) Mutate(ctx context.Context, tenant, run string, fn func(*protocol.Run) error) (*protocol.Run, uint64, error) {
	var refused uint64 // the revision the last refused update was based on
	for attempt := 0; ; attempt++ {
		var r *protocol.Run
		var rev uint64
		var err error
		if attempt == 0 {
			r, rev, err = s.Get(ctx, tenant, run)
		} else {
			// What refused the update may not be on any replica yet.
			r, rev, err = getAfter[protocol.Run](ctx, s.js, s.bucket, bus.Key(tenant, run), refused)
		}
		if err != nil {
			return nil, 0, err
		}
		if err := fn(r); err != nil {
			return r, rev, err
		}
		newRev, err := s.Update(ctx, r, rev)
		if err == nil {
			return r, newRev, nil
		}
		if !errors.Is(err, ErrConflict) || attempt >= maxCASAttempts {
			return nil, 0, fmt.Errorf("update run %s: %w", run, err)
		}
		refused = rev
	}
}

const maxCASAttempts = 100

// List returns the records of a tenant's runs matching keep (nil keeps
// all), newest first. It reads every run of the tenant; use ListThread for
// one thread.
func (s *Runs) List(ctx context.Context, tenant string, keep func(*protocol.Run) bool) ([]*protocol.Run, error) {
	out, err := list(ctx, s.kv, tenant+".*", nil, keep, s.skips)
	if err != nil {
		return nil, err
	}
	sortNewestFirst(out)
	return out, nil
}

func sortNewestFirst(runs []*protocol.Run) {
	sort.SliceStable(runs, func(i, j int) bool { return runs[i].CreatedAt.After(runs[j].CreatedAt) })
}

// NewRun builds the pending record of a run request.
func NewRun(req *protocol.RunRequest, msgSeq uint64, now time.Time) *protocol.Run {
	return &protocol.Run{
		RunID:             req.RunID,
		ThreadID:          req.ThreadID,
		Tenant:            req.Tenant,
		Agent:             req.Agent,
		Status:            protocol.StatusPending,
		MultitaskStrategy: req.MultitaskStrategy,
		CreatedAt:         now,
		Parent:            req.Parent,
		Metadata:          req.Metadata,
		MsgSeq:            msgSeq,
		Webhook:           newWebhook(req.Webhook),
		StreamMode:        req.StreamMode,
	}
}

func newWebhook(url string) *protocol.RunWebhook {
	if url == "" {
		return nil
	}
	return &protocol.RunWebhook{URL: url, Status: protocol.WebhookPending}
}

// RunView reads run the way clients see it (protocol.RunView): its record
// and, unless the record is terminal, its thread's record, which says
// whether it runs or has just ended. thread may be "" when the caller does
// not know it; a run without a record is then not found. The revision is
// the record's (0 when it has none).
func (s *Stores) RunView(ctx context.Context, tenant, thread, run string) (*protocol.Run, uint64, error) {
	rec, rev, err := s.Runs.Get(ctx, tenant, run)
	switch {
	case errors.Is(err, ErrNotFound):
		rec = nil
	case err != nil:
		return nil, 0, err
	case rec.Status.Terminal():
		return rec, rev, nil
	}
	if rec != nil {
		if thread != "" && rec.ThreadID != thread {
			return rec, rev, nil
		}
		thread = rec.ThreadID
	}
	if thread == "" {
		return nil, 0, ErrNotFound
	}
	th, _, err := s.Threads.Get(ctx, tenant, thread)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return nil, 0, err
	}
	v := s.view(ctx, run, rec, th)
	if v == nil {
		return nil, 0, ErrNotFound
	}
	return v, rev, nil
}

// view is protocol.RunView with what a last_run left out for size read
// back (WithOutput), so that every reader shows a run whole. A checkpoint
// that cannot be read leaves the view as last_run has it, naming
// output_checkpoint.
func (s *Stores) view(ctx context.Context, run string, rec *protocol.Run, th *protocol.Thread) *protocol.Run {
	v := protocol.RunView(run, rec, th)
	if v != nil && v != rec && v.OutputCheckpoint != "" {
		if full, err := s.WithOutput(ctx, v); err == nil {
			v = full
		}
	}
	return v
}

// ThreadRuns lists the runs thread's index names, as clients see them
// (RunView), oldest first as the thread indexed them. th is the thread's
// record, nil when it has none; runs whose records are gone, and ids the
// index shares with a run of another thread, are skipped.
func (s *Stores) ThreadRuns(ctx context.Context, tenant, thread string, th *protocol.Thread) ([]*protocol.Run, error) {
	ids, err := s.Threads.RunIDs(ctx, tenant, thread)
	if err != nil {
		return nil, err
	}
	var out []*protocol.Run
	for _, id := range ids {
		rec, _, err := s.Runs.Get(ctx, tenant, id)
		if errors.Is(err, ErrNotFound) {
			rec, err = nil, nil
		}
		if err != nil {
			return nil, err
		}
		// A running run may have no record yet: its thread's lease says it.
		// A run id is unique per tenant; the index is the thread's.
		if v := s.view(ctx, id, rec, th); v != nil && v.ThreadID == thread {
			out = append(out, v)
		}
	}
	return out, nil
}

// WithOutput completes a run made from its thread's last_run, which
// leaves out an output or an interrupt over 4 KiB and names the
// checkpoint the run ended at instead (OutputCheckpoint): the result has
// the last assistant message of the state at that checkpoint as its
// output, and the state's open interrupt (protocol.InterruptValue) as
// the interrupt of an interrupted run. When that checkpoint is gone, or
// lacks what was left out, output_checkpoint stays to say it was not
// kept; a read that failed otherwise is an error to retry.
func (s *Stores) WithOutput(ctx context.Context, v *protocol.Run) (*protocol.Run, error) {
	wantOutput := v.Output == nil
	wantInterrupt := v.Interrupt == nil && v.Status == protocol.StatusInterrupted
	if v.OutputCheckpoint == "" || (!wantOutput && !wantInterrupt) {
		return v, nil
	}
	st, _, err := s.Checkpoints.Load(ctx, v.Tenant, v.ThreadID, v.OutputCheckpoint)
	if errors.Is(err, ErrCheckpointMissing) {
		return v, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the output of run %s: %w", v.RunID, err)
	}
	full := *v
	if wantOutput {
		for i := len(st.Messages) - 1; i >= 0; i-- {
			if st.Messages[i].Role == model.RoleAssistant {
				m := st.Messages[i].Clone()
				full.Output = &m
				break
			}
		}
	}
	if wantInterrupt {
		var intr protocol.Interrupt
		if ok, _ := st.Value(protocol.InterruptValue, &intr); ok && intr.Kind != "" {
			full.Interrupt = &intr
		}
	}
	if (!wantOutput || full.Output != nil) && (!wantInterrupt || full.Interrupt != nil) {
		full.OutputCheckpoint = ""
	}
	return &full, nil
}

// RunOfThread is the run of thread as clients see it (protocol.RunView),
// for a reader that names the thread (an API path, a client's wait): a
// run of another thread is ErrNotFound. A record not found is asked of
// the stream's leader before the thread's lease is consulted: any replica
// answers a read, and one may not have a record created a moment ago. The
// leader's answer is final (GetFromLeader, not GetLatest): every write
// acknowledged is stored there, and most running runs have no record, so
// GetLatest's wait for a write in flight cost them 2 s a read.
func (s *Stores) RunOfThread(ctx context.Context, tenant, thread, run string) (*protocol.Run, error) {
	rec, _, err := s.Runs.Get(ctx, tenant, run)
	if errors.Is(err, ErrNotFound) {
		rec, _, err = s.Runs.GetFromLeader(ctx, tenant, run)
	}
	switch {
	case errors.Is(err, ErrNotFound):
		rec = nil
	case err != nil:
		return nil, err
	case rec.ThreadID != thread:
		return nil, ErrNotFound
	case rec.Status.Terminal():
		return rec, nil
	}
	th, _, err := s.Threads.Get(ctx, tenant, thread)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return nil, err
	}
	v := s.view(ctx, run, rec, th)
	if v == nil {
		return nil, ErrNotFound
	}
	return v, nil
}

// FindRunView is RunView for a caller that knows only the run's id (a
// person at the CLI): a run without a record, one a plain publish sent
// that has not ended, is looked for on the tenant's threads, whose lease
// or last_run names it. That reads every thread record of the tenant, so
// it serves a person's command, not a hot path.
func (s *Stores) FindRunView(ctx context.Context, tenant, run string) (*protocol.Run, error) {
	rec, _, err := s.RunView(ctx, tenant, "", run)
	if !errors.Is(err, ErrNotFound) {
		return rec, err
	}
	ths, err := list(ctx, s.Threads.kv, tenant+".*", threadRecord, func(t *protocol.Thread) bool {
		return (t.Lease != nil && t.Lease.RunID == run) || (t.LastRun != nil && t.LastRun.RunID == run)
	}, s.Threads.skips)
	if err != nil {
		return nil, err
	}
	for _, th := range ths {
		if v := s.view(ctx, run, nil, th); v != nil {
			return v, nil
		}
	}
	return nil, ErrNotFound
}
