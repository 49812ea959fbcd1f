package mcptools

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/tools"
)

func tool(t *testing.T, m *Manager, name string) tools.Tool {
	t.Helper()
	for _, tl := range m.Tools() {
		if tl.Spec().Name == name {
			return tl
		}
	}
	t.Fatalf("no tool %q", name)
	return nil
}

func call(t *testing.T, m *Manager, name, args string) *tools.Result {
	t.Helper()
	return callCtx(context.Background(), t, m, name, args)
}

func callCtx(ctx context.Context, t *testing.T, m *Manager, name, args string) *tools.Result {
	t.Helper()
	res, err := tool(t, m, name).Call(ctx, &tools.Call{ID: "c1", Name: name, Args: json.RawMessage(args), Env: &tools.Env{}})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return res
}

func names(m *Manager) []string {
	var out []string
	for _, t := range m.Tools() {
		out = append(out, t.Spec().Name)
	}
	return out
}

// checkServer exercises listing and calling, whatever the transport.
func checkServer(t *testing.T, m *Manager) {
	t.Helper()
	want := []string{"srv__crash", "srv__echo", "srv__env", "srv__fail", "srv__get_weather_v2", "srv__media", "srv__pid", "srv__slow", "srv__spawn"}
	got := names(m)
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("tools %v, want %v", got, want)
	}
	spec := tool(t, m, "srv__echo").Spec()
	if spec.Description != "Echoes the text back." {
		t.Errorf("description %q", spec.Description)
	}
	var schema struct {
		Type       string                     `json:"type"`
		Properties map[string]json.RawMessage `json:"properties"`
	}
	if err := json.Unmarshal(spec.Parameters, &schema); err != nil || schema.Type != "object" || schema.Properties["text"] == nil {
		t.Errorf("schema %s (%v)", spec.Parameters, err)
	}

	if res := call(t, m, "srv__echo", `{"text":"hi"}`); res.Error || res.Content != "echo: hi" {
		t.Errorf("echo: %+v", res)
	}
	if res := call(t, m, "srv__fail", `{}`); !res.Error || res.Content != "the disk is full" {
		t.Errorf("fail: %+v", res)
	}
	// Arguments the server's schema rejects are an error result too.
	if res := call(t, m, "srv__echo", `{"text":7}`); !res.Error {
		t.Errorf("bad arguments: %+v", res)
	}
	wantMedia := "a chart:\n[image image/png, 4 bytes]\n[audio audio/wav, 2 bytes]\n[resource link \"report\": file:///report.pdf]\n[resource file:///notes.txt]\nsome notes\n[resource file:///blob, application/zip, 3 bytes]"
	if res := call(t, m, "srv__media", `{}`); res.Error || res.Content != wantMedia {
		t.Errorf("media: %+v", res)
	}
	if res := call(t, m, "srv__get_weather_v2", ``); res.Content != "sunny" {
		t.Errorf("sanitized tool: %+v", res)
	}
}

func TestHTTP(t *testing.T) {
	srv := httpServer(t, nil)
	checkServer(t, start(t, httpConfig("srv", srv.URL)))
}

func TestStdio(t *testing.T) {
	t.Setenv("MCPTOOLS_TEST_LEAK", "worker secret")
	m := start(t, stdioServer(t, "srv", map[string]config.Template{"GREETING": "${MCPTOOLS_TEST_GREETING}, world"}))
	checkServer(t, m)
	env := call(t, m, "srv__env", `{}`).Content
	if !strings.Contains(env, "GREETING=hello, world") || !strings.Contains(env, "PATH=") {
		t.Errorf("configured env missing:\n%s", env)
	}
	if strings.Contains(env, "MCPTOOLS_TEST_LEAK") {
		t.Errorf("the worker's environment leaked into the server:\n%s", env)
	}
}

func TestAllowList(t *testing.T) {
	srv := httpServer(t, nil)
	cfg := httpConfig("srv", srv.URL)
	cfg.Tools = []string{"echo", "get.weather/v2"}
	if got := strings.Join(names(start(t, cfg)), ","); got != "srv__echo,srv__get_weather_v2" {
		t.Fatalf("tools %s", got)
	}
}

// TestCallTimeout: a slow tool ends at the server's timeout with an error
// result, and the next call on the same session works.
func TestCallTimeout(t *testing.T) {
	srv := httpServer(t, nil)
	cfg := httpConfig("srv", srv.URL)
	cfg.TimeoutSeconds = 1
	m := start(t, cfg)
	began := time.Now()
	res := call(t, m, "srv__slow", `{"millis":20000}`)
	if took := time.Since(began); took > 5*time.Second {
		t.Fatalf("the call took %s", took)
	}
	if !res.Error || !strings.Contains(res.Content, "did not finish within 1s") {
		t.Fatalf("slow: %+v", res)
	}
	if res := call(t, m, "srv__echo", `{"text":"still here"}`); res.Error || res.Content != "echo: still here" {
		t.Fatalf("after a timeout: %+v", res)
	}
}

// TestRunCancelled: a cancelled run cancels the call and gets its cause
// back, not an error result.
func TestRunCancelled(t *testing.T) {
	m := start(t, stdioServer(t, "srv", nil))
	ctx, cancel := context.WithCancelCause(context.Background())
	stop := errors.New("cancelled by a person")
	time.AfterFunc(100*time.Millisecond, func() { cancel(stop) })
	began := time.Now()
	_, err := tool(t, m, "srv__slow").Call(ctx, &tools.Call{Name: "srv__slow", Args: json.RawMessage(`{"millis":20000}`)})
	if !errors.Is(err, stop) {
		t.Fatalf("err %v, want the run's cause", err)
	}
	if took := time.Since(began); took > 3*time.Second {
		t.Fatalf("the call took %s after the cancel", took)
	}
	if res := call(t, m, "srv__echo", `{"text":"x"}`); res.Error {
		t.Fatalf("after a cancel: %+v", res)
	}
}

func pid(t *testing.T, m *Manager) int {
	t.Helper()
	res := call(t, m, "srv__pid", `{}`)
	n, err := strconv.Atoi(res.Content)
	if err != nil || res.Error {
		t.Fatalf("pid: %+v", res)
	}
	return n
}

// TestStdioDiesMidCall: the server exits during a call; the call is an
// error result and the next call runs on a new server process.
func TestStdioDiesMidCall(t *testing.T) {
	m := start(t, stdioServer(t, "srv", nil))
	first := pid(t, m)
	res := call(t, m, "srv__crash", `{}`)
	if !res.Error || !strings.Contains(res.Content, "connection failed") {
		t.Fatalf("crash: %+v", res)
	}
	if res := call(t, m, "srv__echo", `{"text":"back"}`); res.Error || res.Content != "echo: back" {
		t.Fatalf("after the crash: %+v", res)
	}
	if second := pid(t, m); second == first {
		t.Fatalf("still pid %d", second)
	}
}

// TestStdioKilledBetweenCalls: a server that died while idle is noticed,
// and the next call starts a new one instead of failing.
func TestStdioKilledBetweenCalls(t *testing.T) {
	m := start(t, stdioServer(t, "srv", nil))
	first := pid(t, m)
	p, err := os.FindProcess(first)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	s := m.servers[0]
	deadline := time.Now().Add(5 * time.Second)
	for {
		s.mu.Lock()
		gone := s.cur == nil
		s.mu.Unlock()
		if gone {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the dead server was not noticed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if second := pid(t, m); second == first {
		t.Fatalf("still pid %d", second)
	}
}

// TestHTTPDownBetweenCalls: calls while the server is down are error
// results; once it is back, calls reconnect.
func TestHTTPDownBetweenCalls(t *testing.T) {
	srv := httpServer(t, nil)
	addr := srv.Listener.Addr().String()
	m := start(t, httpConfig("srv", srv.URL))
	if res := call(t, m, "srv__echo", `{"text":"1"}`); res.Error {
		t.Fatalf("first call: %+v", res)
	}
	srv.Close()
	res := call(t, m, "srv__echo", `{"text":"2"}`)
	if !res.Error || !strings.Contains(res.Content, `MCP server "srv"`) {
		t.Fatalf("server down: %+v", res)
	}
	if res := call(t, m, "srv__echo", `{"text":"3"}`); !res.Error || !strings.Contains(res.Content, "unavailable") {
		t.Fatalf("still down: %+v", res)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("cannot listen on %s again: %v", addr, err)
	}
	httpServer(t, ln)
	if res := call(t, m, "srv__echo", `{"text":"4"}`); res.Error || res.Content != "echo: 4" {
		t.Fatalf("server back: %+v", res)
	}
}

func TestStartFailures(t *testing.T) {
	srv := httpServer(t, nil)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "http://" + closed.Addr().String() + "/mcp"
	_ = closed.Close()

	missingTool := httpConfig("picky", srv.URL)
	missingTool.Tools = []string{"echo", "teleport"}
	noToken := httpConfig("locked", srv.URL)
	noToken.Headers = nil
	unsetVar := stdioServer(t, "unset", map[string]config.Template{"TOKEN": "${MCPTOOLS_TEST_NOT_SET}"})
	clash := stdioServer(t, "clash", map[string]config.Template{clashEnv: "1"})

	for _, tc := range []struct {
		name   string
		server config.MCPServer
		want   []string
	}{
		{"no such command", config.MCPServer{Name: "ghost", Transport: config.MCPStdio, Command: "natsagent-no-such-mcp-server"}, []string{`mcp server "ghost" (stdio command natsagent-no-such-mcp-server) failed to start`, "not found"}},
		{"exits at once", config.MCPServer{Name: "broken", Transport: config.MCPStdio, Command: exe, Env: map[string]config.Template{serverModeEnv: "fail"}}, []string{`mcp server "broken"`, "failed to start", "the API token was refused"}},
		{"refused", httpConfig("offline", refused), []string{`mcp server "offline" (http http://127.0.0.1:`, "failed to start"}},
		{"unauthorized", noToken, []string{`mcp server "locked"`, "failed to start"}},
		{"allow-list", missingTool, []string{`mcp server "picky"`, `"teleport"`, "does not offer"}},
		{"unset variable", unsetVar, []string{`mcp server "unset"`, "env.TOKEN", "MCPTOOLS_TEST_NOT_SET is not set"}},
		{"clash", clash, []string{`mcp server "clash"`, `"get.weather/v2"`, `"get_weather_v2"`, `"clash__get_weather_v2"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Start(context.Background(), []config.MCPServer{httpConfig("fine", srv.URL), tc.server}, Options{LookupEnv: lookup})
			if err == nil {
				_ = m.Close()
				t.Fatal("started")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

func TestName(t *testing.T) {
	for _, tc := range []struct{ server, tool, want string }{
		{"gh", "create_issue", "gh__create_issue"},
		{"gh", "repo.list/all", "gh__repo_list_all"},
		{"fs", "lire-fichier", "fs__lire-fichier"},
		{"fs", "é t", "fs____t"},
		{"s", strings.Repeat("x", 80), "s__" + strings.Repeat("x", 61)},
	} {
		if got := Name(tc.server, tc.tool); got != tc.want {
			t.Errorf("Name(%q, %q) = %q, want %q", tc.server, tc.tool, got, tc.want)
		}
	}
}

func TestExpandAndRegister(t *testing.T) {
	srv := httpServer(t, nil)
	cfg := httpConfig("srv", srv.URL)
	cfg.Tools = []string{"echo", "fail"}
	m := start(t, cfg)
	got, err := m.Expand([]string{"current_time", "srv__*", "srv__echo"})
	if err != nil || strings.Join(got, ",") != "current_time,srv__echo,srv__fail" {
		t.Fatalf("expand: %v %v", got, err)
	}
	if _, err := m.Expand([]string{"other__*"}); err == nil || !strings.Contains(err.Error(), `MCP server "other", which is not configured (configured: srv)`) {
		t.Fatalf("unknown server: %v", err)
	}
	var none *Manager
	if _, err := none.Expand([]string{"srv__*"}); err == nil || !strings.Contains(err.Error(), "configured: none") {
		t.Fatalf("no servers: %v", err)
	}

	reg := tools.NewRegistry()
	if err := m.Register(reg); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Select(got); err != nil {
		t.Fatal(err)
	}
	if err := m.Register(reg); err == nil {
		t.Fatal("registering twice replaced tools silently")
	}
}
