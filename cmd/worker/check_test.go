package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/testdeploy"
)

// runEnv makes the test binary run the worker's main with its arguments.
const runEnv = "NATSAGENT_TEST_RUN_WORKER"

func TestMain(m *testing.M) {
	if os.Getenv(runEnv) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runWorker runs the worker command with args; it returns the exit code,
// stdout and stderr.
func runWorker(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	return testdeploy.RunSelf(t, runEnv, 30*time.Second, args...)
}

// A typo in a profile's middleware settings stops the worker, and
// --print-config, before any connection, naming the profile, the
// middleware and the key.
func TestProfileTypoStopsTheStartBeforeNATS(t *testing.T) {
	url, accepted := natstest.RefusingListener(t)

	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	good := filepath.Join(dir, "good.yaml")
	const profile = "agents:\n  - name: researcher\n    middleware:\n      settings:\n        context_compression: {keep: {%s: 20}}\n"
	if err := os.WriteFile(bad, []byte(strings.Replace(profile, "%s", "mesages", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(good, []byte(strings.Replace(profile, "%s", "messages", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	const want = `worker: agent profile "researcher": middleware settings.context_compression: invalid settings: json: unknown field "mesages"`

	code, stdout, stderr := runWorker(t, "--config", bad, "--nats-url", url, "--print-config")
	if code == 0 || !strings.Contains(stderr, want) || stdout != "" {
		t.Errorf("--print-config: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	code, _, stderr = runWorker(t, "--config", bad, "--nats-url", url)
	if code == 0 || !strings.Contains(stderr, want) {
		t.Errorf("start: exit %d, stderr %q", code, stderr)
	}
	if n := accepted.Load(); n != 0 {
		t.Errorf("the worker connected to NATS %d times", n)
	}

	code, stdout, stderr = runWorker(t, "--config", good, "--nats-url", url, "--print-config")
	if code != 0 || !strings.Contains(stdout, "messages: 20") {
		t.Errorf("--print-config of a valid file: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}
