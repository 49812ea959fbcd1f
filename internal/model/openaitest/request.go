package openaitest

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
)

// Request is a decoded chat completion request. It holds only the fields
// the system sends; Raw keeps the whole body for assertions on anything
// else (for example that no "meta" or "status" field leaked out).
type Request struct {
	// Index is the request's arrival number on its server, from 0.
	Index int `json:"-"`

	Model               string         `json:"model"`
	Messages            []Message      `json:"messages"`
	Tools               []Tool         `json:"tools,omitempty"`
	Stream              bool           `json:"stream"`
	StreamOptions       *StreamOptions `json:"stream_options,omitempty"`
	Temperature         *float64       `json:"temperature,omitempty"`
	MaxTokens           int            `json:"max_tokens,omitempty"`
	MaxCompletionTokens int            `json:"max_completion_tokens,omitempty"`

	// Raw is the request body exactly as received.
	Raw json.RawMessage `json:"-"`
}

// IncludeUsage reports whether the client asked for a usage chunk at the
// end of the stream.
func (r *Request) IncludeUsage() bool {
	return r.Stream && r.StreamOptions != nil && r.StreamOptions.IncludeUsage
}

// LastMessage returns the last message of the transcript, or a zero
// Message when there is none.
func (r *Request) LastMessage() Message {
	if len(r.Messages) == 0 {
		return Message{}
	}
	return r.Messages[len(r.Messages)-1]
}

func (r Request) clone() Request {
	r.Messages = append([]Message(nil), r.Messages...)
	for i := range r.Messages {
		r.Messages[i].ToolCalls = append([]ToolCallMsg(nil), r.Messages[i].ToolCalls...)
		if r.Messages[i].Parts != nil {
			r.Messages[i].Parts = append([]ContentPart{}, r.Messages[i].Parts...)
		}
	}
	r.Tools = append([]Tool(nil), r.Tools...)
	if r.StreamOptions != nil {
		so := *r.StreamOptions
		r.StreamOptions = &so
	}
	if r.Temperature != nil {
		t := *r.Temperature
		r.Temperature = &t
	}
	r.Raw = append(json.RawMessage(nil), r.Raw...)
	return r
}

// StreamOptions is the stream_options object of a request.
type StreamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// Message is one transcript entry as sent on the wire. Content is a string
// or, in user messages, an array of parts (text and image_url); for an
// array, Parts holds the parts and Content their text joined, so tests
// read either. Content of any other shape fails to decode and is reported
// as a violation; malformed parts are violations too (see Validate).
type Message struct {
	Role       string        `json:"role"`
	Content    string        `json:"content"`
	Parts      []ContentPart `json:"-"`
	Name       string        `json:"name,omitempty"`
	ToolCalls  []ToolCallMsg `json:"tool_calls,omitempty"`
	ToolCallID string        `json:"tool_call_id,omitempty"`
}

// ContentPart is one element of a content array. Pointers tell a missing
// field from an empty one.
type ContentPart struct {
	Type     string    `json:"type"`
	Text     *string   `json:"text,omitempty"`
	ImageURL *ImageURL `json:"image_url,omitempty"`
}

// ImageURL is the image_url object of an image part.
type ImageURL struct {
	URL    string `json:"url"`
	Detail string `json:"detail,omitempty"`
}

// UnmarshalJSON accepts content as a string, null or an array of parts.
func (m *Message) UnmarshalJSON(data []byte) error {
	type plain Message
	var w struct {
		plain
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(data, &w); err != nil {
		return err
	}
	*m = Message(w.plain)
	m.Content, m.Parts = "", nil
	raw := bytes.TrimSpace(w.Content)
	switch {
	case len(raw) == 0 || string(raw) == "null":
	case raw[0] == '"':
		return json.Unmarshal(raw, &m.Content)
	case raw[0] == '[':
		if err := json.Unmarshal(raw, &m.Parts); err != nil {
			return fmt.Errorf("content array: %w", err)
		}
		if m.Parts == nil {
			m.Parts = []ContentPart{}
		}
		var text []string
		for _, p := range m.Parts {
			if p.Type == "text" && p.Text != nil {
				text = append(text, *p.Text)
			}
		}
		m.Content = strings.Join(text, "\n")
	default:
		return fmt.Errorf("content must be a string or an array of parts, not %s", raw)
	}
	return nil
}

// ToolCallMsg is a tool call inside an assistant message of a request.
type ToolCallMsg struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function FunctionCall `json:"function"`
}

// FunctionCall names the function a tool call invokes and its raw
// arguments text.
type FunctionCall struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// Tool is one offered tool.
type Tool struct {
	Type     string   `json:"type"`
	Function Function `json:"function"`
}

// Function describes an offered function tool.
type Function struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
}

// Validate checks a request the way a strict provider (vLLM's chat
// templates, Anthropic's API) does and returns one line per broken rule,
// or nil when the request is acceptable. The server applies it to every
// request before the handler sees it; it is exported so other test helpers
// can check transcripts without a server.
//
// The rules: the transcript is not empty and uses only the system, user,
// assistant and tool roles; a system message may only come first; an
// assistant message has content or tool calls; every tool call has an id
// and a name, and ids are unique within the message (a past call may name
// a tool this request no longer offers: providers accept that, and tools
// hidden later in a run rely on it); the tool calls of an assistant message are
// answered by exactly one tool message each, in the block of tool messages
// that directly follows it; every tool message has a tool_call_id and a
// name and answers a call of that block's assistant message. Content arrays
// appear only in user messages and are not empty; each part is text with
// its text, or an image_url whose url is http(s) or a base64 data URL of a
// PNG, JPEG, GIF or WebP image, with detail auto, low or high if given.
func Validate(req *Request) []string {
	var problems []string
	add := func(format string, args ...any) {
		problems = append(problems, fmt.Sprintf(format, args...))
	}
	if len(req.Messages) == 0 {
		add("no messages")
		return problems
	}

	for i, t := range req.Tools {
		if t.Type != "function" {
			add("tool %d has type %q, want \"function\"", i, t.Type)
		}
		if t.Function.Name == "" {
			add("tool %d has an empty name", i)
		}
	}

	// open describes the assistant message whose tool calls are waiting for
	// answers; it stays set only while the messages after it are tool
	// messages, which is exactly the window in which answers are allowed.
	type openCalls struct {
		at       int               // index of the assistant message
		names    map[string]string // call id → function name
		order    []string          // call ids in order, for stable messages
		answered map[string]int    // call id → index of its tool message
	}
	var open *openCalls
	closeOpen := func(at int) {
		if open == nil {
			return
		}
		for _, id := range open.order {
			if _, ok := open.answered[id]; !ok {
				where := fmt.Sprintf("before message %d", at)
				if at == len(req.Messages) {
					where = "at the end of the transcript"
				}
				add("message %d: tool call %q (%s) is not answered by a tool message %s",
					open.at, id, open.names[id], where)
			}
		}
		open = nil
	}

	for i, m := range req.Messages {
		if m.Role != "tool" {
			closeOpen(i)
		}
		if m.Parts != nil {
			for _, p := range partProblems(m) {
				add("message %d: %s", i, p)
			}
		}
		switch m.Role {
		case "system":
			if i != 0 {
				add("message %d: system message is only allowed as the first message", i)
			}
		case "user":
		case "assistant":
			if m.Content == "" && len(m.ToolCalls) == 0 {
				add("message %d: assistant message has neither content nor tool calls", i)
			}
			if len(m.ToolCalls) == 0 {
				continue
			}
			oc := &openCalls{at: i, names: map[string]string{}, answered: map[string]int{}}
			for j, tc := range m.ToolCalls {
				if tc.ID == "" {
					add("message %d: tool call %d has an empty id", i, j)
				}
				if tc.Function.Name == "" {
					add("message %d: tool call %d has an empty name", i, j)
				}
				if tc.Type != "" && tc.Type != "function" {
					add("message %d: tool call %d has type %q, want \"function\"", i, j, tc.Type)
				}
				if tc.ID == "" {
					continue
				}
				if _, dup := oc.names[tc.ID]; dup {
					add("message %d: tool call id %q is used twice", i, tc.ID)
					continue
				}
				oc.names[tc.ID] = tc.Function.Name
				oc.order = append(oc.order, tc.ID)
			}
			open = oc
		case "tool":
			if m.ToolCallID == "" {
				add("message %d: tool message has an empty tool_call_id", i)
			}
			if m.Name == "" {
				add("message %d: tool message has an empty name", i)
			}
			if m.ToolCallID == "" {
				continue
			}
			switch {
			case open == nil:
				add("message %d: tool message for %q does not directly follow an assistant message with tool calls (orphan)", i, m.ToolCallID)
			case !hasKey(open.names, m.ToolCallID):
				add("message %d: tool message answers %q, which is not a tool call of assistant message %d (orphan)", i, m.ToolCallID, open.at)
			default:
				if prev, dup := open.answered[m.ToolCallID]; dup {
					add("message %d: tool call %q is answered twice (first at message %d)", i, m.ToolCallID, prev)
				} else {
					open.answered[m.ToolCallID] = i
				}
			}
		default:
			add("message %d: unknown role %q", i, m.Role)
		}
	}
	closeOpen(len(req.Messages))
	return problems
}

func hasKey(m map[string]string, k string) bool {
	_, ok := m[k]
	return ok
}

// partProblems checks the content array of one message.
func partProblems(m Message) []string {
	if m.Role != "user" {
		return []string{fmt.Sprintf("%s message has a content array; the system sends content parts only in user messages", m.Role)}
	}
	if len(m.Parts) == 0 {
		return []string{"content array is empty"}
	}
	var out []string
	for j, p := range m.Parts {
		switch p.Type {
		case "text":
			if p.Text == nil {
				out = append(out, fmt.Sprintf("content part %d (text) has no text", j))
			}
			if p.ImageURL != nil {
				out = append(out, fmt.Sprintf("content part %d (text) has an image_url", j))
			}
		case "image_url":
			if p.ImageURL == nil || p.ImageURL.URL == "" {
				out = append(out, fmt.Sprintf("content part %d (image_url) has no image_url.url", j))
				continue
			}
			if p.Text != nil {
				out = append(out, fmt.Sprintf("content part %d (image_url) has text", j))
			}
			if err := checkImageURL(p.ImageURL.URL); err != "" {
				out = append(out, fmt.Sprintf("content part %d (image_url): %s", j, err))
			}
			switch p.ImageURL.Detail {
			case "", "auto", "low", "high":
			default:
				out = append(out, fmt.Sprintf("content part %d (image_url) has detail %q, want auto, low or high", j, p.ImageURL.Detail))
			}
		default:
			out = append(out, fmt.Sprintf("content part %d has type %q, want text or image_url", j, p.Type))
		}
	}
	return out
}

// imageMIMEs are the image types providers accept inline.
var imageMIMEs = []string{"image/png", "image/jpeg", "image/gif", "image/webp"}

// checkImageURL returns what is wrong with an image URL, or "".
func checkImageURL(u string) string {
	if strings.HasPrefix(u, "https://") || strings.HasPrefix(u, "http://") {
		return ""
	}
	rest, ok := strings.CutPrefix(u, "data:")
	if !ok {
		return "url is neither http(s) nor a data URL"
	}
	mime, payload, ok := strings.Cut(rest, ";base64,")
	if !ok {
		return "data URL is not base64 (want data:<mime>;base64,<data>)"
	}
	known := false
	for _, k := range imageMIMEs {
		known = known || mime == k
	}
	if !known {
		return fmt.Sprintf("data URL has type %q, want one of %s", mime, strings.Join(imageMIMEs, ", "))
	}
	if payload == "" {
		return "data URL has no data"
	}
	if _, err := base64.StdEncoding.DecodeString(payload); err != nil {
		return "data URL's data is not valid base64: " + err.Error()
	}
	return ""
}
