package config

import (
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"
)

// MCP configures the deployment's MCP servers. Every worker connects to
// each of them at start; agent profiles pick their tools by name
// ("<server>__<tool>") or all of a server's ("<server>__*").
type MCP struct {
	Servers []MCPServer `yaml:"servers"`
}

// MCP transports.
const (
	MCPStdio = "stdio"
	MCPHTTP  = "http"
)

// DefaultMCPTimeout bounds one MCP tool call when a server sets none.
const DefaultMCPTimeout = 30 * time.Second

// MCPServer is one MCP server.
type MCPServer struct {
	// Name is the server's id, the prefix of its tools' names.
	Name string `yaml:"name"`
	// Transport is stdio (a subprocess) or http (streamable HTTP).
	Transport string `yaml:"transport"`
	// Command and Args start a stdio server.
	Command string   `yaml:"command"`
	Args    []string `yaml:"args"`
	// Env is the whole environment of a stdio server besides PATH; values
	// may reference the worker's environment as ${VAR}.
	Env map[string]Template `yaml:"env"`
	// URL is an http server's streamable HTTP endpoint.
	URL string `yaml:"url"`
	// Headers are sent with every request to an http server; values may
	// reference the environment as ${VAR}.
	Headers map[string]Template `yaml:"headers"`
	// TimeoutSeconds bounds one tool call (default 30).
	TimeoutSeconds int `yaml:"timeout_seconds"`
	// Tools, when set, is the allow-list of the server's tool names.
	Tools []string `yaml:"tools"`
}

// Timeout is the per-call timeout.
func (s MCPServer) Timeout() time.Duration {
	if s.TimeoutSeconds <= 0 {
		return DefaultMCPTimeout
	}
	return time.Duration(s.TimeoutSeconds) * time.Second
}

// Template is a configuration string that may reference environment
// variables as ${VAR}. Printed, only the references show: the rest may be a
// secret written inline.
type Template string

var templateRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)

// Expand replaces every ${VAR} with its value from lookup; a variable that
// is not set is an error naming it.
func (t Template) Expand(lookup func(string) (string, bool)) (string, error) {
	var missing []string
	out := templateRef.ReplaceAllStringFunc(string(t), func(ref string) string {
		name := ref[2 : len(ref)-1]
		v, ok := lookup(name)
		if !ok {
			missing = append(missing, name)
		}
		return v
	})
	if len(missing) > 0 {
		return "", fmt.Errorf("environment variable %s is not set", strings.Join(missing, ", "))
	}
	return out, nil
}

// MarshalYAML keeps the ${VAR} references and masks everything else.
func (t Template) MarshalYAML() (any, error) {
	s := string(t)
	var b strings.Builder
	last := 0
	for _, loc := range templateRef.FindAllStringIndex(s, -1) {
		if loc[0] > last {
			b.WriteString("****")
		}
		b.WriteString(s[loc[0]:loc[1]])
		last = loc[1]
	}
	if last < len(s) {
		b.WriteString("****")
	}
	return b.String(), nil
}

var (
	mcpServerName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,32}$`)
	envName       = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	headerName    = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
)

// validate checks the MCP section; bad records an error at a path.
func (m *MCP) validate(bad func(path, format string, args ...any)) {
	seen := make(map[string]bool)
	for i := range m.Servers {
		s := &m.Servers[i]
		path := fmt.Sprintf("mcp.servers[%d]", i)
		switch {
		case s.Name == "":
			bad(path+".name", "is required")
		case !mcpServerName.MatchString(s.Name) || strings.Contains(s.Name, "__"):
			// "__" separates the server from the tool in tool names.
			bad(path+".name", "%q must be 1 to 32 letters, digits, '_' or '-', without \"__\"", s.Name)
		case seen[s.Name]:
			bad(path+".name", "%q is defined twice", s.Name)
		}
		seen[s.Name] = true
		switch s.Transport {
		case MCPStdio:
			if s.Command == "" {
				bad(path+".command", "is required for transport stdio")
			}
			if s.URL != "" || len(s.Headers) > 0 {
				bad(path+".url", "url and headers are for transport http, not stdio")
			}
			for _, k := range slices.Sorted(maps.Keys(s.Env)) {
				if !envName.MatchString(k) {
					bad(path+".env."+k, "is not an environment variable name")
				}
				checkTemplate(bad, path+".env."+k, s.Env[k])
			}
		case MCPHTTP:
			if u, err := url.Parse(s.URL); s.URL == "" {
				bad(path+".url", "is required for transport http")
			} else if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				bad(path+".url", "%q is not an http:// or https:// URL", s.URL)
			}
			if s.Command != "" || len(s.Args) > 0 || len(s.Env) > 0 {
				bad(path+".command", "command, args and env are for transport stdio, not http")
			}
			for _, k := range slices.Sorted(maps.Keys(s.Headers)) {
				if !headerName.MatchString(k) {
					bad(path+".headers."+k, "is not an HTTP header name")
				}
				checkTemplate(bad, path+".headers."+k, s.Headers[k])
			}
		case "":
			bad(path+".transport", "is required: stdio or http")
		default:
			bad(path+".transport", "%q is not stdio or http", s.Transport)
		}
		if s.TimeoutSeconds < 0 {
			bad(path+".timeout_seconds", "must not be negative (0 means %s)", DefaultMCPTimeout)
		}
		tools := make(map[string]bool)
		for j, t := range s.Tools {
			switch {
			case t == "":
				bad(fmt.Sprintf("%s.tools[%d]", path, j), "is empty")
			case tools[t]:
				bad(fmt.Sprintf("%s.tools[%d]", path, j), "%q is listed twice", t)
			}
			tools[t] = true
		}
	}
}

// checkTemplate rejects a "${" that does not open a valid reference, which
// would otherwise reach the server verbatim.
func checkTemplate(bad func(path, format string, args ...any), path string, t Template) {
	if strings.Contains(templateRef.ReplaceAllString(string(t), ""), "${") {
		bad(path, "has a malformed reference: write ${NAME} with a variable name of letters, digits and '_'")
	}
}
