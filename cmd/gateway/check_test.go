package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/testdeploy"
)

// runEnv makes the test binary run the gateway's main with its arguments.
const runEnv = "NATSAGENT_TEST_RUN_GATEWAY"

func TestMain(m *testing.M) {
	if os.Getenv(runEnv) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runGateway runs the gateway command with args; it returns the exit code
// and stderr.
func runGateway(t *testing.T, args ...string) (int, string) {
	t.Helper()
	code, _, stderr := testdeploy.RunSelf(t, runEnv, 20*time.Second, args...)
	return code, stderr
}

// With --dev the gateway runs workers: a typo in a profile stops it before
// the embedded NATS server starts; --print-config refuses it too.
func TestDevGatewayChecksProfilesFirst(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "natsagent.yaml")
	yaml := "agents:\n  - name: researcher\n    middleware:\n      settings:\n        context_compression: {keep: {mesages: 20}}\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	const want = "gateway: invalid configuration:\n  agents[0].middleware.settings.context_compression (line 5): invalid settings: unknown key \"mesages\"; did you mean messages?"
	data := filepath.Join(dir, "data")
	code, stderr := runGateway(t, "--config", path, "--dev", "--data", data, "--nats-listen", "127.0.0.1:0", "--listen", "127.0.0.1:0")
	if code == 0 || !strings.Contains(stderr, want) {
		t.Errorf("--dev: exit %d, stderr %q", code, stderr)
	}
	if _, err := os.Stat(data); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the embedded server started (%s: %v)", data, err)
	}
	code, stderr = runGateway(t, "--config", path, "--print-config")
	if code == 0 || !strings.Contains(stderr, want) {
		t.Errorf("--print-config: exit %d, stderr %q", code, stderr)
	}
}

// A gateway with --dev prints every mistake of a file at once, the
// profiles' with the rest and its own listen flags, before the embedded
// server starts; without --dev it checks no profile.
func TestDevGatewayPrintsEveryMistakeAtOnce(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "natsagent.yaml")
	yaml := `gateway:
  listen: 5
agents:
  - name: lead
    tools: [current_tme]
    middleware:
      settings:
        loop_detektion: {}
`
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	want := []string{
		`gateway.listen: "5" is not host:port`,
		`agents[0].tools[0] (line 5): unknown tool "current_tme"; did you mean current_time?`,
		"agents[0].middleware.settings.loop_detektion (line 8): unknown middleware; did you mean loop_detection?",
		`--nats-listen: "4222" is not host:port`,
	}
	data := filepath.Join(dir, "data")
	code, stderr := runGateway(t, "--config", path, "--dev", "--data", data, "--nats-listen", "4222")
	if code == 0 || !strings.HasPrefix(stderr, "gateway: invalid configuration:\n") {
		t.Errorf("--dev: exit %d, stderr %q", code, stderr)
	}
	for _, w := range want {
		if !strings.Contains(stderr, w) {
			t.Errorf("--dev: stderr lacks %q:\n%s", w, stderr)
		}
	}
	if got := strings.Count(stderr, "\n  "); got != len(want) {
		t.Errorf("--dev: %d problems printed, want %d:\n%s", got, len(want), stderr)
	}
	if _, err := os.Stat(data); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the embedded server started (%s: %v)", data, err)
	}
	code, stderr = runGateway(t, "--config", path)
	if code == 0 || !strings.Contains(stderr, want[0]) || strings.Contains(stderr, "agents[0]") {
		t.Errorf("without --dev: exit %d, stderr %q", code, stderr)
	}
}
