// Package compact owns compaction on request as clients see it: the job's
// payload, how to enqueue it, and how to read its result from its events.
// The job itself runs in package compactjob on a worker; this package must
// not depend on the worker's chain, so the CLI and the gateway can use it.
package compact

import (
	"context"
	"encoding/json"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/jobs"
	"github.com/natsagent/natsagent/internal/protocol"
)

// JobKind is the job kind of compaction: its jobs are published to
// P.jobs.compact.<tenant>.<thread>.
const JobKind = "compact"

// Request is a compaction job's payload (JSON).
type Request struct {
	// JobID names the job: its events are published under it
	// (P.events.<tenant>.<thread>.<job_id>.custom) and it is the job's
	// Nats-Msg-Id, so a retried request runs once.
	JobID    string `json:"job_id"`
	Tenant   string `json:"tenant"`
	ThreadID string `json:"thread_id"`
	// Agent is the profile whose settings and model compress the thread;
	// empty means the agent of the thread's last run, else the default.
	Agent string `json:"agent,omitempty"`
}

// Validate checks the ids.
func (r *Request) Validate() error {
	for _, f := range []struct{ name, v string }{{"job_id", r.JobID}, {"tenant", r.Tenant}, {"thread_id", r.ThreadID}} {
		if err := protocol.CheckToken(f.name, f.v); err != nil {
			return err
		}
	}
	if r.Agent != "" {
		return protocol.CheckToken("agent", r.Agent)
	}
	return nil
}

// Enqueue publishes a compaction job. The same job id within the jobs
// stream's duplicate window is one job.
func Enqueue(ctx context.Context, js jetstream.JetStream, names bus.Names, req Request) (jobs.Enqueued, error) {
	if err := req.Validate(); err != nil {
		return jobs.Enqueued{}, err
	}
	data, err := json.Marshal(req)
	if err != nil {
		return jobs.Enqueued{}, err
	}
	return jobs.Enqueue(ctx, js, names, jobs.Spec{Kind: JobKind, Tokens: []string{req.Tenant, req.ThreadID}, Key: req.JobID, ID: req.JobID, Data: data})
}

// CheckpointID is the id of the checkpoint a compaction job writes.
func CheckpointID(jobID string) string { return "compact-" + jobID }

// ResultMsgID is the Nats-Msg-Id of a job's final event, so a redelivered
// job reports once.
func ResultMsgID(jobID string) string { return jobID + ".result" }

// Result reads an event of a compaction job's subject
// (P.events.<tenant>.<thread>.<job_id>.custom) and returns the job's
// result when the event is it: its completed or failed
// context_compression event. Other events (started) return false.
func Result(event []byte) (*protocol.CompressionData, bool) {
	var env struct {
		Type string                   `json:"type"`
		Data protocol.CompressionData `json:"data"`
	}
	if json.Unmarshal(event, &env) != nil || env.Type != protocol.EventContextCompression {
		return nil, false
	}
	if env.Data.Phase != protocol.CompressionCompleted && env.Data.Phase != protocol.CompressionFailed {
		return nil, false
	}
	return &env.Data, true
}
