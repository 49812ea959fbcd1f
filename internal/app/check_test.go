package app

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/mcptools"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/natstest"
)

const typoConfig = `
agents:
  - name: researcher
    tools: [current_time]
    middleware:
      settings:
        context_compression: {keep: {mesages: 20}}
`

const typoMessage = `agent profile "researcher": middleware.settings.context_compression: invalid settings: unknown key "mesages"; did you mean messages?`

// typoProblem is typoMessage as Load reports it, with the rest of the
// file's mistakes: its YAML path and line.
const typoProblem = `agents[0].middleware.settings.context_compression (line 7): invalid settings: unknown key "mesages"; did you mean messages?`

// A typo in a middleware setting is found from the YAML alone, in the
// words the worker would use, with no NATS server to connect to.
func TestCheckProfilesFindsASettingsTypoWithoutNATS(t *testing.T) {
	url, accepted := natstest.RefusingListener(t)
	cfg := loadYAML(t, typoConfig)
	cfg.NATS.URL = url
	err := CheckProfiles(cfg)
	if err == nil || err.Error() != typoMessage {
		t.Fatalf("check: %v\nwant: %s", err, typoMessage)
	}
	// The same words as the worker's assembly.
	if _, werr := Agents(cfg, model.NewDemo(model.DemoOptions{})); werr == nil || werr.Error() != err.Error() {
		t.Errorf("the worker says %v, the check %v", werr, err)
	}
	if n := accepted.Load(); n != 0 {
		t.Errorf("the check connected to NATS %d times", n)
	}
}

// Load checks the profiles of a process that assembles them, and always
// for --print-config, before the configuration is printed and before
// anything connects; a gateway without --dev runs no agent and does not.
func TestLoadChecksProfilesBeforeConnecting(t *testing.T) {
	url, accepted := natstest.RefusingListener(t)
	path := filepath.Join(t.TempDir(), "natsagent.yaml")
	if err := os.WriteFile(path, []byte(typoConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	clearModelEnv(t)
	load := func(assembles bool, args ...string) error {
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		f := RegisterFlags(fs)
		f.AssemblesAgents = assembles
		if err := fs.Parse(append([]string{"--config", path, "--nats-url", url}, args...)); err != nil {
			t.Fatal(err)
		}
		_, err := f.Load()
		return err
	}
	if err := load(false, "--print-config"); err == nil || !strings.Contains(err.Error(), typoProblem) {
		t.Errorf("--print-config: %v", err)
	}
	if err := load(true); err == nil || !strings.Contains(err.Error(), typoProblem) {
		t.Errorf("a worker's Load: %v", err)
	}
	if err := load(false); err != nil {
		t.Errorf("a process without agents: %v", err)
	}
	if n := accepted.Load(); n != 0 {
		t.Errorf("Load connected to NATS %d times", n)
	}
}

// What a worker accepts, the check accepts: tools of MCP servers whose
// tools are known only once connected, remote tools, memory, the execute
// tool of a sandbox, skills depending on MCP tools.
func TestCheckProfilesRefusesNothingValid(t *testing.T) {
	skillsDir := t.TempDir()
	writeSkill(t, skillsDir, "tickets", "tools: [jira__create_issue, github__search_code]")
	cfg := loadYAML(t, `
mcp:
  servers:
    - {name: jira, transport: http, url: "http://127.0.0.1:1/mcp"}
    - {name: github, transport: stdio, command: github-mcp-server, tools: [search_code, get_file_contents]}
files:
  backend: local
  local_dir: `+t.TempDir()+`
  sandbox: {enabled: true}
agents:
  - name: lead
    tools: [current_time, "jira__*", jira__get_issue, "github__*", "remote:crm_*", remote:weather, execute]
    middleware:
      settings:
        memory: {enabled: true}
        skills: {dir: `+skillsDir+`}
        tool_exclusion: {exclude: [jira__delete_issue, github__get_file_contents, remote__crm_delete]}
        tool_approval: {tools: [jira__create_issue]}
  - name: helper
    kind: subagent
    tools: [github__search_code, "remote:*"]
`)
	if err := CheckProfiles(cfg); err != nil {
		t.Fatal(err)
	}
}

// What a worker refuses without connecting to anything, the check refuses
// in the same words.
func TestCheckProfilesRefusesWhatTheWorkerRefuses(t *testing.T) {
	// The words of the worker's own expansion, where no server is
	// configured.
	_, noServersErr := (*mcptools.Manager)(nil).Expand([]string{"ghost__*"})
	if noServersErr == nil {
		t.Fatal("mcptools expands a wildcard of no server")
	}
	skillsDir := t.TempDir()
	writeSkill(t, skillsDir, "repos", "tools: [github__delete_repo]")
	const github = `
mcp:
  servers:
    - {name: github, transport: stdio, command: github-mcp-server, tools: [search_code]}
    - {name: jira, transport: http, url: "http://127.0.0.1:1/mcp"}
`
	cases := []struct {
		name, yaml, want string
	}{
		{"unknown middleware", `
agents:
  - name: a
    middleware: {settings: {loop_detektion: {}}}
`, `agent profile "a": middleware.settings.loop_detektion: unknown middleware`},
		{"bad value", `
agents:
  - name: a
    middleware: {settings: {loop_detection: {warn_threshold: 5, hard_limit: 3}}}
`, `agent profile "a": middleware.settings.loop_detection: hard_limit`},
		{"bad order", `
agents:
  - name: a
    middleware: {order: [title, loop_detection]}
`, `agent profile "a": middleware.order[1]: loop_detection is in the tail segment`},
		{"unknown tool", `
agents:
  - name: a
    tools: [current_tme]
`, `agent profile "a": tools[0]: unknown tool "current_tme"`},
		{"unknown subagent", `
agents:
  - name: a
    subagents: [nobody]
`, `"nobody"`},
		{"wildcard of no MCP server", `
agents:
  - name: a
    tools: ["ghost__*"]
`, `agent profile "a": tools: ` + noServersErr.Error()},
		{"wildcard of an MCP server not configured", github + `
agents:
  - name: a
    tools: ["ghost__*"]
`, `agent profile "a": tools: "ghost__*" selects the tools of MCP server "ghost", which is not configured (configured: github, jira)`},
		{"a tool off an MCP allow-list", github + `
agents:
  - name: a
    tools: [github__delete_repo]
`, `agent profile "a": tools[0]: unknown tool "github__delete_repo"`},
		{"excluding a tool off an MCP allow-list", github + `
agents:
  - name: a
    tools: ["github__*"]
    middleware: {settings: {tool_exclusion: {exclude: [github__delete_repo]}}}
`, `agent profile "a": middleware.settings.tool_exclusion: exclude: unknown tool "github__delete_repo"`},
		{"excluding a tool of an MCP server the profile does not select", github + `
agents:
  - name: a
    tools: [jira__get_issue]
    middleware: {settings: {tool_exclusion: {exclude: [jira__delete_issue]}}}
`, `agent profile "a": middleware.settings.tool_exclusion: exclude: unknown tool "jira__delete_issue"`},
		{"a skill depending on a tool off an MCP allow-list", github + `
agents:
  - name: a
    middleware: {settings: {skills: {dir: ` + skillsDir + `}}}
`, `"github__delete_repo" is not a tool of this deployment`},
		{"a bad remote tools entry", `
agents:
  - name: a
    tools: ["remote:no spaces"]
`, `agent profile "a": tools[0]: "remote:no spaces" is not remote:<name>`},
		{"memory settings", `
agents:
  - name: a
    middleware: {settings: {memory: {enabled: true, max_notes_chars: 10}}}
`, `agent profile "a": middleware.settings.memory: max_notes_chars must be 200 to 32000, not 10`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := CheckProfiles(loadYAML(t, c.yaml))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("check: %v\nwant it to contain: %s", err, c.want)
			}
		})
	}
}

// loadYAML loads a configuration file as a process does, without the
// model variables of the environment.
func loadYAML(t *testing.T, text string) config.Config {
	t.Helper()
	path := filepath.Join(t.TempDir(), "natsagent.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	clearModelEnv(t)
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func clearModelEnv(t *testing.T) {
	for _, v := range []string{config.EnvBaseURL, config.EnvAPIKey, config.EnvModel, config.EnvNATSURL} {
		t.Setenv(v, "")
	}
}

func writeSkill(t *testing.T, dir, slug, tools string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, slug), 0o755); err != nil {
		t.Fatal(err)
	}
	text := "---\nname: " + slug + "\ndescription: A skill.\n" + tools + "\n---\nbody\n"
	if err := os.WriteFile(filepath.Join(dir, slug, "SKILL.md"), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}
