package openaitest

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"
)

// Handler decides how the server answers one valid request. It runs on the
// request's own goroutine, so handlers shared across parallel requests must
// synchronise their own state.
type Handler func(req *Request) Reply

// Reply describes one answer. The zero Reply is a successful, empty
// assistant message with finish reason "stop". Fields combine: a reply can
// stream text and tool calls, slowly, and then be cut off.
type Reply struct {
	// Text is the assistant content.
	Text string
	// Chunks is how many stream chunks Text is split into; 0 sends one chunk
	// per word (with its trailing space), which is what real providers do
	// closely enough.
	Chunks int

	// ToolCalls are the calls the assistant makes, streamed one after the
	// other the way OpenAI does: a first fragment with index, id and name,
	// then the arguments in ArgChunks pieces (0 means 2, so clients always
	// have to assemble them).
	ToolCalls []Call
	ArgChunks int

	// FinishReason defaults to "tool_calls" when there are tool calls and to
	// "stop" otherwise.
	FinishReason string

	// Usage, when set, is sent as the final usage chunk if the client asked
	// for stream_options.include_usage, and in the body of a non-streaming
	// answer. Like OpenAI, nothing is sent when the client did not ask.
	Usage *Usage

	// Model is the model name reported; it defaults to the requested one.
	Model string

	// Delay is waited before the status line; ChunkDelay between stream
	// chunks. Both end early when the client disconnects.
	Delay      time.Duration
	ChunkDelay time.Duration

	// Status, when 400 or more, answers with that HTTP status and an
	// OpenAI-style error body built from ErrorType, ErrorCode and
	// ErrorMessage (defaults follow the status). ErrorBody, when set, is
	// sent verbatim instead, to imitate proxies that answer HTML or text.
	Status       int
	ErrorType    string
	ErrorCode    string
	ErrorMessage string
	ErrorBody    string

	// Truncate ends the stream cleanly after the initial role chunk and
	// TruncateAfter content and tool call chunks, without a finish reason, usage or [DONE], the way a
	// provider that crashes mid-answer looks to the client. A non-streaming
	// answer is cut in the middle of its JSON body instead.
	Truncate      bool
	TruncateAfter int

	// Drop is Truncate with the connection cut instead of the response
	// ended: after the same chunks the server closes the TCP connection
	// without finishing the chunked body, the way a crashed provider or a
	// proxy that gave up looks to the client. A non-streaming answer is cut
	// in the middle of its JSON body.
	Drop bool

	// Hang sends the response headers (for streams) and then nothing, until
	// the client disconnects or the test ends.
	Hang bool

	// Header is added to the response headers, whatever the status (for
	// example Retry-After on a 429 or a 503).
	Header http.Header

	// Raw, when non-nil, replaces every generated chunk of a stream: each
	// element is sent as one "data: <element>" event, ChunkDelay apart, and
	// nothing is added (include "[DONE]" yourself if you want it). It is the
	// escape hatch for wire shapes the other fields cannot express, such as
	// interleaved tool call fragments, an early zero-usage chunk or an error
	// event inside the stream. For a non-streaming request the elements are
	// concatenated into the body.
	Raw []string
}

// Call is one tool call of a Reply.
type Call struct {
	// ID defaults to a unique "call_<n>"; set NoID to send an empty id, as
	// some providers do, instead.
	ID   string
	NoID bool
	// Name is sent as is, even when empty.
	Name string
	// Arguments is sent as is, even when it is not valid JSON.
	Arguments string
}

// Usage is the token usage a Reply reports.
type Usage struct {
	PromptTokens     int
	CompletionTokens int
	// TotalTokens defaults to PromptTokens + CompletionTokens.
	TotalTokens int
	// CachedTokens, when non-nil, is sent as
	// usage.prompt_tokens_details.cached_tokens; when nil the details object
	// is left out, as providers without prompt caching do.
	CachedTokens *int
}

// Text is a reply streaming s and stopping.
func Text(s string) Reply { return Reply{Text: s} }

// ToolCall is a reply calling one tool with the given raw arguments.
func ToolCall(name, args string) Reply {
	return Reply{ToolCalls: []Call{{Name: name, Arguments: args}}}
}

// Error is a reply failing with an HTTP status and an OpenAI-style error
// body carrying message; an empty message uses the status text.
func Error(status int, message string) Reply {
	return Reply{Status: status, ErrorMessage: message}
}

// Script answers requests with replies in order. A request beyond the
// last reply fails the test through t and is answered 400 (not 5xx, so
// retrying clients stop instead of looping).
func Script(t testing.TB, replies ...Reply) Handler {
	var (
		mu   sync.Mutex
		next int
	)
	return func(req *Request) Reply {
		mu.Lock()
		i := next
		next++
		mu.Unlock()
		if i >= len(replies) {
			t.Errorf("openaitest: request %d arrived but the script has only %d replies", req.Index, len(replies))
			return Reply{
				Status:       http.StatusBadRequest,
				ErrorCode:    "script_exhausted",
				ErrorMessage: fmt.Sprintf("openaitest: script exhausted after %d replies", len(replies)),
			}
		}
		return replies[i]
	}
}

// defaultErrorType mirrors the error types OpenAI uses for each status, so
// clients that look at the type see something realistic.
func defaultErrorType(status int) (typ, code string) {
	switch {
	case status == http.StatusUnauthorized:
		return "invalid_request_error", "invalid_api_key"
	case status == http.StatusTooManyRequests:
		return "requests", "rate_limit_exceeded"
	case status == http.StatusNotFound:
		return "invalid_request_error", "model_not_found"
	case status >= 500:
		return "server_error", ""
	default:
		return "invalid_request_error", ""
	}
}
