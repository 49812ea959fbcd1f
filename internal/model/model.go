// Package model owns the conversation types (messages, tool calls, tool
// specs) and the Model interface that every provider implements: the
// OpenAI-compatible client, the offline demo model and the scripted model
// used by tests and benchmarks. It knows nothing about NATS, runs or
// middleware; the agent loop calls Generate and nothing else.
package model

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
)

// Roles of a message.
const (
	RoleSystem    = "system"
	RoleUser      = "user"
	RoleAssistant = "assistant"
	RoleTool      = "tool"
)

// Tool result statuses.
const (
	ToolStatusSuccess = "success"
	ToolStatusError   = "error"
)

// Finish reasons reported by a model.
const (
	FinishStop          = "stop"
	FinishToolCalls     = "tool_calls"
	FinishLength        = "length"
	FinishContentFilter = "content_filter"
)

// Message is one entry of a transcript. IDs are stable: middleware upserts
// and removes messages by ID, and checkpoints store them by ID.
type Message struct {
	ID         string     `json:"id,omitempty"`
	Role       string     `json:"role"`
	Content    string     `json:"content"`
	Name       string     `json:"name,omitempty"`
	ToolCalls  []ToolCall `json:"tool_calls,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
	// Status is set on tool messages: success or error.
	Status string `json:"status,omitempty"`
	// Parts, when not empty, is a user message's content as parts (text
	// and images) for providers that take content arrays; Content then
	// holds the text alone, for text-only readers. Stored state holds
	// images as references (PartImageFile) or http(s) URLs; data URLs
	// belong in one request, never in stored state.
	Parts []Part `json:"parts,omitempty"`
	// Meta carries middleware annotations (hidden flags, usage markers,
	// stop notes). It is stored with the message but never sent to a model.
	Meta map[string]any `json:"meta,omitempty"`
}

// Content part types.
const (
	PartText     = "text"
	PartImageURL = "image_url"
	// PartImageFile is an image stored in the thread's workdir, named by
	// its content; the worker turns it into a data URL for each request.
	PartImageFile = "image_file"
)

// Part is one piece of a multi-part message: text, an image given by URL
// (a data: URL for inline bytes), or an image file of the thread.
type Part struct {
	Type     string     `json:"type"`
	Text     string     `json:"text,omitempty"`
	ImageURL string     `json:"image_url,omitempty"`
	Image    *ImageFile `json:"image_file,omitempty"`
}

// ImageFile names an image of the thread's workdir by its content: the
// file is protocol.InputImagePath of it, in the run's own thread.
type ImageFile struct {
	SHA256 string `json:"sha256"`
	MIME   string `json:"mime_type"`
	Size   int64  `json:"size,omitempty"`
}

// ToolCall is one call an assistant message asks for. Arguments is the raw
// JSON text the model produced; it may be invalid JSON, which the tool layer
// reports as a tool error instead of failing the run.
type ToolCall struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// Clone returns a deep copy of m, so middleware can edit a request without
// touching state.
func (m Message) Clone() Message {
	if m.ToolCalls != nil {
		m.ToolCalls = append([]ToolCall(nil), m.ToolCalls...)
	}
	if m.Parts != nil {
		m.Parts = append([]Part(nil), m.Parts...)
	}
	if m.Meta != nil {
		meta := make(map[string]any, len(m.Meta))
		for k, v := range m.Meta {
			meta[k] = v
		}
		m.Meta = meta
	}
	return m
}

// CloneMessages deep-copies a slice of messages.
func CloneMessages(ms []Message) []Message {
	if ms == nil {
		return nil
	}
	out := make([]Message, len(ms))
	for i, m := range ms {
		out[i] = m.Clone()
	}
	return out
}

// ToolSpec describes a tool to the model. Parameters is a JSON Schema object;
// it is never changed in place once a tool hands it out (token counts and
// caches keep it by reference).
type ToolSpec struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
}

// Request is one model call. The system prompt is sent as the one leading
// system message, before Messages.
type Request struct {
	// Model is the provider's model name; empty means the provider default.
	Model string
	// System is the system prompt ("" for none). It is kept apart so the
	// agent loop never copies a long transcript to put it in front.
	System string
	// Messages is the transcript. Providers only read it: the loop passes
	// the thread's own slice, not a copy.
	Messages []Message
	Tools    []ToolSpec
	// Temperature and MaxTokens are optional; nil/0 means provider default.
	Temperature *float64
	MaxTokens   int
}

// WithSystem returns the messages with the system prompt as a leading
// system message, the form a provider sends.
func (r *Request) WithSystem() []Message {
	if r.System == "" {
		return r.Messages
	}
	return append([]Message{{Role: RoleSystem, Content: r.System}}, r.Messages...)
}

// ContextMessageName names the trailing user message that carries a
// run's dynamic context (the todo list, notes saved during the run: the
// middleware package's promptcontext.go). It is the system's, not the
// person's: code looking for the person's last message skips it.
const ContextMessageName = "context"

// LastUserContent is the content of the request's last user message (the
// trailing context message aside), or "" when it has none.
func (r *Request) LastUserContent() string {
	for i := len(r.Messages) - 1; i >= 0; i-- {
		if r.Messages[i].Role == RoleUser && r.Messages[i].Name != ContextMessageName {
			return r.Messages[i].Content
		}
	}
	return ""
}

// Clone deep-copies the request so a wrapper can edit it for one call only.
func (r *Request) Clone() *Request {
	c := *r
	c.Messages = CloneMessages(r.Messages)
	c.Tools = append([]ToolSpec(nil), r.Tools...)
	return &c
}

// Usage is the token usage a provider reported for one call. A nil pointer
// field means "not reported", which is not the same as zero.
type Usage struct {
	PromptTokens     int  `json:"prompt_tokens"`
	CompletionTokens int  `json:"completion_tokens"`
	TotalTokens      int  `json:"total_tokens"`
	CachedTokens     *int `json:"cached_tokens,omitempty"`
}

// Response is the complete result of a model call.
type Response struct {
	Message      Message
	FinishReason string
	Usage        *Usage
	// Model is the model name the provider reports, when it reports one.
	Model string
}

// Delta is one streamed piece of a response.
type Delta struct {
	Content string
}

// Model is implemented by every provider. Generate streams text deltas to
// onDelta (which may be nil) while the response is produced and returns the
// whole response. Cancelling ctx aborts the call; the returned error then
// wraps ctx.Err().
type Model interface {
	Generate(ctx context.Context, req *Request, onDelta func(Delta)) (*Response, error)
}

// Defaulted is implemented by a Model that answers a Request naming no
// model with a model of its own choice: DefaultModel names it, so spans
// and metrics can say which model a run called.
type Defaulted interface {
	DefaultModel() string
}

// NameOf is the model a Request for name reaches on m: name, else m's
// default (empty when m has none it can tell).
func NameOf(m Model, name string) string {
	if name != "" {
		return name
	}
	if d, ok := m.(Defaulted); ok {
		return d.DefaultModel()
	}
	return ""
}

// Func adapts a function to the Model interface.
type Func func(ctx context.Context, req *Request, onDelta func(Delta)) (*Response, error)

// Generate calls f.
func (f Func) Generate(ctx context.Context, req *Request, onDelta func(Delta)) (*Response, error) {
	return f(ctx, req, onDelta)
}

// APIError is an error answered by a provider over HTTP. Middleware uses
// StatusCode to classify errors (retryable network faults, rate limits,
// invalid requests).
type APIError struct {
	StatusCode int
	Type       string
	Code       string
	Message    string
}

func (e *APIError) Error() string {
	if e.Type != "" {
		return fmt.Sprintf("model provider answered HTTP %d (%s): %s", e.StatusCode, e.Type, e.Message)
	}
	return fmt.Sprintf("model provider answered HTTP %d: %s", e.StatusCode, e.Message)
}

// ErrTruncated reports a stream that ended before the provider said it was
// done (no finish reason, no [DONE]).
var ErrTruncated = errors.New("model stream ended before the response was complete")
