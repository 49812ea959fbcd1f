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
	const want = "worker: invalid configuration:\n  agents[0].middleware.settings.context_compression (line 5): invalid settings: unknown key \"mesages\"; did you mean messages?"

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

// mixedMistakes has mistakes of the file's shape, of its values and of its
// profiles; mixedReport is what a command prints of it, in one report.
const mixedMistakes = `nats:
  replicaz: 3
worker:
  job_concurrency: 0
agents:
  - name: lead
    tools: [current_tme]
    subagents: [helpr]
    middleware:
      settings:
        loop_detection: {hard_limit: 3, warn_threshold: 5}
  - name: helper
    kind: subagent
    middleware:
      settings:
        memory: {enabled: true, max_notes_chars: 10}
`

var mixedReport = []string{
	"nats.replicaz (line 2): unknown key; did you mean replicas?",
	"worker.job_concurrency: must be at least 1",
	`agents[0].tools[0] (line 7): unknown tool "current_tme"; did you mean current_time?`,
	`agents[0].subagents[0] (line 8): "helpr" is not a subagent profile; did you mean helper?`,
	"agents[0].middleware.settings.loop_detection (line 11): hard_limit (3) must be at least warn_threshold (5)",
	"agents[1].middleware.settings.memory (line 16): max_notes_chars must be 200 to 32000, not 10",
	`--listen: "5" is not host:port`,
}

// The worker prints every mistake of a file at once, the profiles' with
// the rest, and with its own --listen, before any connection.
func TestWorkerPrintsEveryMistakeAtOnce(t *testing.T) {
	url, accepted := natstest.RefusingListener(t)
	path := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(path, []byte(mixedMistakes), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"--print-config"}, nil} {
		code, stdout, stderr := runWorker(t, append([]string{"--config", path, "--nats-url", url, "--listen", "5"}, args...)...)
		if code == 0 || stdout != "" || !strings.HasPrefix(stderr, "worker: invalid configuration:\n") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, code, stdout, stderr)
		}
		for _, want := range mixedReport {
			if !strings.Contains(stderr, want) {
				t.Errorf("%v: stderr lacks %q:\n%s", args, want, stderr)
			}
		}
		if got := strings.Count(stderr, "\n  "); got != len(mixedReport) {
			t.Errorf("%v: %d problems printed, want %d:\n%s", args, got, len(mixedReport), stderr)
		}
	}
	if n := accepted.Load(); n != 0 {
		t.Errorf("the worker connected to NATS %d times", n)
	}
}
