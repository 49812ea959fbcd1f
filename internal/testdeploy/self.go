package testdeploy

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"testing"
	"time"
)

// RunSelf runs the test binary again as the command under test: the
// package's TestMain runs main() when the environment variable env is
// "1". The model, NATS and config variables of the caller's environment
// are cleared, so the child sees only its args. It returns the exit code,
// stdout and stderr, and fails the test if the child is not done within
// timeout.
func RunSelf(t testing.TB, env string, timeout time.Duration, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), env+"=1", "OPENAI_BASE_URL=", "OPENAI_API_KEY=", "NATSAGENT_MODEL=", "NATS_URL=", "NATSAGENT_CONFIG=")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%v did not exit within %s: %s", args, timeout, errOut.String())
	}
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), out.String(), errOut.String()
}
