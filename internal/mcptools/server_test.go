package mcptools

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/natsagent/natsagent/internal/config"
)

// The test binary doubles as a stdio MCP server: started with
// serverModeEnv set, it serves instead of running tests.
const (
	serverModeEnv = "MCPTOOLS_TEST_SERVER"
	clashEnv      = "MCPTOOLS_TEST_CLASH"
	pidFileEnv    = "MCPTOOLS_TEST_PIDFILE"
)

func TestMain(m *testing.M) {
	switch os.Getenv(serverModeEnv) {
	case "":
		os.Exit(m.Run())
	case "stdio":
		if f := os.Getenv(pidFileEnv); f != "" {
			if err := os.WriteFile(f, []byte(fmt.Sprint(os.Getpid())), 0o600); err != nil {
				fmt.Fprintln(os.Stderr, "test server:", err)
				os.Exit(1)
			}
		}
		if err := newTestServer().Run(context.Background(), &mcp.StdioTransport{}); err != nil {
			fmt.Fprintln(os.Stderr, "test server:", err)
			os.Exit(1)
		}
		os.Exit(0)
	case "sleep":
		// A helper a server started that would outlive it: it ignores
		// the end of its input.
		time.Sleep(time.Minute)
		os.Exit(0)
	case "fail":
		fmt.Fprintln(os.Stderr, "cannot start: the API token was refused")
		os.Exit(1)
	}
	fmt.Fprintln(os.Stderr, "unknown", serverModeEnv)
	os.Exit(2)
}

type echoIn struct {
	Text string `json:"text" jsonschema:"the text to echo"`
}

type slowIn struct {
	Millis int `json:"millis" jsonschema:"how long to work"`
}

type empty struct{}

func text(s string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
}

// newTestServer is the MCP server the tests talk to, over stdio or HTTP.
func newTestServer() *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "mcptools-test"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "echo", Description: "Echoes the text back."}, func(_ context.Context, _ *mcp.CallToolRequest, in echoIn) (*mcp.CallToolResult, any, error) {
		return text("echo: " + in.Text), nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "fail", Description: "Always fails."}, func(context.Context, *mcp.CallToolRequest, empty) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "the disk is full"}}}, nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "slow", Description: "Works for a while."}, func(ctx context.Context, _ *mcp.CallToolRequest, in slowIn) (*mcp.CallToolResult, any, error) {
		select {
		case <-time.After(time.Duration(in.Millis) * time.Millisecond):
			return text("done"), nil, nil
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	})
	mcp.AddTool(s, &mcp.Tool{Name: "pid", Description: "The server's process id."}, func(context.Context, *mcp.CallToolRequest, empty) (*mcp.CallToolResult, any, error) {
		return text(fmt.Sprint(os.Getpid())), nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "env", Description: "The server's environment."}, func(context.Context, *mcp.CallToolRequest, empty) (*mcp.CallToolResult, any, error) {
		env := os.Environ()
		slices.Sort(env)
		return text(strings.Join(env, "\n")), nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "crash", Description: "Exits in the middle of the call."}, func(context.Context, *mcp.CallToolRequest, empty) (*mcp.CallToolResult, any, error) {
		os.Exit(3)
		return nil, nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "media", Description: "Returns content of every kind."}, func(context.Context, *mcp.CallToolRequest, empty) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{
			&mcp.TextContent{Text: "a chart:"},
			&mcp.ImageContent{MIMEType: "image/png", Data: []byte{1, 2, 3, 4}},
			&mcp.AudioContent{MIMEType: "audio/wav", Data: []byte{1, 2}},
			&mcp.ResourceLink{Name: "report", URI: "file:///report.pdf"},
			&mcp.EmbeddedResource{Resource: &mcp.ResourceContents{URI: "file:///notes.txt", Text: "some notes"}},
			&mcp.EmbeddedResource{Resource: &mcp.ResourceContents{URI: "file:///blob", MIMEType: "application/zip", Blob: []byte{9, 9, 9}}},
		}}, nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "get.weather/v2", Description: "A name to sanitize."}, func(context.Context, *mcp.CallToolRequest, empty) (*mcp.CallToolResult, any, error) {
		return text("sunny"), nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "spawn", Description: "Starts a helper process that outlives the server."}, func(context.Context, *mcp.CallToolRequest, empty) (*mcp.CallToolResult, any, error) {
		exe, err := os.Executable()
		if err != nil {
			return nil, nil, err
		}
		cmd := exec.Command(exe)
		cmd.Env = []string{serverModeEnv + "=sleep"}
		if err := cmd.Start(); err != nil {
			return nil, nil, err
		}
		return text(fmt.Sprint(cmd.Process.Pid)), nil, nil
	})
	if os.Getenv(clashEnv) != "" {
		mcp.AddTool(s, &mcp.Tool{Name: "get_weather_v2", Description: "Clashes once sanitized."}, func(context.Context, *mcp.CallToolRequest, empty) (*mcp.CallToolResult, any, error) {
			return text("rainy"), nil, nil
		})
	}
	return s
}

// stdioServer configures the test binary as a stdio server.
func stdioServer(t *testing.T, name string, env map[string]config.Template) config.MCPServer {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// Under -race a process sleeps a second at exit unless told not to.
	all := map[string]config.Template{serverModeEnv: "stdio", "GORACE": "atexit_sleep_ms=0"}
	for k, v := range env {
		all[k] = v
	}
	return config.MCPServer{Name: name, Transport: config.MCPStdio, Command: exe, Env: all, TimeoutSeconds: 5}
}

// httpServer serves the test server over streamable HTTP on ln (a new
// loopback port when nil) and requires the header X-Token: secret.
func httpServer(t *testing.T, ln net.Listener) *httptest.Server {
	t.Helper()
	mcpSrv := newTestServer()
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return mcpSrv }, nil)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Token") != "secret" {
			http.Error(w, "missing token", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	}))
	if ln != nil {
		_ = srv.Listener.Close()
		srv.Listener = ln
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

func httpConfig(name, url string) config.MCPServer {
	return config.MCPServer{Name: name, Transport: config.MCPHTTP, URL: url, Headers: map[string]config.Template{"X-Token": "${MCPTOOLS_TEST_TOKEN}"}, TimeoutSeconds: 5}
}

// lookup is the environment the tests give Start.
func lookup(name string) (string, bool) {
	switch name {
	case "MCPTOOLS_TEST_TOKEN":
		return "secret", true
	case "MCPTOOLS_TEST_GREETING":
		return "hello", true
	}
	return os.LookupEnv(name)
}

func start(t *testing.T, servers ...config.MCPServer) *Manager {
	t.Helper()
	m, err := Start(context.Background(), servers, Options{LookupEnv: lookup})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}
