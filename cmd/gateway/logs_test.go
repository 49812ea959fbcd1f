package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/testdeploy"
)

// syncBuffer is a bytes.Buffer a child process writes while the test reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// devStderr starts gateway --dev with args on loopback ports, its stderr a
// pipe (not a terminal), waits until it has said where to start and its
// worker started, stops it with SIGINT and returns everything it wrote to
// stderr.
func devStderr(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	args = append([]string{"--dev", "--data", filepath.Join(t.TempDir(), "data"), "--nats-listen", "127.0.0.1:0", "--listen", "127.0.0.1:0", "--workers", "1"}, args...)
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), runEnv+"=1", "OPENAI_BASE_URL=", "OPENAI_API_KEY=", "NATSAGENT_MODEL=", "NATS_URL=", "NATSAGENT_CONFIG=")
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The worker logs its start after the hint: wait for both, so the
	// log holds every start line.
	testdeploy.WaitFor(t, 45*time.Second, "the gateway's hint and its worker's start", func() bool {
		out := stderr.String()
		return strings.Contains(out, "try it") && strings.Contains(out, "worker started")
	})
	_ = cmd.Process.Signal(syscall.SIGINT)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("gateway --dev exited: %v\n%s", err, stderr.String())
	}
	return stderr.String()
}

// --dev logs for a person, but a pipe or a file gets no colour codes, and
// the start hint is a log line, not loose text.
func TestDevLogsPlainWithoutTerminal(t *testing.T) {
	out := devStderr(t)
	if strings.Contains(out, "\x1b[") {
		t.Errorf("colour codes in a piped log:\n%q", out)
	}
	if !strings.Contains(out, "INFO\ttry it\t") || !strings.Contains(out, `/console/`) {
		t.Errorf("no hint line:\n%s", out)
	}
	if strings.Contains(out, "Open the console at") {
		t.Errorf("the terminal banner went to a pipe:\n%s", out)
	}
}

// With JSON logs every line of stderr is one JSON object, the hint too.
func TestDevJSONLogsStayJSON(t *testing.T) {
	out := devStderr(t, "--log-console=false")
	hint := false
	var server string
	var workers []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var entry map[string]any
		if err := json.Unmarshal([]byte(line), &entry); err != nil {
			t.Errorf("not a JSON line: %q (%v)", line, err)
			continue
		}
		switch entry["msg"] {
		case "try it":
			hint = strings.HasSuffix(entry["console"].(string), "/console/") && strings.Contains(entry["curl"].(string), "/threads/demo/runs/stream")
		case "embedded NATS server with JetStream":
			server, _ = entry["url"].(string)
		case "natsagent worker":
			nats, _ := entry["nats"].(string)
			workers = append(workers, nats)
		}
	}
	if !hint {
		t.Errorf("no hint line with console and curl:\n%s", out)
	}
	// The in-process workers name the server they use, the one on the
	// port --nats-listen took, not nats.go's default 4222.
	if server == "" || strings.HasSuffix(server, ":4222") || len(workers) != 1 || workers[0] != server {
		t.Errorf("embedded server %q, workers connected to %q:\n%s", server, workers, out)
	}
}
