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
	const want = `gateway: agent profile "researcher": middleware settings.context_compression: invalid settings: json: unknown field "mesages"`
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
