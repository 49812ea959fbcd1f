// Package compactjob runs compaction on request: a job on the jobs queue that
// summarizes an idle thread's older messages with its agent's
// context_compression settings, as a run does before a model call when the
// context is over the trigger, and records the summary in a checkpoint. A
// run that starts later projects its requests from that summary on any
// worker. The job reads the thread record and moves its head with a
// compare-and-set, only while no run holds the lease (it never takes one:
// a run that starts meanwhile wins and the job changes nothing); it reads
// and writes checkpoints and the thread's workdir, and publishes
// context_compression events under its own id. It never touches runs.
package compactjob

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/compact"
	"github.com/natsagent/natsagent/internal/events"
	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/jobs"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
)

// Agents resolves an agent profile (agent.Agents does).
type Agents interface {
	Prepare(req *protocol.RunRequest) (*agent.Prepared, error)
}

// Handler runs compaction jobs.
type Handler struct {
	stores *kv.Stores
	pub    *events.Publisher
	agents Agents
	files  func(tenant, thread string) files.Workdir
	log    *zap.Logger
}

// NewHandler builds the job handler; workdirs opens a thread's files (nil:
// the deployment keeps none, and summaries go without a history file).
func NewHandler(stores *kv.Stores, pub *events.Publisher, agents Agents, workdirs func(tenant, thread string) files.Workdir, log *zap.Logger) *Handler {
	if log == nil {
		log = zap.NewNop()
	}
	return &Handler{stores: stores, pub: pub, agents: agents, files: workdirs, log: log}
}

// Handle is the jobs.Handler of compact.JobKind. Every outcome, a refusal
// included, ends with one context_compression event of phase completed or
// failed; only NATS trouble before that retries the job.
func (h *Handler) Handle(ctx context.Context, job *jobs.Job) error {
	var req compact.Request
	dec := json.NewDecoder(bytes.NewReader(job.Data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return jobs.Permanent(fmt.Errorf("compaction job payload: %w", err))
	}
	if err := req.Validate(); err != nil {
		return jobs.Permanent(fmt.Errorf("compaction job payload: %w", err))
	}
	if len(job.Tokens) == 2 && !slices.Equal(job.Tokens, []string{req.Tenant, req.ThreadID}) {
		return jobs.Permanent(fmt.Errorf("compaction job for %s.%s published on the subject of %v", req.Tenant, req.ThreadID, job.Tokens))
	}
	log := h.log.With(zap.String("tenant", req.Tenant), zap.String("thread_id", req.ThreadID), zap.String("job_id", req.JobID), zap.Int("attempt", job.Attempt))
	last, err := h.pub.LastSeq(ctx, req.Tenant, req.ThreadID, req.JobID)
	if err != nil {
		return err
	}
	stream := h.pub.NewStream(req.Tenant, req.ThreadID, req.JobID, job.Attempt, last)
	d, err := h.compact(ctx, &req, stream, log)
	if err != nil {
		return err
	}
	d.JobID, d.Reason = req.JobID, middleware.CompressionReasonRequest
	stream.Emit(middleware.EventContextCompression, d, compact.ResultMsgID(req.JobID))
	if err := stream.Flush(ctx); err != nil {
		return fmt.Errorf("publish the compaction result: %w", err)
	}
	log.Info("thread compaction done", zap.String("phase", d.Phase), zap.String("code", d.Code),
		zap.Int("tokens_before", d.TokensBefore), zap.Int("tokens_after", d.TokensAfter), zap.Int("summarized", d.Summarized))
	return nil
}

var errMoved = errors.New("the thread changed while it was compacted")

func failed(code, format string, args ...any) middleware.CompressionData {
	return middleware.CompressionData{Phase: middleware.CompressionFailed, Code: code, Error: fmt.Sprintf(format, args...)}
}

// compact does the work and returns the final event's data; an error means
// the job should be tried again.
func (h *Handler) compact(ctx context.Context, req *compact.Request, stream *events.Stream, log *zap.Logger) (middleware.CompressionData, error) {
	th, rev, err := h.stores.Threads.Get(ctx, req.Tenant, req.ThreadID)
	if errors.Is(err, kv.ErrNotFound) {
		return failed(middleware.CodeNotFound, "thread %s not found", req.ThreadID), nil
	}
	if err != nil {
		return middleware.CompressionData{}, err
	}
	if th.Lease != nil {
		return failed(middleware.CodeBusy, "thread %s is busy with run %s; compact it when it is idle", req.ThreadID, th.Lease.RunID), nil
	}
	st, chain, err := h.stores.Checkpoints.Load(ctx, req.Tenant, req.ThreadID, th.Head)
	if err != nil {
		return middleware.CompressionData{}, err
	}
	for _, d := range chain {
		if d.ID == compact.CheckpointID(req.JobID) {
			// Done by an earlier delivery that died before reporting.
			return done(d), nil
		}
	}
	name := req.Agent
	if name == "" && th.LastRunID != "" {
		if rec, _, err := h.stores.RunView(ctx, req.Tenant, th.ThreadID, th.LastRunID); err == nil {
			name = rec.Agent
		}
	}
	if name == "" {
		name = protocol.DefaultAgent
	}
	prep, err := h.agents.Prepare(&protocol.RunRequest{RunID: req.JobID, ThreadID: req.ThreadID, Tenant: req.Tenant, Agent: name})
	if err != nil {
		return failed(middleware.CodeUnknownAgent, "%v", err), nil
	}
	var cc *middleware.ContextCompression
	for _, m := range prep.Chain.Middlewares() {
		if c, ok := m.(*middleware.ContextCompression); ok {
			cc = c
		}
	}
	if cc == nil {
		return failed(middleware.CodeDisabled, "agent %s has context_compression disabled", name), nil
	}
	var w files.Workdir
	if h.files != nil {
		w = h.files(req.Tenant, req.ThreadID)
	}
	rt := &middleware.Runtime{RunID: req.JobID, ThreadID: req.ThreadID, Tenant: req.Tenant, Agent: name, Tools: prep.Tools, Files: w, Logger: log,
		Emit: func(t string, data any) { stream.Emit(t, data, "") }}
	n := len(st.Messages)
	mreq := &middleware.ModelRequest{System: prep.Profile.SystemPrompt, Messages: st.Messages[:n:n], Tools: prep.Tools.Specs(),
		Model: prep.Model, ModelName: prep.ModelName, State: st}
	out, err := cc.Compact(ctx, rt, mreq, req.JobID)
	if err != nil {
		if ctx.Err() != nil {
			return middleware.CompressionData{}, err
		}
		return failed(middleware.CodeSummaryFailed, "%v", err), nil
	}
	if !out.Summarized {
		return out.Data, nil
	}
	d := &kv.Delta{ID: compact.CheckpointID(req.JobID), Parent: th.Head, RunID: req.JobID, Time: time.Now().UTC(), Update: out.Update}
	if _, err := h.stores.Checkpoints.Put(ctx, req.Tenant, req.ThreadID, d); err != nil {
		return middleware.CompressionData{}, err
	}
	// Like a run's checkpoint, the head moves with a compare-and-set of the
	// thread record; a run that took the thread meanwhile wins, and the
	// delta stays unreferenced.
	head := th.Head
	_, _, err = h.stores.Threads.MutateFrom(ctx, req.Tenant, req.ThreadID, th, rev, func(t *protocol.Thread) error {
		if t.Lease != nil || t.Head != head || t.Status == protocol.ThreadDeleting {
			return errMoved
		}
		t.Head = d.ID
		return nil
	})
	if errors.Is(err, errMoved) {
		return failed(middleware.CodeBusy, "a run took thread %s while it was compacted; nothing was changed", req.ThreadID), nil
	}
	if err != nil {
		return middleware.CompressionData{}, err
	}
	data := out.Data
	data.Checkpoint = d.ID
	return data, nil
}

// done is the result of a compaction whose checkpoint is already on the
// thread.
func done(d *kv.Delta) middleware.CompressionData {
	data := middleware.CompressionData{Phase: middleware.CompressionCompleted, Checkpoint: d.ID}
	st := &state.State{}
	st.Apply(d.Update)
	var rec middleware.ContextSummary
	if ok, err := st.Value(middleware.ContextSummaryValue, &rec); ok && err == nil {
		data.TokensBefore, data.TokensAfter = rec.TokensBefore, rec.TokensAfter
		data.Summarized, data.Count, data.SummarySeq = rec.Summarized, rec.Count, rec.Seq
		data.CutBeforeMessageID, data.HistoryPath = rec.CutBeforeMessageID, rec.HistoryPath
	}
	return data
}
