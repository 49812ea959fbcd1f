// Package openaitest runs an OpenAI-compatible /v1/chat/completions server
// on loopback for tests in every package. It exists so tests exercise the
// real HTTP client, SSE framing and error bodies instead of a mock of the
// client library, and so every transcript the system sends is checked as
// strictly as the pickiest real provider would check it.
//
// A test builds a Server with a Handler (usually Script) and points the
// code under test at Server.URL():
//
//	srv := openaitest.NewServer(t, openaitest.Script(t,
//		openaitest.ToolCall("current_time", `{}`),
//		openaitest.Text("It is noon."),
//	))
//	m, _ := model.NewOpenAI(model.OpenAIConfig{BaseURL: srv.URL(), Model: "test"})
//	...
//	if v := srv.Violations(); len(v) > 0 { t.Fatal(v) }
package openaitest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// chatPath and embeddingsPath are the endpoints served; everything else
// answers 404 so a client built with a wrong base URL fails loudly
// instead of hanging.
const chatPath = "/v1/chat/completions"

// Server is an OpenAI-compatible chat completions endpoint on loopback. It
// is safe for concurrent use; requests are handled in parallel, as a real
// provider would.
type Server struct {
	t       testing.TB
	handler Handler
	srv     *httptest.Server

	// done is closed before the httptest server shuts down, so handlers that
	// hang or sleep give up instead of making Close wait for them forever.
	done chan struct{}

	mu         sync.Mutex
	requests   []Request
	violations []string
	embeddings int // embeddings requests received
	// prompts is the last prompt of each conversation, when the server
	// simulates prompt caching (cache.go); nil otherwise.
	prompts map[string][]byte
}

// NewServer starts a server answering with h and closes it when the test
// ends. A nil h answers every valid request with the text "ok".
func NewServer(t testing.TB, h Handler) *Server {
	t.Helper()
	if h == nil {
		h = func(*Request) Reply { return Text("ok") }
	}
	s := &Server{t: t, handler: h, done: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc(chatPath, s.serveChat)
	mux.HandleFunc(embeddingsPath, s.serveEmbeddings)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "invalid_request_error", "unknown_url",
			fmt.Sprintf("openaitest: no route for %s %s (base URL must end in /v1)", r.Method, r.URL.Path))
	})
	s.srv = httptest.NewServer(mux)
	t.Cleanup(s.close)
	return s
}

// URL is the base URL to configure a client with; it ends in /v1, like
// https://api.openai.com/v1.
func (s *Server) URL() string { return s.srv.URL + "/v1" }

// Requests returns copies of the requests received so far, in arrival
// order, including the ones rejected by validation.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Request, len(s.requests))
	for i, r := range s.requests {
		out[i] = r.clone()
	}
	return out
}

// Count is the number of chat completion requests received so far.
func (s *Server) Count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.requests)
}

// Violations returns every transcript rule broken by a request so far, one
// line each, prefixed with the request number. A test that drives a whole
// run should assert it is empty: a real provider would have answered 400.
func (s *Server) Violations() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.violations...)
}

func (s *Server) close() {
	close(s.done)
	// Active streams would otherwise keep Close waiting for their handlers.
	s.srv.CloseClientConnections()
	s.srv.Close()
}

func (s *Server) serveChat(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		writeError(w, http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed",
			"openaitest: chat completions only accept POST")
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		// The client went away while sending; there is no one to answer.
		return
	}

	req := &Request{Raw: json.RawMessage(body)}
	var problems []string
	if err := json.Unmarshal(body, req); err != nil {
		req = &Request{Raw: json.RawMessage(body)}
		problems = []string{"request body is not a valid chat completion request: " + err.Error()}
	} else {
		problems = Validate(req)
	}

	s.mu.Lock()
	req.Index = len(s.requests)
	s.requests = append(s.requests, req.clone())
	for _, p := range problems {
		s.violations = append(s.violations, fmt.Sprintf("request %d: %s", req.Index, p))
	}
	s.mu.Unlock()

	if len(problems) > 0 {
		for _, p := range problems {
			s.t.Logf("openaitest: request %d rejected: %s", req.Index, p)
		}
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_transcript",
			"openaitest: invalid transcript: "+joinProblems(problems))
		return
	}

	reply := s.handler(req)
	if reply.Status < 400 {
		if u, ok := s.cachedUsage(req, reply); ok {
			reply.Usage = u
		}
	}
	s.write(w, r, req, reply)
}

func joinProblems(ps []string) string {
	out := ps[0]
	for _, p := range ps[1:] {
		out += "; " + p
	}
	return out
}
