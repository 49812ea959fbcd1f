package app

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// MixedMistakes is a file with mistakes of every kind: of its shape, of
// its values, and of its profiles found only when they are assembled. The
// cmd tests run the worker and the gateway on it too.
const MixedMistakes = `nats:
  replicaz: 3
gateway:
  listen: 5
worker:
  job_concurrency: 0
agents:
  - name: lead
    tools: [current_tme, read_file, writ_file]
    subagents: [helpr]
    middleware:
      settings:
        loop_detektion: {}
        loop_detection: {hard_limit: 3, warn_threshold: 5}
        context_compression: {keep: {mesages: 20}}
  - name: helper
    kind: subagent
    tools: [current_time]
    middleware:
      settings:
        memory: {enabled: true, max_notes_chars: 10}
      user:
        - use: tool_call_limt
  - name: Bad Name
    tools: [nothing_at_all]
`

// MixedMistakesReport is what Load says of MixedMistakes: every mistake at
// once, the profiles' with their YAML path and line and the nearest valid
// name, never a Go type.
var MixedMistakesReport = []string{
	"nats.replicaz (line 2): unknown key; did you mean replicas?",
	`gateway.listen: "5" is not host:port (for example 127.0.0.1:8080, or :8080 for every interface)`,
	"worker.job_concurrency: must be at least 1",
	`agents[2].name: "Bad Name" is not a valid name`,
	`agents[0].tools[0] (line 9): unknown tool "current_tme"; did you mean current_time?`,
	`agents[0].tools[2] (line 9): unknown tool "writ_file"; did you mean write_file?`,
	`agents[0].subagents[0] (line 10): "helpr" is not a subagent profile; did you mean helper?`,
	"agents[0].middleware.settings.loop_detektion (line 13): unknown middleware; did you mean loop_detection?",
	"agents[0].middleware.settings.loop_detection (line 14): hard_limit (3) must be at least warn_threshold (5)",
	`agents[0].middleware.settings.context_compression (line 15): invalid settings: unknown key "mesages"; did you mean messages?`,
	"agents[1].middleware.settings.memory (line 21): max_notes_chars must be 200 to 32000, not 10",
	`agents[1].middleware.user[0].use (line 23): unknown middleware "tool_call_limt"; did you mean tool_call_limit?`,
}

// The file's mistakes and the profiles' come in one report, each once.
func TestLoadReportsProfileMistakesWithTheRest(t *testing.T) {
	path := filepath.Join(t.TempDir(), "natsagent.yaml")
	if err := os.WriteFile(path, []byte(MixedMistakes), 0o600); err != nil {
		t.Fatal(err)
	}
	clearModelEnv(t)
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	f := RegisterFlags(fs)
	f.AssemblesAgents = true
	if err := fs.Parse([]string{"--config", path}); err != nil {
		t.Fatal(err)
	}
	_, err := f.Load()
	if err == nil {
		t.Fatal("a file with mistakes loaded")
	}
	msg := err.Error()
	for _, want := range MixedMistakesReport {
		if !strings.Contains(msg, want) {
			t.Errorf("the report lacks %q:\n%s", want, msg)
		}
	}
	if got := strings.Count(msg, "\n  "); got != len(MixedMistakesReport) {
		t.Errorf("%d problems reported, want %d:\n%s", got, len(MixedMistakesReport), msg)
	}
	for _, goish := range []string{"json:", "config.", "!!", "unmarshal", "int64", "struct", "nothing_at_all"} {
		if strings.Contains(msg, goish) {
			t.Errorf("the report has %q:\n%s", goish, msg)
		}
	}

	// A process that assembles no profile reports the file's mistakes
	// alone.
	fs = flag.NewFlagSet("test", flag.ContinueOnError)
	f = RegisterFlags(fs)
	if err := fs.Parse([]string{"--config", path}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Load(); err == nil || strings.Contains(err.Error(), "agents[0].tools") || !strings.Contains(err.Error(), "nats.replicaz") {
		t.Errorf("a gateway without --dev: %v", err)
	}
}
