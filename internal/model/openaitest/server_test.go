package openaitest_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/natsagent/natsagent/internal/model/openaitest"
)

// msg and call keep transcripts in the tests short.
func msg(role, content string) map[string]any {
	return map[string]any{"role": role, "content": content}
}

func toolMsg(id, name, content string) map[string]any {
	m := map[string]any{"role": "tool", "content": content, "tool_call_id": id}
	if name != "" {
		m["name"] = name
	}
	return m
}

func callMsg(content string, calls ...[2]string) map[string]any {
	m := map[string]any{"role": "assistant", "content": content}
	var tcs []map[string]any
	for _, c := range calls {
		tcs = append(tcs, map[string]any{
			"id": c[0], "type": "function",
			"function": map[string]any{"name": c[1], "arguments": "{}"},
		})
	}
	m["tool_calls"] = tcs
	return m
}

func tools(names ...string) []map[string]any {
	var out []map[string]any
	for _, n := range names {
		out = append(out, map[string]any{"type": "function", "function": map[string]any{
			"name": n, "parameters": map[string]any{"type": "object", "properties": map[string]any{}},
		}})
	}
	return out
}

func post(t *testing.T, url string, body any) (int, []byte) {
	t.Helper()
	var data []byte
	switch b := body.(type) {
	case string:
		data = []byte(b)
	default:
		var err error
		if data, err = json.Marshal(body); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := http.Post(url+"/chat/completions", "application/json", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, out
}

func mustNotBeCalled(t *testing.T) openaitest.Handler {
	return func(req *openaitest.Request) openaitest.Reply {
		t.Errorf("handler called for request %d, which should have been rejected", req.Index)
		return openaitest.Text("unexpected")
	}
}

func TestValidTranscriptIsAccepted(t *testing.T) {
	srv := openaitest.NewServer(t, func(req *openaitest.Request) openaitest.Reply {
		return openaitest.Text("last was " + req.LastMessage().Role)
	})
	body := map[string]any{
		"model": "m",
		"tools": tools("a", "b"),
		"messages": []any{
			msg("system", "be brief"),
			msg("user", "do two things"),
			callMsg("", [2]string{"c1", "a"}, [2]string{"c2", "b"}),
			// Answers may come in any order inside the block.
			toolMsg("c2", "b", "B done"),
			toolMsg("c1", "a", "A done"),
			msg("assistant", "both done"),
			msg("user", "again"),
			callMsg("working on it", [2]string{"c3", "a"}),
			toolMsg("c3", "a", ""),
		},
	}
	status, out := post(t, srv.URL(), body)
	if status != http.StatusOK || !strings.Contains(string(out), "last was tool") {
		t.Fatalf("status %d: %s", status, out)
	}
	if v := srv.Violations(); len(v) != 0 {
		t.Fatalf("violations: %v", v)
	}
	reqs := srv.Requests()
	if srv.Count() != 1 || len(reqs) != 1 {
		t.Fatalf("count %d, %d requests recorded", srv.Count(), len(reqs))
	}
	got := reqs[0]
	if got.Model != "m" || len(got.Messages) != 9 || len(got.Tools) != 2 {
		t.Fatalf("decoded request: %+v", got)
	}
	if tc := got.Messages[2].ToolCalls; len(tc) != 2 || tc[1].ID != "c2" || tc[1].Function.Name != "b" {
		t.Fatalf("decoded tool calls: %+v", tc)
	}
	if got.Messages[3].ToolCallID != "c2" || got.Messages[3].Name != "b" {
		t.Fatalf("decoded tool message: %+v", got.Messages[3])
	}
}

func TestValidationRejects(t *testing.T) {
	cases := []struct {
		name     string
		tools    []map[string]any
		messages []any
		want     string
	}{
		{"no messages", nil, []any{}, "no messages"},
		{"system not first", nil, []any{msg("user", "hi"), msg("system", "late")}, "system message is only allowed as the first"},
		{"unknown role", nil, []any{msg("user", "hi"), msg("developer", "x")}, `unknown role "developer"`},
		{"empty assistant", nil, []any{msg("user", "hi"), msg("assistant", "")}, "neither content nor tool calls"},
		{"orphan after user", nil, []any{msg("user", "hi"), toolMsg("c1", "a", "r")}, "orphan"},
		{"orphan wrong id", nil, []any{
			msg("user", "hi"), callMsg("", [2]string{"c1", "a"}), toolMsg("c1", "a", "r"), toolMsg("zz", "a", "r"),
		}, `answers "zz", which is not a tool call`},
		{"tool after non-tool", nil, []any{
			msg("user", "hi"), callMsg("", [2]string{"c1", "a"}), toolMsg("c1", "a", "r"),
			msg("user", "more"), toolMsg("c1", "a", "again"),
		}, "does not directly follow"},
		{"unanswered before next message", nil, []any{
			msg("user", "hi"), callMsg("", [2]string{"c1", "a"}, [2]string{"c2", "a"}), toolMsg("c1", "a", "r"),
			msg("user", "more"),
		}, `tool call "c2" (a) is not answered by a tool message before message 3`},
		{"unanswered at end", nil, []any{
			msg("user", "hi"), callMsg("", [2]string{"c1", "a"}),
		}, "not answered by a tool message at the end"},
		{"answered twice", nil, []any{
			msg("user", "hi"), callMsg("", [2]string{"c1", "a"}), toolMsg("c1", "a", "r"), toolMsg("c1", "a", "r"),
		}, `"c1" is answered twice`},
		{"duplicate call id", nil, []any{
			msg("user", "hi"), callMsg("", [2]string{"c1", "a"}, [2]string{"c1", "a"}), toolMsg("c1", "a", "r"),
		}, `tool call id "c1" is used twice`},
		{"empty call id", nil, []any{
			msg("user", "hi"), callMsg("", [2]string{"", "a"}),
		}, "tool call 0 has an empty id"},
		{"empty call name", nil, []any{
			msg("user", "hi"), callMsg("", [2]string{"c1", ""}), toolMsg("c1", "a", "r"),
		}, "tool call 0 has an empty name"},
		{"tool message empty id", nil, []any{
			msg("user", "hi"), callMsg("", [2]string{"c1", "a"}), toolMsg("c1", "a", "r"), toolMsg("", "a", "r"),
		}, "empty tool_call_id"},
		{"tool message empty name", nil, []any{
			msg("user", "hi"), callMsg("", [2]string{"c1", "a"}), toolMsg("c1", "", "r"),
		}, "tool message has an empty name"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := openaitest.NewServer(t, mustNotBeCalled(t))
			body := map[string]any{"model": "m", "messages": tc.messages}
			if tc.tools != nil {
				body["tools"] = tc.tools
			}
			status, out := post(t, srv.URL(), body)
			if status != http.StatusBadRequest {
				t.Fatalf("status %d, want 400: %s", status, out)
			}
			var e struct {
				Error struct{ Message, Type string }
			}
			if err := json.Unmarshal(out, &e); err != nil {
				t.Fatalf("error body is not OpenAI-style JSON: %v: %s", err, out)
			}
			if e.Error.Type != "invalid_request_error" || !strings.Contains(e.Error.Message, tc.want) {
				t.Fatalf("error %+v, want message containing %q", e.Error, tc.want)
			}
			v := srv.Violations()
			if len(v) != 1 || !strings.Contains(v[0], tc.want) || !strings.HasPrefix(v[0], "request 0: ") {
				t.Fatalf("violations %q, want exactly one containing %q", v, tc.want)
			}
			if srv.Count() != 1 {
				t.Fatalf("rejected request not recorded: count %d", srv.Count())
			}
		})
	}
}

func TestUndecodableRequestIsAViolation(t *testing.T) {
	srv := openaitest.NewServer(t, mustNotBeCalled(t))
	// Content is a string or an array of parts, never an object.
	status, _ := post(t, srv.URL(), `{"model":"m","messages":[{"role":"user","content":{"type":"text","text":"hi"}}]}`)
	if status != http.StatusBadRequest {
		t.Fatalf("status %d, want 400", status)
	}
	v := srv.Violations()
	if len(v) != 1 || !strings.Contains(v[0], "not a valid chat completion request") {
		t.Fatalf("violations %q", v)
	}
	if reqs := srv.Requests(); len(reqs) != 1 || !strings.Contains(string(reqs[0].Raw), `"text":"hi"`) {
		t.Fatalf("raw body not kept: %+v", reqs)
	}
}

func TestUnknownPathIs404(t *testing.T) {
	srv := openaitest.NewServer(t, nil)
	resp, err := http.Post(strings.TrimSuffix(srv.URL(), "/v1")+"/chat/completions", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("status %d, want 404", resp.StatusCode)
	}
}

// sseEvents reads a whole SSE body and returns the data payloads.
func sseEvents(t *testing.T, body io.Reader) []string {
	t.Helper()
	var events []string
	sc := bufio.NewScanner(body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("unexpected SSE line %q", line)
		}
		events = append(events, data)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return events
}

func streamRequest(t *testing.T, srv *openaitest.Server, includeUsage bool) []string {
	t.Helper()
	body := map[string]any{"model": "m", "stream": true, "messages": []any{msg("user", "hi")}}
	if includeUsage {
		body["stream_options"] = map[string]any{"include_usage": true}
	}
	data, _ := json.Marshal(body)
	resp, err := http.Post(srv.URL()+"/chat/completions", "application/json", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	return sseEvents(t, resp.Body)
}

type wireChunk struct {
	Model   string `json:"model"`
	Choices []struct {
		Delta struct {
			Content   *string `json:"content"`
			ToolCalls []struct {
				Index    *int   `json:"index"`
				ID       string `json:"id"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		TotalTokens         int `json:"total_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

func decodeChunks(t *testing.T, events []string) []wireChunk {
	t.Helper()
	var out []wireChunk
	for _, ev := range events {
		if ev == "[DONE]" {
			continue
		}
		var c wireChunk
		if err := json.Unmarshal([]byte(ev), &c); err != nil {
			t.Fatalf("bad chunk %q: %v", ev, err)
		}
		out = append(out, c)
	}
	return out
}

func TestStreamWireFormat(t *testing.T) {
	cached := 7
	srv := openaitest.NewServer(t, func(*openaitest.Request) openaitest.Reply {
		return openaitest.Reply{
			Text: "one two three", Chunks: 2,
			ToolCalls: []openaitest.Call{{Name: "a", Arguments: `{"x":1}`}, {Name: "b", Arguments: `{}`, NoID: true}},
			Usage:     &openaitest.Usage{PromptTokens: 10, CompletionTokens: 5, CachedTokens: &cached},
		}
	})

	events := streamRequest(t, srv, true)
	if events[len(events)-1] != "[DONE]" {
		t.Fatalf("stream does not end with [DONE]: %q", events)
	}
	chunks := decodeChunks(t, events)
	var text string
	args := map[int]string{}
	ids := map[int]string{}
	names := map[int]string{}
	var finish string
	for _, c := range chunks {
		for _, ch := range c.Choices {
			if ch.Delta.Content != nil {
				text += *ch.Delta.Content
			}
			for _, tc := range ch.Delta.ToolCalls {
				if tc.Index == nil {
					t.Fatalf("tool call fragment without index: %+v", tc)
				}
				ids[*tc.Index] += tc.ID
				names[*tc.Index] += tc.Function.Name
				args[*tc.Index] += tc.Function.Arguments
			}
			if ch.FinishReason != nil {
				finish = *ch.FinishReason
			}
		}
	}
	if text != "one two three" {
		t.Errorf("text %q", text)
	}
	if names[0] != "a" || names[1] != "b" || args[0] != `{"x":1}` || args[1] != `{}` {
		t.Errorf("tool calls: names %v args %v", names, args)
	}
	if !strings.HasPrefix(ids[0], "call_") || ids[1] != "" {
		t.Errorf("tool call ids %v, want generated and empty (NoID)", ids)
	}
	if finish != "tool_calls" {
		t.Errorf("finish reason %q", finish)
	}
	last := chunks[len(chunks)-1]
	if last.Usage == nil || len(last.Choices) != 0 || last.Usage.TotalTokens != 15 ||
		last.Usage.PromptTokensDetails == nil || last.Usage.PromptTokensDetails.CachedTokens != 7 {
		t.Errorf("usage chunk %+v", last)
	}

	// Without include_usage no usage is sent, like OpenAI.
	for _, c := range decodeChunks(t, streamRequest(t, srv, false)) {
		if c.Usage != nil {
			t.Fatalf("usage sent although not asked for: %+v", c.Usage)
		}
	}
	if reqs := srv.Requests(); len(reqs) != 2 || !reqs[0].IncludeUsage() || reqs[1].IncludeUsage() || !reqs[1].Stream {
		t.Fatalf("recorded stream flags wrong: %+v", reqs)
	}
}

func TestTruncatedStream(t *testing.T) {
	srv := openaitest.NewServer(t, func(*openaitest.Request) openaitest.Reply {
		return openaitest.Reply{Text: "a b c d", Truncate: true, TruncateAfter: 2}
	})
	events := streamRequest(t, srv, true)
	if len(events) != 3 {
		t.Fatalf("got %d events, want role chunk + 2: %q", len(events), events)
	}
	for _, c := range decodeChunks(t, events) {
		for _, ch := range c.Choices {
			if ch.FinishReason != nil {
				t.Fatalf("truncated stream has finish reason %q", *ch.FinishReason)
			}
		}
	}
	for _, ev := range events {
		if ev == "[DONE]" {
			t.Fatal("truncated stream sent [DONE]")
		}
	}
}

func TestRawEvents(t *testing.T) {
	srv := openaitest.NewServer(t, func(*openaitest.Request) openaitest.Reply {
		return openaitest.Reply{Raw: []string{`{"x":1}`, "[DONE]"}}
	})
	events := streamRequest(t, srv, false)
	if len(events) != 2 || events[0] != `{"x":1}` || events[1] != "[DONE]" {
		t.Fatalf("raw events %q", events)
	}
}

// The go-openai round trips check the server speaks what a real client
// expects, not just what this package's own decoder accepts.

func newClient(srv *openaitest.Server) *openai.Client {
	cfg := openai.DefaultConfig("test-key")
	cfg.BaseURL = srv.URL()
	return openai.NewClientWithConfig(cfg)
}

func TestGoOpenAIStreamRoundTrip(t *testing.T) {
	srv := openaitest.NewServer(t, openaitest.Script(t,
		openaitest.Reply{Text: "héllo wörld", Chunks: 4, Model: "served-model"},
	))
	stream, err := newClient(srv).CreateChatCompletionStream(context.Background(), openai.ChatCompletionRequest{
		Model:    "asked-model",
		Messages: []openai.ChatCompletionMessage{{Role: "user", Content: "hi"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	var text, finish, model string
	pieces := 0
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		model = resp.Model
		for _, ch := range resp.Choices {
			if ch.Delta.Content != "" {
				pieces++
				text += ch.Delta.Content
			}
			if ch.FinishReason != "" {
				finish = string(ch.FinishReason)
			}
		}
	}
	if text != "héllo wörld" || pieces != 4 || finish != "stop" || model != "served-model" {
		t.Fatalf("text %q in %d pieces, finish %q, model %q", text, pieces, finish, model)
	}
}

func TestGoOpenAINonStreaming(t *testing.T) {
	srv := openaitest.NewServer(t, openaitest.Script(t,
		openaitest.Reply{Text: "hi there", Usage: &openaitest.Usage{PromptTokens: 3, CompletionTokens: 2}},
		openaitest.ToolCall("a", `{"k":"v"}`),
	))
	c := newClient(srv)
	req := openai.ChatCompletionRequest{Model: "m", Messages: []openai.ChatCompletionMessage{{Role: "user", Content: "hi"}}}
	resp, err := c.CreateChatCompletion(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Choices[0].Message.Content != "hi there" || resp.Usage.TotalTokens != 5 || resp.Choices[0].FinishReason != "stop" {
		t.Fatalf("response %+v", resp)
	}
	resp, err = c.CreateChatCompletion(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	tc := resp.Choices[0].Message.ToolCalls
	if len(tc) != 1 || tc[0].Function.Name != "a" || tc[0].Function.Arguments != `{"k":"v"}` || tc[0].ID == "" ||
		resp.Choices[0].FinishReason != "tool_calls" {
		t.Fatalf("tool call response %+v", resp)
	}
	if srv.Requests()[0].Stream {
		t.Fatal("non-streaming request recorded as streaming")
	}
}

func TestGoOpenAIErrorReplies(t *testing.T) {
	for _, status := range []int{400, 429, 500, 503} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			srv := openaitest.NewServer(t, openaitest.Script(t, openaitest.Error(status, "boom")))
			_, err := newClient(srv).CreateChatCompletionStream(context.Background(), openai.ChatCompletionRequest{
				Model: "m", Messages: []openai.ChatCompletionMessage{{Role: "user", Content: "hi"}},
			})
			var apiErr *openai.APIError
			if !errors.As(err, &apiErr) || apiErr.HTTPStatusCode != status || apiErr.Message != "boom" || apiErr.Type == "" {
				t.Fatalf("error %#v, want *openai.APIError with status %d", err, status)
			}
		})
	}

	t.Run("non-JSON body", func(t *testing.T) {
		srv := openaitest.NewServer(t, openaitest.Script(t, openaitest.Reply{Status: 502, ErrorBody: "<html>bad gateway</html>"}))
		_, err := newClient(srv).CreateChatCompletionStream(context.Background(), openai.ChatCompletionRequest{
			Model: "m", Messages: []openai.ChatCompletionMessage{{Role: "user", Content: "hi"}},
		})
		var reqErr *openai.RequestError
		if !errors.As(err, &reqErr) || reqErr.HTTPStatusCode != 502 || !strings.Contains(string(reqErr.Body), "bad gateway") {
			t.Fatalf("error %#v, want *openai.RequestError with status 502", err)
		}
	})
}

func TestHangEndsWhenClientLeaves(t *testing.T) {
	srv := openaitest.NewServer(t, openaitest.Script(t, openaitest.Reply{Hang: true}))
	// A second, not less: under load the headers alone can take longer
	// than a tight deadline.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	stream, err := newClient(srv).CreateChatCompletionStream(ctx, openai.ChatCompletionRequest{
		Model: "m", Messages: []openai.ChatCompletionMessage{{Role: "user", Content: "hi"}},
	})
	if err != nil {
		t.Fatal(err) // headers arrive before the hang
	}
	defer stream.Close()
	_, err = stream.Recv()
	if err == nil || time.Since(start) > 30*time.Second {
		t.Fatalf("Recv on a hung stream: err %v after %v", err, time.Since(start))
	}
}

func TestDelayIsHonoured(t *testing.T) {
	srv := openaitest.NewServer(t, openaitest.Script(t, openaitest.Reply{Text: "a b", Delay: 50 * time.Millisecond, ChunkDelay: 30 * time.Millisecond}))
	start := time.Now()
	events := streamRequest(t, srv, false)
	// role chunk, two words, finish, [DONE]: four gaps of 30ms after 50ms.
	if len(events) != 5 {
		t.Fatalf("events %q", events)
	}
	if d := time.Since(start); d < 50*time.Millisecond+4*30*time.Millisecond {
		t.Fatalf("reply took %v, delays not applied", d)
	}
}

// recordingTB captures Errorf so the script's own failure can be checked
// without failing this test.
type recordingTB struct {
	testing.TB
	mu   sync.Mutex
	errs []string
}

func (r *recordingTB) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func TestScriptFailsTestWhenExhausted(t *testing.T) {
	rec := &recordingTB{TB: t}
	srv := openaitest.NewServer(t, openaitest.Script(rec, openaitest.Text("only one")))
	body := map[string]any{"model": "m", "messages": []any{msg("user", "hi")}}
	if status, out := post(t, srv.URL(), body); status != http.StatusOK || !strings.Contains(string(out), "only one") {
		t.Fatalf("first reply: %d %s", status, out)
	}
	status, _ := post(t, srv.URL(), body)
	if status != http.StatusBadRequest {
		t.Fatalf("second reply status %d, want 400", status)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.errs) != 1 || !strings.Contains(rec.errs[0], "script has only 1 replies") {
		t.Fatalf("script errors %q", rec.errs)
	}
}

// Drop cuts the connection where Truncate ends the response cleanly: the
// client reads the same chunks, then an unexpected EOF instead of the end
// of the body.
func TestDroppedConnection(t *testing.T) {
	for name, stream := range map[string]bool{"stream": true, "body": false} {
		t.Run(name, func(t *testing.T) {
			srv := openaitest.NewServer(t, func(*openaitest.Request) openaitest.Reply {
				return openaitest.Reply{Text: "a b c d", Drop: true, TruncateAfter: 2}
			})
			data, _ := json.Marshal(map[string]any{"model": "m", "stream": stream, "messages": []any{msg("user", "hi")}})
			resp, err := http.Post(srv.URL()+"/chat/completions", "application/json", bytes.NewReader(data))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("read err %v after %q, want io.ErrUnexpectedEOF", err, body)
			}
			if stream && strings.Count(string(body), "data: ") != 3 {
				t.Fatalf("got %q, want the role chunk and 2 more before the cut", body)
			}
		})
	}
}

// Header adds response headers, on errors too: a 429 tells the client
// when to come back.
func TestReplyHeaders(t *testing.T) {
	srv := openaitest.NewServer(t, func(*openaitest.Request) openaitest.Reply {
		r := openaitest.Error(http.StatusTooManyRequests, "slow down")
		r.Header = http.Header{"Retry-After": {"7"}}
		return r
	})
	data, _ := json.Marshal(map[string]any{"model": "m", "messages": []any{msg("user", "hi")}})
	resp, err := http.Post(srv.URL()+"/chat/completions", "application/json", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "7" {
		t.Fatalf("status %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}
