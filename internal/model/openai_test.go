package model_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/model/openaitest"
)

func newOpenAI(t *testing.T, srv *openaitest.Server, edit ...func(*model.OpenAIConfig)) *model.OpenAI {
	t.Helper()
	cfg := model.OpenAIConfig{BaseURL: srv.URL(), APIKey: "test-key", Model: "test-model"}
	for _, e := range edit {
		e(&cfg)
	}
	m, err := model.NewOpenAI(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func userRequest(text string) *model.Request {
	return &model.Request{Messages: []model.Message{
		{Role: model.RoleSystem, Content: "You are terse."},
		{Role: model.RoleUser, Content: text},
	}}
}

// deltaRecorder collects deltas; it locks because nothing in the Model
// contract promises onDelta runs on the caller's goroutine.
type deltaRecorder struct {
	mu     sync.Mutex
	pieces []string
}

func (d *deltaRecorder) add(x model.Delta) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.pieces = append(d.pieces, x.Content)
}

func (d *deltaRecorder) get() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.pieces...)
}

func noViolations(t *testing.T, srv *openaitest.Server) {
	t.Helper()
	if v := srv.Violations(); len(v) > 0 {
		t.Fatalf("transcript violations: %q", v)
	}
}

func TestNewOpenAINeedsModel(t *testing.T) {
	if _, err := model.NewOpenAI(model.OpenAIConfig{BaseURL: "http://127.0.0.1:1/v1"}); err == nil {
		t.Fatal("NewOpenAI accepted an empty model name")
	}
}

func TestOpenAIStreamsText(t *testing.T) {
	srv := openaitest.NewServer(t, openaitest.Script(t, openaitest.Reply{
		Text: "Hello there, streaming world!", Model: "served-model",
	}))
	var rec deltaRecorder
	resp, err := newOpenAI(t, srv).Generate(context.Background(), userRequest("hi"), rec.add)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"Hello ", "there, ", "streaming ", "world!"}
	if got := rec.get(); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("deltas %q, want %q", got, want)
	}
	if resp.Message.Role != model.RoleAssistant || resp.Message.Content != "Hello there, streaming world!" {
		t.Fatalf("message %+v", resp.Message)
	}
	if resp.FinishReason != model.FinishStop || resp.Model != "served-model" || len(resp.Message.ToolCalls) != 0 {
		t.Fatalf("response %+v", resp)
	}
	req := srv.Requests()[0]
	if req.Model != "test-model" || !req.Stream || !req.IncludeUsage() {
		t.Fatalf("request model %q stream %v include_usage %v", req.Model, req.Stream, req.IncludeUsage())
	}
	noViolations(t, srv)
}

func TestOpenAINilOnDelta(t *testing.T) {
	srv := openaitest.NewServer(t, openaitest.Script(t, openaitest.Text("fine")))
	resp, err := newOpenAI(t, srv).Generate(context.Background(), userRequest("hi"), nil)
	if err != nil || resp.Message.Content != "fine" {
		t.Fatalf("resp %+v, err %v", resp, err)
	}
}

func TestOpenAIRequestMapping(t *testing.T) {
	srv := openaitest.NewServer(t, openaitest.Script(t, openaitest.Text("done")))
	temp := 0.5
	req := &model.Request{
		Model:       "override-model",
		Temperature: &temp,
		MaxTokens:   123,
		Tools: []model.ToolSpec{
			{Name: "weather", Description: "Weather for a city",
				Parameters: json.RawMessage(`{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}`)},
			{Name: "current_time", Description: "Now"},
		},
		Messages: []model.Message{
			{ID: "m1", Role: model.RoleSystem, Content: "sys", Meta: map[string]any{"hidden": true}},
			{ID: "m2", Role: model.RoleUser, Content: "weather and time?"},
			{ID: "m3", Role: model.RoleAssistant, Content: "", ToolCalls: []model.ToolCall{
				{ID: "c1", Name: "weather", Arguments: `{"city":"Paris"}`},
				{ID: "c2", Name: "current_time", Arguments: ""},
			}},
			{ID: "m4", Role: model.RoleTool, ToolCallID: "c1", Name: "weather", Content: "sunny", Status: model.ToolStatusSuccess},
			// Name left empty on purpose: the client fills it from the call.
			{ID: "m5", Role: model.RoleTool, ToolCallID: "c2", Content: "noon", Status: model.ToolStatusError,
				Meta: map[string]any{"note": "x"}},
		},
	}
	if _, err := newOpenAI(t, srv).Generate(context.Background(), req, nil); err != nil {
		t.Fatal(err)
	}
	noViolations(t, srv)
	got := srv.Requests()[0]

	if got.Model != "override-model" {
		t.Errorf("model %q, want the request's override", got.Model)
	}
	if got.Temperature == nil || *got.Temperature != 0.5 || got.MaxTokens != 123 || got.MaxCompletionTokens != 0 {
		t.Errorf("temperature %v max_tokens %d max_completion_tokens %d", got.Temperature, got.MaxTokens, got.MaxCompletionTokens)
	}
	if len(got.Messages) != 5 {
		t.Fatalf("messages %+v", got.Messages)
	}
	a := got.Messages[2]
	if a.Role != "assistant" || len(a.ToolCalls) != 2 || a.ToolCalls[0].Type != "function" ||
		a.ToolCalls[0].ID != "c1" || a.ToolCalls[0].Function.Name != "weather" || a.ToolCalls[0].Function.Arguments != `{"city":"Paris"}` {
		t.Errorf("assistant message %+v", a)
	}
	if a.ToolCalls[1].Function.Arguments != "{}" {
		t.Errorf("empty arguments sent as %q, want {}", a.ToolCalls[1].Function.Arguments)
	}
	if m := got.Messages[4]; m.Role != "tool" || m.ToolCallID != "c2" || m.Name != "current_time" || m.Content != "noon" {
		t.Errorf("tool message %+v", m)
	}
	if len(got.Tools) != 2 || got.Tools[0].Type != "function" || got.Tools[0].Function.Name != "weather" ||
		got.Tools[0].Function.Description != "Weather for a city" {
		t.Fatalf("tools %+v", got.Tools)
	}
	var schema map[string]any
	if err := json.Unmarshal(got.Tools[0].Function.Parameters, &schema); err != nil || schema["required"] == nil {
		t.Errorf("schema not passed through: %s", got.Tools[0].Function.Parameters)
	}
	if p := string(got.Tools[1].Function.Parameters); p != `{"type":"object","properties":{}}` {
		t.Errorf("empty parameters sent as %s", p)
	}

	// Our bookkeeping fields must never reach a provider.
	var raw struct {
		Messages []map[string]json.RawMessage `json:"messages"`
	}
	if err := json.Unmarshal(got.Raw, &raw); err != nil {
		t.Fatal(err)
	}
	for i, m := range raw.Messages {
		for _, field := range []string{"id", "meta", "status"} {
			if _, ok := m[field]; ok {
				t.Errorf("message %d sent field %q: %v", i, field, m)
			}
		}
	}
}

func TestOpenAIZeroTemperatureIsSent(t *testing.T) {
	srv := openaitest.NewServer(t, openaitest.Script(t, openaitest.Text("ok")))
	zero := 0.0
	req := userRequest("hi")
	req.Temperature = &zero
	if _, err := newOpenAI(t, srv).Generate(context.Background(), req, nil); err != nil {
		t.Fatal(err)
	}
	got := srv.Requests()[0].Temperature
	if got == nil || *got < 0 || *got > 1e-6 {
		t.Fatalf("temperature %v, want a present, effectively zero value", got)
	}
}

func TestOpenAIReasoningModelUsesMaxCompletionTokens(t *testing.T) {
	srv := openaitest.NewServer(t, openaitest.Script(t, openaitest.Text("ok")))
	req := userRequest("hi")
	req.MaxTokens = 50
	m := newOpenAI(t, srv, func(c *model.OpenAIConfig) { c.Model = "gpt-5-mini" })
	if _, err := m.Generate(context.Background(), req, nil); err != nil {
		t.Fatal(err)
	}
	if got := srv.Requests()[0]; got.MaxCompletionTokens != 50 || got.MaxTokens != 0 {
		t.Fatalf("max_tokens %d max_completion_tokens %d", got.MaxTokens, got.MaxCompletionTokens)
	}
}

func TestOpenAIUnknownRoleFailsBeforeSending(t *testing.T) {
	srv := openaitest.NewServer(t, nil)
	req := &model.Request{Messages: []model.Message{{Role: "developer", Content: "x"}}}
	if _, err := newOpenAI(t, srv).Generate(context.Background(), req, nil); err == nil || !strings.Contains(err.Error(), "developer") {
		t.Fatalf("err %v, want unknown role error", err)
	}
	if srv.Count() != 0 {
		t.Fatalf("request was sent anyway")
	}
}

func TestOpenAIToolCallAssembly(t *testing.T) {
	srv := openaitest.NewServer(t, openaitest.Script(t, openaitest.Reply{
		Text: "Checking both.",
		ToolCalls: []openaitest.Call{
			{ID: "call_a", Name: "weather", Arguments: `{"city":"Paris","unit":"celsius"}`},
			{ID: "call_b", Name: "current_time", Arguments: `{"tz":"Europe/Paris"}`},
		},
		ArgChunks: 5,
	}))
	var rec deltaRecorder
	resp, err := newOpenAI(t, srv).Generate(context.Background(), userRequest("hi"), rec.add)
	if err != nil {
		t.Fatal(err)
	}
	want := []model.ToolCall{
		{ID: "call_a", Name: "weather", Arguments: `{"city":"Paris","unit":"celsius"}`},
		{ID: "call_b", Name: "current_time", Arguments: `{"tz":"Europe/Paris"}`},
	}
	if fmt.Sprint(resp.Message.ToolCalls) != fmt.Sprint(want) {
		t.Fatalf("tool calls %+v, want %+v", resp.Message.ToolCalls, want)
	}
	if resp.FinishReason != model.FinishToolCalls || resp.Message.Content != "Checking both." {
		t.Fatalf("response %+v", resp)
	}
	// Tool call fragments are not text and must not leak into deltas.
	if strings.Join(rec.get(), "") != "Checking both." {
		t.Fatalf("deltas %q", rec.get())
	}
}

func TestOpenAIInterleavedToolCallFragments(t *testing.T) {
	// Some servers interleave parallel calls; the index decides where a
	// fragment belongs, not arrival order.
	chunk := func(delta string) string {
		return `{"id":"x","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":` + delta + `,"finish_reason":null}]}`
	}
	srv := openaitest.NewServer(t, openaitest.Script(t, openaitest.Reply{Raw: []string{
		chunk(`{"role":"assistant","tool_calls":[{"index":0,"id":"c0","type":"function","function":{"name":"f","arguments":""}}]}`),
		chunk(`{"tool_calls":[{"index":1,"id":"c1","type":"function","function":{"name":"g","arguments":"{\"b\""}}]}`),
		chunk(`{"tool_calls":[{"index":0,"function":{"arguments":"{\"a\":"}}]}`),
		chunk(`{"tool_calls":[{"index":1,"function":{"arguments":":2}"}}]}`),
		chunk(`{"tool_calls":[{"index":0,"function":{"arguments":"1}"}}]}`),
		`{"id":"x","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
		"[DONE]",
	}}))
	resp, err := newOpenAI(t, srv).Generate(context.Background(), userRequest("hi"), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []model.ToolCall{{ID: "c0", Name: "f", Arguments: `{"a":1}`}, {ID: "c1", Name: "g", Arguments: `{"b":2}`}}
	if fmt.Sprint(resp.Message.ToolCalls) != fmt.Sprint(want) {
		t.Fatalf("tool calls %+v, want %+v", resp.Message.ToolCalls, want)
	}
}

func TestOpenAIMalformedArgumentsPassThrough(t *testing.T) {
	bad := `{"city": "Par` + "\u00e9" + `s", oops`
	srv := openaitest.NewServer(t, openaitest.Script(t, openaitest.ToolCall("weather", bad)))
	resp, err := newOpenAI(t, srv).Generate(context.Background(), userRequest("hi"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Message.ToolCalls) != 1 || resp.Message.ToolCalls[0].Arguments != bad {
		t.Fatalf("tool calls %+v, want arguments %q untouched", resp.Message.ToolCalls, bad)
	}
}

func TestOpenAIKeepsEmptyIDAndName(t *testing.T) {
	srv := openaitest.NewServer(t, openaitest.Script(t, openaitest.Reply{
		ToolCalls: []openaitest.Call{{NoID: true, Name: "", Arguments: `{}`}},
	}))
	resp, err := newOpenAI(t, srv).Generate(context.Background(), userRequest("hi"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Message.ToolCalls) != 1 || resp.Message.ToolCalls[0] != (model.ToolCall{Arguments: "{}"}) {
		t.Fatalf("tool calls %+v, want one call with empty id and name", resp.Message.ToolCalls)
	}
}

func TestOpenAIUsage(t *testing.T) {
	intp := func(n int) *int { return &n }
	cases := []struct {
		name    string
		reply   openaitest.Reply
		noUsage bool // DisableStreamUsage
		want    *model.Usage
	}{
		{"with cached tokens", openaitest.Reply{Text: "x", Usage: &openaitest.Usage{
			PromptTokens: 100, CompletionTokens: 20, CachedTokens: intp(64)}},
			false, &model.Usage{PromptTokens: 100, CompletionTokens: 20, TotalTokens: 120, CachedTokens: intp(64)}},
		{"zero cached tokens reported", openaitest.Reply{Text: "x", Usage: &openaitest.Usage{
			PromptTokens: 10, CompletionTokens: 2, CachedTokens: intp(0)}},
			false, &model.Usage{PromptTokens: 10, CompletionTokens: 2, TotalTokens: 12, CachedTokens: intp(0)}},
		{"no prompt cache", openaitest.Reply{Text: "x", Usage: &openaitest.Usage{PromptTokens: 10, CompletionTokens: 2}},
			false, &model.Usage{PromptTokens: 10, CompletionTokens: 2, TotalTokens: 12}},
		{"not reported", openaitest.Text("x"), false, nil},
		{"not requested", openaitest.Reply{Text: "x", Usage: &openaitest.Usage{PromptTokens: 10, CompletionTokens: 2}},
			true, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := openaitest.NewServer(t, openaitest.Script(t, tc.reply))
			m := newOpenAI(t, srv, func(c *model.OpenAIConfig) { c.DisableStreamUsage = tc.noUsage })
			resp, err := m.Generate(context.Background(), userRequest("hi"), nil)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := usageString(resp.Usage), usageString(tc.want); got != want {
				t.Fatalf("usage %s, want %s", got, want)
			}
			req := srv.Requests()[0]
			if tc.noUsage && req.StreamOptions != nil {
				t.Fatalf("stream_options sent although disabled: %+v", req.StreamOptions)
			}
		})
	}
}

func TestOpenAIZeroUsageChunkDoesNotWin(t *testing.T) {
	const zero = `"usage":{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0}`
	srv := openaitest.NewServer(t, openaitest.Script(t, openaitest.Reply{Raw: []string{
		`{"id":"x","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"hi"},"finish_reason":null}],` + zero + `}`,
		`{"id":"x","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10}}`,
		`{"id":"x","model":"m","choices":[],` + zero + `}`,
		"[DONE]",
	}}))
	resp, err := newOpenAI(t, srv).Generate(context.Background(), userRequest("hi"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := usageString(resp.Usage); got != usageString(&model.Usage{PromptTokens: 9, CompletionTokens: 1, TotalTokens: 10}) {
		t.Fatalf("usage %s", got)
	}
}

func usageString(u *model.Usage) string {
	if u == nil {
		return "<nil>"
	}
	cached := "nil"
	if u.CachedTokens != nil {
		cached = fmt.Sprint(*u.CachedTokens)
	}
	return fmt.Sprintf("{prompt %d completion %d total %d cached %s}", u.PromptTokens, u.CompletionTokens, u.TotalTokens, cached)
}

func TestOpenAIHTTPErrors(t *testing.T) {
	cases := []struct {
		reply openaitest.Reply
		want  model.APIError
	}{
		{openaitest.Error(500, "internal failure"),
			model.APIError{StatusCode: 500, Type: "server_error", Message: "internal failure"}},
		{openaitest.Error(503, ""),
			model.APIError{StatusCode: 503, Type: "server_error", Message: "Service Unavailable"}},
		{openaitest.Error(429, "slow down"),
			model.APIError{StatusCode: 429, Type: "requests", Code: "rate_limit_exceeded", Message: "slow down"}},
		{openaitest.Reply{Status: 400, ErrorType: "invalid_request_error", ErrorCode: "context_length_exceeded", ErrorMessage: "too long"},
			model.APIError{StatusCode: 400, Type: "invalid_request_error", Code: "context_length_exceeded", Message: "too long"}},
		// A proxy's HTML page reaches go-openai as a RequestError.
		{openaitest.Reply{Status: 502, ErrorBody: "<html>502 Bad Gateway</html>"},
			model.APIError{StatusCode: 502, Message: "<html>502 Bad Gateway</html>"}},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprint(tc.want.StatusCode), func(t *testing.T) {
			srv := openaitest.NewServer(t, openaitest.Script(t, tc.reply))
			_, err := newOpenAI(t, srv).Generate(context.Background(), userRequest("hi"), nil)
			var apiErr *model.APIError
			if !errors.As(err, &apiErr) {
				t.Fatalf("err %T %v, want *model.APIError", err, err)
			}
			if *apiErr != tc.want {
				t.Fatalf("api error %+v, want %+v", *apiErr, tc.want)
			}
		})
	}
}

func TestOpenAIErrorEventInsideStream(t *testing.T) {
	srv := openaitest.NewServer(t, openaitest.Script(t, openaitest.Reply{Raw: []string{
		`{"id":"x","model":"m","choices":[{"index":0,"delta":{"content":"par"},"finish_reason":null}]}`,
		`{"error":{"message":"upstream overloaded","type":"server_error","code":502}}`,
	}}))
	_, err := newOpenAI(t, srv).Generate(context.Background(), userRequest("hi"), nil)
	var apiErr *model.APIError
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 502 || apiErr.Message != "upstream overloaded" || apiErr.Type != "server_error" {
		t.Fatalf("err %#v, want APIError 502 from the in-stream error event", err)
	}
}

func TestOpenAITruncatedStream(t *testing.T) {
	cases := map[string]openaitest.Reply{
		"after some text":   {Text: "one two three four", Truncate: true, TruncateAfter: 2},
		"in a tool call":    {ToolCalls: []openaitest.Call{{Name: "f", Arguments: `{"a":1}`}}, Truncate: true, TruncateAfter: 2},
		"right after start": {Text: "x", Truncate: true},
		"[DONE] without finish reason": {Raw: []string{
			`{"id":"x","model":"m","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}`, "[DONE]"}},
	}
	for name, reply := range cases {
		t.Run(name, func(t *testing.T) {
			srv := openaitest.NewServer(t, openaitest.Script(t, reply))
			var rec deltaRecorder
			resp, err := newOpenAI(t, srv).Generate(context.Background(), userRequest("hi"), rec.add)
			if !errors.Is(err, model.ErrTruncated) || resp != nil {
				t.Fatalf("resp %+v err %v, want ErrTruncated", resp, err)
			}
		})
	}
}

// A cancel during a stream ends Generate at once, not at the provider's
// next chunk: the next chunk here comes an hour after the first, so
// Generate returns only if it stops waiting for it. No wall-clock bound
// but the test's patience.
func TestOpenAICancelDuringSlowStream(t *testing.T) {
	chunk := `{"id":"c1","object":"chat.completion.chunk","created":0,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"slow "}}]}`
	srv := openaitest.NewServer(t, openaitest.Script(t, openaitest.Reply{
		Raw: []string{chunk, chunk, "[DONE]"}, ChunkDelay: time.Hour,
	}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := make(chan struct{})
	var once sync.Once
	done := make(chan error, 1)
	go func() {
		_, err := newOpenAI(t, srv).Generate(ctx, userRequest("hi"), func(model.Delta) {
			once.Do(func() { close(first) })
		})
		done <- err
	}()
	select {
	case <-first:
	case <-time.After(time.Minute):
		t.Fatal("no delta arrived")
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err %v, want context.Canceled", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Generate did not return after cancel: it waits for the provider's next chunk")
	}
}

func TestOpenAIDeadlineWhileProviderHangs(t *testing.T) {
	for name, reply := range map[string]openaitest.Reply{
		"before headers": {Text: "x", Delay: time.Minute},
		"after headers":  {Hang: true},
	} {
		t.Run(name, func(t *testing.T) {
			srv := openaitest.NewServer(t, openaitest.Script(t, reply))
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			start := time.Now()
			_, err := newOpenAI(t, srv).Generate(ctx, userRequest("hi"), nil)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("err %v, want context.DeadlineExceeded", err)
			}
			// The provider answers in a minute or never: half of that
			// says Generate gave up at its deadline, however loaded the
			// machine.
			if d := time.Since(start); d > 30*time.Second {
				t.Fatalf("Generate took %v", d)
			}
		})
	}
}

func TestOpenAITransportErrorIsNotAnAPIError(t *testing.T) {
	// A transport failure must not masquerade as a provider answer, or
	// middleware would classify it by a status code that never existed.
	m, err := model.NewOpenAI(model.OpenAIConfig{BaseURL: "http://127.0.0.1:1/v1", Model: "m", HTTPClient: &http.Client{
		Transport: roundTripFunc(func(*http.Request) (*http.Response, error) { return nil, errors.New("dial refused") }),
	}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = m.Generate(context.Background(), userRequest("hi"), nil)
	var apiErr *model.APIError
	if err == nil || errors.As(err, &apiErr) || !strings.Contains(err.Error(), "dial refused") {
		t.Fatalf("err %v", err)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
