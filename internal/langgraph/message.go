// Package langgraph owns the shapes of the LangGraph Agent Server API that
// natsagent serves: LangChain's message format, thread values, the state
// and checkpoint objects and LangGraph's interrupts. It converts
// natsagent's own records (model.Message, state.State, protocol.Interrupt)
// to those shapes and LangChain messages back. It does no I/O and knows
// nothing of NATS or HTTP: the gateway serves what it builds, and Stream
// (stream.go) translates a run's events to LangGraph's stream modes with
// the same functions.
package langgraph

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/natsagent/natsagent/internal/model"
)

// LangChain message types.
const (
	TypeHuman  = "human"
	TypeAI     = "ai"
	TypeTool   = "tool"
	TypeSystem = "system"
	// TypeRemove is LangGraph's RemoveMessage: on input, it removes the
	// message with its id from the thread.
	TypeRemove = "remove"
)

// Message is a message in LangChain's shape, as LangGraph clients read it
// (the fields of a serialized HumanMessage, AIMessage, ToolMessage or
// SystemMessage).
type Message struct {
	Type string `json:"type"`
	// Content is a string, or a list of content blocks for a message
	// with images.
	Content any    `json:"content"`
	ID      string `json:"id,omitempty"`
	Name    string `json:"name,omitempty"`
	// ToolCalls and InvalidToolCalls are an AI message's (always present
	// on one, empty when it called nothing).
	ToolCalls        []ToolCall        `json:"tool_calls,omitempty"`
	InvalidToolCalls []InvalidToolCall `json:"invalid_tool_calls,omitempty"`
	// ToolCallID and Status are a tool message's.
	ToolCallID    string         `json:"tool_call_id,omitempty"`
	Status        string         `json:"status,omitempty"`
	UsageMetadata *UsageMetadata `json:"usage_metadata,omitempty"`
	// ResponseMetadata holds finish_reason and model_name when known.
	ResponseMetadata map[string]any `json:"response_metadata"`
	// AdditionalKwargs holds natsagent's own annotations of the message
	// (its meta: run_id, stopped_by, ...) under "natsagent".
	AdditionalKwargs map[string]any `json:"additional_kwargs"`
}

// MarshalJSON writes tool_calls and invalid_tool_calls on every AI
// message, empty when it called nothing, as LangChain serializes them.
func (m Message) MarshalJSON() ([]byte, error) {
	type plain Message
	if m.Type != TypeAI {
		return json.Marshal(plain(m))
	}
	return json.Marshal(struct {
		plain
		ToolCalls        []ToolCall        `json:"tool_calls"`
		InvalidToolCalls []InvalidToolCall `json:"invalid_tool_calls"`
	}{plain(m), nonNil(m.ToolCalls), nonNil(m.InvalidToolCalls)})
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// ToolCall is a tool call of an AI message, with its arguments decoded.
type ToolCall struct {
	ID   string         `json:"id"`
	Name string         `json:"name"`
	Args map[string]any `json:"args"`
	Type string         `json:"type"` // "tool_call"
}

// InvalidToolCall is a tool call whose arguments are not a JSON object,
// kept as the model wrote them (LangChain's invalid_tool_calls).
type InvalidToolCall struct {
	ID    string `json:"id"`
	Name  string `json:"name"`
	Args  string `json:"args"`
	Error string `json:"error"`
	Type  string `json:"type"` // "invalid_tool_call"
}

// UsageMetadata is an AI message's token usage.
type UsageMetadata struct {
	InputTokens  int64 `json:"input_tokens"`
	OutputTokens int64 `json:"output_tokens"`
	TotalTokens  int64 `json:"total_tokens"`
}

// Meta keys natsagent's messages carry that become LangChain fields
// instead of additional_kwargs.
const (
	metaUsage        = "usage"
	metaFinishReason = "finish_reason"
	metaModel        = "model"
)

// FromModel converts a natsagent message to LangChain's shape.
func FromModel(m model.Message) Message {
	out := Message{ID: m.ID, Name: m.Name, Content: m.Content, ResponseMetadata: map[string]any{}, AdditionalKwargs: map[string]any{}}
	switch m.Role {
	case model.RoleUser:
		out.Type = TypeHuman
	case model.RoleAssistant:
		out.Type = TypeAI
	case model.RoleTool:
		out.Type, out.ToolCallID, out.Status = TypeTool, m.ToolCallID, m.Status
		if out.Status == "" {
			out.Status = "success"
		}
	case model.RoleSystem:
		out.Type = TypeSystem
	default:
		out.Type = m.Role
	}
	if len(m.Parts) > 0 {
		blocks := make([]map[string]any, 0, len(m.Parts))
		for _, p := range m.Parts {
			switch p.Type {
			case model.PartImageURL:
				blocks = append(blocks, map[string]any{"type": model.PartImageURL, "image_url": map[string]any{"url": p.ImageURL}})
			case model.PartImageFile:
				blocks = append(blocks, map[string]any{"type": model.PartImageFile, "image_file": p.Image})
			default:
				blocks = append(blocks, map[string]any{"type": "text", "text": p.Text})
			}
		}
		out.Content = blocks
	}
	for _, c := range m.ToolCalls {
		args, err := decodeArgs(c.Arguments)
		if err != nil {
			out.InvalidToolCalls = append(out.InvalidToolCalls, InvalidToolCall{ID: c.ID, Name: c.Name, Args: c.Arguments, Error: err.Error(), Type: "invalid_tool_call"})
			continue
		}
		out.ToolCalls = append(out.ToolCalls, ToolCall{ID: c.ID, Name: c.Name, Args: args, Type: "tool_call"})
	}
	if len(m.Meta) > 0 {
		rest := make(map[string]any, len(m.Meta))
		for k, v := range m.Meta {
			switch k {
			case metaFinishReason:
				out.ResponseMetadata["finish_reason"] = v
			case metaUsage:
				if u, ok := usageOf(v); ok && out.Type == TypeAI {
					out.UsageMetadata = u
				}
				if um, ok := v.(map[string]any); ok {
					if name, ok := um[metaModel].(string); ok && name != "" {
						out.ResponseMetadata["model_name"] = name
					}
				}
				rest[k] = v
			default:
				rest[k] = v
			}
		}
		if len(rest) > 0 {
			out.AdditionalKwargs["natsagent"] = rest
		}
	}
	return out
}

// FromModels converts a transcript (never nil: [] for none).
func FromModels(ms []model.Message) []Message {
	out := make([]Message, len(ms))
	for i, m := range ms {
		out[i] = FromModel(m)
	}
	return out
}

// decodeArgs decodes a tool call's raw arguments: a JSON object, or
// nothing (an empty object).
func decodeArgs(raw string) (map[string]any, error) {
	if strings.TrimSpace(raw) == "" {
		return map[string]any{}, nil
	}
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.UseNumber()
	var args map[string]any
	if err := dec.Decode(&args); err != nil || args == nil || dec.More() {
		return nil, errors.New("arguments are not a JSON object")
	}
	return args, nil
}

// usageOf reads natsagent's usage annotation ({"input_tokens",
// "output_tokens", ...}).
func usageOf(v any) (*UsageMetadata, bool) {
	m, ok := v.(map[string]any)
	if !ok {
		return nil, false
	}
	in, okIn := number(m["input_tokens"])
	outT, okOut := number(m["output_tokens"])
	if !okIn && !okOut {
		return nil, false
	}
	return &UsageMetadata{InputTokens: in, OutputTokens: outT, TotalTokens: in + outT}, true
}

func number(v any) (int64, bool) {
	switch n := v.(type) {
	case float64:
		return int64(n), true
	case int:
		return int64(n), true
	case int64:
		return n, true
	case json.Number:
		i, err := n.Int64()
		return i, err == nil
	}
	return 0, false
}

// Input is a message as a client sends it: LangChain's shape ("type",
// content blocks, tool_calls with args objects) or natsagent's ("role",
// tool_calls with raw arguments). When both role and type are set, role
// wins.
type Input struct {
	ID         string          `json:"id"`
	Role       string          `json:"role"`
	Type       string          `json:"type"`
	Name       string          `json:"name"`
	Content    json.RawMessage `json:"content"`
	ToolCalls  []InputToolCall `json:"tool_calls"`
	ToolCallID string          `json:"tool_call_id"`
	Status     string          `json:"status"`
}

// InputToolCall is a tool call as either shape writes it: args (an
// object, LangChain) or arguments (raw JSON text, natsagent).
type InputToolCall struct {
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Args      json.RawMessage `json:"args"`
	Arguments string          `json:"arguments"`
}

// FieldError is an invalid field of an input message; Field is relative
// to the message ("content", "tool_calls[0].args").
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

// Remove reports whether in is a RemoveMessage, and the id it removes.
func (in *Input) Remove() (string, bool) {
	return in.ID, in.Role == "" && in.Type == TypeRemove
}

// ToModel converts an input message to natsagent's. Roles may be given as
// LangChain types (human, ai, tool, system) or natsagent roles; content as
// a string or a list of blocks: text blocks ({"type":"text","text"}) are
// joined; image blocks ({"type":"image_url"}) are kept as parts, which a
// caller storing the message must refuse. The caller decides which roles
// it accepts.
func ToModel(in Input) (model.Message, error) {
	role := in.Role
	if role == "" {
		role = in.Type
	}
	switch role {
	case TypeHuman, model.RoleUser:
		role = model.RoleUser
	case TypeAI, model.RoleAssistant:
		role = model.RoleAssistant
	case TypeTool:
		role = model.RoleTool
	case TypeSystem:
		role = model.RoleSystem
	}
	text, parts, err := content(in.Content)
	if err != nil {
		return model.Message{}, &FieldError{"content", err.Error()}
	}
	out := model.Message{ID: in.ID, Role: role, Name: in.Name, Content: text, Parts: parts, ToolCallID: in.ToolCallID, Status: in.Status}
	for i, c := range in.ToolCalls {
		args := c.Arguments
		if raw := bytes.TrimSpace(c.Args); len(raw) > 0 && !bytes.Equal(raw, []byte("null")) {
			if raw[0] != '{' {
				return model.Message{}, &FieldError{fmt.Sprintf("tool_calls[%d].args", i), "must be a JSON object"}
			}
			args = string(raw)
		}
		out.ToolCalls = append(out.ToolCalls, model.ToolCall{ID: c.ID, Name: c.Name, Arguments: args})
	}
	return out, nil
}

// content reads message content: a string, or a list of blocks.
func content(raw json.RawMessage) (string, []model.Part, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", nil, nil
	}
	if raw[0] == '"' {
		var text string
		err := json.Unmarshal(raw, &text)
		return text, nil, err
	}
	var blocks []struct {
		Type     string          `json:"type"`
		Text     string          `json:"text"`
		ImageURL json.RawMessage `json:"image_url"`
		// LangChain's image block: source_type base64 (data,
		// mime_type) or url (url); v1 blocks name base64 or url alone.
		SourceType string `json:"source_type"`
		Data       string `json:"data"`
		Base64     string `json:"base64"`
		URL        string `json:"url"`
		MIMEType   string `json:"mime_type"`
		// natsagent's reference to an image of the thread.
		ImageFile *model.ImageFile `json:"image_file"`
	}
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return "", nil, errors.New("must be a string or a list of content blocks")
	}
	var b strings.Builder
	var parts []model.Part
	images := false
	for _, blk := range blocks {
		switch blk.Type {
		case "text":
			b.WriteString(blk.Text)
			parts = append(parts, model.Part{Type: model.PartText, Text: blk.Text})
		case model.PartImageURL:
			url, err := imageURL(blk.ImageURL)
			if err != nil {
				return "", nil, err
			}
			images = true
			parts = append(parts, model.Part{Type: model.PartImageURL, ImageURL: url})
		case "image":
			data := blk.Data
			if data == "" {
				data = blk.Base64
			}
			switch {
			case (blk.SourceType == "base64" || blk.SourceType == "") && data != "":
				if blk.MIMEType == "" {
					return "", nil, errors.New("an image block with base64 data needs mime_type")
				}
				parts = append(parts, model.Part{Type: model.PartImageURL, ImageURL: "data:" + blk.MIMEType + ";base64," + data})
			case (blk.SourceType == "url" || blk.SourceType == "") && blk.URL != "":
				parts = append(parts, model.Part{Type: model.PartImageURL, ImageURL: blk.URL})
			default:
				return "", nil, errors.New(`an image block needs source_type "base64" with data and mime_type, or source_type "url" with url`)
			}
			images = true
		case model.PartImageFile:
			if blk.ImageFile == nil {
				return "", nil, errors.New("an image_file block needs image_file.sha256 and image_file.mime_type")
			}
			img := *blk.ImageFile
			images = true
			parts = append(parts, model.Part{Type: model.PartImageFile, Image: &img})
		default:
			return "", nil, fmt.Errorf("content blocks of type %q are not supported; send text, image_url or image", clip(blk.Type))
		}
	}
	if !images {
		parts = nil
	}
	return b.String(), parts, nil
}

// imageURL reads an image_url block's URL: a string or {"url": ...}.
func imageURL(raw json.RawMessage) (string, error) {
	var url string
	if json.Unmarshal(raw, &url) == nil && url != "" {
		return url, nil
	}
	var obj struct {
		URL string `json:"url"`
	}
	if json.Unmarshal(raw, &obj) == nil && obj.URL != "" {
		return obj.URL, nil
	}
	return "", errors.New("an image_url block needs image_url.url")
}

func clip(s string) string {
	if len(s) <= 40 {
		return s
	}
	return s[:40] + "..."
}

// Encoder encodes transcripts in LangChain's shape, each distinct message
// once: the states of a history page share most of their messages, and
// encoding them is most of the cost of serving it. An Encoder serves one
// response; it is not safe for concurrent use.
type Encoder struct {
	seen map[string]encoded
	// size is the length of the last transcript encoded: the next one
	// (the state before or after it) is about as long.
	size int
}

type encoded struct {
	msg  model.Message
	json []byte
}

// Messages returns the JSON array of ms in LangChain's shape.
func (e *Encoder) Messages(ms []model.Message) (json.RawMessage, error) {
	if e.seen == nil {
		e.seen = make(map[string]encoded)
	}
	var b bytes.Buffer
	b.Grow(e.size + len(ms) + 2)
	b.WriteByte('[')
	for i, m := range ms {
		if i > 0 {
			b.WriteByte(',')
		}
		if c, ok := e.seen[m.ID]; ok && m.ID != "" && same(c.msg, m) {
			b.Write(c.json)
			continue
		}
		data, err := json.Marshal(FromModel(m))
		if err != nil {
			return nil, err
		}
		if m.ID != "" {
			e.seen[m.ID] = encoded{m, data}
		}
		b.Write(data)
	}
	b.WriteByte(']')
	e.size = b.Len()
	return b.Bytes(), nil
}

// same reports whether two messages with one id are equal (an upsert may
// have replaced one).
func same(a, b model.Message) bool {
	return a.Content == b.Content && a.Role == b.Role && a.Name == b.Name && a.ToolCallID == b.ToolCallID && a.Status == b.Status &&
		slices.Equal(a.ToolCalls, b.ToolCalls) && slices.Equal(a.Parts, b.Parts) && reflect.DeepEqual(a.Meta, b.Meta)
}
