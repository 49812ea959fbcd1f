package protocol

// What the built-in middlewares put on the wire: the event types they
// emit, the state values a client reads from a checkpoint, the payloads of
// both, and the check a resume's decisions must pass. They live here, not
// in the middleware package, so a client (the CLI, the gateway, a Go
// service through the public package) depends on the wire and never on
// the worker's chain.

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// Event types of the built-in middlewares (docs/middleware.md says which
// kind each goes to and what its data holds).
const (
	EventApprovalRequested  = "approval.requested"
	EventBudgetWarning      = "budget.warning"
	EventBudgetExceeded     = "budget.exceeded"
	EventLoopDetected       = "loop.detected"
	EventModelRetry         = "model.retry"
	EventSafetyStopped      = "safety.stopped"
	EventTodos              = "state.todos"
	EventContextCompression = "context_compression"
)

// State values a client reads from a thread's state.
const (
	// InterruptValue holds the open interrupt of a waiting thread.
	InterruptValue = "interrupt"
	// TitleValue holds the thread's title.
	TitleValue = "title"
	// TodosValue holds the todo list ([]Todo).
	TodosValue = "todos"
)

// Todo is one item of the todo list.
type Todo struct {
	Content string `json:"content"`
	Status  string `json:"status"`
}

// Phases of a context_compression event.
const (
	CompressionStarted   = "started"
	CompressionCompleted = "completed"
	CompressionFailed    = "failed"
)

// Codes of a failed context_compression event, beyond CodeBusy and
// CodeNotFound.
const (
	CodeSummaryFailed = "summary_failed"
	CodeDisabled      = "disabled"
	CodeUnknownAgent  = "unknown_agent"
)

// CompressionData is the data of a context_compression event.
type CompressionData struct {
	Phase  string `json:"phase"`
	Reason string `json:"reason"`
	// MessageID is the model call compression prepared (runs); JobID the
	// compaction job (on request).
	MessageID string `json:"message_id,omitempty"`
	JobID     string `json:"job_id,omitempty"`
	// TokensBefore is the request's size before compression, TokensAfter
	// what was sent (for a job: what the next request starts from).
	TokensBefore int `json:"tokens_before"`
	TokensAfter  int `json:"tokens_after,omitempty"`
	// Compacted counts the messages newly compacted for this call.
	Compacted int `json:"compacted,omitempty"`
	// Summarized counts the messages the summary cut; Count all messages
	// summaries replaced so far.
	Summarized         int    `json:"summarized,omitempty"`
	Count              int    `json:"count,omitempty"`
	SummarySeq         int    `json:"summary_seq,omitempty"`
	CutBeforeMessageID string `json:"cut_before_message_id,omitempty"`
	HistoryPath        string `json:"history_path,omitempty"`
	// Code and Error say why it failed (busy, not_found, disabled,
	// summary_failed, ...).
	Code  string `json:"code,omitempty"`
	Error string `json:"error,omitempty"`
	// Checkpoint is the checkpoint a compaction job wrote.
	Checkpoint string `json:"checkpoint_id,omitempty"`
}

// CheckDecisions validates a resume's decisions against the interrupt: one
// per waiting call, each allowed, an edit with a JSON object, a respond
// with a message.
func CheckDecisions(open *Interrupt, decisions []Decision) error {
	if len(decisions) != len(open.ActionRequests) {
		return fmt.Errorf("command.resume.decisions: %d decisions for %d tool calls waiting for approval; send one decision per call, in the order of the interrupt's action_requests", len(decisions), len(open.ActionRequests))
	}
	for k, d := range decisions {
		if !slices.Contains(open.AllowedDecisions, d.Type) {
			return fmt.Errorf("command.resume.decisions[%d].type: %q is not allowed here (allowed: %s)", k, d.Type, strings.Join(open.AllowedDecisions, ", "))
		}
		switch d.Type {
		case DecisionEdit:
			if !isObject(string(d.Arguments)) || len(strings.TrimSpace(string(d.Arguments))) == 0 {
				return fmt.Errorf("command.resume.decisions[%d].arguments: an edit needs the new arguments as a JSON object", k)
			}
		case DecisionRespond:
			if strings.TrimSpace(d.Message) == "" {
				return fmt.Errorf("command.resume.decisions[%d].message: a respond decision needs the text to answer with", k)
			}
		}
	}
	return nil
}

func isObject(s string) bool {
	t := strings.Trim(s, " \t\r\n")
	return t != "" && t[0] == '{' && json.Valid([]byte(t))
}
