// Package submit enqueues run requests. Every submitter (the gateway, the
// natsagent command, the subagent service) goes through Enqueue, so that
// all of them write the same things in the same order, and a crash after
// any step leaves nothing a worker cannot finish:
//
//  1. the request is published to agent.runs.<tenant>.<thread> with
//     Nats-Msg-Id = "<tenant>.<run id>" (protocol.RunMsgID: the stream
//     stores one copy however often it is sent, and bus.PublishMsg sends
//     it again through a leader election; the tenant keeps one tenant's
//     run id from matching another's), the Natsagent-Submitter header and
//     the caller's trace context. A duplicate answer is checked against
//     the stored message: one of another run is ErrRunIDTaken, never a
//     pending record for a run that will not run;
//  2. run.queued is published (idempotent by its own message id) before
//     the record exists, so no worker's run.started can precede it;
//  3. the pending record is created with seq 1 (run.queued); a record a
//     worker created first stands, read from the bucket's leader;
//  4. the thread's run index entry is written (the worker writes the same
//     key: indexing twice is harmless).
//
// What comes before (validating the request, creating the thread record,
// answering a retried run id, the reject strategy) differs by submitter
// and stays with it.
package submit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/events"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/telemetry"
)

// ErrMaxPayload reports a request larger than the NATS server accepts in
// one message (max_payload), which is not always the deployment's
// nats.max_request_bytes.
var ErrMaxPayload = errors.New("run request is over the NATS server's max payload; put large content in files and reference it")

// ErrRunIDTaken reports a run request the runs stream refused as a
// duplicate of a message that is not this run's request (another thread's
// run with the same id, or a message id written by a broken submitter), or
// of a request that is gone without leaving a run record. Nothing was
// enqueued; the submitter should choose another run id.
var ErrRunIDTaken = errors.New("run id already taken")

// Queue is where a submitter enqueues runs.
type Queue struct {
	JS     jetstream.JetStream
	Names  bus.Names
	Stores *kv.Stores
	Events *events.Publisher
	// Submitter names the client in the Natsagent-Submitter header
	// (gateway, cli, subagents...), for the workers' logs.
	Submitter string
}

// Enqueued is what Enqueue did.
type Enqueued struct {
	// Record is the run's record: the pending one Enqueue created, or the
	// one a worker had created first.
	Record *protocol.Run
	// Ack is the stream's answer to the request: its sequence, and
	// Duplicate when the stream already held a request of this run id.
	Ack *jetstream.PubAck
}

// Enqueue publishes req, encoded as data (the caller has validated it and
// checked its size against nats.max_request_bytes), and records it as
// pending. The thread record must exist.
func (q *Queue) Enqueue(ctx context.Context, req *protocol.RunRequest, data []byte) (*Enqueued, error) {
	m := nats.NewMsg(q.Names.RunSubject(req.Tenant, req.ThreadID))
	m.Data = data
	m.Header.Set(jetstream.MsgIDHeader, protocol.RunMsgID(req.Tenant, req.RunID))
	m.Header.Set(protocol.HeaderSubmitter, q.Submitter)
	telemetry.Inject(ctx, m.Header)
	ack, err := bus.PublishMsg(ctx, q.JS, m)
	if err != nil {
		if errors.Is(err, nats.ErrMaxPayload) {
			return nil, ErrMaxPayload
		}
		return nil, fmt.Errorf("publish run request: %w", bus.MarkStoreFull(q.Names.RunsStream(), err))
	}
	if ack.Duplicate {
		rec, err := q.checkDuplicate(ctx, req, ack.Sequence)
		if err != nil {
			return nil, err
		}
		if rec != nil {
			return &Enqueued{Record: rec, Ack: ack}, nil
		}
	}
	if err := q.Events.PublishQueued(ctx, req); err != nil {
		return nil, fmt.Errorf("publish run.queued: %w", err)
	}
	rec := kv.NewRun(req, ack.Sequence, time.Now().UTC())
	rec.Seq = 1 // run.queued
	if _, err := q.Stores.Runs.Create(ctx, rec); err != nil {
		if !errors.Is(err, kv.ErrExists) {
			return nil, fmt.Errorf("create run record: %w", err)
		}
		// A worker was faster; a replica may not have its record yet.
		if rec, _, err = q.Stores.Runs.GetLatest(ctx, req.Tenant, req.RunID); err != nil {
			return nil, fmt.Errorf("read run record: %w", err)
		}
	}
	_ = q.Stores.Threads.IndexRun(ctx, req.Tenant, req.ThreadID, req.RunID, rec.CreatedAt)
	return &Enqueued{Record: rec, Ack: ack}, nil
}

// checkDuplicate looks at the message a duplicate answer points to. The
// run's own earlier request (same subject and message id) is a retry:
// Enqueue goes on (every later step is idempotent) and rec is nil. A
// request gone from the work-queue stream was consumed: its run has a
// record (a worker writes one before it acks or dead-letters), which is
// the answer; without one the run will never run, and that is
// ErrRunIDTaken, as is a message of another subject or id.
func (q *Queue) checkDuplicate(ctx context.Context, req *protocol.RunRequest, seq uint64) (*protocol.Run, error) {
	m, err := bus.GetMsgFromLeader(ctx, q.JS, q.Names.RunsStream(), bus.MsgQuery{Seq: seq})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		rec, _, err := q.Stores.Runs.GetFromLeader(ctx, req.Tenant, req.RunID)
		if errors.Is(err, kv.ErrNotFound) {
			return nil, fmt.Errorf("%w: run %s of tenant %s was submitted before (stream sequence %d) and left no run record; choose another run_id",
				ErrRunIDTaken, req.RunID, req.Tenant, seq)
		}
		if err != nil {
			return nil, fmt.Errorf("read run record: %w", err)
		}
		if rec.ThreadID != req.ThreadID {
			return nil, fmt.Errorf("%w: run id %s is already used by a run on thread %s; choose another run_id", ErrRunIDTaken, req.RunID, rec.ThreadID)
		}
		return rec, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the request the stream calls a duplicate (sequence %d): %w", seq, err)
	}
	if m.Subject != q.Names.RunSubject(req.Tenant, req.ThreadID) || m.Header.Get(jetstream.MsgIDHeader) != protocol.RunMsgID(req.Tenant, req.RunID) {
		// The subject is not named: it may be another tenant's.
		return nil, fmt.Errorf("%w: the runs stream holds another request under the message id of run %s (stream sequence %d); choose another run_id",
			ErrRunIDTaken, req.RunID, seq)
	}
	return nil, nil
}
