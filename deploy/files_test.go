package deploy

import (
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/natsagent/natsagent/internal/app"
	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/config"
)

// The files under test, relative to this package.
const (
	dockerfile     = "Dockerfile"
	composeFile    = "compose.yaml"
	composeConfig  = "natsagent.yaml"
	natsConfDir    = "nats"
	k8sDir         = "k8s"
	repoRoot       = ".."
	natsValuesFile = "k8s/nats-values.yaml"
)

func read(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// loadConfig loads a natsagent configuration file the way the processes
// do (internal/config: unknown fields are errors, then validation), with
// the environment overrides cleared so the file alone decides.
func loadConfig(t *testing.T, path string) config.Config {
	t.Helper()
	for _, env := range []string{config.EnvBaseURL, config.EnvAPIKey, config.EnvModel, config.EnvNATSURL} {
		t.Setenv(env, "")
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return cfg
}

// loadConfigData loads configuration text (a ConfigMap's file).
func loadConfigData(t *testing.T, name, data string) config.Config {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return loadConfig(t, path)
}

func settingsOf(t *testing.T, cfg config.Config) bus.Settings {
	t.Helper()
	s, err := app.Settings(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// goMod reads the go directive and a module's required version from the
// repository's go.mod.
func goMod(t *testing.T) (goVersion string, require func(module string) string) {
	t.Helper()
	mod := string(read(t, filepath.Join(repoRoot, "go.mod")))
	m := regexp.MustCompile(`(?m)^go (\S+)$`).FindStringSubmatch(mod)
	if m == nil {
		t.Fatal("go.mod has no go directive")
	}
	return m[1], func(module string) string {
		t.Helper()
		m := regexp.MustCompile(`(?m)^\s*(?:require\s+)?` + regexp.QuoteMeta(module) + ` (v\S+)`).FindStringSubmatch(mod)
		if m == nil {
			t.Fatalf("go.mod does not require %s", module)
		}
		return m[1]
	}
}

// minor cuts a version to major.minor: "v2.15.2" → "2.15".
func minor(v string) string {
	parts := strings.SplitN(strings.TrimPrefix(v, "v"), ".", 3)
	if len(parts) < 2 {
		return v
	}
	return parts[0] + "." + parts[1]
}

// portOf returns the port of a listen address like "0.0.0.0:8080" or ":8081".
func portOf(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("listen address %q: %v", addr, err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatalf("listen address %q: %v", addr, err)
	}
	return n
}

// urlPort returns the host and port of a URL, with the default port of its
// scheme when it has none.
func urlPort(t *testing.T, raw string) (string, int) {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("URL %q: %v", raw, err)
	}
	p := u.Port()
	if p == "" {
		switch u.Scheme {
		case "nats":
			p = "4222"
		case "http":
			p = "80"
		default:
			t.Fatalf("URL %q has no port", raw)
		}
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatalf("URL %q: %v", raw, err)
	}
	return u.Hostname(), n
}

// flagValue returns the value of --name in args ("--name v" or "--name=v").
func flagValue(args []string, name string) (string, bool) {
	for i, a := range args {
		for _, dash := range []string{"-", "--"} {
			if a == dash+name && i+1 < len(args) {
				return args[i+1], true
			}
			if v, ok := strings.CutPrefix(a, dash+name+"="); ok {
				return v, true
			}
		}
	}
	return "", false
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	seen := make(map[string]int)
	for _, s := range a {
		seen[s]++
	}
	for _, s := range b {
		seen[s]--
	}
	for _, n := range seen {
		if n != 0 {
			return false
		}
	}
	return true
}
