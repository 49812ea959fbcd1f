package mcptools

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/config"
)

// alive reports whether a process exists and is not a zombie (a container
// whose init reaps nothing keeps the dead as zombies).
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(stat, ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] != 'Z'
}

func gone(t *testing.T, what string, pid int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("%s (pid %d) still runs", what, pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestCloseStopsProcesses: Close stops a stdio server and what it started.
func TestCloseStopsProcesses(t *testing.T) {
	m := start(t, stdioServer(t, "srv", nil))
	server := pid(t, m)
	res := call(t, m, "srv__spawn", `{}`)
	helper, err := strconv.Atoi(res.Content)
	if err != nil {
		t.Fatalf("spawn: %+v", res)
	}
	if !alive(server) || !alive(helper) {
		t.Fatal("nothing runs before Close")
	}
	began := time.Now()
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(began); took > 2*time.Second {
		t.Errorf("Close took %s for a server that exits when its input ends", took)
	}
	gone(t, "the server", server)
	gone(t, "the server's helper", helper)
	if res := call(t, m, "srv__echo", `{"text":"late"}`); !res.Error {
		t.Fatalf("a call after Close: %+v", res)
	}
}

// TestFailedStartStopsTheOthers: when one server fails, the ones that did
// start are stopped before Start returns.
func TestFailedStartStopsTheOthers(t *testing.T) {
	file := filepath.Join(t.TempDir(), "pid")
	good := stdioServer(t, "good", map[string]config.Template{pidFileEnv: config.Template(file)})
	bad := config.MCPServer{Name: "bad", Transport: config.MCPStdio, Command: "natsagent-no-such-mcp-server"}
	if _, err := Start(context.Background(), []config.MCPServer{good, bad}, Options{LookupEnv: lookup}); err == nil {
		t.Fatal("started")
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(string(data))
	if err != nil {
		t.Fatal(err)
	}
	gone(t, "the server that started", pid)
}
