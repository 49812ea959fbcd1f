package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/sandbox"
)

// Limits of execute.
const (
	DefaultExecuteTimeout = 60 * time.Second
	MaxExecuteTimeout     = 600 * time.Second
	// MaxExecuteOutputBytes caps what a command's output contributes to
	// the transcript; the start and the end are kept.
	MaxExecuteOutputBytes = 30 << 10
	// DefaultMaxWorkdirBytes bounds the copy of a workdir a command works
	// on, in and out.
	DefaultMaxWorkdirBytes = 256 << 20
)

// ExecuteConfig configures the execute tool.
type ExecuteConfig struct {
	// Sandbox runs the commands (sandbox.New). Without one, execute
	// refuses every command: it never runs one unconfined by accident.
	Sandbox *sandbox.Sandbox
	// Timeout is the time limit of a command that sets none (default 60
	// s); a command may ask for up to MaxExecuteTimeout.
	Timeout time.Duration
	// MaxFileBytes bounds a file the command writes back (default
	// files.DefaultMaxFileBytes); the workdir's own limit applies too.
	MaxFileBytes int64
	// MaxWorkdirBytes bounds the workdir copied in for the command and
	// what it writes back (default DefaultMaxWorkdirBytes).
	MaxWorkdirBytes int64
}

// Execute returns the execute tool: it copies the thread's workdir, from
// whatever backend, into a fresh directory, runs `sh -c command` there in
// the sandbox (sandbox.Sandbox: namespaces, an unprivileged user, no
// network, limits, a wall time that ends every process of the command),
// writes back what the command created, changed or removed, and returns
// the exit code and the output (stdout and stderr together), capped.
func Execute(cfg ExecuteConfig) Tool {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultExecuteTimeout
	}
	cfg.Timeout = min(cfg.Timeout, MaxExecuteTimeout)
	if cfg.MaxFileBytes <= 0 {
		cfg.MaxFileBytes = files.DefaultMaxFileBytes
	}
	if cfg.MaxWorkdirBytes <= 0 {
		cfg.MaxWorkdirBytes = DefaultMaxWorkdirBytes
	}
	return executeTool{cfg: cfg}
}

type executeTool struct{ cfg ExecuteConfig }

func (t executeTool) Spec() model.ToolSpec {
	return model.ToolSpec{
		Name: ToolExecute,
		Description: fmt.Sprintf("Run a shell command (sh -c) in a sandbox whose directory /workdir holds a copy of the workdir: "+
			"the same files as ls and read_file show (a file /notes/a.md is notes/a.md here). Files the command creates, "+
			"changes or deletes there are written back to the workdir when it ends; symbolic links, empty directories and "+
			"anything outside /workdir are not kept (/tmp is private and discarded). There is no network. Only PATH=/usr/bin:/bin "+
			"and HOME=/workdir are set. The command and everything it started are stopped after timeout_seconds (default %d, "+
			"at most %d), and when it exits. Returns the exit code and the output (stdout and stderr together; long output "+
			"keeps its start and end).", int(t.cfg.Timeout/time.Second), int(MaxExecuteTimeout/time.Second)),
		Parameters: t.params(),
	}
}

type executeArgs struct {
	Command        string `json:"command" jsonschema:"The shell command, e.g. wc -l uploads/*.csv"`
	TimeoutSeconds *int   `json:"timeout_seconds,omitempty" schema:"minimum=1" jsonschema:"Time limit in seconds."`
}

// params is execute's schema: its bound and default come from the
// configuration.
func (t executeTool) params() json.RawMessage {
	s := Schema[executeArgs]()
	ts := s.Properties["timeout_seconds"]
	limit := float64(MaxExecuteTimeout / time.Second)
	ts.Maximum = &limit
	ts.Description = fmt.Sprintf("Time limit in seconds. Defaults to %d.", int(t.cfg.Timeout/time.Second))
	return MarshalSchema(s)
}

func (t executeTool) Call(ctx context.Context, call *Call) (*Result, error) {
	if call.Env == nil || call.Env.Files == nil {
		return nil, ErrNoWorkdir
	}
	if t.cfg.Sandbox == nil {
		return nil, refuse(nil, "execute is not available: this worker has no command sandbox (files.sandbox).")
	}
	var in executeArgs
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
	dir, err := t.cfg.Sandbox.TempDir()
	if err != nil {
		return nil, err
	}
	defer func() { _ = sandbox.RemoveAll(dir) }()
	lim := syncLimits{maxFile: t.cfg.MaxFileBytes, maxTotal: t.cfg.MaxWorkdirBytes}
	m, err := materialize(ctx, call.Env.Files, dir, lim)
	if err != nil {
		if errors.Is(err, errWorkdirTooLarge) {
			return nil, refuse(nil, "%v.", err)
		}
		return nil, err
	}
	out := &headTail{max: MaxExecuteOutputBytes}
	res := t.cfg.Sandbox.Run(ctx, dir, in.Command, timeout, out)
	if ctx.Err() != nil {
		// The run was stopped: nothing is written back.
		return &Result{Error: true, Content: "The command was stopped because the run was stopped."}, nil
	}
	if res.Err != nil {
		return &Result{Error: true, Content: fmt.Sprintf("The command could not run: %v.", res.Err)}, nil
	}
	rep, err := syncBack(ctx, call.Env.Files, dir, m, lim)
	if err != nil {
		return &Result{Error: true, Content: fmt.Sprintf("The command ran, but its files could not be written back to the workdir: %v.", err)}, nil
	}
	output := out.String()
	if output == "" {
		output = "(no output)"
	}
	if res.TimedOut {
		return &Result{Error: true, Content: fmt.Sprintf("The command was stopped after %s (time limit). Output so far:\n%s%s", timeout, output, rep)}, nil
	}
	return Text(fmt.Sprintf("Exit code %d.\n%s%s", res.ExitCode, output, rep)), nil
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
