package natsagent_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/natsagent/natsagent"
	"github.com/natsagent/natsagent/natsagenttest"
)

// runWorker runs w until the test ends, and checks it stopped cleanly.
func runWorker(t *testing.T, w *natsagent.Worker) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("worker: %v", err)
			}
		case <-time.After(natsagenttest.Timeout):
			t.Errorf("the worker did not stop within %s", natsagenttest.Timeout)
		}
	})
}

// scrape GETs /metrics from h and returns the body.
func scrape(t *testing.T, h http.Handler) string {
	t.Helper()
	rr := httptest.NewRecorder()
	h.ServeHTTP(rr, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	body, _ := io.ReadAll(rr.Body)
	if rr.Code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", rr.Code, body)
	}
	return string(body)
}

// waitFor polls cond until it holds or the generous deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(natsagenttest.Timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A worker's metrics can be served before Run (a program mounts them on
// its health server first); once it runs they show its slots, which
// Config.Concurrency sets.
func TestWorker_MetricsHandler(t *testing.T) {
	d := natsagenttest.Start(t, natsagent.Config{}, natsagenttest.Text("unused"))
	w, err := natsagent.NewWorker(d.Conn, natsagent.Config{Model: echoModel, Concurrency: 3})
	if err != nil {
		t.Fatal(err)
	}
	h := w.MetricsHandler()
	if h == nil {
		t.Fatal("no metrics handler with metrics on by default")
	}
	if body := scrape(t, h); !strings.Contains(body, "natsagent_worker_slots 0") || !strings.Contains(body, "go_goroutines ") {
		t.Fatalf("before Run:\n%s", body)
	}
	runWorker(t, w)
	waitFor(t, "the worker's slots on /metrics", func() bool { return strings.Contains(scrape(t, h), "natsagent_worker_slots 3\n") })

	off, err := natsagent.NewWorker(d.Conn, natsagent.Config{ConfigYAML: []byte("telemetry:\n  metrics:\n    enabled: false\n")})
	if err != nil {
		t.Fatal(err)
	}
	if off.MetricsHandler() != nil {
		t.Error("a metrics handler with metrics off")
	}
}

// Workers given one registry count into it and do not serve it
// themselves: the program does.
func TestWorker_MetricsRegistryShared(t *testing.T) {
	d := natsagenttest.Start(t, natsagent.Config{}, natsagenttest.Text("unused"))
	reg := prometheus.NewRegistry()
	for _, n := range []int{2, 5} {
		w, err := natsagent.NewWorker(d.Conn, natsagent.Config{Model: echoModel, Concurrency: n, MetricsRegistry: reg})
		if err != nil {
			t.Fatal(err)
		}
		if w.MetricsHandler() != nil {
			t.Error("a worker serves a registry the program gave it")
		}
		runWorker(t, w)
	}
	gauge := func() float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "natsagent_worker_slots" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		return -1
	}
	waitFor(t, "both workers' slots in the registry", func() bool { return gauge() == 7 })
}

// Config.Prefix replaces the configuration's: a worker on another prefix
// serves the clients of that prefix, beside a deployment on the default.
func TestWorker_Prefix(t *testing.T) {
	d := natsagenttest.Start(t, natsagent.Config{}, natsagenttest.Text("from the default deployment"))
	w, err := natsagent.NewWorker(d.Conn, natsagent.Config{ConfigYAML: []byte("nats:\n  prefix: ignored\n"), Prefix: "other", Model: echoModel})
	if err != nil {
		t.Fatal(err)
	}
	runWorker(t, w)
	var c *natsagent.Client
	waitFor(t, "the worker to provision the other deployment", func() bool {
		var err error
		c, err = natsagent.NewClient(d.Conn, &natsagent.ClientConfig{Prefix: "other"})
		return err == nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), natsagenttest.Timeout)
	defer cancel()
	if _, err := c.Submit(ctx, natsagent.RunRequest{RunID: "r1", ThreadID: "t1", Input: natsagent.UserInput("hello")}); err != nil {
		t.Fatal(err)
	}
	run, err := c.Wait(ctx, "t1", "r1")
	if err != nil {
		t.Fatal(err)
	}
	if run.Status != natsagent.StatusSuccess {
		t.Fatalf("run %s: %s", run.Status, run.Error)
	}
	if run.Output == nil || run.Output.Content != "echo: hello" {
		t.Errorf("the other deployment answered %+v", run.Output)
	}
	if res := d.Ask("t1", "", "hi"); res.Output() != "from the default deployment" {
		t.Errorf("the default deployment answered %q", res.Output())
	}
}
