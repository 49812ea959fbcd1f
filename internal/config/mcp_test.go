package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestMCPConfig(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "natsagent.yaml")
	err := os.WriteFile(path, []byte(`
mcp:
  servers:
    - name: github
      transport: stdio
      command: npx
      args: ["-y", "@modelcontextprotocol/server-github"]
      env: {GITHUB_TOKEN: "${GH_TOKEN}"}
      tools: [create_issue, list_issues]
    - name: search
      transport: http
      url: https://search.example/mcp
      headers: {Authorization: "Bearer ${SEARCH_KEY}"}
      timeout_seconds: 90
agents:
  - name: chatbot
    tools: [current_time, github__*, search__query]
`), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	s := cfg.MCP.Servers
	if len(s) != 2 || s[0].Command != "npx" || s[0].Env["GITHUB_TOKEN"] != "${GH_TOKEN}" || s[1].URL != "https://search.example/mcp" {
		t.Fatalf("servers %+v", s)
	}
	if s[0].Timeout() != 30*time.Second || s[1].Timeout() != 90*time.Second {
		t.Errorf("timeouts %s %s", s[0].Timeout(), s[1].Timeout())
	}
	out := cfg.String()
	if !strings.Contains(out, "GITHUB_TOKEN: ${GH_TOKEN}") || !strings.Contains(out, "Authorization: '****${SEARCH_KEY}'") {
		t.Errorf("printed config:\n%s", out)
	}
}

func TestMCPValidation(t *testing.T) {
	cfg := Default()
	cfg.MCP.Servers = []MCPServer{
		{Name: "ok", Transport: MCPStdio, Command: "srv"},
		{Name: "ok", Transport: MCPStdio, Command: "srv"},
		{Name: "a__b", Transport: MCPHTTP, URL: "ftp://x"},
		{Name: "", Transport: "grpc"},
		{Name: "c", Transport: MCPStdio, URL: "http://x", Env: map[string]Template{"1X": "v", "K": "${oops"}},
		{Name: "d", Transport: MCPHTTP, Command: "x", Headers: map[string]Template{"Bad Header": "v"}, TimeoutSeconds: -1, Tools: []string{"t", "t", ""}},
		{Name: "e"},
	}
	err := cfg.Validate()
	if err == nil {
		t.Fatal("valid")
	}
	for _, want := range []string{
		`mcp.servers[1].name: "ok" is defined twice`,
		`mcp.servers[2].name: "a__b" must be`,
		`mcp.servers[2].url: "ftp://x" is not an http:// or https:// URL`,
		`mcp.servers[3].name: is required`,
		`mcp.servers[3].transport: "grpc" is not stdio or http`,
		`mcp.servers[4].url: url and headers are for transport http`,
		`mcp.servers[4].env.1X: is not an environment variable name`,
		`mcp.servers[4].env.K: has a malformed reference`,
		`mcp.servers[5].command: command, args and env are for transport stdio`,
		`mcp.servers[5].headers.Bad Header: is not an HTTP header name`,
		`mcp.servers[5].timeout_seconds: must not be negative`,
		`mcp.servers[5].tools[1]: "t" is listed twice`,
		`mcp.servers[5].tools[2]: is empty`,
		`mcp.servers[6].transport: is required: stdio or http`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q:\n%v", want, err)
		}
	}
}

func TestTemplate(t *testing.T) {
	env := map[string]string{"USER_NAME": "ada", "EMPTY": ""}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	for in, want := range map[Template]string{
		"plain":                    "plain",
		"${USER_NAME}":             "ada",
		"hi ${USER_NAME}${EMPTY}!": "hi ada!",
		"$USER_NAME":               "$USER_NAME",
	} {
		if got, err := in.Expand(lookup); err != nil || got != want {
			t.Errorf("%q: %q %v, want %q", in, got, err, want)
		}
	}
	if _, err := Template("${MISSING} ${USER_NAME}").Expand(lookup); err == nil || !strings.Contains(err.Error(), "MISSING is not set") {
		t.Errorf("missing variable: %v", err)
	}
	for in, want := range map[Template]string{"": "", "secret": "****", "${A}": "${A}", "Bearer ${A}": "****${A}", "${A}:${B}x": "${A}****${B}****"} {
		if got, _ := in.MarshalYAML(); got != want {
			t.Errorf("%q prints as %q, want %q", in, got, want)
		}
	}
}
