// Package sandboxtest gives tests a working bubblewrap sandbox, or says
// why there is none: outside CI a machine without one skips the test with
// a message; with NATSAGENT_SANDBOX_TESTS=1 (set by .ci/run) it fails it,
// so CI never passes with the sandbox tests skipped.
package sandboxtest

import (
	"context"
	"os"
	"testing"

	"github.com/natsagent/natsagent/internal/sandbox"
)

// Env is the variable that makes a missing sandbox a test failure.
const Env = "NATSAGENT_SANDBOX_TESTS"

// New returns a bubblewrap sandbox with cfg, or ends the test.
func New(t testing.TB, cfg sandbox.Config) *sandbox.Sandbox {
	t.Helper()
	cfg.Isolation = sandbox.Bubblewrap
	s, err := sandbox.New(context.Background(), cfg)
	if err != nil {
		Unavailable(t, err)
	}
	return s
}

// Unavailable ends a test that needs the sandbox: a failure under
// NATSAGENT_SANDBOX_TESTS=1, a skip otherwise.
func Unavailable(t testing.TB, err error) {
	t.Helper()
	if os.Getenv(Env) == "1" {
		t.Fatalf("%v; %s=1 requires the sandbox", err, Env)
	}
	t.Skipf("%v; set %s=1 to make this a failure", err, Env)
}
