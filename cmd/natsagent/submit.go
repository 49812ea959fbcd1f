package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/natsagent/natsagent"
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

// submit publishes a run request through the public client. A run id
// submitted before (a retry, within the runs stream's duplicate window) is
// that run: its view is the answer and existing is true. The client
// refuses the id of another thread's run when it can tell; past the
// window the worker refuses such a request and the run ends error, saying
// why. The multitask strategy reject is left to the worker, which ends the
// run rejected when the thread is busy.
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
	if limit := c.api.MaxRequestBytes(); len(data) > limit {
		return nil, false, fmt.Errorf("run request is %d bytes, over the deployment's limit of %d bytes (nats.max_request_bytes); put large content in files and reference it", len(data), limit)
	}
	sub, err := c.api.Submit(ctx, *req)
	if errors.Is(err, natsagent.ErrRunIDTaken) {
		return nil, false, fmt.Errorf("%s (--run-id)", strings.TrimPrefix(err.Error(), natsagent.ErrRunIDTaken.Error()+": "))
	}
	if err != nil {
		return nil, false, err
	}
	if sub.Duplicate {
		if rec, err := c.api.RunOf(ctx, sub.ThreadID, sub.RunID); err == nil {
			return rec, true, nil
		}
	}
	// What the run's record will say until a worker takes it.
	return &protocol.Run{RunID: sub.RunID, ThreadID: sub.ThreadID, Tenant: c.tenant, Agent: req.Agent, Status: protocol.StatusPending,
		MultitaskStrategy: req.MultitaskStrategy, Metadata: req.Metadata, CreatedAt: time.Now().UTC(), MsgSeq: sub.Sequence}, sub.Duplicate, nil
}
