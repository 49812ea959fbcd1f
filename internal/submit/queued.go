package submit

import (
	"context"
	"encoding/json"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/protocol"
)

// maxQueuedScan bounds the requests QueuedRun reads.
const maxQueuedScan = 1000

// QueuedRun is the view (status pending) of a run no worker holds: it has
// no record, no lease and no last_run names it, and its request waits in
// the runs stream, published and not taken yet, or handed back between
// workers. thread "" looks on every thread of the tenant. It returns nil
// when no waiting request of the tenant (and thread) names the run. The
// requests are read in order through the stream's leader, at most
// maxQueuedScan of them, so it serves a miss, not a hot path.
func QueuedRun(ctx context.Context, js jetstream.JetStream, names bus.Names, tenant, thread, run string) (*protocol.Run, error) {
	token := thread
	if token == "" {
		token = "*"
	}
	subject := names.RunSubject(tenant, token)
	id := protocol.RunMsgID(tenant, run)
	seq := uint64(1)
	for range maxQueuedScan {
		m, err := bus.GetMsgFromLeader(ctx, js, names.RunsStream(), bus.MsgQuery{Seq: seq, NextBySubject: subject})
		if err != nil {
			// Not found, or a stream this caller may not read (a tenant
			// account): no request names the run.
			return nil, nil
		}
		seq = m.Sequence + 1
		if m.Header.Get(jetstream.MsgIDHeader) != id {
			continue
		}
		var req protocol.RunRequest
		if json.Unmarshal(m.Data, &req) != nil || req.RunID != run || protocol.CheckToken("thread id", req.ThreadID) != nil ||
			m.Subject != names.RunSubject(tenant, req.ThreadID) || (thread != "" && req.ThreadID != thread) {
			return nil, nil
		}
		return &protocol.Run{RunID: run, ThreadID: req.ThreadID, Tenant: tenant, Agent: req.Agent, Status: protocol.StatusPending,
			MultitaskStrategy: req.MultitaskStrategy, Metadata: req.Metadata, Parent: req.Parent, CreatedAt: m.Time.UTC(), MsgSeq: m.Sequence}, nil
	}
	return nil, nil
}
