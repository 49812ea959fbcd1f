package openaitest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"
)

// callSeq numbers generated tool call ids across all servers of the test
// binary, so ids never repeat even when a test uses several servers.
var callSeq atomic.Int64

// Wire shapes of the answers. They are our own structs, not the client
// library's, so the server cannot silently agree with a client bug.
type (
	wireChunk struct {
		ID      string       `json:"id"`
		Object  string       `json:"object"`
		Created int64        `json:"created"`
		Model   string       `json:"model"`
		Choices []wireChoice `json:"choices"`
		Usage   *wireUsage   `json:"usage,omitempty"`
	}
	wireChoice struct {
		Index        int        `json:"index"`
		Delta        *wireDelta `json:"delta,omitempty"`
		Message      *wireDelta `json:"message,omitempty"`
		FinishReason *string    `json:"finish_reason"`
	}
	wireDelta struct {
		Role      string         `json:"role,omitempty"`
		Content   *string        `json:"content,omitempty"`
		ToolCalls []wireToolCall `json:"tool_calls,omitempty"`
	}
	wireToolCall struct {
		Index    *int         `json:"index,omitempty"`
		ID       string       `json:"id,omitempty"`
		Type     string       `json:"type,omitempty"`
		Function wireFunction `json:"function"`
	}
	wireFunction struct {
		Name      string `json:"name,omitempty"`
		Arguments string `json:"arguments"`
	}
	wireUsage struct {
		PromptTokens        int                `json:"prompt_tokens"`
		CompletionTokens    int                `json:"completion_tokens"`
		TotalTokens         int                `json:"total_tokens"`
		PromptTokensDetails *wireTokensDetails `json:"prompt_tokens_details,omitempty"`
	}
	wireTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	}
	wireError struct {
		Error wireErrorBody `json:"error"`
	}
	wireErrorBody struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	}
)

func writeError(w http.ResponseWriter, status int, typ, code, message string) {
	body := wireError{Error: wireErrorBody{Message: message, Type: typ}}
	if code != "" {
		body.Error.Code = &code
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

// wait sleeps for d unless the client goes away or the server closes first;
// it reports whether the handler should carry on.
func (s *Server) wait(r *http.Request, d time.Duration) bool {
	if d <= 0 {
		return r.Context().Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-r.Context().Done():
		return false
	case <-s.done:
		return false
	}
}

func (s *Server) write(w http.ResponseWriter, r *http.Request, req *Request, reply Reply) {
	if !s.wait(r, reply.Delay) {
		return
	}
	for k, v := range reply.Header {
		w.Header()[http.CanonicalHeaderKey(k)] = append([]string(nil), v...)
	}
	if reply.Status >= 400 {
		if reply.ErrorBody != "" {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(reply.Status)
			_, _ = w.Write([]byte(reply.ErrorBody))
			return
		}
		typ, code := defaultErrorType(reply.Status)
		if reply.ErrorType != "" {
			typ = reply.ErrorType
		}
		if reply.ErrorCode != "" {
			code = reply.ErrorCode
		}
		msg := reply.ErrorMessage
		if msg == "" {
			msg = http.StatusText(reply.Status)
		}
		writeError(w, reply.Status, typ, code, msg)
		return
	}

	model := reply.Model
	if model == "" {
		model = req.Model
	}
	calls := make([]Call, len(reply.ToolCalls))
	for i, c := range reply.ToolCalls {
		if c.ID == "" && !c.NoID {
			c.ID = fmt.Sprintf("call_%d", callSeq.Add(1))
		}
		calls[i] = c
	}
	finish := reply.FinishReason
	if finish == "" {
		finish = "stop"
		if len(calls) > 0 {
			finish = "tool_calls"
		}
	}
	id := fmt.Sprintf("chatcmpl-openaitest-%d", req.Index)

	if req.Stream {
		s.writeStream(w, r, req, reply, id, model, calls, finish)
	} else {
		s.writeBody(w, r, reply, id, model, calls, finish)
	}
}

func (s *Server) writeBody(w http.ResponseWriter, r *http.Request, reply Reply, id, model string, calls []Call, finish string) {
	if reply.Hang {
		s.wait(r, time.Hour)
		return
	}
	if reply.Raw != nil {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(strings.Join(reply.Raw, "")))
		return
	}
	msg := &wireDelta{Role: "assistant"}
	// OpenAI sends "content": null for a pure tool call answer; keep it.
	if reply.Text != "" || len(calls) == 0 {
		text := reply.Text
		msg.Content = &text
	}
	for _, c := range calls {
		msg.ToolCalls = append(msg.ToolCalls, wireToolCall{
			ID: c.ID, Type: "function",
			Function: wireFunction{Name: c.Name, Arguments: c.Arguments},
		})
	}
	body := wireChunk{
		ID: id, Object: "chat.completion", Created: time.Now().Unix(), Model: model,
		Choices: []wireChoice{{Message: msg, FinishReason: &finish}},
		Usage:   reply.Usage.wire(),
	}
	data, _ := json.Marshal(body)
	if reply.Truncate || reply.Drop {
		data = data[:len(data)/2]
	}
	w.Header().Set("Content-Type", "application/json")
	if reply.Drop {
		// Announce the whole length, send half, and cut the connection.
		w.Header().Set("Content-Length", strconv.Itoa(2*len(data)+1))
	}
	_, _ = w.Write(data)
	if reply.Drop {
		dropConnection(w)
	}
}

// dropConnection closes the client's connection without ending the
// response: net/http aborts a handler that panics with ErrAbortHandler,
// quietly, leaving the client with an unexpected EOF.
func dropConnection(w http.ResponseWriter) {
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	panic(http.ErrAbortHandler)
}

func (s *Server) writeStream(w http.ResponseWriter, r *http.Request, req *Request, reply Reply, id, model string, calls []Call, finish string) {
	flusher, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	if flusher != nil {
		flusher.Flush()
	}
	if reply.Hang {
		s.wait(r, time.Hour)
		return
	}

	var events []string
	if reply.Raw != nil {
		events = reply.Raw
	} else {
		created := time.Now().Unix()
		chunk := func(c wireChoice, u *wireUsage) string {
			ch := wireChunk{ID: id, Object: "chat.completion.chunk", Created: created, Model: model, Usage: u}
			if c.Delta != nil || c.FinishReason != nil {
				ch.Choices = []wireChoice{c}
			} else {
				ch.Choices = []wireChoice{}
			}
			data, _ := json.Marshal(ch)
			return string(data)
		}
		empty := ""
		events = append(events, chunk(wireChoice{Delta: &wireDelta{Role: "assistant", Content: &empty}}, nil))
		for _, piece := range split(reply.Text, reply.Chunks) {
			events = append(events, chunk(wireChoice{Delta: &wireDelta{Content: &piece}}, nil))
		}
		argChunks := reply.ArgChunks
		if argChunks <= 0 {
			argChunks = 2
		}
		for i, c := range calls {
			idx := i
			events = append(events, chunk(wireChoice{Delta: &wireDelta{ToolCalls: []wireToolCall{{
				Index: &idx, ID: c.ID, Type: "function", Function: wireFunction{Name: c.Name},
			}}}}, nil))
			for _, piece := range splitEven(c.Arguments, argChunks) {
				events = append(events, chunk(wireChoice{Delta: &wireDelta{ToolCalls: []wireToolCall{{
					Index: &idx, Function: wireFunction{Arguments: piece},
				}}}}, nil))
			}
		}
		if reply.Truncate || reply.Drop {
			// The role chunk always goes out, so the client sees an open,
			// healthy stream before it stops.
			n := min(1+max(reply.TruncateAfter, 0), len(events))
			events = events[:n]
		} else {
			events = append(events, chunk(wireChoice{Delta: &wireDelta{}, FinishReason: &finish}, nil))
			if req.IncludeUsage() && reply.Usage != nil {
				events = append(events, chunk(wireChoice{}, reply.Usage.wire()))
			}
			events = append(events, "[DONE]")
		}
	}

	for i, ev := range events {
		if i > 0 && !s.wait(r, reply.ChunkDelay) {
			return
		}
		if _, err := fmt.Fprintf(w, "data: %s\n\n", ev); err != nil {
			return
		}
		if flusher != nil {
			flusher.Flush()
		}
	}
	if reply.Drop {
		dropConnection(w)
	}
}

func (u *Usage) wire() *wireUsage {
	if u == nil {
		return nil
	}
	out := &wireUsage{
		PromptTokens:     u.PromptTokens,
		CompletionTokens: u.CompletionTokens,
		TotalTokens:      u.TotalTokens,
	}
	if out.TotalTokens == 0 {
		out.TotalTokens = u.PromptTokens + u.CompletionTokens
	}
	if u.CachedTokens != nil {
		out.PromptTokensDetails = &wireTokensDetails{CachedTokens: *u.CachedTokens}
	}
	return out
}

// split cuts s into n pieces of similar length, or into words with their
// trailing whitespace when n <= 0. Joining the pieces gives s back.
func split(s string, n int) []string {
	if s == "" {
		return nil
	}
	if n > 0 {
		return splitEven(s, n)
	}
	var pieces []string
	start := 0
	inSpace := false
	for i, r := range s {
		space := unicode.IsSpace(r)
		if inSpace && !space {
			pieces = append(pieces, s[start:i])
			start = i
		}
		inSpace = space
	}
	return append(pieces, s[start:])
}

// splitEven cuts s into at most n pieces of similar length on rune
// boundaries, so multi-byte characters are never torn apart.
func splitEven(s string, n int) []string {
	if s == "" {
		return nil
	}
	runes := utf8.RuneCountInString(s)
	n = min(n, runes)
	pieces := make([]string, 0, n)
	per := runes / n
	extra := runes % n
	for i := 0; i < n; i++ {
		size := per
		if i < extra {
			size++
		}
		end := 0
		for k := 0; k < size; k++ {
			_, w := utf8.DecodeRuneInString(s[end:])
			end += w
		}
		pieces = append(pieces, s[:end])
		s = s[end:]
	}
	return pieces
}
