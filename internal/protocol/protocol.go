// Package protocol owns the public wire contract of natsagent: the run
// request, the run and thread records, statuses, event envelopes and the
// validation of every token that becomes part of a subject or a key. Any
// NATS client in any language speaks this contract (docs/protocol.md); the
// package has no NATS code and no knowledge of how runs are executed.
package protocol

import (
	"encoding/json"
	"slices"
	"strings"
	"time"

	"github.com/natsagent/natsagent/internal/model"
)

// Status is the state of a run.
type Status string

// Run statuses. Cancel (a person or parent asked) and interrupt (waiting
// for a human) are never the same status.
const (
	StatusPending     Status = "pending"
	StatusRunning     Status = "running"
	StatusSuccess     Status = "success"
	StatusError       Status = "error"
	StatusCancelled   Status = "cancelled"
	StatusInterrupted Status = "interrupted"
	StatusSteered     Status = "steered"
	StatusRejected    Status = "rejected"
	StatusTimeout     Status = "timeout"
	// StatusIncomplete is a run a guard ended before the agent finished
	// (max_steps, loop detection, a budget or limit, a safety stop): it has
	// an output, and IncompleteDetails says why, as OpenAI's Responses
	// API does. A client that reads only the status must not take it for
	// a success.
	StatusIncomplete Status = "incomplete"
)

// IncompleteDetails says why a run ended incomplete. Reason is its
// stop_reason.
type IncompleteDetails struct {
	Reason string `json:"reason"`
}

// IncompleteFor is the incomplete_details of a run that ended in status
// with stopReason: nil unless the status is incomplete.
func IncompleteFor(status Status, stopReason string) *IncompleteDetails {
	if status != StatusIncomplete {
		return nil
	}
	return &IncompleteDetails{Reason: stopReason}
}

// Terminal reports whether a run in status s will never change again.
func (s Status) Terminal() bool {
	switch s {
	case StatusPending, StatusRunning, "":
		return false
	}
	return true
}

// Stop reasons recorded when a guard ended a run early.
const (
	StopLoopCapped          = "loop_capped"
	StopTokenCapped         = "token_capped"
	StopSubagentLimitCapped = "subagent_limit_capped"
	StopMaxSteps            = "max_steps"
	StopSafety              = "safety"
	StopToolLimitCapped     = "tool_limit_capped"
	// StopRejectedCallRepeated ends a run whose model kept asking for a
	// tool call a person had rejected (approval's max_rejected_repeats).
	StopRejectedCallRepeated = "rejected_call_repeated"
	// StopStoreFull ends a run (status error) that JetStream had no room
	// to save for longer than the worker's store_full_wait.
	StopStoreFull = "store_full"
)

// Multitask strategies: what happens when a thread already has an active run.
const (
	StrategyEnqueue  = "enqueue"
	StrategyReject   = "reject"
	StrategySteer    = "steer"
	StrategyRollback = "rollback"
)

// HeaderSubmitter on a run request says a submitter (the gateway) creates
// the run's pending record itself; without it a worker that sees the
// request first may assume no record exists yet and save a read.
const HeaderSubmitter = "Natsagent-Submitter"

// DefaultTenant is used when a request names none.
const DefaultTenant = "default"

// RunRequest is the message published to P.runs.<tenant>.<thread>.
type RunRequest struct {
	RunID             string         `json:"run_id"`
	ThreadID          string         `json:"thread_id"`
	Tenant            string         `json:"tenant,omitempty"`
	Agent             string         `json:"agent,omitempty"`
	Input             *Input         `json:"input,omitempty"`
	Command           *Command       `json:"command,omitempty"`
	MultitaskStrategy string         `json:"multitask_strategy,omitempty"`
	Config            RunConfig      `json:"config,omitempty"`
	Metadata          map[string]any `json:"metadata,omitempty"`
	Parent            *Parent        `json:"parent,omitempty"`
	// Principal is who submitted the run, as authenticated by the submitter
	// (the gateway, or the submit service for NATS clients). Only trusted
	// submitters write the runs stream, and each of them replaces whatever a
	// client put here; a worker takes it as given.
	Principal *Principal `json:"principal,omitempty"`
	// StreamResumable stores the run's live events (LiveEvent: token
	// deltas, progress lines, titles) in the events stream as well, so a
	// reader resuming mid-message gets every delta again. Default false:
	// they go out on core NATS only (P.live...), and a resumed reader
	// gets the whole message from its stored message.completed.
	StreamResumable bool `json:"stream_resumable,omitempty"`
	// Webhook is a URL the final run record is POSTed to once the run
	// ended (docs/protocol.md 3.4; internal/webhook).
	Webhook string `json:"webhook,omitempty"`
	// StreamMode is the LangGraph stream modes the run was created with
	// (the gateway's stream_mode); a LangGraph join of its stream that
	// names none streams these, as LangGraph does. Kept on the record.
	StreamMode []string `json:"stream_mode,omitempty"`
}

// Principal is an authenticated caller: a user of one tenant with roles.
// The tenant is the request's own (it comes from the subject).
type Principal struct {
	// User is the authenticated user: an API key's user, a bearer token's
	// subject, or the NATS user of the connection.
	User string `json:"user"`
	// Roles name the policy entries that apply to the user.
	Roles []string `json:"roles,omitempty"`
}

// Input carries the new messages of a run.
type Input struct {
	Messages []model.Message `json:"messages"`
}

// Command continues a thread without new input: Resume answers the
// interrupt it waits for (approval, clarification, or a custom one, as
// the interrupting middleware reads it), Update changes its state first
// (messages appended, title), Goto names where the loop goes on (model or
// tools). At least one is set.
type Command struct {
	Resume json.RawMessage `json:"resume,omitempty"`
	Update json.RawMessage `json:"update,omitempty"`
	Goto   string          `json:"goto,omitempty"`
}

// Goto targets: the agent loop's two nodes, named as LangChain's
// create_agent names them.
const (
	GotoModel = "model"
	GotoTools = "tools"
)

// RunConfig holds per-run settings. Zero values mean "the agent's default".
type RunConfig struct {
	Model            string `json:"model,omitempty"`
	ToolApprovalMode string `json:"tool_approval_mode,omitempty"`
	MaxSteps         int    `json:"max_steps,omitempty"`
	// TimeoutSeconds bounds the run's wall time; the run ends "timeout".
	TimeoutSeconds int `json:"timeout_seconds,omitempty"`
	// UserID owns per-user data such as memory ("default" when empty).
	UserID string `json:"user_id,omitempty"`
	// Per-run switches (docs/protocol.md 2.2): nil keeps what the agent
	// profile has; false turns the capability off for this run; true
	// asks for it, and a submitter refuses the run when the principal's
	// policy denies its tool (ask_clarification, task, write_todos).
	Clarification *bool `json:"clarification,omitempty"`
	Subagents     *bool `json:"subagents,omitempty"`
	PlanMode      *bool `json:"plan_mode,omitempty"`
}

// Switch is one per-run switch of a RunConfig: its key under config, its
// value, and the tool whose offer it turns off or asks for.
type Switch struct {
	Key   string
	Tool  string
	Value *bool
}

// Switches lists the config's per-run switches, set or not.
func (c RunConfig) Switches() []Switch {
	return []Switch{
		{Key: "clarification", Tool: "ask_clarification", Value: c.Clarification},
		{Key: "subagents", Tool: "task", Value: c.Subagents},
		{Key: "plan_mode", Tool: "write_todos", Value: c.PlanMode},
	}
}

// Parent links a subagent run to the tool call that started it.
type Parent struct {
	RunID      string `json:"run_id"`
	ThreadID   string `json:"thread_id"`
	ToolCallID string `json:"tool_call_id"`
}

// Run is the run record stored in the runs bucket under "<tenant>.<run>".
type Run struct {
	RunID             string     `json:"run_id"`
	ThreadID          string     `json:"thread_id"`
	Tenant            string     `json:"tenant"`
	Agent             string     `json:"agent"`
	Status            Status     `json:"status"`
	MultitaskStrategy string     `json:"multitask_strategy,omitempty"`
	Attempt           int        `json:"attempt"`
	CreatedAt         time.Time  `json:"created_at"`
	StartedAt         *time.Time `json:"started_at,omitempty"`
	FinishedAt        *time.Time `json:"finished_at,omitempty"`
	StopReason        string     `json:"stop_reason,omitempty"`
	// IncompleteDetails is set when Status is incomplete.
	IncompleteDetails *IncompleteDetails `json:"incomplete_details,omitempty"`
	Error             string             `json:"error,omitempty"`
	Output            *model.Message     `json:"output,omitempty"`
	// OutputCheckpoint is set on a thread's last_run whose output was
	// too large to carry (over 4 KiB): the checkpoint whose last
	// assistant message is the output. The record written from the
	// summary carries the output instead; a record still has it only
	// when that checkpoint could not be read (it was deleted).
	OutputCheckpoint string         `json:"output_checkpoint,omitempty"`
	Parent           *Parent        `json:"parent,omitempty"`
	Metadata         map[string]any `json:"metadata,omitempty"`
	// SupersededBy names the run that steered or rolled back this one.
	SupersededBy string `json:"superseded_by,omitempty"`
	// Interrupt says what a person must answer before an interrupted run's
	// thread goes on.
	Interrupt *Interrupt `json:"interrupt,omitempty"`
	// Usage is the run's token usage, set when it ends (absent when it
	// made no model call).
	Usage *RunUsage `json:"usage,omitempty"`

	// Worker and Epoch identify the lease under which the run is running;
	// a write from an older epoch is refused (fencing).
	Worker string `json:"worker,omitempty"`
	Epoch  uint64 `json:"epoch,omitempty"`
	// MsgSeq is the stream sequence of the request message that owns the
	// run; a second message with the same run id is a duplicate.
	MsgSeq uint64 `json:"msg_seq,omitempty"`
	// BaseCheckpoint is the thread's checkpoint when the run started; a
	// rollback returns the thread to it.
	BaseCheckpoint string `json:"base_checkpoint,omitempty"`
	// Seq is the event sequence number of the last event published at the
	// record's last transition (the terminal event's seq once terminal).
	Seq uint64 `json:"seq,omitempty"`
	// CancelRequested survives the death of the worker running the run:
	// the next worker to pick it up cancels it.
	CancelRequested bool `json:"cancel_requested,omitempty"`
	// FinishedEventID is the stream sequence in AGENT_EVENTS (the SSE id)
	// of the run's stored run.finished, noted by the gateway once it sent
	// it to a client: a client resuming after it gets an empty stream
	// also once the run's events expired.
	FinishedEventID uint64 `json:"finished_event_id,omitempty"`
	// Webhook is the delivery of the run's webhook, when it asked for one.
	Webhook *RunWebhook `json:"webhook,omitempty"`
	// StreamMode is the request's (RunRequest.StreamMode).
	StreamMode []string `json:"stream_mode,omitempty"`
}

// RunWebhook is where a run's webhook delivery stands.
type RunWebhook struct {
	URL string `json:"url"`
	// Status is pending (the run has not ended or the first POST is on
	// its way), retrying (a POST failed; another follows), sent (a 2xx
	// answer) or failed (every attempt failed, or the URL was refused).
	Status    string     `json:"status"`
	Attempts  int        `json:"attempts,omitempty"`
	LastError string     `json:"last_error,omitempty"`
	SentAt    *time.Time `json:"sent_at,omitempty"`
}

// Webhook delivery statuses.
const (
	WebhookPending  = "pending"
	WebhookRetrying = "retrying"
	WebhookSent     = "sent"
	WebhookFailed   = "failed"
)

// Thread statuses.
const (
	ThreadIdle        = "idle"
	ThreadBusy        = "busy"
	ThreadInterrupted = "interrupted"
	ThreadError       = "error"
	// ThreadDeleting: the thread is being deleted (internal/erase); no new
	// run may take it, and it disappears when the deletion ends.
	ThreadDeleting = "deleting"
)

// Thread is the thread record stored in the threads bucket under
// "<tenant>.<thread>". It is also the lease: the one active run of the
// thread, and the checkpoint head, change together under one CAS write.
type Thread struct {
	ThreadID  string         `json:"thread_id"`
	Tenant    string         `json:"tenant"`
	CreatedAt time.Time      `json:"created_at"`
	UpdatedAt time.Time      `json:"updated_at"`
	Status    string         `json:"status"`
	Metadata  map[string]any `json:"metadata,omitempty"`
	Title     string         `json:"title,omitempty"`
	// Head is the id of the latest checkpoint ("" for a new thread).
	Head string `json:"head,omitempty"`
	// FilesAt is the checkpoint whose files the thread's versioned
	// workdir shows, when it is not Head's: time travel moves the head
	// first, and a run starting on the thread (or the gateway right
	// after) checks the head's files out. Every head a run moves to sets
	// it. "" is the head's.
	FilesAt string `json:"files_at,omitempty"`
	// Epoch counts lease acquisitions; every acquisition increments it.
	Epoch uint64 `json:"epoch"`
	Lease *Lease `json:"lease,omitempty"`
	// Preempt lists runs (steer, rollback) that go before every enqueued
	// run, in arrival order.
	Preempt []Preemption `json:"preempt,omitempty"`
	// LastRunID is the most recent run that held the lease.
	LastRunID string `json:"last_run_id,omitempty"`
	// Owner is the user of the principal that created the thread ("":
	// created unauthenticated, any user of the tenant may use it). Over
	// HTTP, another user's thread is not found unless a role reads all.
	Owner string `json:"owner,omitempty"`
	// Usage sums the token usage of the thread's ended runs (protocol
	// v2): each run's total is applied by the fenced write that releases
	// the thread at its end, so it counts once. It keeps the last
	// ThreadRecordUsageRuns runs' entries and folds the older ones into
	// one sum. Threads whose runs ended before v2 also have totals in
	// the usage bucket; readers add the two (kv.Usage.ThreadOf).
	Usage *ThreadUsage `json:"usage,omitempty"`
	// RecentRuns lists the runs that took the thread's lease most
	// recently, oldest first, at most ThreadRecentRuns (protocol v2): the
	// lease's write adds a run here instead of a run index key, and a run
	// that leaves the list gets its index key then (AddRecentRun). A
	// thread's runs are the index keys plus this list.
	RecentRuns []string `json:"recent_runs,omitempty"`
	// LastRun is the terminal summary of the last run that released the
	// thread (protocol v2): the write that gives the thread back carries
	// it, before the run's terminal record is written. A run whose record
	// is still pending or missing but whose id is here has ended; the
	// next delivery of its request writes its record from this (RunView).
	LastRun *Run `json:"last_run,omitempty"`
	// CancelledRuns lists runs a cancel ended while they did not hold the
	// thread's lease (pending, or not yet seen by a worker), newest last,
	// at most ThreadCancelledRuns. The cancel writes its run here after
	// ending the run's record, unless the lease names the run by then
	// (then it signals the lease's worker instead); a run listed here
	// never takes the lease. Both writes are compare-and-set on this
	// record, so a run that starts in the same moment is either seen by
	// the cancel or sees it.
	CancelledRuns []string `json:"cancelled_runs,omitempty"`
}

// ThreadRecentRuns bounds Thread.RecentRuns.
const ThreadRecentRuns = 32

// AddRecentRun puts run at the end of t.RecentRuns unless it is there,
// and returns the runs pushed out of the list (the oldest, beyond
// ThreadRecentRuns), which the caller writes to the run index.
func (t *Thread) AddRecentRun(run string) (evicted []string) {
	for _, r := range t.RecentRuns {
		if r == run {
			return nil
		}
	}
	runs := append(append(make([]string, 0, len(t.RecentRuns)+1), t.RecentRuns...), run)
	if over := len(runs) - ThreadRecentRuns; over > 0 {
		evicted, runs = runs[:over], runs[over:]
	}
	t.RecentRuns = runs
	return evicted
}

// ThreadCancelledRuns bounds Thread.CancelledRuns. A run drops out of
// the list only when this many later runs of its thread were cancelled
// the same way; by then its request has long been settled.
const ThreadCancelledRuns = 32

// RunCancelled reports whether t lists run as cancelled before it took
// the lease.
func (t *Thread) RunCancelled(run string) bool {
	return slices.Contains(t.CancelledRuns, run)
}

// AddCancelledRun lists run in t.CancelledRuns, once, dropping the
// oldest entries beyond ThreadCancelledRuns.
func (t *Thread) AddCancelledRun(run string) {
	if t.RunCancelled(run) {
		return
	}
	runs := append(append(make([]string, 0, len(t.CancelledRuns)+1), t.CancelledRuns...), run)
	if over := len(runs) - ThreadCancelledRuns; over > 0 {
		runs = runs[over:]
	}
	t.CancelledRuns = runs
}

// Lease names the run that currently owns a thread.
type Lease struct {
	RunID      string    `json:"run_id"`
	Worker     string    `json:"worker"`
	Epoch      uint64    `json:"epoch"`
	MsgSeq     uint64    `json:"msg_seq"`
	AcquiredAt time.Time `json:"acquired_at"`
	RenewedAt  time.Time `json:"renewed_at"`
	// HandedOver is set by a holder that stopped the run and handed its
	// request back (a worker shutting down): the next delivery takes the
	// run over at once instead of waiting for the lease to lapse.
	HandedOver bool `json:"handed_over,omitempty"`
	// Tentative is set on a lease taken on a new thread at the same time
	// as its run's turn was read (protocol v2 revision 3): should an
	// older request of the thread still wait in the runs stream, the run
	// gives the lease back at once. A run whose request is older than
	// MsgSeq waits for that instead of finding the thread busy.
	Tentative bool `json:"tentative,omitempty"`
	// What a running run's record carried in protocol v1 (since v2 no
	// record is written when a run starts: the lease says it runs). Its
	// start is AcquiredAt.
	//
	// Attempt counts the run's starts, this one included.
	Attempt int `json:"attempt,omitempty"`
	// Agent is the run's agent profile.
	Agent string `json:"agent,omitempty"`
	// BaseCheckpoint is the thread's head when the run first started; a
	// rollback returns the thread to it.
	BaseCheckpoint string `json:"base_checkpoint,omitempty"`
	// CreatedAt is when the run was first seen (the record's created_at).
	CreatedAt *time.Time `json:"created_at,omitempty"`
}

// Preemption is a pending steer or rollback.
type Preemption struct {
	RunID    string `json:"run_id"`
	Strategy string `json:"strategy"`
}

// Event kinds (the last subject token of an event).
const (
	KindLifecycle = "lifecycle"
	KindMessages  = "messages"
	KindTools     = "tools"
	KindUpdates   = "updates"
	KindUsage     = "usage"
	KindCustom    = "custom"
)

// Fixed event types.
const (
	EventRunQueued        = "run.queued"
	EventRunStarted       = "run.started"
	EventRunFinished      = "run.finished"
	EventMessageDelta     = "message.delta"
	EventMessageCompleted = "message.completed"
	EventToolStarted      = "tool.started"
	EventToolFinished     = "tool.finished"
	// EventLost stands in for an event a worker published but that was
	// never stored: the worker died right after a NATS node loss
	// swallowed it. The worker that takes the run over publishes one per
	// missing seq, so seq has no gaps.
	EventLost = "event.lost"
)

// LostData is the data of event.lost.
type LostData struct {
	Reason string `json:"reason"`
}

// EnvelopeVersion is the "v" every event envelope carries: 2 since live
// events (docs/protocol.md 1.6). An envelope without "v" is version 1.
const EnvelopeVersion = 2

// Event is the envelope of every run event.
type Event struct {
	// V is the envelope's protocol version (EnvelopeVersion; 0: an
	// envelope of version 1, stored before "v" existed).
	V    int    `json:"v,omitempty"`
	Type string `json:"type"`
	// Seq numbers the run's stored events from 1 without gaps; a live
	// event has none (0).
	Seq uint64 `json:"seq,omitempty"`
	// Live marks an event published on core NATS only (LiveEvent), not
	// stored. After is the seq of the last stored event its attempt
	// emitted before it, and Index counts the attempt's live events
	// from 1: a reader shows it once the stored event After was shown,
	// in Index order, and drops it once its message's message.completed
	// (stored) arrived.
	Live     bool   `json:"live,omitempty"`
	After    uint64 `json:"after,omitempty"`
	Index    uint64 `json:"index,omitempty"`
	RunID    string `json:"run_id"`
	ThreadID string `json:"thread_id"`
	Tenant   string `json:"tenant"`
	// Attempt is the run attempt that published the event (0 before the
	// run started). After a takeover, a client ignores events of an
	// attempt older than the newest run.started it saw.
	Attempt int             `json:"attempt,omitempty"`
	Time    time.Time       `json:"time"`
	Data    json.RawMessage `json:"data,omitempty"`
}

// LiveEvent reports whether an event type goes out live (core NATS,
// not stored) unless its run asked for a resumable stream: the events a
// later stored event makes redundant. A message.delta is repeated whole
// by its message.completed; a thread.titled by the thread's record
// (title); a subagent.progress by the subagent's own run record and its
// subagent.finished.
func LiveEvent(eventType string) bool {
	switch eventType {
	case EventMessageDelta, EventSubagentProgress, EventThreadTitled:
		return true
	}
	return false
}

// EventThreadTitled is published when the title middleware names a
// thread; the title is kept in the thread record.
const EventThreadTitled = "thread.titled"

// KindOf returns the subject kind an event type is published under.
func KindOf(eventType string) string {
	switch eventType {
	case EventRunQueued, EventRunStarted, EventRunFinished:
		return KindLifecycle
	case EventMessageDelta, EventMessageCompleted:
		return KindMessages
	case EventToolStarted, EventToolFinished:
		return KindTools
	}
	switch {
	case strings.HasPrefix(eventType, "thread."), strings.HasPrefix(eventType, "state."), eventType == EventLost:
		return KindUpdates
	case strings.HasPrefix(eventType, "usage."):
		return KindUsage
	}
	return KindCustom
}

// FinishedData is the data of run.finished.
type FinishedData struct {
	Status     Status `json:"status"`
	StopReason string `json:"stop_reason,omitempty"`
	// IncompleteDetails is set when Status is incomplete.
	IncompleteDetails *IncompleteDetails `json:"incomplete_details,omitempty"`
	Error             string             `json:"error,omitempty"`
	Output            *model.Message     `json:"output,omitempty"`
	SupersededBy      string             `json:"superseded_by,omitempty"`
	Interrupt         *Interrupt         `json:"interrupt,omitempty"`
}

// Interrupt kinds.
const (
	InterruptApproval      = "approval"
	InterruptClarification = "clarification"
)

// Decisions a person may take on a tool call awaiting approval.
const (
	DecisionApprove = "approve"
	DecisionEdit    = "edit"
	DecisionReject  = "reject"
	DecisionRespond = "respond"
)

// Interrupt is what an interrupted run waits for: decisions on tool calls
// (approval) or an answer to a question (clarification). A run with
// "command":{"resume":...} on the thread answers it.
type Interrupt struct {
	Kind  string `json:"kind"`
	RunID string `json:"run_id"`
	// MessageID is the assistant message whose tool calls wait.
	MessageID string `json:"message_id,omitempty"`
	// ActionRequests are the tool calls awaiting a decision (approval),
	// in the order decisions must be given.
	ActionRequests []ActionRequest `json:"action_requests,omitempty"`
	// AllowedDecisions lists what a person may decide (approval).
	AllowedDecisions []string `json:"allowed_decisions,omitempty"`
	// Question, Type and Options ask for a clarification; ToolCallID is
	// the ask_clarification call the answer completes.
	Question   string   `json:"question,omitempty"`
	Type       string   `json:"type,omitempty"`
	Options    []string `json:"options,omitempty"`
	ToolCallID string   `json:"tool_call_id,omitempty"`
}

// ActionRequest is one tool call awaiting a decision.
type ActionRequest struct {
	ToolCallID  string `json:"tool_call_id"`
	Name        string `json:"name"`
	Arguments   string `json:"arguments"`
	Description string `json:"description,omitempty"`
}

// Resume is the value of command.resume.
type Resume struct {
	// Decisions answer an approval interrupt, one per action request, in
	// order.
	Decisions []Decision `json:"decisions,omitempty"`
	// Answer answers a clarification.
	Answer string `json:"answer,omitempty"`
}

// Decision is a person's decision on one tool call.
type Decision struct {
	Type string `json:"type"`
	// Arguments replace the call's arguments (edit): a JSON object.
	Arguments json.RawMessage `json:"arguments,omitempty"`
	// Message explains a reject, or is the result of a respond.
	Message string `json:"message,omitempty"`
}

// StartedData is the data of run.started.
type StartedData struct {
	Attempt int    `json:"attempt"`
	Worker  string `json:"worker"`
	Agent   string `json:"agent"`
	// MultitaskStrategy and QueuedAt are set when run.started stands in
	// for run.queued (protocol v2): the worker created the run from a
	// request a plain publish sent, and the run has no run.queued.
	MultitaskStrategy string     `json:"multitask_strategy,omitempty"`
	QueuedAt          *time.Time `json:"queued_at,omitempty"`
}

// QueuedData is the data of run.queued.
type QueuedData struct {
	Agent             string `json:"agent"`
	MultitaskStrategy string `json:"multitask_strategy"`
}

// DeltaData is the data of message.delta.
type DeltaData struct {
	MessageID string `json:"message_id"`
	Delta     string `json:"delta"`
}

// ToolEventData is the data of tool.started and tool.finished.
type ToolEventData struct {
	ToolCallID string `json:"tool_call_id"`
	Name       string `json:"name"`
	Arguments  string `json:"arguments,omitempty"`
	Status     string `json:"status,omitempty"`
	Result     string `json:"result,omitempty"`
	// MessageID is the id of the tool message tool.finished stored in
	// the thread.
	MessageID string `json:"message_id,omitempty"`
}

// Cancel actions, in a cancel request's body {"action": ...}.
const (
	// CancelInterrupt (the default) stops the run and keeps what it did.
	CancelInterrupt = "interrupt"
	// CancelRollback stops it and returns the thread to the checkpoint
	// before it; the gateway then deletes the run.
	CancelRollback = "rollback"
)

// CancelReply answers a cancel request.
type CancelReply struct {
	RunID  string `json:"run_id"`
	Status Status `json:"status"`
}

// DeleteReply answers a delete request (P.ctl.<tenant>.<thread>.delete,
// P.ctl.<tenant>.<thread>.<run>.delete).
type DeleteReply struct {
	ThreadID string `json:"thread_id"`
	RunID    string `json:"run_id,omitempty"`
	Deleted  bool   `json:"deleted"`
}

// Error codes used in NATS error replies and HTTP error bodies.
const (
	CodeInvalid     = "invalid"
	CodeNotFound    = "not_found"
	CodeConflict    = "conflict"
	CodeUnavailable = "unavailable"
	CodeInternal    = "internal"
	// CodeRateLimited: the tenant is over one of its limits (HTTP 429);
	// try again later.
	CodeRateLimited = "rate_limited"
	// CodeQuotaExceeded: the tenant's stored data is at its quota (HTTP
	// 507); remove some before adding more.
	CodeQuotaExceeded = "quota_exceeded"
	// CodeStoreFull: JetStream had no room for the write (HTTP 507): the
	// server's, the account's or a stream's or bucket's store is full.
	// Nothing was stored; an operator must free space. Try again later.
	CodeStoreFull = "store_full"
)

// ErrorBody describes an error to a client.
type ErrorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	// Field names the invalid input field, for CodeInvalid.
	Field string `json:"field,omitempty"`
}

// ErrorReply is the JSON body of an error reply.
type ErrorReply struct {
	Error ErrorBody `json:"error"`
}
