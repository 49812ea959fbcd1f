package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), runEnv+"=1", "OPENAI_BASE_URL=", "OPENAI_API_KEY=", "NATSAGENT_MODEL=", "NATS_URL=", "NATSAGENT_CONFIG=")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("gateway %v did not exit: %s", args, stderr.String())
	}
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), stderr.String()
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
