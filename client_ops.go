package natsagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/natsagent/natsagent/internal/compact"
	"github.com/natsagent/natsagent/internal/erase"
	"github.com/natsagent/natsagent/internal/events"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/protocol"
)

// The client's actions beyond a run's lifecycle: deletion, compaction,
// the thread's checkpoints, a run's end told from its record.

// DeleteReply is the delete service's answer.
type DeleteReply = protocol.DeleteReply

// DeleteOptions say how a thread is deleted.
type DeleteOptions struct {
	// Cancel cancels the thread's pending or running run first; without
	// it a thread with one is refused.
	Cancel bool
}

// DeleteThread deletes a thread and everything keyed by it: its runs,
// checkpoints, events, files and usage (docs/operations.md, "Deleting
// data"). It is a request to the delete service the workers serve; ctx
// without a deadline gets two minutes.
func (c *Client) DeleteThread(ctx context.Context, thread string, opts *DeleteOptions) (*DeleteReply, error) {
	if err := protocol.CheckToken("thread id", thread); err != nil {
		return nil, err
	}
	return c.deleteRequest(ctx, c.names.ThreadDeleteSubject(c.tenant, thread), opts != nil && opts.Cancel)
}

// DeleteRun deletes a finished run: its record, events and usage. The
// thread keeps its state; a pending or running run is refused.
func (c *Client) DeleteRun(ctx context.Context, thread, run string) (*DeleteReply, error) {
	if err := checkIDs(thread, run); err != nil {
		return nil, err
	}
	return c.deleteRequest(ctx, c.names.RunDeleteSubject(c.tenant, thread, run), false)
}

func (c *Client) deleteRequest(ctx context.Context, subject string, cancelFirst bool) (*DeleteReply, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
	}
	m := nats.NewMsg(subject)
	if cancelFirst {
		m.Header.Set(erase.HeaderCancel, "true")
	}
	msg, err := c.nc.RequestMsgWithContext(ctx, m)
	if errors.Is(err, nats.ErrNoResponders) {
		return nil, fmt.Errorf("natsagent: no worker serves delete requests on %s: start a worker", subject)
	}
	if err != nil {
		return nil, fmt.Errorf("natsagent: delete request: %w", err)
	}
	if err := serviceError(msg); err != nil {
		return nil, err
	}
	var reply DeleteReply
	if err := json.Unmarshal(msg.Data, &reply); err != nil {
		return nil, fmt.Errorf("natsagent: decode the delete reply: %w", err)
	}
	return &reply, nil
}

// serviceError is the refusal a workers' service (cancel, delete)
// answered msg with; ErrNotFound for the code not_found.
func serviceError(msg *nats.Msg) error {
	if msg.Header.Get("Nats-Service-Error-Code") == "" {
		return nil
	}
	var er protocol.ErrorReply
	_ = json.Unmarshal(msg.Data, &er)
	text := er.Error.Message
	if text == "" {
		text = msg.Header.Get("Nats-Service-Error")
	}
	if er.Error.Code == protocol.CodeNotFound {
		return fmt.Errorf("%w: %s", ErrNotFound, text)
	}
	return errors.New(text)
}

// CompactOptions say how a thread is compacted.
type CompactOptions struct {
	// Agent is the agent whose context_compression settings and model
	// summarize ("": the agent of the thread's last run).
	Agent string
	// JobID names the job ("": a new id); the same id within the jobs
	// stream's duplicate window is one job.
	JobID string
}

// Compact queues a compaction job for an idle thread: a worker summarizes
// its older messages so its next run starts from the summary
// (docs/protocol.md 2.19). It returns the job's id; the job publishes its
// result as a custom event under that id, which Follow(ctx, thread, id,
// &FollowOptions{NewOnly: true}) opened before Compact reads.
func (c *Client) Compact(ctx context.Context, thread string, opts *CompactOptions) (string, error) {
	if opts == nil {
		opts = &CompactOptions{}
	}
	req := compact.Request{JobID: opts.JobID, Tenant: c.tenant, ThreadID: thread, Agent: opts.Agent}
	if req.JobID == "" {
		req.JobID = "compact-" + uuid.NewString()
	}
	if err := req.Validate(); err != nil {
		return "", err
	}
	if _, err := compact.Enqueue(ctx, c.js, c.names, req); err != nil {
		return "", fmt.Errorf("natsagent: queue the compaction job: %w", err)
	}
	return req.JobID, nil
}

// Checkpoint is one checkpoint of a thread: the state update a step of a
// run wrote, and which run and when.
type Checkpoint = kv.Delta

// Checkpoints reads a thread's checkpoints from its first to its head
// (the thread's current branch).
func (c *Client) Checkpoints(ctx context.Context, thread string) ([]*Checkpoint, error) {
	th, err := c.Thread(ctx, thread)
	if err != nil {
		return nil, err
	}
	_, chain, err := c.stores.Checkpoints.Load(ctx, c.tenant, thread, th.Head)
	if err != nil {
		return nil, fmt.Errorf("natsagent: checkpoints of thread %s: %w", thread, err)
	}
	return chain, nil
}

// FinishedEvent is the run.finished event a terminal record stands for,
// for a reader whose run's events expired (docs/protocol.md 2.10): the
// envelope the worker stored, timed at the record's finished_at, with no
// stream sequence.
func FinishedEvent(rec *Run) (*Event, error) {
	if rec == nil || !rec.Status.Terminal() {
		return nil, errors.New("natsagent: a run.finished event needs a terminal run record")
	}
	raw, err := events.FinishedEnvelope(rec)
	if err != nil {
		return nil, err
	}
	ev := &Event{raw: raw}
	if err := json.Unmarshal(raw, &ev.Event); err != nil {
		return nil, err
	}
	return ev, nil
}
