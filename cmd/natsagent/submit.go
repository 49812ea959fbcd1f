package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/submit"
)

// submitter is the value of protocol.HeaderSubmitter on the requests the
// CLI publishes.
const submitter = "natsagent-cli"

// submitTimeout bounds the round trips of one submission; Ctrl-C does not
// cut it short, so a submission is never left half done.
const submitTimeout = 15 * time.Second

// newID returns a random id valid as a token, as the gateway makes them.
func newID() string { return strings.ToLower(rand.Text()) }

// submit publishes a run request through internal/submit, as the gateway
// does: a run id that already has a record is a retry, whose record is the
// answer (existing is true); otherwise the thread record is created if
// missing and the request enqueued (request, run.queued, pending record,
// run index, in that order). The multitask strategy reject is left to the
// worker, which ends the run rejected when the thread is busy.
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

	rec, _, err = c.stores.RunView(ctx, req.Tenant, req.ThreadID, req.RunID)
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

	q := submit.Queue{JS: c.js, Names: c.names, Stores: c.stores, Events: c.pub, Submitter: submitter}
	out, err := q.Enqueue(ctx, req, data)
	if err != nil {
		return nil, false, err
	}
	return out.Record, false, nil
}
