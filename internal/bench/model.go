package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/natsagent/natsagent/internal/model"
)

// Model modes.
const (
	ModelInProcess = "in-process"
	ModelHTTP      = "http"
)

// policy decides the answer to one model call. The in-process model and
// the HTTP model server share it, so both modes answer alike.
type policy func(req *model.Request) model.Reply

// streamingReply answers with pieces words, the whole answer taking
// latency: the first piece comes after latency/pieces, the others follow
// at the same pace.
func streamingReply(latency time.Duration, pieces int) model.Reply {
	pieces = max(pieces, 1)
	words := make([]string, pieces)
	for i := range words {
		words[i] = "ok"
	}
	step := latency / time.Duration(pieces)
	return model.Reply{Text: strings.Join(words, " "), Pieces: pieces, Delay: step, PieceDelay: step}
}

// fixed answers every call alike.
func fixed(r model.Reply) policy { return func(*model.Request) model.Reply { return r } }

// inProcessModel is a model behind the Model interface: no HTTP, no JSON,
// so what is measured is the queue's own cost.
func inProcessModel(p policy) model.Model {
	return model.Func(func(ctx context.Context, req *model.Request, onDelta func(model.Delta)) (*model.Response, error) {
		return model.NewFixed(p(req)).Generate(ctx, req, onDelta)
	})
}

// modelServer is a minimal OpenAI-compatible chat completions server on
// loopback: it streams the policy's answer with its delays, for end-to-end
// measurements through model.OpenAI.
type modelServer struct {
	srv *http.Server
	url string
}

func startModelServer(p policy) (*modelServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("model server: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { serveCompletion(w, r, p) })
	s := &modelServer{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}, url: "http://" + ln.Addr().String() + "/v1"}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

func (s *modelServer) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if s.srv.Shutdown(ctx) != nil {
		_ = s.srv.Close()
	}
}

// client returns a model.OpenAI for the server, with a connection pool as
// large as the bench's concurrency (the default transport keeps two idle
// connections per host, which would measure connection set-up instead).
func (s *modelServer) client() (model.Model, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns, tr.MaxIdleConnsPerHost = 4096, 4096
	return model.NewOpenAI(model.OpenAIConfig{BaseURL: s.url, Model: "bench", HTTPClient: &http.Client{Transport: tr}})
}

type wireRequest struct {
	Model    string `json:"model"`
	Stream   bool   `json:"stream"`
	Messages []struct {
		Role       string `json:"role"`
		Content    string `json:"content"`
		Name       string `json:"name"`
		ToolCallID string `json:"tool_call_id"`
	} `json:"messages"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

func serveCompletion(w http.ResponseWriter, r *http.Request, p policy) {
	var in wireRequest
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		http.Error(w, `{"error":{"message":"request body is not JSON","type":"invalid_request_error"}}`, http.StatusBadRequest)
		return
	}
	if !in.Stream {
		http.Error(w, `{"error":{"message":"the bench model server only streams","type":"invalid_request_error"}}`, http.StatusBadRequest)
		return
	}
	req := &model.Request{Model: in.Model}
	for _, m := range in.Messages {
		req.Messages = append(req.Messages, model.Message{Role: m.Role, Content: m.Content, Name: m.Name, ToolCallID: m.ToolCallID})
	}
	reply := p(req)
	ctx := r.Context()
	if !sleepCtx(ctx, reply.Delay) {
		return
	}
	if reply.Err != nil {
		http.Error(w, fmt.Sprintf(`{"error":{"message":%q,"type":"server_error"}}`, reply.Err.Error()), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	flusher, _ := w.(http.Flusher)
	created := time.Now().Unix()
	send := func(choices []map[string]any, usage map[string]any) bool {
		chunk := map[string]any{"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": created, "model": "bench", "choices": choices}
		if usage != nil {
			chunk["usage"] = usage
		}
		data, _ := json.Marshal(chunk)
		if _, err := fmt.Fprintf(w, "data: %s\n\n", data); err != nil {
			return false
		}
		if flusher != nil {
			flusher.Flush()
		}
		return true
	}
	for i, piece := range splitWords(reply.Text, reply.Pieces) {
		if i > 0 && !sleepCtx(ctx, reply.PieceDelay) {
			return
		}
		delta := map[string]any{"content": piece}
		if i == 0 {
			delta["role"] = "assistant"
		}
		if !send([]map[string]any{{"index": 0, "delta": delta, "finish_reason": nil}}, nil) {
			return
		}
	}
	finish := model.FinishStop
	if len(reply.ToolCalls) > 0 {
		finish = model.FinishToolCalls
		calls := make([]map[string]any, len(reply.ToolCalls))
		for i, c := range reply.ToolCalls {
			calls[i] = map[string]any{"index": i, "id": c.ID, "type": "function", "function": map[string]any{"name": c.Name, "arguments": c.Arguments}}
		}
		if !send([]map[string]any{{"index": 0, "delta": map[string]any{"tool_calls": calls}, "finish_reason": nil}}, nil) {
			return
		}
	}
	if !send([]map[string]any{{"index": 0, "delta": map[string]any{}, "finish_reason": finish}}, nil) {
		return
	}
	if in.StreamOptions != nil && in.StreamOptions.IncludeUsage {
		out := len(reply.Text)/4 + 1
		if !send([]map[string]any{}, map[string]any{"prompt_tokens": 10, "completion_tokens": out, "total_tokens": 10 + out}) {
			return
		}
	}
	_, _ = fmt.Fprint(w, "data: [DONE]\n\n")
	if flusher != nil {
		flusher.Flush()
	}
}

// splitWords cuts s into about n pieces at word boundaries, as the
// in-process model does.
func splitWords(s string, n int) []string {
	if s == "" {
		return nil
	}
	words := strings.SplitAfter(s, " ")
	n = min(max(n, 1), len(words))
	per := (len(words) + n - 1) / n
	var out []string
	for i := 0; i < len(words); i += per {
		out = append(out, strings.Join(words[i:min(i+per, len(words))], ""))
	}
	return out
}

// sleepCtx waits d; false when ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
