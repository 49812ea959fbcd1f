package natsagent_test

import (
	"os/exec"
	"strings"
	"testing"
)

// Clients read the wire, not the engine: the gateway, the CLI and the
// wire half of compaction must not depend on the worker's chain. The
// gateway's whole dependency graph is checked; the CLI's own imports are
// (its bench and soak commands run workers in-process on purpose).
func TestClientsDependOnTheWireOnly(t *testing.T) {
	engine := []string{"internal/middleware", "internal/agent", "internal/worker"}
	check := func(what string, args ...string) {
		t.Helper()
		out, err := exec.Command("go", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		pkgs := strings.Fields(string(out))
		if len(pkgs) < 3 {
			t.Fatalf("go %s listed %d packages: %s", strings.Join(args, " "), len(pkgs), out)
		}
		for _, p := range pkgs {
			for _, e := range engine {
				if strings.HasSuffix(p, "/"+e) {
					t.Errorf("%s depends on %s", what, p)
				}
			}
		}
	}
	check("internal/gateway", "list", "-deps", "./internal/gateway")
	check("internal/compact", "list", "-deps", "./internal/compact")
	check("cmd/natsagent", "list", "-f", `{{join .Imports "\n"}}`, "./cmd/natsagent")
}
