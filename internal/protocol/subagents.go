package protocol

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"unicode/utf8"

	"github.com/natsagent/natsagent/internal/model"
)

// Subagent service endpoints: P.subagent.<tenant>.<op>, served by every
// worker as the micro service SubagentService (docs/protocol.md,
// "Subagents").
const (
	SubagentStartOp  = "start"
	SubagentStatusOp = "status"
	SubagentCancelOp = "cancel"
	SubagentAwaitOp  = "await"

	SubagentService        = "natsagent-subagents"
	SubagentServiceVersion = "1.0.0"
)

// Events a lead run publishes on its own stream (kind custom) about the
// subagent runs it starts, so a client can follow each child's stream.
const (
	EventSubagentStarted  = "subagent.started"
	EventSubagentProgress = "subagent.progress"
	EventSubagentFinished = "subagent.finished"
	EventSubagentLimited  = "subagent.limited"
)

// MaxSubagentTask bounds the task text of a start request (bytes).
const MaxSubagentTask = 64 << 10

// MaxToolCallIDLen bounds parent.tool_call_id.
const MaxToolCallIDLen = 256

// SubagentStart is the body of a start request.
type SubagentStart struct {
	// Parent names the lead run, its thread and the tool call that
	// delegates (the idempotency key of the start).
	Parent Parent `json:"parent"`
	// Subagent is the subagent profile to run.
	Subagent string `json:"subagent"`
	// Task is what the subagent is asked to do; it becomes the child
	// run's one user message.
	Task string `json:"task"`
	// ThreadID continues a child thread an earlier start of the same
	// parent thread and subagent created; empty starts a new one.
	ThreadID string `json:"thread_id,omitempty"`
	// Config is given to the child run (user_id and tool_approval_mode
	// are the parent's permissions; model, max_steps and timeout_seconds
	// default to the subagent profile's).
	Config RunConfig `json:"config,omitzero"`
	// Principal is the lead run's: the child acts for the same
	// authenticated caller, with the same tool policy.
	Principal *Principal `json:"principal,omitempty"`
}

// Check validates a start request.
func (s *SubagentStart) Check() error {
	if err := CheckToken("parent.run_id", s.Parent.RunID); err != nil {
		return err
	}
	if err := CheckToken("parent.thread_id", s.Parent.ThreadID); err != nil {
		return err
	}
	if id := s.Parent.ToolCallID; id == "" || len(id) > MaxToolCallIDLen || !utf8.ValidString(id) {
		return invalid("parent.tool_call_id", "is required: 1 to %d bytes of UTF-8 (it makes a retried start find the same child)", MaxToolCallIDLen)
	}
	if err := CheckToken("subagent", s.Subagent); err != nil {
		return err
	}
	if strings.TrimSpace(s.Task) == "" {
		return invalid("task", "is required: say what the subagent should do")
	}
	if len(s.Task) > MaxSubagentTask || !utf8.ValidString(s.Task) {
		return invalid("task", "must be valid UTF-8 of at most %d bytes; put large content in files", MaxSubagentTask)
	}
	if s.ThreadID != "" {
		if err := CheckToken("thread_id", s.ThreadID); err != nil {
			return err
		}
	}
	// The config is checked as a run request's is.
	probe := RunRequest{RunID: "x", ThreadID: "x", Tenant: DefaultTenant, Agent: DefaultAgent, MultitaskStrategy: StrategyEnqueue,
		Input: &Input{Messages: []model.Message{{Role: model.RoleUser, Content: "x"}}}, Config: s.Config}
	return probe.Validate()
}

// SubagentStarted answers a start request.
type SubagentStarted struct {
	RunID    string `json:"run_id"`
	ThreadID string `json:"thread_id"`
	Subagent string `json:"subagent"`
	// Status is the child run's status now.
	Status Status `json:"status"`
	// Existing is true when the child existed before this request (a
	// retried start): nothing new was started.
	Existing bool `json:"existing"`
}

// SubagentQuery is the body of status, cancel and await requests.
type SubagentQuery struct {
	RunID string `json:"run_id"`
	// ParentRunID, when set, restricts the query to children of that
	// run: another run's child is answered as unknown (404).
	ParentRunID string `json:"parent_run_id,omitempty"`
	// TimeoutMS bounds an await (default 30 s, at most 10 min).
	TimeoutMS int `json:"timeout_ms,omitempty"`
}

// SubagentStatus answers status, cancel and await requests.
type SubagentStatus struct {
	RunID       string `json:"run_id"`
	ThreadID    string `json:"thread_id"`
	Subagent    string `json:"subagent"`
	ParentRunID string `json:"parent_run_id"`
	Status      Status `json:"status"`
	StopReason  string `json:"stop_reason,omitempty"`
	Error       string `json:"error,omitempty"`
	// Result is the child's final answer once it ended: its last
	// non-empty assistant text.
	Result string `json:"result,omitempty"`
	// Progress holds the child's last few steps (status only).
	Progress []string `json:"progress,omitempty"`
	// TimedOut is true when an await's timeout passed before the child
	// ended.
	TimedOut bool `json:"timed_out,omitempty"`
	// Usage is the child's token usage once it ended.
	Usage *UsageTotals `json:"usage,omitempty"`
}

// Subagent error codes, beyond the general ones (CodeInvalid,
// CodeNotFound, CodeUnavailable, CodeInternal).
const (
	// CodeBusy: the child thread to continue has an active run.
	CodeBusy = "busy"
)

// SubagentError is an error of the subagent service.
type SubagentError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	// ActiveRunID and ThreadID name the run a busy child thread is
	// running (CodeBusy).
	ActiveRunID string `json:"active_run_id,omitempty"`
	ThreadID    string `json:"thread_id,omitempty"`
}

func (e *SubagentError) Error() string { return e.Message }

// SubagentErrorReply is the body of an error reply of the service.
type SubagentErrorReply struct {
	Error SubagentError `json:"error"`
}

// SubagentEventData is the data of subagent.started, subagent.progress
// and subagent.finished on the lead run's stream: the child's ids, so a
// client can follow the child's own events
// (P.events.<tenant>.<thread_id>.<run_id>.>).
type SubagentEventData struct {
	RunID      string `json:"run_id"`
	ThreadID   string `json:"thread_id"`
	Subagent   string `json:"subagent"`
	ToolCallID string `json:"tool_call_id"`
	// Existing (started): the child existed already (a retried or
	// recovered call).
	Existing bool `json:"existing,omitempty"`
	// Line (progress) is one step of the child.
	Line string `json:"line,omitempty"`
	// Status, StopReason and Error (finished) are the child's end.
	Status     Status `json:"status,omitempty"`
	StopReason string `json:"stop_reason,omitempty"`
	Error      string `json:"error,omitempty"`
}

// SubagentThreadID is the thread of the child a tool call of a parent run
// starts: a hash of the parent's thread and run, the subagent and the tool
// call id, so a retried start (or a recovered parent re-running the call)
// finds the same child. The parent run id is part of it because tool call
// ids are only unique within one response for some providers.
func SubagentThreadID(parentThread, parentRun, subagent, toolCallID string) string {
	return "sub_" + idHash("thread", parentThread, parentRun, subagent, toolCallID)
}

// SubagentRunID is the run of the child a tool call of a parent run starts
// on a child thread.
func SubagentRunID(childThread, parentRun, toolCallID string) string {
	return "subrun_" + idHash("run", childThread, parentRun, toolCallID)
}

func idHash(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		// Length-prefixed, so ("ab","c") and ("a","bc") differ.
		h.Write([]byte{byte(len(p) >> 8), byte(len(p))})
		h.Write([]byte(p))
	}
	return hex.EncodeToString(h.Sum(nil)[:20])
}
