package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/testdeploy"
)

// devEnv is the environment of a gateway --dev child: the offline demo
// model, no configuration or NATS URL from the test's environment.
func devEnv() []string {
	return append(os.Environ(), runEnv+"=1", "OPENAI_BASE_URL=", "OPENAI_API_KEY=", "NATSAGENT_MODEL=", "NATS_URL=", "NATSAGENT_CONFIG=")
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().String()
}

// The in-process workers are natsagent.Workers counting into the
// gateway's registry: its /metrics holds the slots of both
// (docs/operations.md, "Metrics").
func TestDevServesItsWorkersMetrics(t *testing.T) {
	addr := freeAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "--dev", "--data", filepath.Join(t.TempDir(), "data"), "--nats-listen", "127.0.0.1:0",
		"--listen", addr, "--workers", "2", "--concurrency", "3")
	cmd.Env = devEnv()
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		if err := cmd.Wait(); err != nil {
			t.Errorf("gateway --dev exited: %v\n%s", err, stderr.String())
		}
	}()
	var body string
	testdeploy.WaitFor(t, 60*time.Second, "both workers' slots on the gateway's /metrics", func() bool {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return false
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		body = string(b)
		return resp.StatusCode == http.StatusOK && strings.Contains(body, "natsagent_worker_slots 6\n")
	})
	if !strings.Contains(body, "natsagent_http_requests_total") || strings.Count(body, "# TYPE go_goroutines ") != 1 {
		t.Errorf("the gateway's own series or the process collectors are missing or doubled:\n%s", body)
	}
	if n := strings.Count(stderr.String(), "natsagent worker"); n != 2 {
		t.Errorf("%d workers said they started, want 2:\n%s", n, stderr.String())
	}
}

// An in-process worker that cannot start (here: an MCP server that does
// not exist, which only the worker's start finds) stops the gateway with
// its error, as a worker process would exit.
func TestDevStopsWhenAWorkerFails(t *testing.T) {
	path := filepath.Join(t.TempDir(), "natsagent.yaml")
	yaml := "mcp:\n  servers:\n    - name: gone\n      transport: stdio\n      command: /nonexistent/natsagent-test-mcp\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := testdeploy.RunSelf(t, runEnv, 60*time.Second, "--config", path, "--dev", "--data", filepath.Join(t.TempDir(), "data"),
		"--nats-listen", "127.0.0.1:0", "--listen", "127.0.0.1:0", "--workers", "1")
	if code == 0 || !strings.Contains(stderr, "in-process worker dev-") || !strings.Contains(stderr, "gone") {
		t.Errorf("exit %d, stderr:\n%s", code, stderr)
	}
}
