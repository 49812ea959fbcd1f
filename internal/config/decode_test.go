package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A file with many mistakes reports all of them at once, each with its
// YAML path and line, a typo with the key it probably meant, and never a
// Go type name; what is right in the file still applies.
func TestLoadReportsEveryMistakeWithItsPath(t *testing.T) {
	const file = `nats:
  replicaz: 3
  ack_wait: soon
  max_deliver: 5
worker:
  concurrency: eight
  job_concurrency: 0
gateway:
  listen: 127.0.0.1:9090
  max_body_bytes: [1, 2]
agents:
  - name: research
    modle: gpt-4o
    tools: current_time
    max_steps: 12
  - name: writer
    middleware:
      setings: {}
telemetry:
  metrics:
    enabled: maybe
frobnicate: true
`
	path := filepath.Join(t.TempDir(), "natsagent.yaml")
	if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{EnvBaseURL, EnvAPIKey, EnvModel, EnvNATSURL} {
		t.Setenv(v, "")
	}
	cfg, err := Load(path)
	if err == nil {
		t.Fatal("a file with mistakes loaded")
	}
	msg := err.Error()
	for _, want := range []string{
		"nats.replicaz (line 2): unknown key; did you mean replicas?",
		`nats.ack_wait (line 3): "soon" is not a duration`,
		`worker.concurrency (line 6): must be a whole number, not "eight"`,
		"gateway.max_body_bytes (line 10): must be a whole number, not a list",
		"agents[0].modle (line 13): unknown key; did you mean model?",
		`agents[0].tools (line 14): must be a list, not "current_time"`,
		"agents[1].middleware.setings (line 18): unknown key; did you mean settings?",
		`telemetry.metrics.enabled (line 21): must be true or false, not "maybe"`,
		"frobnicate (line 22): unknown key; the keys here are nats, model,",
		// A semantic check of the same load, beside the file's mistakes.
		"worker.job_concurrency: must be at least 1",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("the error lacks %q:\n%s", want, msg)
		}
	}
	for _, goish := range []string{"config.", "!!", "unmarshal", "int64", "[]string", "struct"} {
		if strings.Contains(msg, goish) {
			t.Errorf("the error speaks Go (%q):\n%s", goish, msg)
		}
	}
	if got := strings.Count(msg, "\n  "); got != 10 {
		t.Errorf("%d problems reported, want 10:\n%s", got, msg)
	}
	// What was right still applied.
	if cfg.NATS.MaxDeliver != 5 || cfg.Gateway.Listen != "127.0.0.1:9090" || len(cfg.Agents) != 2 || cfg.Agents[0].MaxSteps != 12 {
		t.Errorf("the valid part of the file was lost: %+v %+v %+v", cfg.NATS, cfg.Gateway, cfg.Agents)
	}
}

func TestNearestKey(t *testing.T) {
	keys := []string{"url", "prefix", "replicas", "ack_wait", "max_deliver", "max_ack_pending"}
	for in, want := range map[string]string{
		"replicaz": "replicas", "REPLICAS": "replicas", "prefx": "prefix", "ackwait": "ack_wait",
		"max_delivr": "max_deliver", "repl": "replicas", "zzz": "", "max": "", "uri": "url",
	} {
		if got := nearest(in, keys); got != want {
			t.Errorf("nearest(%q) = %q, want %q", in, got, want)
		}
	}
}

// A file that is not YAML says so with its line.
func TestLoadNotYAML(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(path, []byte("nats:\n  url: [\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), "line") {
		t.Fatalf("broken YAML: %v", err)
	}
}

// A file that is a list or a single value, not a mapping, says so in words:
// the root cannot be dropped the way a wrong key is, and yaml's own
// "cannot unmarshal !!seq into config.Config" must not follow.
func TestLoadRootNotAMapping(t *testing.T) {
	for _, v := range []string{EnvBaseURL, EnvAPIKey, EnvModel, EnvNATSURL} {
		t.Setenv(v, "")
	}
	for _, file := range []string{"- nats\n- worker\n", "just words\n", "42\n"} {
		_, err := Parse([]byte(file), "natsagent.yaml")
		if err == nil {
			t.Errorf("%q loaded", file)
			continue
		}
		msg := err.Error()
		if !strings.Contains(msg, "the file (line 1): must be a mapping of nats, model,") {
			t.Errorf("%q: the error does not say the file must be a mapping:\n%s", file, msg)
		}
		for _, goish := range []string{"config.", "!!", "unmarshal"} {
			if strings.Contains(msg, goish) {
				t.Errorf("%q: the error speaks Go (%q):\n%s", file, goish, msg)
			}
		}
		if got := strings.Count(msg, "\n  "); got != 1 {
			t.Errorf("%q: %d problems reported, want 1:\n%s", file, got, msg)
		}
	}
}

// An agent profile's name and kind are checked with the rest of the file,
// with their paths: a bad name no longer waits for a second start, after
// the file's other mistakes are fixed, to be reported without a path.
func TestLoadReportsBadProfileNamesWithTheRest(t *testing.T) {
	for _, v := range []string{EnvBaseURL, EnvAPIKey, EnvModel, EnvNATSURL} {
		t.Setenv(v, "")
	}
	_, err := Parse([]byte(`agents:
  - name: Bad Name
    model: {x: 1}
  - name: ok
    kind: leader
  - name: ok
`), "natsagent.yaml")
	if err == nil {
		t.Fatal("a file with mistakes loaded")
	}
	msg := err.Error()
	for _, want := range []string{
		"agents[0].model (line 3): must be a string, not a mapping",
		`agents[0].name: "Bad Name" is not a valid name: letters, digits, _ and - only`,
		`agents[1].kind: must be lead or subagent, not "leader"`,
		`agents[2].name: "ok" is defined twice`,
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("the error lacks %q:\n%s", want, msg)
		}
	}
}
