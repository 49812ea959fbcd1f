package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "natsagent.yaml")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// clearModelEnv keeps the machine's model variables out of a test.
func clearModelEnv(t *testing.T) {
	t.Helper()
	for _, v := range []string{EnvModel, EnvBaseURL, EnvAPIKey} {
		t.Setenv(v, "")
	}
}

// loadRefuses loads each configuration of cases and checks that it is
// refused with an error that mentions the case's text.
func loadRefuses(t *testing.T, cases map[string]string) {
	t.Helper()
	for text, want := range cases {
		_, err := Load(writeConfig(t, text))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("config %q: error %v, want it to mention %q", text, err, want)
		}
	}
}

func TestLoadFileAndEnvironment(t *testing.T) {
	p := writeConfig(t, `
nats:
  url: nats://n1:4222,nats://n2:4222
  replicas: 3
  ack_wait: 45s
worker:
  concurrency: 16
model:
  base_url: http://localhost:11434/v1
  name: qwen2.5:7b
models:
  - name: qwen2.5:7b
    context_window: 32768
  - name: text-only
    vision: false
agents:
  - name: researcher
    tools: [current_time]
    middleware:
      settings:
        token_budget: {enabled: true, max_tokens: 50000}
      user:
        - use: tool_call_limit
          settings: {run_limit: 5}
`)
	t.Setenv(EnvAPIKey, "sk-secret")
	t.Setenv(EnvModel, "")
	cfg, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if w := cfg.ContextWindows(); len(w) != 1 || w["qwen2.5:7b"] != 32768 {
		t.Fatalf("context windows %v", w)
	}
	if v := cfg.Vision(); len(v) != 1 || v["text-only"] {
		t.Fatalf("vision %v, want text-only false only", v)
	}
	if cfg.NATS.Replicas != 3 || time.Duration(cfg.NATS.AckWait) != 45*time.Second || cfg.Worker.Concurrency != 16 {
		t.Fatalf("file values not applied: %+v", cfg)
	}
	if cfg.NATS.MaxDeliver != 10 || cfg.Gateway.Listen != "127.0.0.1:8080" {
		t.Fatalf("defaults lost: %+v", cfg)
	}
	if cfg.Model.APIKey != "sk-secret" || cfg.Model.Name != "qwen2.5:7b" {
		t.Fatalf("model %+v", cfg.Model)
	}
	if w := cfg.ContextWindows(); len(w) != 1 || w["qwen2.5:7b"] != 32768 {
		t.Fatalf("models %+v: windows %v", cfg.Models, w)
	}
	if len(cfg.Agents) != 1 || cfg.Agents[0].Middleware.Settings["token_budget"]["max_tokens"] != 50000 {
		t.Fatalf("agents %+v", cfg.Agents)
	}
	out := cfg.String()
	if strings.Contains(out, "sk-secret") || !strings.Contains(out, "api_key: '****'") {
		t.Fatalf("secret not masked:\n%s", out)
	}
}

func TestLoadRejectsBadFieldsWithTheirPath(t *testing.T) {
	cases := map[string]string{
		"nats:\n  replicaz: 3\n":                          "replicaz",
		"nats:\n  replicas: 2\n":                          "nats.replicas",
		"nats:\n  ack_wait: soon\n":                       "is not a duration",
		"worker:\n  concurrency: 0\n":                     "worker.concurrency",
		"agents:\n  - name: a\n  - name: a\n":             "agents[1].name",
		"agents:\n  - max_steps: 3\n":                     "agents[0].name",
		"model:\n  base_url: http://localhost:8000/v1\n":  "model.name",
		"models:\n  - context_window: 8192\n":             "models[0].name",
		"models:\n  - name: m\n    context_window: 512\n": "models[0].context_window",
		"models:\n  - name: m\n":                          "models[0]: says nothing of the model",
		"models:\n  - name: m\n    context_window: 8192\n  - name: m\n    context_window: 8192\n": "models[1].name",
		"models:\n  - name: m\n    context_windw: 8192\n":                                         "context_windw",
		"nats:\n  events_max_age: 1m\n  duplicate_window: 10m\n":                                  "nats.duplicate_window: 10m0s is longer than nats.events_max_age 1m0s",
		"nats:\n  events_max_age: 50ms\n":                                                         "nats.events_max_age: must be at least 100ms",
		"store:\n  index:\n    dims: 256\n":                                                       "store.index.model",
		"store:\n  index:\n    model: m\n    dims: -1\n":                                          "store.index.dims",
		"store:\n  index_memory_bytes: 1000\n":                                                    "store.index_memory_bytes",
		"crons:\n  missed_ticks: replay\n":                                                        "crons.missed_ticks",
		"crons:\n  late_grace: -1s\n":                                                             "crons.late_grace",
	}
	t.Setenv(EnvModel, "")
	t.Setenv(EnvBaseURL, "")
	t.Setenv(EnvAPIKey, "")
	for text, want := range cases {
		_, err := Load(writeConfig(t, text))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("config %q: error %v, want it to mention %q", text, err, want)
		}
	}
}

func TestDemoModelWithoutConfiguration(t *testing.T) {
	t.Setenv(EnvModel, "")
	t.Setenv(EnvBaseURL, "")
	t.Setenv(EnvAPIKey, "")
	cfg, err := Load("")
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.UsesDemoModel() {
		t.Fatal("no model configured must mean the demo model")
	}
	t.Setenv(EnvModel, "gpt-4o-mini")
	cfg, err = Load("")
	if err != nil || cfg.UsesDemoModel() {
		t.Fatalf("NATSAGENT_MODEL set: demo %v, err %v", cfg.UsesDemoModel(), err)
	}
}
