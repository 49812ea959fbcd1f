package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/natsagent/natsagent/internal/model"
)

// MaxTokenLen is the longest tenant, thread or run id.
const MaxTokenLen = 128

// DefaultMaxRequestBytes bounds an encoded run request.
const DefaultMaxRequestBytes = 256 << 10

// Bounds of a run request's numbers, whatever a deployment configures:
// they keep every conversion (seconds to time.Duration) far from
// overflow. A deployment's limits (internal/limits) may be lower.
const (
	// MaxTimeoutSeconds bounds config.timeout_seconds (7 days).
	MaxTimeoutSeconds = 7 * 24 * 3600
	// MaxRunSteps bounds config.max_steps.
	MaxRunSteps = 10000
)

// Tool approval modes.
const (
	// ApprovalDefault stops before sensitive tools until a person decides.
	ApprovalDefault = "default"
	// ApprovalAlwaysTrust runs every tool without asking.
	ApprovalAlwaysTrust = "always_trust"
	// ApprovalAlwaysAsk stops before every tool call until a person
	// decides (LangGraph's interrupt_before: ["tools"]).
	ApprovalAlwaysAsk = "always_ask"
)

// DefaultAgent is the agent profile used when a request names none.
const DefaultAgent = "chatbot"

// ValidationError reports one invalid field of a request. Field is a JSON
// path ("thread_id", "input.messages[2].role").
type ValidationError struct {
	Field   string
	Message string
}

func (e *ValidationError) Error() string {
	if e.Field == "" {
		return e.Message
	}
	return e.Field + ": " + e.Message
}

// ErrInvalid matches every *ValidationError with errors.Is.
var ErrInvalid = errors.New("invalid request")

// Is lets errors.Is(err, ErrInvalid) match a ValidationError.
func (e *ValidationError) Is(target error) bool { return target == ErrInvalid }

func invalid(field, format string, args ...any) error {
	return &ValidationError{Field: field, Message: fmt.Sprintf(format, args...)}
}

// ValidToken reports whether s may be used as a tenant, thread, run or
// worker id: 1 to 128 characters from [A-Za-z0-9_-]. Every such id becomes
// a subject token or a key, so nothing else is accepted.
func ValidToken(s string) bool {
	if len(s) == 0 || len(s) > MaxTokenLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// CheckToken returns a ValidationError naming field when s is not a valid
// token.
func CheckToken(field, s string) error {
	if s == "" {
		return invalid(field, "is required")
	}
	if !ValidToken(s) {
		return invalid(field, "%q is not a valid id: use 1 to %d characters from A-Z, a-z, 0-9, '_' and '-'", clip(s, 40), MaxTokenLen)
	}
	return nil
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// DecodeRunRequest parses and validates an encoded run request, filling
// defaults (tenant, agent, strategy). maxBytes <= 0 means
// DefaultMaxRequestBytes.
func DecodeRunRequest(data []byte, maxBytes int) (*RunRequest, error) {
	return DecodeRunRequestFor(data, maxBytes, "", "")
}

// DecodeRunRequestFor is DecodeRunRequest for a request that arrived on a
// run subject: an empty tenant or thread_id is taken from the subject's
// tokens (which are still checked to be valid ids).
func DecodeRunRequestFor(data []byte, maxBytes int, tenant, thread string) (*RunRequest, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxRequestBytes
	}
	if len(data) > maxBytes {
		return nil, invalid("", "run request is %d bytes, over the limit of %d bytes; put large content in files and reference it", len(data), maxBytes)
	}
	// Names the field that holds invalid UTF-8 or nests too deeply.
	if err := CheckJSON(data, MaxJSONDepth); err != nil {
		return nil, err
	}
	if !utf8.Valid(data) {
		return nil, invalid("", "run request is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber() // metadata keeps large integers exact
	var req RunRequest
	if err := dec.Decode(&req); err != nil {
		return nil, invalid("", "run request is not valid JSON: %v", err)
	}
	if dec.More() {
		return nil, invalid("", "run request has data after the JSON object")
	}
	if req.Tenant == "" {
		req.Tenant = tenant
	}
	if req.ThreadID == "" {
		req.ThreadID = thread
	}
	req.Normalize()
	if err := req.Validate(); err != nil {
		return nil, err
	}
	return &req, nil
}

// Normalize fills defaults for empty fields.
func (r *RunRequest) Normalize() {
	if r.Tenant == "" {
		r.Tenant = DefaultTenant
	}
	if r.Agent == "" {
		r.Agent = DefaultAgent
	}
	if r.MultitaskStrategy == "" {
		r.MultitaskStrategy = StrategyEnqueue
	}
}

// Validate checks a normalized request.
func (r *RunRequest) Validate() error {
	if err := CheckToken("run_id", r.RunID); err != nil {
		return err
	}
	if err := CheckToken("thread_id", r.ThreadID); err != nil {
		return err
	}
	if err := CheckToken("tenant", r.Tenant); err != nil {
		return err
	}
	if err := CheckToken("agent", r.Agent); err != nil {
		return err
	}
	switch r.MultitaskStrategy {
	case StrategyEnqueue, StrategyReject, StrategySteer, StrategyRollback:
	default:
		return invalid("multitask_strategy", "%q is not one of enqueue, reject, steer, rollback", clip(r.MultitaskStrategy, 40))
	}
	switch {
	case r.Input != nil && r.Command != nil:
		return invalid("command", "input and command are exclusive: send new messages as input, or resume an interrupted thread with command")
	case r.Input == nil && r.Command == nil:
		return invalid("input", "is required (or command to resume an interrupted thread)")
	case r.Input != nil:
		if len(r.Input.Messages) == 0 {
			return invalid("input.messages", "must contain at least one message")
		}
		for i, m := range r.Input.Messages {
			field := fmt.Sprintf("input.messages[%d]", i)
			switch m.Role {
			case model.RoleUser, model.RoleSystem:
			case model.RoleAssistant, model.RoleTool:
				return invalid(field+".role", "%q messages are produced by the agent; input may hold user and system messages", m.Role)
			default:
				return invalid(field+".role", "%q is not a valid role (user or system)", clip(m.Role, 20))
			}
			if m.ID != "" && !ValidToken(m.ID) {
				return invalid(field+".id", "%q is not a valid message id", clip(m.ID, 40))
			}
			if err := CheckInputParts(field, m); err != nil {
				return err
			}
		}
	case r.Command != nil:
		if err := r.Command.validate(); err != nil {
			return err
		}
	}
	if r.Config.MaxSteps < 0 || r.Config.MaxSteps > MaxRunSteps {
		return invalid("config.max_steps", "%d is out of range: use 1 to %d (or leave it out for the agent's default)", r.Config.MaxSteps, MaxRunSteps)
	}
	if r.Config.TimeoutSeconds < 0 || r.Config.TimeoutSeconds > MaxTimeoutSeconds {
		return invalid("config.timeout_seconds", "%d is out of range: use 1 to %d seconds (7 days; the deployment's maximum run time may be lower), or leave it out for the default", r.Config.TimeoutSeconds, MaxTimeoutSeconds)
	}
	if r.Config.UserID != "" && !ValidToken(r.Config.UserID) {
		return invalid("config.user_id", "%q is not a valid id", clip(r.Config.UserID, 40))
	}
	switch r.Config.ToolApprovalMode {
	case "", ApprovalDefault, ApprovalAlwaysTrust, ApprovalAlwaysAsk:
	default:
		return invalid("config.tool_approval_mode", "%q is not one of default, always_trust, always_ask", clip(r.Config.ToolApprovalMode, 40))
	}
	if r.Webhook != "" && (len(r.Webhook) > 2048 || !(strings.HasPrefix(r.Webhook, "http://") || strings.HasPrefix(r.Webhook, "https://"))) {
		return invalid("webhook", "must be an http or https URL of at most 2048 bytes")
	}
	if len(r.StreamMode) > 16 {
		return invalid("stream_mode", "names %d modes; at most 16", len(r.StreamMode))
	}
	for i, m := range r.StreamMode {
		if len(m) > 40 || !ValidToken(m) {
			return invalid(fmt.Sprintf("stream_mode[%d]", i), "%q is not a stream mode name", clip(m, 40))
		}
	}
	if r.Parent != nil {
		if err := CheckToken("parent.run_id", r.Parent.RunID); err != nil {
			return err
		}
		if err := CheckToken("parent.thread_id", r.Parent.ThreadID); err != nil {
			return err
		}
	}
	return nil
}

// MaxThreadMetadataFields bounds the top-level fields of a thread's
// metadata that a client sets (a thread's first run may add its
// graph_id and assistant_id tags), and of a thread search's metadata
// filter: each field of a thread is an index key written with it (kv's
// metadata index), each field of a filter a request or two to the
// server.
const MaxThreadMetadataFields = 128
