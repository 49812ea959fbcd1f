package deploy

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/testdeploy"
)

// jsClientDir is the pinned npm project of the official NATS JavaScript
// client that cmd/gateway's TestJSClient uses (.ci/run installs it).
const jsClientDir = "../cmd/gateway/testdata/nats-js"

// A client of tenant acme in another language, the official NATS
// JavaScript client, is refused globex's subjects by the shipped
// tenants.conf and sees the permission violations
// (testdata/nats-js/tenant.mjs). Without node or the client it skips,
// unless NATSAGENT_CLIENT_TESTS=1 (CI), where it fails.
func TestJSClientTenantRefused(t *testing.T) {
	node := testdeploy.NodeJSClient(t, jsClientDir)
	url := startTenantsServer(t).ClientURL()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "tenant.mjs")
	cmd.Dir = jsClientDir
	cmd.Env = append(os.Environ(), "NATS_URL="+url, "NATS_USER=acme", "NATS_PASSWORD=acme-test-password")
	out, err := cmd.CombinedOutput()
	t.Logf("JS client checks:\n%s", out)
	if err != nil {
		t.Fatalf("the JS client checks failed: %v", err)
	}
	if !strings.Contains(string(out), "\nchecks passed: 8\n") {
		t.Fatal("the script did not pass its 8 checks")
	}
}
