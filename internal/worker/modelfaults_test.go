package worker

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/model/openaitest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/tools"
)

// Provider faults, end to end: the strict OpenAI-compatible server fails
// the way real providers do, a worker runs the default chain (model_retry
// included) against it over HTTP, and every run ends in a retried success
// or an error a person can act on, within a bound. retry_test.go proves
// the retry policy with fake clocks and errors; these prove the wire
// faults reach it classified as they should.

// faultyProvider serves the script of each run (keyed by its user
// message) in order; past the script it answers "recovered".
type faultyProvider struct {
	mu      sync.Mutex
	scripts map[string][]openaitest.Reply
	times   map[string][]time.Time
}

func (p *faultyProvider) handle(req *openaitest.Request) openaitest.Reply {
	key := ""
	for _, m := range req.Messages {
		if m.Role == "user" {
			key = m.Content
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.times[key] = append(p.times[key], time.Now())
	if s := p.scripts[key]; len(s) > 0 {
		p.scripts[key] = s[1:]
		return s[0]
	}
	return openaitest.Text("recovered")
}

func (p *faultyProvider) calls(key string) []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]time.Time(nil), p.times[key]...)
}

// faultHarness runs one worker whose chatbot talks to a strict server
// with the given script per user message and model_retry settings.
func faultHarness(t *testing.T, retry string, scripts map[string][]openaitest.Reply) (*harness, *faultyProvider, *openaitest.Server) {
	t.Helper()
	h := newHarness(t)
	h.tools.Register(tools.Func(model.ToolSpec{Name: "lookup", Parameters: json.RawMessage(`{"type":"object","properties":{"q":{"type":"string"}}}`)},
		func(_ context.Context, args json.RawMessage) (string, error) {
			var a struct{ Q string }
			if err := json.Unmarshal(args, &a); err != nil {
				return "", err
			}
			return "found " + a.Q, nil
		}))
	p := &faultyProvider{scripts: scripts, times: map[string][]time.Time{}}
	srv, m := strictModel(t, p.handle)
	chatbot := agent.Chatbot()
	chatbot.Tools = h.tools.Names()
	if retry != "" {
		chatbot.Middleware = middleware.ChainConfig{Settings: map[string]json.RawMessage{"model_retry": json.RawMessage(retry)}}
	}
	agents, err := agent.NewAgents(m, h.tools, chatbot)
	if err != nil {
		t.Fatal(err)
	}
	h.startWorker(m, func(c *Config) { c.Agents = agents })
	return h, p, srv
}

func (w *watcher) retries() []middleware.RetryData {
	var out []middleware.RetryData
	for _, ev := range w.all() {
		if ev.Type == middleware.EventModelRetry {
			var d middleware.RetryData
			_ = json.Unmarshal(ev.Data, &d)
			out = append(out, d)
		}
	}
	return out
}

// Transient provider faults are retried inside the model call and the
// run succeeds: HTTP 500, a proxy's 502 HTML page, 503, a stream that
// ends early without [DONE], and a connection cut mid-stream.
func TestModelFaultsRetriedToSuccess(t *testing.T) {
	t.Parallel()
	cases := map[string]openaitest.Reply{
		"http 500":       openaitest.Error(http.StatusInternalServerError, "internal failure"),
		"http 502 proxy": {Status: http.StatusBadGateway, ErrorBody: "<html><body>502 Bad Gateway</body></html>"},
		"http 503":       {Status: http.StatusServiceUnavailable, Header: http.Header{"Retry-After": {"1"}}},
		"truncated":      {Text: "half an answer that never", Truncate: true, TruncateAfter: 2},
		"cut":            {Text: "half an answer that never", Drop: true, TruncateAfter: 2},
	}
	scripts := map[string][]openaitest.Reply{}
	for name, r := range cases {
		scripts[name] = []openaitest.Reply{r}
	}
	h, p, srv := faultHarness(t, "", scripts)
	watchers := map[string]*watcher{}
	i := 0
	for name := range cases {
		i++
		thread := "t" + string(rune('a'+i))
		watchers[name] = h.watch("default", thread, "r-"+thread)
		h.submit(request(thread, "r-"+thread, name))
	}
	for name, w := range watchers {
		fin := w.finished(t, 15*time.Second)
		if fin.Status != protocol.StatusSuccess || fin.Output == nil || fin.Output.Content != "recovered" {
			t.Errorf("%s: run ended %s (%q) with %+v", name, fin.Status, fin.Error, fin.Output)
			continue
		}
		rs := w.retries()
		if len(rs) != 1 || rs[0].Kind != "network" {
			t.Errorf("%s: retries %+v, want one network retry", name, rs)
		}
		if n := len(p.calls(name)); n != 2 {
			t.Errorf("%s: %d model requests, want 2", name, n)
		}
	}
	if v := srv.Violations(); len(v) > 0 {
		t.Fatalf("strict provider saw invalid requests: %v", v)
	}
}

// A provider that keeps failing ends the run as an error that names the
// provider's answer, once the retries give up: server errors when the
// network budget is spent, a rate limit after max_retries.
func TestModelFaultsEndInClearError(t *testing.T) {
	t.Parallel()
	always := func(r openaitest.Reply) []openaitest.Reply { return []openaitest.Reply{r, r, r, r, r, r} }
	rateLimited := openaitest.Error(http.StatusTooManyRequests, "Rate limit reached for requests per minute")
	rateLimited.Header = http.Header{"Retry-After": {"1"}}
	scripts := map[string][]openaitest.Reply{
		"down":    always(openaitest.Error(http.StatusServiceUnavailable, "The engine is currently overloaded")),
		"limited": always(rateLimited),
	}
	// A budget shorter than the first network backoff (2 s): no network
	// retry; one count retry after about a second for the 429.
	h, p, _ := faultHarness(t, `{"network_budget_seconds": 1, "max_retries": 1}`, scripts)
	down := h.watch("default", "t1", "down")
	limited := h.watch("default", "t2", "limited")
	start := time.Now()
	h.submit(request("t1", "down", "down"))
	h.submit(request("t2", "limited", "limited"))

	fin := down.finished(t, 10*time.Second)
	if fin.Status != protocol.StatusError || !strings.Contains(fin.Error, "HTTP 503") || !strings.Contains(fin.Error, "overloaded") {
		t.Fatalf("down: run ended %s: %q", fin.Status, fin.Error)
	}
	if n := len(p.calls("down")); n != 1 {
		t.Fatalf("down: %d requests, want 1 (budget spent before the first backoff)", n)
	}
	fin = limited.finished(t, 10*time.Second)
	if fin.Status != protocol.StatusError || !strings.Contains(fin.Error, "HTTP 429") || !strings.Contains(fin.Error, "Rate limit reached") {
		t.Fatalf("limited: run ended %s: %q", fin.Status, fin.Error)
	}
	calls := p.calls("limited")
	if len(calls) != 2 || calls[1].Sub(calls[0]) < 700*time.Millisecond {
		t.Fatalf("limited: %d requests (%v apart), want 2, about a second apart", len(calls), durations(calls))
	}
	if rs := limited.retries(); len(rs) != 1 || rs[0].Kind != "error" {
		t.Fatalf("limited: retries %+v", rs)
	}
	if d := time.Since(start); d > 8*time.Second {
		t.Fatalf("took %s", d)
	}
}

func durations(ts []time.Time) []time.Duration {
	var out []time.Duration
	for i := 1; i < len(ts); i++ {
		out = append(out, ts[i].Sub(ts[i-1]))
	}
	return out
}

// A provider that stops answering (before or after the response headers)
// never hangs a run: the run's time limit ends it as "timeout" with an
// error naming the limit and where it is set.
func TestHangingModelEndsAtRunTimeout(t *testing.T) {
	t.Parallel()
	scripts := map[string][]openaitest.Reply{
		"silent":  {{Text: "never", Delay: time.Hour}},
		"stalled": {{Hang: true}},
	}
	h, _, _ := faultHarness(t, "", scripts)
	var ws []*watcher
	for i, name := range []string{"silent", "stalled"} {
		thread := []string{"t1", "t2"}[i]
		ws = append(ws, h.watch("default", thread, name))
		req := request(thread, name, name)
		req.Config.TimeoutSeconds = 1
		h.submit(req)
	}
	for _, w := range ws {
		fin := w.finished(t, 10*time.Second)
		if fin.Status != protocol.StatusTimeout || !strings.Contains(fin.Error, "time limit") || !strings.Contains(fin.Error, "timeout_seconds") {
			t.Fatalf("run ended %s: %q", fin.Status, fin.Error)
		}
	}
}

// A tool call whose arguments are not JSON (streamed that way by the
// model) does not end the run: the model reads an error result, calls
// again correctly, and the run succeeds; the provider never sees the
// malformed arguments again.
func TestMalformedToolCallJSONRecovers(t *testing.T) {
	t.Parallel()
	scripts := map[string][]openaitest.Reply{
		"look it up": {
			{ToolCalls: []openaitest.Call{{ID: "bad", Name: "lookup", Arguments: `{"q": "natsagent`}}, ArgChunks: 3},
			{ToolCalls: []openaitest.Call{{ID: "good", Name: "lookup", Arguments: `{"q": "natsagent"}`}}},
		},
	}
	h, p, srv := faultHarness(t, "", scripts)
	w := h.watch("default", "t1", "r1")
	h.submit(request("t1", "r1", "look it up"))
	fin := w.finished(t, 10*time.Second)
	if fin.Status != protocol.StatusSuccess || fin.Output.Content != "recovered" {
		t.Fatalf("run ended %s (%q)", fin.Status, fin.Error)
	}
	if n := len(p.calls("look it up")); n != 3 {
		t.Fatalf("%d model requests, want 3", n)
	}
	var results []model.Message
	for _, m := range h.threadState("default", "t1") {
		if m.Role == model.RoleTool {
			results = append(results, m)
		}
	}
	if len(results) != 2 || results[0].Status != model.ToolStatusError || !strings.Contains(results[0].Content, "not valid JSON") ||
		results[1].Status != model.ToolStatusSuccess || results[1].Content != "found natsagent" {
		t.Fatalf("tool results %+v", results)
	}
	reqs := srv.Requests()
	for _, tc := range reqs[len(reqs)-1].Messages {
		for _, c := range tc.ToolCalls {
			if !json.Valid([]byte(c.Function.Arguments)) {
				t.Fatalf("the provider was sent malformed arguments %q", c.Function.Arguments)
			}
		}
	}
	if v := srv.Violations(); len(v) > 0 {
		t.Fatalf("strict provider saw invalid requests: %v", v)
	}
}
