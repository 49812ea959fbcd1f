package model

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"unicode/utf8"

	openai "github.com/sashabaranov/go-openai"
)

// OpenAIConfig configures a client for any OpenAI-compatible chat
// completions endpoint (OpenAI, vLLM, Ollama, LiteLLM, OpenRouter...).
type OpenAIConfig struct {
	// BaseURL is the API root including the version, e.g.
	// http://localhost:8000/v1; empty means https://api.openai.com/v1.
	BaseURL string
	// APIKey is sent as a bearer token; empty sends no Authorization
	// header, which local servers expect.
	APIKey string
	// Model is the default model name, used when a Request names none.
	Model string
	// HTTPClient replaces the default client (which has no timeout: calls
	// are bounded by their context, since a long answer legitimately
	// streams for minutes).
	HTTPClient *http.Client
	// DisableStreamUsage stops asking for stream_options.include_usage, for
	// providers that reject the option. Usage is then usually not reported.
	DisableStreamUsage bool
}

// OpenAI is a Model backed by an OpenAI-compatible chat completions API.
// It always streams, so deltas reach the user as they are produced and a
// stalled provider is noticed by the caller's context rather than by a
// whole-response timeout. It is safe for concurrent use.
type OpenAI struct {
	client       *openai.Client
	model        string
	includeUsage bool
}

var _ Model = (*OpenAI)(nil)

// NewOpenAI returns a client for cfg. It does not contact the provider.
func NewOpenAI(cfg OpenAIConfig) (*OpenAI, error) {
	if strings.TrimSpace(cfg.Model) == "" {
		return nil, errors.New("model: OpenAI-compatible provider needs a model name")
	}
	oc := openai.DefaultConfig(cfg.APIKey)
	if cfg.BaseURL != "" {
		oc.BaseURL = cfg.BaseURL
	}
	if cfg.HTTPClient != nil {
		oc.HTTPClient = cfg.HTTPClient
	}
	return &OpenAI{
		client:       openai.NewClientWithConfig(oc),
		model:        cfg.Model,
		includeUsage: !cfg.DisableStreamUsage,
	}, nil
}

// DefaultModel implements Defaulted: the configured model name.
func (o *OpenAI) DefaultModel() string { return o.model }

// Generate implements Model.
func (o *OpenAI) Generate(ctx context.Context, req *Request, onDelta func(Delta)) (*Response, error) {
	creq, err := o.chatRequest(req)
	if err != nil {
		return nil, err
	}
	stream, err := o.client.CreateChatCompletionStream(ctx, creq)
	if err != nil {
		return nil, convertError(ctx, err)
	}
	defer stream.Close()
	// The transport already aborts a body read when ctx ends, but a custom
	// HTTPClient may not; closing the body guarantees Recv returns promptly.
	stopClose := context.AfterFunc(ctx, func() { _ = stream.Close() })
	defer stopClose()

	var acc streamAccumulator
	for {
		raw, err := stream.RecvRaw()
		if errors.Is(err, io.EOF) {
			// go-openai answers io.EOF both for "data: [DONE]" and for a
			// body that simply ended, so only the finish reason tells a
			// complete answer from a cut one.
			break
		}
		if err != nil {
			if ctx.Err() == nil && errors.Is(err, io.ErrUnexpectedEOF) {
				// The connection dropped mid-chunk: the same failure as a
				// clean early end, seen one layer lower.
				return nil, fmt.Errorf("model: %w: %w", ErrTruncated, err)
			}
			return nil, convertError(ctx, err)
		}
		if err := acc.add(raw, onDelta); err != nil {
			return nil, err
		}
	}
	if acc.finishReason == "" {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("model: request aborted: %w", err)
		}
		return nil, fmt.Errorf("model: %w (no finish reason after %d chunks)", ErrTruncated, acc.chunks)
	}
	return acc.response(), nil
}

// chatRequest maps our request to go-openai's. Only wire fields are copied:
// message IDs, statuses and Meta are ours and never leave the process.
func (o *OpenAI) chatRequest(req *Request) (openai.ChatCompletionRequest, error) {
	creq := openai.ChatCompletionRequest{
		Model:    o.model,
		Messages: make([]openai.ChatCompletionMessage, 0, len(req.Messages)+1),
	}
	if req.System != "" {
		creq.Messages = append(creq.Messages, openai.ChatCompletionMessage{Role: RoleSystem, Content: req.System})
	}
	if req.Model != "" {
		creq.Model = req.Model
	}
	if o.includeUsage {
		creq.StreamOptions = &openai.StreamOptions{IncludeUsage: true}
	}
	if req.Temperature != nil {
		t := float32(*req.Temperature)
		if t == 0 {
			// go-openai drops a zero temperature (float32 with omitempty),
			// which would leave the provider default (usually 1) in place.
			// The smallest positive float32 survives and every provider
			// treats it as greedy decoding.
			t = math.SmallestNonzeroFloat32
		}
		creq.Temperature = t
	}
	if req.MaxTokens > 0 {
		if usesMaxCompletionTokens(creq.Model) {
			creq.MaxCompletionTokens = req.MaxTokens
		} else {
			// max_tokens is the field every compatible server understands;
			// max_completion_tokens is OpenAI-only.
			creq.MaxTokens = req.MaxTokens
		}
	}

	// callNames lets a tool message whose Name was left empty carry the name
	// of the call it answers; several providers (and the strict test server)
	// require it.
	callNames := map[string]string{}
	for i, m := range req.Messages {
		cm := openai.ChatCompletionMessage{Role: m.Role, Content: m.Content}
		if len(m.Parts) > 0 {
			if m.Role != RoleUser {
				return creq, fmt.Errorf("model: message %d: only user messages may have content parts, not %s", i, m.Role)
			}
			parts, err := chatParts(m.Parts)
			if err != nil {
				return creq, fmt.Errorf("model: message %d: %w", i, err)
			}
			// go-openai refuses a message with both; the parts carry
			// the text.
			cm.Content, cm.MultiContent = "", parts
		}
		switch m.Role {
		case RoleSystem, RoleUser:
		case RoleAssistant:
			for _, tc := range m.ToolCalls {
				args := tc.Arguments
				if args == "" {
					// go-openai omits an empty arguments string and
					// OpenAI then rejects the history as malformed; "{}" is
					// what an argument-less call means.
					args = "{}"
				}
				cm.ToolCalls = append(cm.ToolCalls, openai.ToolCall{
					ID:       tc.ID,
					Type:     openai.ToolTypeFunction,
					Function: openai.FunctionCall{Name: tc.Name, Arguments: args},
				})
				callNames[tc.ID] = tc.Name
			}
		case RoleTool:
			cm.ToolCallID = m.ToolCallID
			cm.Name = m.Name
			if cm.Name == "" {
				cm.Name = callNames[m.ToolCallID]
			}
		default:
			return creq, fmt.Errorf("model: message %d has unknown role %q", i, m.Role)
		}
		creq.Messages = append(creq.Messages, cm)
	}

	for _, t := range req.Tools {
		params := json.RawMessage(t.Parameters)
		if len(params) == 0 || string(params) == "null" {
			// Providers reject a function without a parameters schema, and
			// some reject an empty object, so describe "no arguments".
			params = json.RawMessage(`{"type":"object","properties":{}}`)
		}
		creq.Tools = append(creq.Tools, openai.Tool{
			Type: openai.ToolTypeFunction,
			Function: &openai.FunctionDefinition{
				Name:        t.Name,
				Description: t.Description,
				Parameters:  params,
			},
		})
	}
	return creq, nil
}

// chatParts maps content parts to go-openai's, sent as a content array.
func chatParts(parts []Part) ([]openai.ChatMessagePart, error) {
	out := make([]openai.ChatMessagePart, len(parts))
	for i, p := range parts {
		switch p.Type {
		case PartText:
			if p.Text == "" {
				// go-openai would drop the field, and providers refuse a
				// text part without text.
				return nil, fmt.Errorf("content part %d is empty text", i)
			}
			out[i] = openai.ChatMessagePart{Type: openai.ChatMessagePartTypeText, Text: p.Text}
		case PartImageURL:
			if p.ImageURL == "" {
				return nil, fmt.Errorf("content part %d is an image without a URL", i)
			}
			out[i] = openai.ChatMessagePart{Type: openai.ChatMessagePartTypeImageURL, ImageURL: &openai.ChatMessageImageURL{URL: p.ImageURL}}
		default:
			return nil, fmt.Errorf("content part %d has unknown type %q", i, p.Type)
		}
	}
	return out, nil
}

// usesMaxCompletionTokens reports models that reject max_tokens. go-openai
// refuses to even send max_tokens to them, so the choice has to follow the
// same name prefixes its validator uses.
func usesMaxCompletionTokens(model string) bool {
	for _, p := range []string{"o1", "o3", "o4", "gpt-5", "gpt-6"} {
		if strings.HasPrefix(model, p) {
			return true
		}
	}
	return false
}

// streamChunk is one decoded stream event. It embeds go-openai's chunk type
// but shadows Usage: go-openai decodes cached_tokens as a plain int, which
// cannot tell "provider reported 0 cached tokens" from "provider has no
// prompt cache", and Usage keeps that distinction.
type streamChunk struct {
	openai.ChatCompletionStreamResponse
	Usage *wireUsage `json:"usage"`
}

type wireUsage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails *struct {
		CachedTokens *int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// streamAccumulator builds a Response from stream chunks.
type streamAccumulator struct {
	chunks       int
	content      strings.Builder
	calls        []ToolCall
	callAt       map[int]int // provider's tool call index → position in calls
	finishReason string
	usage        *Usage
	model        string
}

func (a *streamAccumulator) add(raw []byte, onDelta func(Delta)) error {
	var chunk streamChunk
	if err := json.Unmarshal(raw, &chunk); err != nil {
		return fmt.Errorf("model: provider sent an undecodable stream chunk: %w", err)
	}
	a.chunks++
	if a.model == "" {
		a.model = chunk.Model
	}
	if u := chunk.Usage; u != nil {
		usage := &Usage{
			PromptTokens:     u.PromptTokens,
			CompletionTokens: u.CompletionTokens,
			TotalTokens:      u.TotalTokens,
		}
		if u.PromptTokensDetails != nil && u.PromptTokensDetails.CachedTokens != nil {
			cached := *u.PromptTokensDetails.CachedTokens
			usage.CachedTokens = &cached
		}
		// Some providers put a zeroed usage on early chunks and the real
		// one on the last; an all-zero report must not replace real counts.
		if a.usage == nil || !usage.isZero() {
			a.usage = usage
		}
	}
	for _, choice := range chunk.Choices {
		// We never ask for n > 1; other choices would be a provider bug and
		// mixing them in would corrupt the answer.
		if choice.Index != 0 {
			continue
		}
		if c := choice.Delta.Content; c != "" {
			a.content.WriteString(c)
			if onDelta != nil {
				onDelta(Delta{Content: c})
			}
		}
		for _, tc := range choice.Delta.ToolCalls {
			a.addToolCall(tc)
		}
		if choice.FinishReason != "" {
			a.finishReason = string(choice.FinishReason)
		}
	}
	return nil
}

// addToolCall merges one tool call fragment. The id and name arrive once
// (some providers repeat them; the first value is kept), the arguments in
// pieces. Empty ids and names are kept as sent: repairing them is a
// middleware decision, not the transport's.
func (a *streamAccumulator) addToolCall(tc openai.ToolCall) {
	pos := -1
	switch {
	case tc.Index != nil:
		if p, ok := a.callAt[*tc.Index]; ok {
			pos = p
		} else {
			if a.callAt == nil {
				a.callAt = map[int]int{}
			}
			a.callAt[*tc.Index] = len(a.calls)
		}
	default:
		// Some compatible servers omit the index. Then a new id starts a
		// new call and anything else continues the latest one.
		for i := range a.calls {
			if tc.ID != "" && a.calls[i].ID == tc.ID {
				pos = i
			}
		}
		if pos < 0 && tc.ID == "" && len(a.calls) > 0 {
			pos = len(a.calls) - 1
		}
	}
	if pos < 0 {
		a.calls = append(a.calls, ToolCall{})
		pos = len(a.calls) - 1
	}
	c := &a.calls[pos]
	if c.ID == "" {
		c.ID = tc.ID
	}
	if c.Name == "" {
		c.Name = tc.Function.Name
	}
	c.Arguments += tc.Function.Arguments
}

func (a *streamAccumulator) response() *Response {
	return &Response{
		Message: Message{
			Role:      RoleAssistant,
			Content:   a.content.String(),
			ToolCalls: a.calls,
		},
		FinishReason: a.finishReason,
		Usage:        a.usage,
		Model:        a.model,
	}
}

func (u *Usage) isZero() bool {
	return u.PromptTokens == 0 && u.CompletionTokens == 0 && u.TotalTokens == 0 &&
		(u.CachedTokens == nil || *u.CachedTokens == 0)
}

// convertError turns go-openai's errors into ours: cancellation wraps
// ctx.Err() (whatever the transport made of it), provider answers become
// *APIError, anything else is wrapped as is.
func convertError(ctx context.Context, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return fmt.Errorf("model: request aborted: %w", ctxErr)
	}
	// RequestError first: it is what go-openai returns when the error body
	// was not the usual JSON, and it may wrap a partial *openai.APIError
	// that lacks the status code.
	var reqErr *openai.RequestError
	if errors.As(err, &reqErr) {
		out := &APIError{StatusCode: reqErr.HTTPStatusCode}
		var inner *openai.APIError
		if errors.As(reqErr.Err, &inner) {
			out.Type, out.Code, out.Message = inner.Type, codeString(inner.Code), inner.Message
		}
		if out.Message == "" {
			out.Message = bodySnippet(reqErr.Body)
		}
		if out.Message == "" {
			out.Message = http.StatusText(reqErr.HTTPStatusCode)
		}
		return out
	}
	var apiErr *openai.APIError
	if errors.As(err, &apiErr) {
		out := &APIError{
			StatusCode: apiErr.HTTPStatusCode,
			Type:       apiErr.Type,
			Code:       codeString(apiErr.Code),
			Message:    apiErr.Message,
		}
		if out.StatusCode == 0 {
			// An error event inside a 200 stream has no HTTP status. Some
			// providers (OpenRouter, LiteLLM) put the upstream status in the
			// numeric code; otherwise StatusCode stays 0.
			if n, ok := apiErr.Code.(int); ok && n >= 400 && n < 600 {
				out.StatusCode = n
			}
		}
		return out
	}
	return fmt.Errorf("model: openai-compatible provider: %w", err)
}

func codeString(code any) string {
	switch c := code.(type) {
	case nil:
		return ""
	case int:
		// go-openai decodes "code": null (what OpenAI sends for most
		// errors) as the integer 0, so 0 means "no code".
		if c == 0 {
			return ""
		}
	}
	return fmt.Sprint(code)
}

// bodySnippet keeps error messages readable when a proxy answers with a
// whole HTML page.
func bodySnippet(body []byte) string {
	const limit = 512
	s := strings.TrimSpace(string(body))
	if len(s) > limit {
		cut := limit
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}
