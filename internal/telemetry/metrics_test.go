package telemetry_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	pmodel "github.com/prometheus/common/model"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/metrics/prom"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/testdeploy"
)

// After a success, an error (with a fallback retry), a cancel, a steer and
// a dead-lettered request, /metrics on the gateway (which shares the
// process's registry with its worker, as gateway --dev does) holds the
// exact counts, and the gauges read the worker's state and the consumer's
// lag at scrape time.
func TestMetricsScrapeAfterRuns(t *testing.T) {
	rec, err := prom.New(prom.Options{Registry: prometheus.NewRegistry(), LagRefresh: -1})
	if err != nil {
		t.Fatal(err)
	}
	chatbot := agent.Chatbot()
	chatbot.Model = "main"
	chatbot.Tools = nil
	chatbot.Middleware = middleware.ChainConfig{Settings: map[string]json.RawMessage{
		"model_retry": json.RawMessage(`{"max_retries":0,"network_budget_seconds":0,"fallback_models":["backup"]}`)}}
	d := newDeployment(t, deploymentConfig{metrics: rec, metricsHandler: rec.Handler(), profiles: []agent.Profile{chatbot}})

	blocked := make(chan string, 4)
	d.startWorker(model.Func(func(ctx context.Context, req *model.Request, onDelta func(model.Delta)) (*model.Response, error) {
		switch req.LastUserContent() {
		case "fail":
			return nil, errors.New("invalid_request_error: the model refused the request")
		case "block":
			blocked <- req.Model
			<-ctx.Done()
			return nil, fmt.Errorf("model call stopped: %w", ctx.Err())
		}
		return &model.Response{Message: model.Message{Role: model.RoleAssistant, Content: "ok"}, FinishReason: model.FinishStop,
			Usage: &model.Usage{PromptTokens: 10, CompletionTokens: 5, TotalTokens: 15}}, nil
	}), nil)

	d.submit("t1", "r-ok", "hello", "")
	d.waitStatus("r-ok", protocol.StatusSuccess, 10*time.Second)
	d.submit("t2", "r-fail", "fail", "")
	d.waitStatus("r-fail", protocol.StatusError, 10*time.Second)

	d.submit("t3", "r-cancel", "block", "")
	natstest.Recv(t, blocked, "the model call of run r-cancel")
	if code, out := d.post("/threads/t3/runs/r-cancel/cancel", map[string]any{}); code >= 300 {
		t.Fatalf("cancel: %d %s", code, out)
	}
	d.waitStatus("r-cancel", protocol.StatusCancelled, 10*time.Second)

	d.submit("t4", "r-long", "block", "")
	natstest.Recv(t, blocked, "the model call of run r-long")
	// While it runs: one lease, one busy slot, its request unacked.
	mf := scrape(t, d)
	gauge(t, mf, "natsagent_worker_active_leases", nil, 1)
	gauge(t, mf, "natsagent_worker_slots_busy", nil, 1)
	gauge(t, mf, "natsagent_worker_slots", nil, 4)
	gauge(t, mf, "natsagent_consumer_lag", nil, 1)
	d.submit("t4", "r-steer", "hello", protocol.StrategySteer)
	d.waitStatus("r-long", protocol.StatusSteered, 10*time.Second)
	d.waitStatus("r-steer", protocol.StatusSuccess, 10*time.Second)

	// An invalid request (an agent nobody serves) is dead-lettered.
	bad := nats.NewMsg(d.settings.Names.RunSubject(protocol.DefaultTenant, "t5"))
	bad.Data = []byte(`{"run_id":"r-bad","thread_id":"t5","tenant":"default","agent":"nobody","input":{"messages":[{"role":"user","content":"x"}]}}`)
	if _, err := d.js.PublishMsg(context.Background(), bad); err != nil {
		t.Fatal(err)
	}
	d.waitStatus("r-bad", protocol.StatusError, 10*time.Second)

	testdeploy.WaitFor(t, 10*time.Second, "every request acked", func() bool {
		mf = scrape(t, d)
		return value(mf, "natsagent_consumer_lag", nil) == 0 && value(mf, "natsagent_worker_jobs_processed_total", labels{"delivery": "first"}) == 6
	})

	for _, c := range []struct {
		name   string
		labels labels
		want   float64
	}{
		{"natsagent_runs_finished_total", labels{"agent": "chatbot", "status": "success"}, 2},
		{"natsagent_runs_finished_total", labels{"agent": "chatbot", "status": "error"}, 1},
		{"natsagent_runs_finished_total", labels{"agent": "chatbot", "status": "cancelled"}, 1},
		{"natsagent_runs_finished_total", labels{"agent": "chatbot", "status": "steered"}, 1},
		{"natsagent_runs_finished_total", labels{"agent": "unknown", "status": "error"}, 1},
		{"natsagent_runs_started_total", labels{"agent": "chatbot", "strategy": "enqueue"}, 4},
		{"natsagent_runs_started_total", labels{"agent": "chatbot", "strategy": "steer"}, 1},
		{"natsagent_model_tokens_total", labels{"model": "main", "purpose": "main", "direction": "input"}, 20},
		{"natsagent_model_tokens_total", labels{"model": "main", "purpose": "main", "direction": "output"}, 10},
		{"natsagent_model_retries_total", labels{"kind": "fallback"}, 1},
		{"natsagent_cancel_requests_total", labels{"outcome": "ok"}, 1},
		{"natsagent_dead_lettered_total", labels{"reason": "invalid"}, 1},
		{"natsagent_gateway_runs_submitted_total", labels{"strategy": "enqueue"}, 4},
		{"natsagent_gateway_runs_submitted_total", labels{"strategy": "steer"}, 1},
		{"natsagent_http_requests_total", labels{"route": "POST /threads/{thread_id}/runs", "code": "200"}, 5},
		{"natsagent_http_requests_total", labels{"route": "POST /threads/{thread_id}/runs/{run_id}/cancel", "code": "200"}, 1},
		{"natsagent_worker_jobs_processed_total", labels{"delivery": "first"}, 6},
		{"natsagent_worker_active_leases", nil, 0},
		{"natsagent_worker_slots_busy", nil, 0},
		{"natsagent_consumer_lag", labels{"consumer": d.settings.Names.RunsStream() + "/" + bus.RunsConsumer}, 0},
	} {
		if got := value(mf, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v\n%s", c.name, c.labels, got, c.want, dump(mf, c.name))
		}
	}
	for _, c := range []struct {
		name   string
		labels labels
		want   uint64
	}{
		{"natsagent_run_queue_wait_seconds", labels{"agent": "chatbot"}, 5},
		{"natsagent_run_duration_seconds", labels{"agent": "chatbot", "status": "success"}, 2},
		{"natsagent_run_duration_seconds", labels{"agent": "chatbot", "status": "cancelled"}, 1},
		{"natsagent_model_call_duration_seconds", labels{"model": "main", "outcome": "ok"}, 2},
		{"natsagent_model_call_duration_seconds", labels{"model": "main", "outcome": "error"}, 1},
		{"natsagent_model_call_duration_seconds", labels{"model": "backup", "outcome": "error"}, 1},
		{"natsagent_model_call_duration_seconds", labels{"model": "main", "outcome": "cancelled"}, 2},
	} {
		if got := histCount(mf, c.name, c.labels); got != c.want {
			t.Errorf("%s%v count = %d, want %d\n%s", c.name, c.labels, got, c.want, dump(mf, c.name))
		}
	}
	// A never-started run has no duration; the dead-lettered one is
	// counted, not timed.
	if got := histCount(mf, "natsagent_run_duration_seconds", labels{"agent": "unknown", "status": "error"}); got != 0 {
		t.Errorf("a run that never started has a duration (%d observations)", got)
	}
	// No id ever becomes a label.
	for name, f := range mf {
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if strings.HasPrefix(lp.GetValue(), "r-") || strings.HasPrefix(lp.GetValue(), "t") && len(lp.GetValue()) == 2 {
					t.Errorf("%s has an id as label %s=%s", name, lp.GetName(), lp.GetValue())
				}
				if lp.GetName() == "tenant" {
					t.Errorf("%s has a tenant label, which is off by default", name)
				}
			}
		}
	}
}

type labels map[string]string

func scrape(t *testing.T, d *deployment) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := d.http.Client().Get(d.http.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics answered %d", resp.StatusCode)
	}
	p := expfmt.NewTextParser(pmodel.UTF8Validation)
	mf, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return mf
}

func match(m *dto.Metric, want labels) bool {
	n := 0
	for _, lp := range m.GetLabel() {
		if v, ok := want[lp.GetName()]; ok {
			if v != lp.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(want)
}

// value is a counter's or gauge's value, summed over the series matching
// want; -1 when none matches.
func value(mf map[string]*dto.MetricFamily, name string, want labels) float64 {
	f := mf[name]
	if f == nil {
		return -1
	}
	sum, found := 0.0, false
	for _, m := range f.GetMetric() {
		if !match(m, want) {
			continue
		}
		found = true
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		}
	}
	if !found {
		return -1
	}
	return sum
}

func gauge(t *testing.T, mf map[string]*dto.MetricFamily, name string, want labels, v float64) {
	t.Helper()
	if got := value(mf, name, want); got != v {
		t.Errorf("%s%v = %v, want %v", name, want, got, v)
	}
}

func histCount(mf map[string]*dto.MetricFamily, name string, want labels) uint64 {
	f := mf[name]
	if f == nil {
		return 0
	}
	var n uint64
	for _, m := range f.GetMetric() {
		if match(m, want) {
			n += m.GetHistogram().GetSampleCount()
		}
	}
	return n
}

func dump(mf map[string]*dto.MetricFamily, name string) string {
	f := mf[name]
	if f == nil {
		return "  (no " + name + ")"
	}
	var lines []string
	for _, m := range f.GetMetric() {
		var ls []string
		for _, lp := range m.GetLabel() {
			ls = append(ls, lp.GetName()+"="+lp.GetValue())
		}
		v := m.GetCounter().GetValue() + m.GetGauge().GetValue() + float64(m.GetHistogram().GetSampleCount())
		lines = append(lines, fmt.Sprintf("  {%s} %v", strings.Join(ls, ","), v))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}
