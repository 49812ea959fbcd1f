package main

import (
	"context"
	"flag"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/metrics"
	"github.com/natsagent/natsagent/internal/metrics/prom"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/testdeploy"
)

// With metrics on, the health server serves /metrics beside the probes;
// without, /metrics is not there.
func TestHealthServerServesMetrics(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect()
	rec, err := prom.New(prom.Options{Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	untrack := rec.TrackWorker(func() metrics.WorkerStats { return metrics.WorkerStats{Slots: 8, BusySlots: 2, ActiveLeases: 2} })
	defer untrack()
	addr := freeAddr(t)
	stop, err := serveHealth(context.Background(), addr, nc, zap.NewNop(), rec.Handler())
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	get := func(path string) (int, string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			resp, err := http.Get("http://" + addr + path)
			if err == nil {
				b, _ := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				return resp.StatusCode, string(b)
			}
			if time.Now().After(deadline) {
				t.Fatalf("GET %s: %v", path, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	code, body := get("/metrics")
	if code != http.StatusOK || !strings.Contains(body, "natsagent_worker_slots 8") || !strings.Contains(body, "natsagent_worker_active_leases 2") {
		t.Fatalf("/metrics: %d\n%s", code, body)
	}
	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz beside /metrics: %d", code)
	}
	stop()

	addr = freeAddr(t)
	stop, err = serveHealth(context.Background(), addr, nc, zap.NewNop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if code, body := get("/metrics"); code == http.StatusOK {
		t.Fatalf("/metrics served with metrics off: %s", body)
	}
}

// Issue 20 item 12: the worker command serves /metrics without being
// asked, on the documented default address, and a default address that
// is taken (a second worker on the host) does not stop the worker; an
// address asked for with --listen must be served.
func TestWorkerServesMetricsByDefault(t *testing.T) {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	listen := fs.String("listen", defaultListen, "")
	if err := fs.Parse(nil); err != nil || *listen != "127.0.0.1:8081" || isSet(fs, "listen") {
		t.Fatalf("default --listen %q (set %v), want 127.0.0.1:8081 as docs/operations.md says", *listen, isSet(fs, "listen"))
	}

	srv := natstest.Start(t)
	nc := srv.Connect()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = taken.Close() }()
	stop, err := startHealth(context.Background(), taken.Addr().String(), false, nc, zap.NewNop(), nil)
	if err != nil {
		t.Fatalf("a taken default address stopped the worker: %v", err)
	}
	stop()
	if _, err := startHealth(context.Background(), taken.Addr().String(), true, nc, zap.NewNop(), nil); err == nil {
		t.Fatal("a taken --listen address was not an error")
	}
}

// The worker command, run as a process, serves its metrics over loopback
// with the series and labels docs/operations.md lists for workers: after
// one run of the demo model (which calls current_time), its tool call by
// tool and status, and its model call under the demo model's name.
func TestWorkerProcessMetricsScrape(t *testing.T) {
	srv := natstest.Start(t)
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "--nats-url", srv.URL(), "--listen", addr)
	cmd.Env = append(os.Environ(), runEnv+"=1", "OPENAI_BASE_URL=", "OPENAI_API_KEY=", "NATSAGENT_MODEL=", "NATS_URL=", "NATSAGENT_CONFIG=")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
	}()
	scrape := func() (bool, string) {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return false, ""
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, string(b)
	}
	testdeploy.WaitFor(t, time.Minute, "the worker's /metrics", func() bool {
		ok, body := scrape()
		return ok && strings.Contains(body, "natsagent_worker_slots ")
	})

	js, err := jetstream.New(srv.Connect())
	if err != nil {
		t.Fatal(err)
	}
	req := `{"run_id":"r1","thread_id":"t1","tenant":"default","agent":"chatbot","input":{"messages":[{"role":"user","content":"what time is it?"}]}}`
	if _, err := js.Publish(ctx, "agent.runs.default.t1", []byte(req), jetstream.WithMsgID("default.r1")); err != nil {
		t.Fatal(err)
	}
	want := []string{
		`natsagent_tool_call_duration_seconds_count{status="success",tool="current_time"} 1`,
		`natsagent_model_call_duration_seconds_count{model="natsagent-demo",outcome="ok"} 2`,
		`natsagent_runs_finished_total{agent="chatbot",status="success"} 1`,
		"natsagent_lease_fence_pauses_total 0",
		"natsagent_worker_active_leases 0",
		"go_goroutines ",
	}
	var body string
	testdeploy.WaitFor(t, time.Minute, "the run's series on /metrics", func() bool {
		_, body = scrape()
		for _, w := range want {
			if !strings.Contains(body, w) {
				return false
			}
		}
		return true
	})
}
