package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/model"
)

// Limits of execute.
const (
	DefaultExecuteTimeout = 60 * time.Second
	MaxExecuteTimeout     = 600 * time.Second
	// MaxExecuteOutputBytes caps what a command's output contributes to
	// the transcript; the start and the end are kept.
	MaxExecuteOutputBytes = 30 << 10
)

// ExecuteConfig configures the execute tool.
type ExecuteConfig struct {
	// Timeout is the time limit of a command that sets none (default 60
	// s); a command may ask for up to MaxExecuteTimeout.
	Timeout time.Duration
}

// Execute returns the execute tool: it runs `sh -c command` in the
// thread's local directory, with a scrubbed environment (PATH=/usr/bin:/bin
// and HOME=the directory, nothing else), under a time limit that kills the
// command's whole process group, and returns its output (stdout and stderr
// together), capped. It works only on a local workdir. It is not an
// isolation boundary: the command runs as the worker's user; deploy it
// only where that is acceptable (a container per worker).
func Execute(cfg ExecuteConfig) Tool {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultExecuteTimeout
	}
	cfg.Timeout = min(cfg.Timeout, MaxExecuteTimeout)
	return executeTool{cfg: cfg}
}

type executeTool struct{ cfg ExecuteConfig }

func (t executeTool) Spec() model.ToolSpec {
	return model.ToolSpec{
		Name: ToolExecute,
		Description: fmt.Sprintf("Run a shell command (sh -c) in the workdir's directory, which holds the same files as "+
			"ls and read_file show (a file /notes/a.md is notes/a.md here). Only PATH=/usr/bin:/bin and HOME are set. "+
			"The command is stopped after timeout_seconds (default %d, at most %d). Returns the exit code and the "+
			"output (stdout and stderr together; long output keeps its start and end). Do not start programs that "+
			"keep running in the background.", int(t.cfg.Timeout/time.Second), int(MaxExecuteTimeout/time.Second)),
		Parameters: json.RawMessage(fmt.Sprintf(`{"type":"object","properties":{`+
			`"command":{"type":"string","description":"The shell command, e.g. wc -l uploads/*.csv"},`+
			`"timeout_seconds":{"type":"integer","minimum":1,"maximum":%d,"description":"Time limit in seconds. Defaults to %d."}},`+
			`"required":["command"]}`, int(MaxExecuteTimeout/time.Second), int(t.cfg.Timeout/time.Second))),
	}
}

func (t executeTool) Call(ctx context.Context, call *Call) (*Result, error) {
	if call.Env == nil || call.Env.Files == nil {
		return nil, ErrNoWorkdir
	}
	dir, ok := files.HostDir(call.Env.Files)
	if !ok {
		return nil, refuse(nil, "execute is not available: this deployment keeps files in the object store, not in a local directory.")
	}
	var in struct {
		Command        string `json:"command"`
		TimeoutSeconds *int   `json:"timeout_seconds"`
	}
	if err := decodeArgs(ToolExecute, call.Args, &in); err != nil {
		return nil, err
	}
	if strings.TrimSpace(in.Command) == "" {
		return nil, refuse(nil, "execute needs a command.")
	}
	timeout := t.cfg.Timeout
	if s := in.TimeoutSeconds; s != nil {
		if *s < 1 || time.Duration(*s)*time.Second > MaxExecuteTimeout {
			return nil, refuse(nil, "timeout_seconds must be between 1 and %d, not %d.", int(MaxExecuteTimeout/time.Second), *s)
		}
		timeout = time.Duration(*s) * time.Second
	}
	return run(ctx, dir, in.Command, timeout), nil
}

// run executes the command and describes how it ended.
func run(ctx context.Context, dir, command string, timeout time.Duration) *Result {
	runCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out := &headTail{max: MaxExecuteOutputBytes}
	cmd := exec.CommandContext(runCtx, "/bin/sh", "-c", command)
	cmd.Dir = dir
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + dir}
	cmd.Stdout, cmd.Stderr = out, out
	// Its own process group, so the limit stops everything it started.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// A background child holding the output open must not hold the tool.
	cmd.WaitDelay = time.Second
	start := time.Now()
	err := cmd.Run()
	if cmd.Process != nil {
		// Whatever the command left running goes with it.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	output := out.String()
	if output == "" {
		output = "(no output)"
	}
	var exit *exec.ExitError
	switch {
	case errors.Is(runCtx.Err(), context.DeadlineExceeded) && ctx.Err() == nil:
		return &Result{Error: true, Content: fmt.Sprintf("The command was stopped after %s (time limit). Output so far:\n%s", timeout, output)}
	case ctx.Err() != nil:
		return &Result{Error: true, Content: "The command was stopped because the run was stopped."}
	case err == nil:
		return Text("Exit code 0.\n" + output)
	case errors.As(err, &exit):
		return Text(fmt.Sprintf("Exit code %d.\n%s", exit.ExitCode(), output))
	case errors.Is(err, exec.ErrWaitDelay):
		return Text(fmt.Sprintf("Exit code 0 after %s; a background process it started was stopped.\n%s", time.Since(start).Round(time.Millisecond), output))
	}
	return &Result{Error: true, Content: fmt.Sprintf("The command could not run: %v.", err)}
}

// headTail keeps the first and the last max/2 bytes written to it.
type headTail struct {
	max     int
	head    []byte
	tail    []byte
	dropped int
}

func (h *headTail) Write(p []byte) (int, error) {
	n := len(p)
	if room := h.max/2 - len(h.head); room > 0 {
		k := min(room, len(p))
		h.head = append(h.head, p[:k]...)
		p = p[k:]
	}
	if len(p) == 0 {
		return n, nil
	}
	h.tail = append(h.tail, p...)
	if over := len(h.tail) - h.max/2; over > 0 {
		h.dropped += over
		h.tail = append(h.tail[:0], h.tail[over:]...)
	}
	return n, nil
}

func (h *headTail) String() string {
	if h.dropped == 0 {
		return string(h.head) + string(h.tail)
	}
	return fmt.Sprintf("%s\n[... %d bytes of output left out ...]\n%s", h.head, h.dropped, h.tail)
}
