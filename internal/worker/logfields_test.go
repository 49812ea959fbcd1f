package worker

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/testdeploy"
	"github.com/natsagent/natsagent/internal/tools"
)

// Every line logged during a run carries tenant, thread_id, run_id and
// worker: the worker's own lines and the middlewares' (a model retry, a
// failing tool), which log through Runtime.Logger.
func TestEveryRunLogLineCarriesRunFields(t *testing.T) {
	h := newHarness(t)
	h.tools.Register(tools.Func(model.ToolSpec{Name: "explode", Description: "Always fails.", Parameters: json.RawMessage(`{"type":"object"}`)},
		func(context.Context, json.RawMessage) (string, error) { return "", errors.New("the fuse blew") }))
	m := model.Func(func(ctx context.Context, req *model.Request, onDelta func(model.Delta)) (*model.Response, error) {
		last := req.Messages[len(req.Messages)-1]
		switch {
		case last.Role == model.RoleTool:
			return &model.Response{Message: model.Message{Role: model.RoleAssistant, Content: "done"}, FinishReason: model.FinishStop}, nil
		case req.Model == "main":
			return nil, errors.New("invalid_request_error: refused")
		}
		return &model.Response{Message: model.Message{Role: model.RoleAssistant, ToolCalls: []model.ToolCall{{ID: "c1", Name: "explode", Arguments: "{}"}}}, FinishReason: model.FinishToolCalls}, nil
	})
	core, logs := observer.New(zapcore.DebugLevel)
	chatbot := agent.Chatbot()
	chatbot.Model = "main"
	chatbot.Tools = []string{"explode"}
	chatbot.Middleware = middleware.ChainConfig{Settings: map[string]json.RawMessage{
		"model_retry": json.RawMessage(`{"max_retries":0,"network_budget_seconds":0,"fallback_models":["backup"]}`)}}
	agents, err := agent.NewAgents(m, h.tools, chatbot)
	if err != nil {
		t.Fatal(err)
	}
	h.startWorker(m, func(c *Config) {
		c.ID = "w-logs"
		c.Agents = agents
		c.Logger = zap.New(core)
	})
	w := h.watch("tenant-a", "t1", "r1")
	req := request("t1", "r1", "go")
	req.Tenant = "tenant-a"
	h.submit(req)
	if fin := w.finished(t, 10*time.Second); fin.Status != protocol.StatusSuccess {
		t.Fatalf("run ended %s: %s", fin.Status, fin.Error)
	}
	testdeploy.WaitFor(t, 5*time.Second, "the run's last log line", func() bool { return logs.FilterMessage("run finished").Len() == 1 })

	process := map[string]bool{"worker started": true, "worker stopped": true}
	seen := map[string]bool{}
	for _, e := range logs.All() {
		if process[e.Message] {
			continue
		}
		seen[e.Message] = true
		fields := e.ContextMap()
		for k, want := range map[string]string{"tenant": "tenant-a", "thread_id": "t1", "run_id": "r1", "worker": "w-logs"} {
			if got, _ := fields[k].(string); got != want {
				t.Errorf("log line %q has %s=%q, want %q (fields %v)", e.Message, k, got, want, fields)
			}
		}
	}
	for _, msg := range []string{"run started", "model call failed; retrying", "tool call failed", "run finished"} {
		if !seen[msg] {
			t.Errorf("no log line %q (lines: %v)", msg, seen)
		}
	}
	// A run's start and end are the lines an operator reads at info: the
	// end says how it ended and how long it took.
	for _, msg := range []string{"run started", "run finished"} {
		for _, e := range logs.FilterMessage(msg).All() {
			if e.Level != zapcore.InfoLevel {
				t.Errorf("%q logged at %s, want info", msg, e.Level)
			}
			if got, _ := e.ContextMap()["attempt"].(int64); got != 1 {
				t.Errorf("%q has attempt %v, want 1 (fields %v)", msg, e.ContextMap()["attempt"], e.ContextMap())
			}
		}
	}
	for _, e := range logs.FilterMessage("run finished").All() {
		fields := e.ContextMap()
		if fields["status"] != string(protocol.StatusSuccess) {
			t.Errorf("run finished: status %v (fields %v)", fields["status"], fields)
		}
		if d, ok := fields["duration"].(time.Duration); !ok || d <= 0 {
			t.Errorf("run finished: duration %v (fields %v)", fields["duration"], fields)
		}
	}
}

// A run a guard cut short says so in its last log line: status
// incomplete and the guard as stop_reason, beside attempt and duration.
func TestRunFinishedLogsStopReason(t *testing.T) {
	h := newHarness(t)
	m := model.Func(func(ctx context.Context, req *model.Request, onDelta func(model.Delta)) (*model.Response, error) {
		return &model.Response{Message: model.Message{Role: model.RoleAssistant,
			ToolCalls: []model.ToolCall{{ID: "c1", Name: "current_time", Arguments: "{}"}}}, FinishReason: model.FinishToolCalls}, nil
	})
	core, logs := observer.New(zapcore.InfoLevel)
	h.startWorker(m, func(c *Config) { c.Logger = zap.New(core) })
	w := h.watch("default", "t1", "capped")
	req := request("t1", "capped", "keep calling tools")
	req.Config.MaxSteps = 1
	h.submit(req)
	if fin := w.finished(t, 15*time.Second); fin.Status != protocol.StatusIncomplete {
		t.Fatalf("run ended %s (%s)", fin.Status, fin.StopReason)
	}
	testdeploy.WaitFor(t, 5*time.Second, "the run's last log line", func() bool { return logs.FilterMessage("run finished").Len() == 1 })
	fields := logs.FilterMessage("run finished").All()[0].ContextMap()
	if fields["status"] != string(protocol.StatusIncomplete) || fields["stop_reason"] != protocol.StopMaxSteps ||
		fields["run_id"] != "capped" || fields["attempt"] != int64(1) {
		t.Fatalf("run finished: %v", fields)
	}
	if d, ok := fields["duration"].(time.Duration); !ok || d <= 0 {
		t.Fatalf("run finished: duration %v", fields["duration"])
	}
}
