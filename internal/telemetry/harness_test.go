package telemetry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/gateway"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/metrics"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/testdeploy"
	"github.com/natsagent/natsagent/internal/tools"
	"github.com/natsagent/natsagent/internal/worker"
)

// deployment is a real embedded JetStream server with natsagent
// provisioned, a gateway behind an httptest server and workers on their
// own connections, sharing the metrics recorder and tracer provider the
// test gives.
type deployment struct {
	t        *testing.T
	srv      *natstest.Server
	nc       *nats.Conn
	js       jetstream.JetStream
	settings bus.Settings
	stores   *kv.Stores
	http     *httptest.Server
	rec      metrics.Recorder
	tp       trace.TracerProvider
	profiles []agent.Profile
}

type deploymentConfig struct {
	metrics        metrics.Recorder
	metricsHandler http.Handler
	traces         trace.TracerProvider
	profiles       []agent.Profile
}

func newDeployment(t *testing.T, c deploymentConfig) *deployment {
	t.Helper()
	// A long ack wait: a 2 s one redelivered healthy runs on a loaded
	// machine, and the spans assert attempt 1.
	d := testdeploy.Start(t, bus.Settings{AckWait: 30 * time.Second, MaxDeliver: 5})
	srv, nc, js, settings, stores := d.Server, d.NC, d.JS, d.Settings, d.Stores
	gw, err := gateway.New(context.Background(), nc, gateway.Config{Settings: settings, Logger: zaptest.NewLogger(t),
		Metrics: c.metrics, MetricsHandler: c.metricsHandler, Traces: c.traces})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(gw.Handler())
	t.Cleanup(hs.Close)
	return &deployment{t: t, srv: srv, nc: nc, js: js, settings: settings, stores: stores, http: hs,
		rec: c.metrics, tp: c.traces, profiles: c.profiles}
}

// startWorker starts a worker serving the deployment's profiles with m.
func (d *deployment) startWorker(m model.Model, log *zap.Logger) {
	d.t.Helper()
	nc, err := nats.Connect(d.srv.URL(), nats.MaxReconnects(-1))
	if err != nil {
		d.t.Fatal(err)
	}
	agents, err := agent.NewAgents(m, tools.NewRegistry(), d.profiles...)
	if err != nil {
		d.t.Fatal(err)
	}
	if log == nil {
		log = zaptest.NewLogger(d.t)
	}
	w, err := worker.New(context.Background(), nc, worker.Config{
		Settings: d.settings, ID: "w1", Concurrency: 4, Agents: agents, Logger: log,
		WaitPoll: 200 * time.Millisecond, ShutdownGrace: 3 * time.Second,
		Metrics: d.rec, Traces: d.tp,
	})
	if err != nil {
		d.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	d.t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, worker.ErrConnectionClosed) {
				d.t.Errorf("worker: %v", err)
			}
		case <-time.After(20 * time.Second):
			d.t.Error("worker did not stop")
		}
		nc.Close()
	})
}

// post sends a JSON request to the gateway and returns the status and
// body.
func (d *deployment) post(path string, body any) (int, []byte) {
	d.t.Helper()
	data, err := json.Marshal(body)
	if err != nil {
		d.t.Fatal(err)
	}
	resp, err := d.http.Client().Post(d.http.URL+path, "application/json", bytes.NewReader(data))
	if err != nil {
		d.t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

// submit starts a run in the background with one user message.
func (d *deployment) submit(thread, run, text, strategy string) {
	d.t.Helper()
	body := map[string]any{"run_id": run, "input": map[string]any{"messages": []map[string]string{{"role": "user", "content": text}}}}
	if strategy != "" {
		body["multitask_strategy"] = strategy
	}
	if code, out := d.post("/threads/"+thread+"/runs", body); code >= 300 {
		d.t.Fatalf("submit %s: %d %s", run, code, out)
	}
}

// waitStatus waits until the run's record has the status.
func (d *deployment) waitStatus(run string, status protocol.Status, timeout time.Duration) *protocol.Run {
	d.t.Helper()
	// The timeout says when a run is overdue, not how fast it must be.
	timeout = max(timeout, testdeploy.MinWait)
	deadline := time.Now().Add(timeout)
	var last *protocol.Run
	for time.Now().Before(deadline) {
		rec, _, err := d.stores.Runs.Get(context.Background(), protocol.DefaultTenant, run)
		if err == nil {
			last = rec
			if rec.Status == status {
				return rec
			}
			if rec.Status.Terminal() {
				d.t.Fatalf("run %s ended %s (%s), want %s", run, rec.Status, rec.Error, status)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	d.t.Fatalf("run %s not %s after %s (last: %+v)", run, status, timeout, last)
	return nil
}

// answered reports whether the request ends with tool results.
func answered(req *model.Request) bool {
	n := len(req.Messages)
	return n > 0 && req.Messages[n-1].Role == model.RoleTool
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
