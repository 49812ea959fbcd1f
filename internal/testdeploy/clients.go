package testdeploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// ClientTestsEnv, when "1" (CI), makes the tests that drive natsagent with
// other clients (the nats CLI, the official NATS JavaScript client) fail
// when the client is not installed; otherwise they skip.
const ClientTestsEnv = "NATSAGENT_CLIENT_TESTS"

// NeedClient skips the test when missing says a client is not installed,
// or fails it under ClientTestsEnv=1. An empty missing does nothing.
func NeedClient(t testing.TB, missing string) {
	t.Helper()
	if missing == "" {
		return
	}
	if os.Getenv(ClientTestsEnv) == "1" {
		t.Fatal(missing + "; " + ClientTestsEnv + "=1 requires it")
	}
	t.Skip(missing + "; set " + ClientTestsEnv + "=1 to make this a failure")
}

// NodeJSClient returns the path of node for the tests that run the
// official NATS JavaScript client, pinned in the npm project dir (relative
// to the test's package; .ci/run runs npm ci there). Without node or the
// client it skips the test, or fails it (NeedClient).
func NodeJSClient(t testing.TB, dir string) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		NeedClient(t, "node not found on PATH (Node 20 or later)")
	}
	for _, p := range []string{"transport-node", "jetstream", "kv", "services"} {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", "@nats-io", p, "package.json")); err != nil {
			NeedClient(t, "the NATS JavaScript client is not installed (run npm ci in "+dir+")")
		}
	}
	return node
}
