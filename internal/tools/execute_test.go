package tools_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/sandbox"
	"github.com/natsagent/natsagent/internal/sandbox/sandboxtest"
	"github.com/natsagent/natsagent/internal/tools"
)

// execTool is execute in a bubblewrap sandbox.
func execTool(t *testing.T, cfg tools.ExecuteConfig) tools.Tool {
	t.Helper()
	cfg.Sandbox = sandboxtest.New(t, sandbox.Config{})
	if cfg.Timeout == 0 {
		cfg.Timeout = 10 * time.Second
	}
	return tools.Execute(cfg)
}

func execCall(t *testing.T, exe tools.Tool, w files.Workdir, a string) *tools.Result {
	t.Helper()
	res, err := exe.Call(context.Background(), &tools.Call{Name: tools.ToolExecute, Args: json.RawMessage(a), Env: &tools.Env{Files: w}})
	if err != nil {
		t.Fatalf("execute %s: %v", a, err)
	}
	return res
}

// workdirOn opens a thread's object store workdir on its own connection,
// as one worker does.
func workdirOn(t *testing.T, nc *nats.Conn, thread string) files.Workdir {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	names := bus.DefaultNames()
	store, err := js.ObjectStore(context.Background(), names.FilesBucket())
	if err != nil {
		t.Fatal(err)
	}
	index, err := js.KeyValue(context.Background(), names.ThreadsBucket())
	if err != nil {
		t.Fatal(err)
	}
	return files.NewObjectStore(store, index, "default", thread)
}

func readFile(t *testing.T, w files.Workdir, p string) (string, error) {
	t.Helper()
	b, err := w.Read(context.Background(), p)
	return string(b), err
}

func TestExecute_SandboxedOnEveryBackend(t *testing.T) {
	exe := execTool(t, tools.ExecuteConfig{})
	local, err := files.NewLocal(t.TempDir(), "default", "h1")
	if err != nil {
		t.Fatal(err)
	}
	for name, w := range map[string]files.Workdir{"memory": files.NewMemory(), "local": local} {
		t.Run(name, func(t *testing.T) {
			write(t, w, "/uploads/data.csv", "a\nb\nc\n")
			t.Setenv("NATSAGENT_TEST_SECRET", "leak")
			res := execCall(t, exe, w, args("command", "wc -l < uploads/data.csv; pwd; echo \"$HOME\"; id -u; env; echo made > out.txt; exit 3"))
			if res.Error || !strings.HasPrefix(res.Content, "Exit code 3.\n3\n/workdir\n/workdir\n65534\n") {
				t.Fatalf("result %+v", res)
			}
			if strings.Contains(res.Content, "NATSAGENT_TEST_SECRET") || !strings.Contains(res.Content, "PATH=/usr/bin:/bin") {
				t.Errorf("environment not scrubbed: %q", res.Content)
			}
			if got, err := readFile(t, w, "/out.txt"); err != nil || got != "made\n" {
				t.Errorf("file written by the command: %q, %v", got, err)
			}
			if !strings.Contains(res.Content, "Files written to the workdir: /out.txt") {
				t.Errorf("the result does not say what was written: %q", res.Content)
			}
		})
	}
}

// A file execute writes on one worker is in the object store for another
// worker, and so are its changes and removals; files nobody touched stay.
func TestExecute_ObjectStoreSharedAcrossWorkers(t *testing.T) {
	exe := execTool(t, tools.ExecuteConfig{})
	srv := natstest.Start(t)
	nc1, nc2 := srv.Connect(), srv.Connect()
	natstest.Provision(t, nc1, bus.Settings{})
	w1, w2 := workdirOn(t, nc1, "h1"), workdirOn(t, nc2, "h1")
	other := workdirOn(t, nc2, "h2")
	write(t, w2, "/keep.txt", "untouched")
	write(t, w2, "/edit.txt", "v1")
	write(t, w2, "/gone.txt", "bye")
	write(t, other, "/secret.txt", "thread h2's")

	res := execCall(t, exe, w1, args("command", "cat keep.txt; ls; mkdir -p out/deep && echo hello > out/deep/new.txt && echo v2 > edit.txt && rm gone.txt"))
	if res.Error || !strings.Contains(res.Content, "untouched") || strings.Contains(res.Content, "secret.txt") {
		t.Fatalf("result %+v", res)
	}
	for p, want := range map[string]string{"/out/deep/new.txt": "hello\n", "/edit.txt": "v2\n", "/keep.txt": "untouched"} {
		if got, err := readFile(t, w2, p); err != nil || got != want {
			t.Errorf("worker 2 reads %s: %q, %v; want %q", p, got, err, want)
		}
	}
	if _, err := readFile(t, w2, "/gone.txt"); !errors.Is(err, files.ErrNotFound) {
		t.Errorf("a file the command removed is still in the object store: %v", err)
	}
	if got, err := readFile(t, other, "/secret.txt"); err != nil || got != "thread h2's" {
		t.Errorf("another thread's file: %q, %v", got, err)
	}
	if strings.Contains(res.Content, "keep.txt") && strings.Contains(res.Content, "written to the workdir: /keep.txt") {
		t.Errorf("an unchanged file was written back: %q", res.Content)
	}
}

// What the command leaves that is not a regular file with a valid name is
// not kept, and a symbolic link is never followed, whatever it points to.
func TestExecute_SyncBackKeepsOnlyRegularFiles(t *testing.T) {
	exe := execTool(t, tools.ExecuteConfig{})
	w := files.NewMemory()
	write(t, w, "/notes.md", "mine")
	cmd := strings.Join([]string{
		"ln -s /etc/passwd passwd",
		"mkdir d && ln -s /etc/passwd d/pw",
		"ln -s / rootlink",
		"rm notes.md && ln -s /etc/passwd notes.md",
		"mkfifo fifo",
		`printf x > "$(printf 'bad\001name')"`,
		"echo ok > fine.txt",
	}, " && ")
	res := execCall(t, exe, w, args("command", cmd))
	if res.Error || !strings.HasPrefix(res.Content, "Exit code 0.") {
		t.Fatalf("result %+v", res)
	}
	var paths []string
	err := w.Walk(context.Background(), "/", func(i files.Info) error {
		paths = append(paths, i.Path)
		data, _ := w.Read(context.Background(), i.Path)
		if strings.Contains(string(data), "root:") {
			t.Errorf("%s holds the host's /etc/passwd", i.Path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(paths, " ") != "/fine.txt" {
		t.Errorf("workdir after the command: %v, want only /fine.txt", paths)
	}
	for _, s := range []string{"/passwd (symbolic link)", "/rootlink (symbolic link)", "/fifo (not a regular file)", "control character", "Files removed from the workdir: /notes.md"} {
		if !strings.Contains(res.Content, s) {
			t.Errorf("the result does not say %q: %q", s, res.Content)
		}
	}
}

func TestExecute_Limits(t *testing.T) {
	exe := execTool(t, tools.ExecuteConfig{MaxFileBytes: 1 << 20, MaxWorkdirBytes: 2 << 20})
	w := files.NewMemory()

	// Output keeps its start and end.
	res := execCall(t, exe, w, args("command", "head -c 200000 /dev/zero | tr '\\0' x; echo; echo THE-END"))
	if len(res.Content) > tools.MaxExecuteOutputBytes+200 || !strings.Contains(res.Content, "bytes of output left out") || !strings.Contains(res.Content, "THE-END") {
		t.Errorf("output not capped to head and tail: %d bytes", len(res.Content))
	}
	// A file over max_file_bytes is not kept (the sandbox's own limit,
	// the same number in a worker, is larger here).
	res = execCall(t, exe, w, args("command", "head -c 1500000 /dev/zero > big; echo done"))
	if _, err := w.Stat(context.Background(), "/big"); err == nil || !strings.Contains(res.Content, "/big (1500000 bytes, over the limit of 1048576 bytes per file)") {
		t.Errorf("a file over the limit was written back: %q, %v", res.Content, err)
	}
	// The time limit.
	start := time.Now()
	res = execCall(t, exe, w, args("command", "echo started; echo partial > part.txt; sleep 30", "timeout_seconds", 1))
	if !res.Error || !strings.Contains(res.Content, "stopped after 1s") || !strings.Contains(res.Content, "started") {
		t.Errorf("timeout result %+v", res)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("timeout took %s", d)
	}
	if got, _ := readFile(t, w, "/part.txt"); got != "partial\n" {
		t.Errorf("files written before the time limit: %q", got)
	}
	// A workdir over max_workdir_bytes is not copied.
	for i := range 3 {
		if err := w.Write(context.Background(), "/fill"+string(rune('a'+i)), make([]byte, 1<<20)); err != nil {
			t.Fatal(err)
		}
	}
	_, err := exe.Call(context.Background(), &tools.Call{Name: tools.ToolExecute, Args: json.RawMessage(args("command", "true")), Env: &tools.Env{Files: w}})
	if err == nil || !strings.Contains(err.Error(), "max_workdir_bytes") {
		t.Errorf("a workdir over the copy's limit: %v", err)
	}

	for _, bad := range []string{args("command", " "), args("command", "true", "timeout_seconds", 601), args("command", "true", "timeout_seconds", 0)} {
		if _, err := exe.Call(context.Background(), &tools.Call{Name: tools.ToolExecute, Args: json.RawMessage(bad), Env: &tools.Env{Files: files.NewMemory()}}); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

// Without a sandbox execute runs nothing.
func TestExecute_NoSandboxRefuses(t *testing.T) {
	w := files.NewMemory()
	marker := t.TempDir() + "/ran"
	_, err := tools.Execute(tools.ExecuteConfig{}).Call(context.Background(), &tools.Call{Name: tools.ToolExecute,
		Args: json.RawMessage(args("command", "touch "+marker)), Env: &tools.Env{Files: w}})
	if err == nil || !strings.Contains(err.Error(), "files.sandbox") {
		t.Errorf("execute without a sandbox: %v", err)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("the command ran without a sandbox")
	}
}

// BenchmarkExecute measures one call: copy in, sandbox, write back.
// go test -run '^$' -bench Execute ./internal/tools
func BenchmarkExecute(b *testing.B) {
	sb := sandboxtest.New(b, sandbox.Config{})
	exe := tools.Execute(tools.ExecuteConfig{Sandbox: sb, Timeout: 10 * time.Second})
	srv := natstest.Start(b)
	nc := srv.Connect()
	natstest.Provision(b, nc, bus.Settings{})
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	store, err := js.ObjectStore(context.Background(), bus.DefaultNames().FilesBucket())
	if err != nil {
		b.Fatal(err)
	}
	index, err := js.KeyValue(context.Background(), bus.DefaultNames().ThreadsBucket())
	if err != nil {
		b.Fatal(err)
	}
	full := files.NewObjectStore(store, index, "default", "full")
	for i := range 100 {
		if err := full.Write(context.Background(), fmt.Sprintf("/data/f%03d.txt", i), make([]byte, 10<<10)); err != nil {
			b.Fatal(err)
		}
	}
	for _, c := range []struct {
		name, command string
		w             files.Workdir
	}{
		{"memory-empty-true", "true", files.NewMemory()},
		{"objectstore-empty-true", "true", files.NewObjectStore(store, index, "default", "empty")},
		{"objectstore-100x10KiB-true", "true", full},
		{"objectstore-100x10KiB-touch1", "date > data/f000.txt", full},
	} {
		b.Run(c.name, func(b *testing.B) {
			a := json.RawMessage(args("command", c.command))
			for b.Loop() {
				res, err := exe.Call(context.Background(), &tools.Call{Name: tools.ToolExecute, Args: a, Env: &tools.Env{Files: c.w}})
				if err != nil || res.Error {
					b.Fatal(err, res)
				}
			}
		})
	}
}
