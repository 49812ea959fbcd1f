package telemetry_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/metrics/prom"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/model/openaitest"
	"github.com/natsagent/natsagent/internal/testdeploy"
)

// Issue 20 item 12: a run whose profile names no model reaches the
// provider's default, and its spans and metrics say which ("chat
// test-default", model="test-default"), not an empty name; each tool call
// is timed by tool and status, a tool the model made up as "unknown" (no
// series per made-up name); the lease fence's counters are on /metrics.
func TestToolCallsAndTheDefaultModelOnMetricsAndSpans(t *testing.T) {
	rec, err := prom.New(prom.Options{Registry: prometheus.NewRegistry(), LagRefresh: -1})
	if err != nil {
		t.Fatal(err)
	}
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	chatbot := agent.Chatbot()
	chatbot.Model = ""
	chatbot.Tools = []string{"current_time"}
	d := newDeployment(t, deploymentConfig{metrics: rec, metricsHandler: rec.Handler(), traces: tp, profiles: []agent.Profile{chatbot}})

	srv := openaitest.NewServer(t, func(req *openaitest.Request) openaitest.Reply {
		if req.LastMessage().Role == "tool" {
			return openaitest.Reply{Text: "it is late"}
		}
		return openaitest.Reply{ToolCalls: []openaitest.Call{
			{ID: "c1", Name: "current_time", Arguments: "{}"},
			{ID: "c2", Name: "made_up_tool", Arguments: "{}"},
		}}
	})
	m, err := model.NewOpenAI(model.OpenAIConfig{BaseURL: srv.URL(), Model: "test-default"})
	if err != nil {
		t.Fatal(err)
	}
	d.startWorker(m, nil)

	code, out := d.post("/threads/t1/runs/wait?format=natsagent", map[string]any{"run_id": "r1",
		"input": map[string]any{"messages": []map[string]string{{"role": "user", "content": "what time is it?"}}}})
	if code != http.StatusOK || !strings.Contains(string(out), "it is late") {
		t.Fatalf("wait: %d %s", code, out)
	}
	for _, r := range srv.Requests() {
		if r.Model != "test-default" {
			t.Fatalf("the provider was asked for model %q, want its default test-default", r.Model)
		}
	}

	mf := scrape(t, d)
	if n := histCount(mf, "natsagent_tool_call_duration_seconds", labels{"tool": "current_time", "status": "success"}); n != 1 {
		t.Fatalf("current_time success calls = %d, want 1\n%s", n, dump(mf, "natsagent_tool_call_duration_seconds"))
	}
	if n := histCount(mf, "natsagent_tool_call_duration_seconds", labels{"tool": "unknown"}); n != 1 {
		t.Fatalf("unknown tool calls = %d, want 1\n%s", n, dump(mf, "natsagent_tool_call_duration_seconds"))
	}
	if n := histCount(mf, "natsagent_tool_call_duration_seconds", labels{"tool": "made_up_tool"}); n != 0 {
		t.Fatal("a tool name the model made up became a label value")
	}
	if n := histCount(mf, "natsagent_model_call_duration_seconds", labels{"model": "test-default", "outcome": "ok"}); n != 2 {
		t.Fatalf("model calls of test-default = %d, want 2\n%s", n, dump(mf, "natsagent_model_call_duration_seconds"))
	}
	if n := histCount(mf, "natsagent_model_call_duration_seconds", labels{"model": ""}); n != 0 {
		t.Fatal("model calls counted under an empty model name")
	}
	if v := value(mf, "natsagent_lease_fence_pauses_total", nil); v != 0 {
		t.Fatalf("lease_fence_pauses_total = %v, want 0 (present, nothing paused)", v)
	}

	var spans []sdktrace.ReadOnlySpan
	testdeploy.WaitFor(t, 10*time.Second, "the run's span", func() bool {
		spans = sr.Ended()
		return find(spans, "run chatbot") != nil
	})
	if n := len(findAll(spans, "chat test-default")); n != 2 {
		t.Fatalf("%d spans \"chat test-default\", want 2, among %v", n, names(spans))
	}
	for _, s := range spans {
		if strings.TrimSpace(s.Name()) == "chat" {
			t.Fatalf("a model call span named %q", s.Name())
		}
	}
}
