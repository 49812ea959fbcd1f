package app

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/doctest"
	"github.com/natsagent/natsagent/internal/model"
)

// docs/configuration.md shows a whole configuration file; it must load,
// validate and assemble, so the reference never drifts from the code.
func TestConfigurationReferenceLoads(t *testing.T) {
	section := doctest.Section(t, "docs/configuration.md", "## A whole file")
	_, rest, ok := strings.Cut(section, "```yaml\n")
	if !ok {
		t.Fatal("the section has no yaml block")
	}
	text, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatal("the yaml block is not closed")
	}
	path := filepath.Join(t.TempDir(), "natsagent.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{config.EnvBaseURL, config.EnvAPIKey, config.EnvModel, config.EnvNATSURL, config.EnvOTLPEndpoint} {
		t.Setenv(v, "")
	}
	t.Setenv("GLOBEX_API_KEY", "globex-secret")

	cfg, err := config.Load(path)
	if err != nil {
		t.Fatalf("the documented file does not load: %v", err)
	}
	if cfg.NATS.Replicas != 3 || cfg.Model.Name != "qwen2.5:7b" || len(cfg.Gateway.APIKeys) != 2 || len(cfg.MCP.Servers) != 1 {
		t.Fatalf("sections lost: %+v", cfg)
	}
	if r := cfg.Retention.For("acme"); time.Duration(r.Events) != 12*time.Hour || time.Duration(r.Runs) != 168*time.Hour || r.Checkpoints != 50 {
		t.Fatalf("retention: %+v", r)
	}
	if w := cfg.ContextWindows(); w["qwen2.5:7b"] != 32768 || w["deepseek-chat"] != 65536 {
		t.Fatalf("models: %v", w)
	}
	// What a process checks at start and --print-config, before it
	// connects to anything.
	if err := CheckProfiles(cfg); err != nil {
		t.Fatalf("the documented profiles fail the start's check: %v", err)
	}
	agents, err := Agents(cfg, model.NewDemo(model.DemoOptions{}))
	if err != nil {
		t.Fatalf("the documented profiles do not assemble: %v", err)
	}
	for _, name := range []string{"researcher", "fact-checker", "chatbot"} {
		if !agents.Has(name) {
			t.Errorf("profile %s missing: %v", name, agents.Names())
		}
	}
	if names := strings.Join(agents.Chain("researcher").Names(), ","); !strings.Contains(names, "token_budget") || !strings.Contains(names, "tool_call_limit") {
		t.Errorf("researcher chain %s", names)
	}

	// The keys shown commented out (the defaults) are keys too: the file
	// with them uncommented loads and assembles, so none is misspelt,
	// misplaced or gone from the code.
	commented := regexp.MustCompile(`(?m)^(\s*)# (\s*[a-z_]+:( .*)?)$`)
	if n := len(commented.FindAllString(text, -1)); n < 40 {
		t.Fatalf("%d commented-out keys found: the scan no longer reads the block right", n)
	}
	cfg, err = config.Parse([]byte(commented.ReplaceAllString(text, "$1$2")), "natsagent.yaml with its comments uncommented")
	if err != nil {
		t.Fatalf("a commented-out key of the documented file is not valid: %v", err)
	}
	if err := CheckProfiles(cfg); err != nil {
		t.Fatalf("with its commented-out keys, the documented file fails the start's check: %v", err)
	}
}
