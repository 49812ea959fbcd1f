package telemetry_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/app"
	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/testdeploy"
)

// Secret texts that must never reach a span: the person's message, the
// model's answers, a tool's arguments and result.
const (
	secretQuestion = "what is the secret plan"
	secretAnswer   = "the secret plan is tea"
	secretChild    = "child secret notes"
)

// leadAndResearcher are a lead (model "lead") that calls current_time and
// delegates to the researcher (model "researcher") in one response, then
// answers; the researcher answers at once.
func leadAndResearcher() ([]agent.Profile, model.Model) {
	lead := agent.Chatbot()
	lead.Model = "lead"
	lead.Tools = []string{"current_time"}
	profiles := []agent.Profile{lead, {Name: "researcher", Kind: middleware.KindSubagent, Model: "researcher",
		Description: "Finds facts.", SystemPrompt: "You research."}}
	args, _ := json.Marshal(map[string]string{"description": secretQuestion, "subagent_type": "researcher"})
	m := model.Func(func(ctx context.Context, req *model.Request, onDelta func(model.Delta)) (*model.Response, error) {
		usage := &model.Usage{PromptTokens: 40, CompletionTokens: 7, TotalTokens: 47}
		switch {
		case req.Model == "researcher":
			return &model.Response{Message: model.Message{Role: model.RoleAssistant, Content: secretChild}, FinishReason: model.FinishStop, Usage: usage, Model: "researcher-v1"}, nil
		case answered(req):
			return &model.Response{Message: model.Message{Role: model.RoleAssistant, Content: secretAnswer}, FinishReason: model.FinishStop, Usage: usage, Model: "lead-v1"}, nil
		}
		return &model.Response{Message: model.Message{Role: model.RoleAssistant, ToolCalls: []model.ToolCall{
			{ID: "call_time", Name: "current_time", Arguments: "{}"},
			{ID: "call_task", Name: middleware.TaskTool, Arguments: string(args)},
		}}, FinishReason: model.FinishToolCalls, Usage: usage, Model: "lead-v1"}, nil
	})
	return profiles, m
}

// One trace per run, across NATS: the gateway's request span is the parent
// of its publish span, whose context the run request carries to the
// worker's run span; the model calls and tool calls are its children, and
// the subagent's run hangs under the task call that started it.
func TestTraceFromGatewayThroughWorkerAndSubagent(t *testing.T) {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	profiles, m := leadAndResearcher()
	d := newDeployment(t, deploymentConfig{traces: tp, profiles: profiles})
	d.startWorker(m, nil)

	code, out := d.post("/threads/t1/runs/wait?format=natsagent", map[string]any{"run_id": "r1",
		"input": map[string]any{"messages": []map[string]string{{"role": "user", "content": secretQuestion}}}})
	if code != http.StatusOK {
		t.Fatalf("wait: %d %s", code, out)
	}
	if !strings.Contains(string(out), secretAnswer) {
		t.Fatalf("answer %s", out)
	}

	// The run spans end just after run.finished. The subagent's may end
	// after the lead's: the task call returns on the child's terminal
	// summary, written before the child's run.finished (a loaded machine
	// stretches that gap).
	var spans []sdktrace.ReadOnlySpan
	testdeploy.WaitFor(t, 10*time.Second, "the lead's and the subagent's run spans", func() bool {
		spans = sr.Ended()
		return find(spans, "run chatbot") != nil && find(spans, "run researcher") != nil
	})
	byName := func(name string) sdktrace.ReadOnlySpan {
		t.Helper()
		s := find(spans, name)
		if s == nil {
			t.Fatalf("no span %q among %v", name, names(spans))
		}
		return s
	}
	httpSpan := byName("POST /threads/{thread_id}/runs/wait")
	publish := byName("publish AGENT_RUNS")
	run := byName("run chatbot")
	timeTool := byName("execute_tool current_time")
	taskTool := byName("execute_tool task")
	child := byName("run researcher")
	chats := findAll(spans, "chat lead")
	childChats := findAll(spans, "chat researcher")

	traceID := httpSpan.SpanContext().TraceID()
	for _, s := range append([]sdktrace.ReadOnlySpan{publish, run, timeTool, taskTool, child}, append(chats, childChats...)...) {
		if s.SpanContext().TraceID() != traceID {
			t.Errorf("span %q is in trace %s, want %s (one trace per run)", s.Name(), s.SpanContext().TraceID(), traceID)
		}
	}
	parentIs(t, publish, httpSpan)
	parentIs(t, run, publish)
	if !run.Parent().IsRemote() {
		t.Errorf("the run span's parent should come from the request's headers (remote)")
	}
	if run.SpanKind() != trace.SpanKindConsumer || publish.SpanKind() != trace.SpanKindProducer || httpSpan.SpanKind() != trace.SpanKindServer {
		t.Errorf("kinds: run %v, publish %v", run.SpanKind(), publish.SpanKind())
	}
	if len(chats) != 2 {
		t.Fatalf("%d chat spans of the lead, want 2 (tool calls, then the answer)", len(chats))
	}
	for _, c := range chats {
		parentIs(t, c, run)
		attrs := attrMap(c)
		if attrs["gen_ai.request.model"] != "lead" || attrs["gen_ai.response.model"] != "lead-v1" || attrs["gen_ai.usage.input_tokens"] != "40" || attrs["gen_ai.usage.output_tokens"] != "7" {
			t.Errorf("chat span attributes %v", attrs)
		}
	}
	parentIs(t, timeTool, run)
	parentIs(t, taskTool, run)
	if a := attrMap(timeTool); a["gen_ai.tool.name"] != "current_time" || a["gen_ai.tool.call.id"] != "call_time" || a["natsagent.tool.status"] != "success" {
		t.Errorf("tool span attributes %v", a)
	}
	// The child's request carried the task call's span.
	parentIs(t, child, taskTool)
	if len(childChats) != 1 {
		t.Fatalf("%d chat spans of the researcher, want 1", len(childChats))
	}
	parentIs(t, childChats[0], child)

	a := attrMap(run)
	for k, want := range map[string]string{"natsagent.agent": "chatbot", "natsagent.run_id": "r1", "natsagent.thread_id": "t1",
		"natsagent.tenant": "default", "natsagent.attempt": "1", "natsagent.status": "success", "natsagent.worker": "w1",
		"gen_ai.usage.input_tokens": "80", "gen_ai.usage.output_tokens": "14"} {
		if a[k] != want {
			t.Errorf("run span %s = %q, want %q (all: %v)", k, a[k], want, a)
		}
	}
	if a := attrMap(child); a["natsagent.parent_run_id"] != "r1" || a["natsagent.status"] != "success" {
		t.Errorf("child run span attributes %v", a)
	}

	// No message content anywhere: not the question, not the answers, not
	// the task's description.
	for _, s := range spans {
		for k, v := range attrMap(s) {
			for _, secret := range []string{secretQuestion, secretAnswer, secretChild} {
				if strings.Contains(v, secret) {
					t.Errorf("span %q attribute %s carries message content %q", s.Name(), k, v)
				}
			}
		}
	}
}

// Enabled, traces leave the process over OTLP/HTTP as protobuf: a
// collector (here an httptest receiver) gets the run's spans under the
// configured service name.
func TestOTLPHTTPExport(t *testing.T) {
	rcv := newReceiver(t)
	tel, err := app.NewTelemetry(context.Background(), config.Telemetry{Traces: config.Traces{Enabled: true, Endpoint: rcv.srv.URL, SampleRatio: 1, ServiceName: "natsagent-test"}}, app.ServiceWorker)
	if err != nil {
		t.Fatal(err)
	}
	profiles, m := leadAndResearcher()
	d := newDeployment(t, deploymentConfig{traces: tel.TracerProvider, profiles: profiles})
	d.startWorker(m, nil)
	d.submit("t1", "r1", secretQuestion, "")
	d.waitStatus("r1", protocol.StatusSuccess, 15*time.Second)
	defer func() {
		if t.Failed() {
			t.Logf("%d export requests, spans %v", rcv.requests(), rcv.spanNames())
		}
	}()
	testdeploy.WaitFor(t, 10*time.Second, "the spans exported", func() bool {
		if err := tel.TracerProvider.(interface{ ForceFlush(context.Context) error }).ForceFlush(context.Background()); err != nil {
			t.Logf("flush: %v", err)
		}
		got := rcv.spanNames()
		return got["run chatbot"] && got["run researcher"] && got["chat lead"] && got["execute_tool task"]
	})
	if err := tel.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	if rcv.contentType != "application/x-protobuf" || rcv.path != "/v1/traces" {
		t.Errorf("export went to %s as %s, want /v1/traces as application/x-protobuf", rcv.path, rcv.contentType)
	}
	if rcv.service != "natsagent-test" {
		t.Errorf("service.name %q, want natsagent-test", rcv.service)
	}
}

// Disabled (the default), nothing is exported and no tracer exists: the
// gateway and workers get none, and a run request carries no trace
// context.
func TestTracesOffExportNothing(t *testing.T) {
	rcv := newReceiver(t)
	cfg := config.Default().Telemetry
	cfg.Traces.Endpoint = rcv.srv.URL
	tel, err := app.NewTelemetry(context.Background(), cfg, app.ServiceGateway)
	if err != nil {
		t.Fatal(err)
	}
	if tel.TracerProvider != nil {
		t.Fatal("traces are off by default but a tracer provider was built")
	}
	profiles, m := leadAndResearcher()
	d := newDeployment(t, deploymentConfig{traces: tel.TracerProvider, profiles: profiles})
	d.startWorker(m, nil)
	d.submit("t1", "r1", secretQuestion, "")
	d.waitStatus("r1", protocol.StatusSuccess, 15*time.Second)
	if err := tel.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := rcv.requests(); n != 0 {
		t.Fatalf("%d export requests with traces off", n)
	}
	// A request the gateway publishes carries no trace context.
	sub, err := d.nc.SubscribeSync(d.settings.Names.RunSubject(protocol.DefaultTenant, "t2"))
	if err != nil {
		t.Fatal(err)
	}
	// The gateway publishes on its own connection: the server must know
	// of the subscription first, or the request goes to nobody.
	if err := d.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	d.submit("t2", "r2", "hi", "")
	msg, err := sub.NextMsg(natstest.Patience)
	if err != nil {
		t.Fatal(err)
	}
	if tp := msg.Header.Get("traceparent"); tp != "" {
		t.Fatalf("a run request carries traceparent %q with traces off", tp)
	}
}

// receiver is an OTLP/HTTP collector: it decodes every export request.
type receiver struct {
	srv         *httptest.Server
	mu          sync.Mutex
	n           int
	names       map[string]bool
	contentType string
	path        string
	service     string
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{names: map[string]bool{}}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var msg coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &msg); err != nil {
			t.Errorf("undecodable export: %v", err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		r.n++
		r.contentType, r.path = req.Header.Get("Content-Type"), req.URL.Path
		for _, rs := range msg.ResourceSpans {
			for _, kv := range rs.GetResource().GetAttributes() {
				if kv.Key == "service.name" {
					r.service = kv.GetValue().GetStringValue()
				}
			}
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					r.names[s.Name] = true
				}
			}
		}
		r.mu.Unlock()
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) spanNames() map[string]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]bool, len(r.names))
	for k, v := range r.names {
		out[k] = v
	}
	return out
}

func (r *receiver) requests() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

func find(spans []sdktrace.ReadOnlySpan, name string) sdktrace.ReadOnlySpan {
	for _, s := range spans {
		if s.Name() == name {
			return s
		}
	}
	return nil
}

func findAll(spans []sdktrace.ReadOnlySpan, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func names(spans []sdktrace.ReadOnlySpan) []string {
	out := make([]string, len(spans))
	for i, s := range spans {
		out[i] = s.Name()
	}
	return out
}

func parentIs(t *testing.T, child, parent sdktrace.ReadOnlySpan) {
	t.Helper()
	if child.Parent().SpanID() != parent.SpanContext().SpanID() {
		t.Errorf("span %q has parent %s, want %q (%s)", child.Name(), child.Parent().SpanID(), parent.Name(), parent.SpanContext().SpanID())
	}
}

func attrMap(s sdktrace.ReadOnlySpan) map[string]string {
	out := map[string]string{}
	for _, kv := range s.Attributes() {
		out[string(kv.Key)] = attrString(kv)
	}
	return out
}

func attrString(kv attribute.KeyValue) string {
	if kv.Value.Type() == attribute.STRING {
		return kv.Value.AsString()
	}
	return fmt.Sprint(kv.Value.AsInterface())
}
