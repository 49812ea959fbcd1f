package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/protocol"
)

// submitter is the value of protocol.HeaderSubmitter on the requests the
// CLI publishes.
const submitter = "natsagent-cli"

// submitTimeout bounds the round trips of one submission; Ctrl-C does not
// cut it short, so a submission is never left half done.
const submitTimeout = 15 * time.Second

// newID returns a random id valid as a token, as the gateway makes them.
func newID() string { return strings.ToLower(rand.Text()) }

// submit publishes a run request the way the gateway does
// (internal/gateway/submit.go), in the same order so that a crash after
// any step leaves nothing a worker cannot finish:
//
//  1. a run id that already has a record is a retry: its record is the
//     answer (existing is true);
//  2. the thread record is created if missing;
//  3. the request is published with Nats-Msg-Id = run id and the
//     submitter header, and the PubAck awaited;
//  4. run.queued is published (idempotent by its message id) before the
//     record exists, so no worker can publish run.started ahead of it;
//  5. the pending record is created; if a worker was faster, its record
//     stands; the thread's run index is written.
//
// The multitask strategy reject is left to the worker, which ends the run
// rejected when the thread is busy.
func (c *client) submit(ctx context.Context, req *protocol.RunRequest) (rec *protocol.Run, existing bool, err error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), submitTimeout)
	defer cancel()
	req.Normalize()
	if err := req.Validate(); err != nil {
		return nil, false, err
	}
	data, err := json.Marshal(req)
	if err != nil {
		return nil, false, err
	}
	if c.maxRequest > 0 && len(data) > c.maxRequest {
		return nil, false, fmt.Errorf("run request is %d bytes, over the deployment's limit of %d bytes (nats.max_request_bytes); put large content in files and reference it", len(data), c.maxRequest)
	}

	rec, _, err = c.stores.Runs.Get(ctx, req.Tenant, req.RunID)
	switch {
	case err == nil:
		if rec.ThreadID != req.ThreadID {
			return nil, false, fmt.Errorf("run id %s is already used by a run on thread %s; choose another --run-id", req.RunID, rec.ThreadID)
		}
		return rec, true, nil
	case !errors.Is(err, kv.ErrNotFound):
		return nil, false, err
	}

	if _, _, err := c.stores.Threads.Get(ctx, req.Tenant, req.ThreadID); errors.Is(err, kv.ErrNotFound) {
		now := time.Now().UTC()
		th := &protocol.Thread{ThreadID: req.ThreadID, Tenant: req.Tenant, CreatedAt: now, UpdatedAt: now, Status: protocol.ThreadIdle}
		if _, err := c.stores.Threads.Put(ctx, th, 0); err != nil && !errors.Is(err, kv.ErrExists) {
			return nil, false, fmt.Errorf("create thread %s: %w", req.ThreadID, err)
		}
	} else if err != nil {
		return nil, false, err
	}

	m := nats.NewMsg(c.names.RunSubject(req.Tenant, req.ThreadID))
	m.Data = data
	m.Header.Set(jetstream.MsgIDHeader, req.RunID)
	m.Header.Set(protocol.HeaderSubmitter, submitter)
	ack, err := c.js.PublishMsg(ctx, m)
	if err != nil {
		if errors.Is(err, nats.ErrMaxPayload) {
			return nil, false, errors.New("run request is over the NATS server's max payload; put large content in files and reference it")
		}
		return nil, false, fmt.Errorf("publish run request: %w", err)
	}
	if err := c.pub.PublishQueued(ctx, req); err != nil {
		return nil, false, fmt.Errorf("publish run.queued: %w", err)
	}
	rec = kv.NewRun(req, ack.Sequence, time.Now().UTC())
	rec.Seq = 1 // run.queued
	if _, err := c.stores.Runs.Create(ctx, rec); err != nil {
		if !errors.Is(err, kv.ErrExists) {
			return nil, false, fmt.Errorf("create run record: %w", err)
		}
		if rec, _, err = c.stores.Runs.Get(ctx, req.Tenant, req.RunID); err != nil {
			return nil, false, err
		}
	}
	// Indexing again what a worker indexed writes the same key: harmless.
	_ = c.stores.Threads.IndexRun(ctx, req.Tenant, req.ThreadID, req.RunID, rec.CreatedAt)
	return rec, false, nil
}
