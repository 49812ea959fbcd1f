// Package bus owns everything natsagent does with NATS itself: the names of
// streams, consumers and buckets, the subjects of the wire protocol, the
// embedded server, connections, and the idempotent provisioning of every
// JetStream asset. It knows the shape of subjects, not what flows on them.
package bus

import (
	"fmt"
	"strings"

	"github.com/natsagent/natsagent/internal/protocol"
)

// DefaultPrefix is the first subject token of every natsagent subject.
const DefaultPrefix = "agent"

// RunsConsumer is the durable pull consumer all workers share.
const RunsConsumer = "workers"

// Names derives every stream, bucket and subject name from one prefix, so
// two deployments with different prefixes can share a NATS account.
type Names struct {
	Prefix string
}

// NewNames validates prefix ("" means DefaultPrefix).
func NewNames(prefix string) (Names, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if !protocol.ValidToken(prefix) || len(prefix) > 32 {
		return Names{}, fmt.Errorf("prefix %q is not valid: use 1 to 32 characters from A-Z, a-z, 0-9, '_' and '-'", prefix)
	}
	return Names{Prefix: prefix}, nil
}

// DefaultNames uses DefaultPrefix.
func DefaultNames() Names { return Names{Prefix: DefaultPrefix} }

func (n Names) stream(s string) string { return strings.ToUpper(n.Prefix) + "_" + s }
func (n Names) bucket(s string) string { return n.Prefix + "_" + s }

// Streams.
func (n Names) RunsStream() string   { return n.stream("RUNS") }
func (n Names) EventsStream() string { return n.stream("EVENTS") }
func (n Names) DLQStream() string    { return n.stream("DLQ") }
func (n Names) JobsStream() string   { return n.stream("JOBS") }

// Buckets.
func (n Names) RunsBucket() string        { return n.bucket("runs") }
func (n Names) ThreadsBucket() string     { return n.bucket("threads") }
func (n Names) CheckpointsBucket() string { return n.bucket("checkpoints") }
func (n Names) UsageBucket() string       { return n.bucket("usage") }
func (n Names) FilesBucket() string       { return n.bucket("files") }
func (n Names) MemoryBucket() string      { return n.bucket("memory") }
func (n Names) LimitsBucket() string      { return n.bucket("limits") }
func (n Names) CronsBucket() string       { return n.bucket("crons") }

// AssistantsBucket holds the assistants users create on the graphs
// (LangGraph assistants), under "<tenant>.<assistant>".
func (n Names) AssistantsBucket() string { return n.bucket("assistants") }

// StoreBucket holds the LangGraph store's items (internal/store), under
// "<tenant>.<namespace labels>.<key>", each label and the key encoded
// by store.EncodeLabel.
func (n Names) StoreBucket() string { return n.bucket("store") }

// RunSubject is where a run request for a thread is published.
func (n Names) RunSubject(tenant, thread string) string {
	return n.Prefix + ".runs." + tenant + "." + thread
}

// RunsSubjects is the subject filter of the runs stream.
func (n Names) RunsSubjects() string { return n.Prefix + ".runs.*.*" }

// EventSubject is where one event of a run is published.
func (n Names) EventSubject(tenant, thread, run, kind string) string {
	return n.Prefix + ".events." + tenant + "." + thread + "." + run + "." + kind
}

// RunEvents matches every event of one run.
func (n Names) RunEvents(tenant, thread, run string) string {
	return n.Prefix + ".events." + tenant + "." + thread + "." + run + ".>"
}

// ThreadEvents matches every event of a thread's runs.
func (n Names) ThreadEvents(tenant, thread string) string {
	return n.Prefix + ".events." + tenant + "." + thread + ".>"
}

// ThreadLifecycle matches the lifecycle events of a thread's runs.
func (n Names) ThreadLifecycle(tenant, thread string) string {
	return n.Prefix + ".events." + tenant + "." + thread + ".*." + protocol.KindLifecycle
}

// EventsSubjects is the subject filter of the events stream.
func (n Names) EventsSubjects() string { return n.Prefix + ".events.>" }

// LiveSubject is where one live event of a run is published, on core
// NATS: outside the events stream's subjects (EventsSubjects), so it is
// never stored (protocol.LiveEvent).
func (n Names) LiveSubject(tenant, thread, run, kind string) string {
	return n.Prefix + ".live." + tenant + "." + thread + "." + run + "." + kind
}

// RunLive matches every live event of one run.
func (n Names) RunLive(tenant, thread, run string) string {
	return n.Prefix + ".live." + tenant + "." + thread + "." + run + ".>"
}

// ThreadLive matches every live event of a thread's runs.
func (n Names) ThreadLive(tenant, thread string) string {
	return n.Prefix + ".live." + tenant + "." + thread + ".>"
}

// LiveOf is the live subject that goes with a filter of the events stream
// (RunEvents, ThreadEvents, EventSubject), "" when it has none (a filter
// of another prefix).
func (n Names) LiveOf(eventsFilter string) string {
	head := n.Prefix + ".events."
	if !strings.HasPrefix(eventsFilter, head) {
		return ""
	}
	return n.Prefix + ".live." + eventsFilter[len(head):]
}

// CancelSubject is the core request subject that cancels a run.
func (n Names) CancelSubject(tenant, thread, run string) string {
	return n.Prefix + ".ctl." + tenant + "." + thread + "." + run + ".cancel"
}

// CancelSubjects matches every cancel request.
func (n Names) CancelSubjects() string { return n.Prefix + ".ctl.*.*.*.cancel" }

// ThreadDeleteSubject is the core request subject that deletes a thread
// and everything keyed by it (internal/erase).
func (n Names) ThreadDeleteSubject(tenant, thread string) string {
	return n.Prefix + ".ctl." + tenant + "." + thread + ".delete"
}

// RunDeleteSubject is the core request subject that deletes a finished run.
func (n Names) RunDeleteSubject(tenant, thread, run string) string {
	return n.Prefix + ".ctl." + tenant + "." + thread + "." + run + ".delete"
}

// ThreadDeleteSubjects matches every thread delete request.
func (n Names) ThreadDeleteSubjects() string { return n.Prefix + ".ctl.*.*.delete" }

// RunDeleteSubjects matches every run delete request.
func (n Names) RunDeleteSubjects() string { return n.Prefix + ".ctl.*.*.*.delete" }

// ParseDeleteSubject returns the tokens of a delete subject; run is ""
// for a thread's. The tokens are not validated.
func (n Names) ParseDeleteSubject(subject string) (tenant, thread, run string, ok bool) {
	rest, found := strings.CutPrefix(subject, n.Prefix+".ctl.")
	if !found {
		return "", "", "", false
	}
	parts := strings.Split(rest, ".")
	switch {
	case len(parts) == 3 && parts[2] == "delete":
		return parts[0], parts[1], "", true
	case len(parts) == 4 && parts[3] == "delete":
		return parts[0], parts[1], parts[2], true
	}
	return "", "", "", false
}

// WorkerControl is the private control subject of one worker: cancel and
// steer signals for the runs it holds are forwarded there.
func (n Names) WorkerControl(worker string) string { return n.Prefix + ".worker." + worker + ".ctl" }

// WorkerHolds is where every worker answers whether it holds the run
// request whose stream sequence the question carries (the lease sweep
// asks).
func (n Names) WorkerHolds() string { return n.Prefix + ".worker.holds" }

// DLQSubject is where a dead-lettered run request of a thread goes.
func (n Names) DLQSubject(tenant, thread string) string {
	return n.Prefix + ".dlq.runs." + tenant + "." + thread
}

// JobsConsumer is the durable pull consumer of background jobs, shared by
// every worker.
const JobsConsumer = "jobs"

// JobSubject is where a due job of a kind is published; tokens are the
// job's routing tokens (memory: tenant, user).
func (n Names) JobSubject(kind string, tokens ...string) string {
	return strings.Join(append([]string{n.Prefix, "jobs", kind}, tokens...), ".")
}

// JobsSubjects is the jobs consumer's filter: every due job.
func (n Names) JobsSubjects() string { return n.Prefix + ".jobs.>" }

// JobScheduleSubject holds a job until it is due (a JetStream message
// schedule); one pending schedule per subject.
func (n Names) JobScheduleSubject(kind string, tokens ...string) string {
	return strings.Join(append([]string{n.Prefix, "schedules", "jobs", kind}, tokens...), ".")
}

// JobSchedulesSubjects matches every job schedule.
func (n Names) JobSchedulesSubjects() string { return n.Prefix + ".schedules.jobs.>" }

// DLQJobSubject is where a dead-lettered job of a kind goes.
func (n Names) DLQJobSubject(kind string) string { return n.Prefix + ".dlq.jobs." + kind }

// ToolSubject is the request subject of a remote tool a tenant's runs
// may call (a NATS micro endpoint served by any client).
func (n Names) ToolSubject(tenant, name string) string {
	return n.Prefix + ".tools." + tenant + "." + name
}

// ToolsRefreshSubject asks every worker to look for remote tools now.
func (n Names) ToolsRefreshSubject() string { return n.Prefix + ".tools.refresh" }

// SubagentSubject is the request subject of one operation (start, status,
// cancel, await) of the subagent service for a tenant.
func (n Names) SubagentSubject(tenant, op string) string {
	return n.Prefix + ".subagent." + tenant + "." + op
}

// SubagentEndpoint matches one operation's requests of every tenant.
func (n Names) SubagentEndpoint(op string) string { return n.Prefix + ".subagent.*." + op }

// ParseSubagentSubject returns the tenant and operation tokens of a
// subagent service subject. The tenant is not validated.
func (n Names) ParseSubagentSubject(subject string) (tenant, op string, ok bool) {
	return n.parsePair(subject, "subagent")
}

// DLQSubjects is the subject filter of the dead-letter stream.
func (n Names) DLQSubjects() string { return n.Prefix + ".dlq.>" }

// ParseRunSubject returns the tenant and thread tokens of a run subject.
// The tokens are not validated; callers check them with protocol.ValidToken.
func (n Names) ParseRunSubject(subject string) (tenant, thread string, ok bool) {
	return n.parsePair(subject, "runs")
}

// parsePair returns the two tokens after P.<kind> of a subject of exactly
// four tokens, P.<kind>.<a>.<b>; the tokens are not validated.
func (n Names) parsePair(subject, kind string) (a, b string, ok bool) {
	rest, found := strings.CutPrefix(subject, n.Prefix+"."+kind+".")
	if !found {
		return "", "", false
	}
	a, b, found = strings.Cut(rest, ".")
	if !found || strings.Contains(b, ".") {
		return "", "", false
	}
	return a, b, true
}

// ParseCancelSubject returns the tokens of a cancel subject.
func (n Names) ParseCancelSubject(subject string) (tenant, thread, run string, ok bool) {
	rest, found := strings.CutPrefix(subject, n.Prefix+".ctl.")
	if !found {
		return "", "", "", false
	}
	parts := strings.Split(rest, ".")
	if len(parts) != 4 || parts[3] != "cancel" {
		return "", "", "", false
	}
	return parts[0], parts[1], parts[2], true
}

// Key joins tokens into a KV key.
func Key(tokens ...string) string { return strings.Join(tokens, ".") }
