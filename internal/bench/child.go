package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"
)

// child is a worker process started by the bench (natsagent
// bench-worker): a real worker in a process of its own, on its own TCP
// connection.
type child struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	stderr *cappedBuffer
	exited chan struct{}
}

// childSpec is the worker process's configuration.
type childSpec struct {
	id          string
	concurrency int
	latency     time.Duration
	pieces      int
	modelURL    string
}

// startChild starts a worker process for the deployment and waits for its
// ready line. It is stopped by d.close.
func (d *deployment) startChild(ctx context.Context, spec childSpec) (*child, error) {
	c, err := d.startChildAsync(spec)
	if err != nil {
		return nil, err
	}
	return c, c.ready(ctx, spec.id)
}

// startChildAsync starts a worker process without waiting for it. Not safe
// for concurrent use (it registers the process with the deployment).
func (d *deployment) startChildAsync(spec childSpec) (*child, error) {
	cfg := d.e.cfg
	if len(cfg.WorkerCommand) == 0 {
		return nil, errors.New("no worker command configured")
	}
	args := append([]string(nil), cfg.WorkerCommand[1:]...)
	args = append(args,
		"--nats-url", d.e.url,
		"--prefix", d.names.Prefix,
		"--id", spec.id,
		"--concurrency", strconv.Itoa(spec.concurrency),
		"--model-latency", spec.latency.String(),
		"--model-pieces", strconv.Itoa(max(spec.pieces, 1)),
		"--max-ack-pending", strconv.Itoa(d.settings.MaxAckPending),
		"--shutdown-grace", "2s",
	)
	if spec.modelURL != "" {
		args = append(args, "--model-url", spec.modelURL)
	}
	cmd := exec.Command(cfg.WorkerCommand[0], args...)
	cmd.Env = append(os.Environ(), cfg.WorkerEnv...)
	c := &child{cmd: cmd, lines: make(chan string, 16), stderr: &cappedBuffer{max: 8 << 10}, exited: make(chan struct{})}
	cmd.Stderr = c.stderr
	var err error
	if c.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start worker process %s: %w", cfg.WorkerCommand[0], err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	go func() {
		_ = cmd.Wait()
		close(c.exited)
	}()
	d.closers = append(d.closers, func() { c.stop(3 * time.Second) })
	return c, nil
}

// ready waits for the process's ready line.
func (c *child) ready(ctx context.Context, id string) error {
	wait, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	line, err := c.next(wait)
	if err != nil || !strings.HasPrefix(line, "ready") {
		c.stop(0)
		return fmt.Errorf("worker process %s did not start (%q, %v): %s", id, line, err, strings.TrimSpace(c.stderr.String()))
	}
	return nil
}

// next returns the next line the process printed.
func (c *child) next(ctx context.Context) (string, error) {
	select {
	case line, ok := <-c.lines:
		if !ok {
			return "", errors.New("worker process exited")
		}
		return line, nil
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// stop closes the process's stdin (it shuts down gracefully) and kills it
// after grace.
func (c *child) stop(grace time.Duration) {
	_ = c.stdin.Close()
	select {
	case <-c.exited:
		return
	case <-time.After(grace):
	}
	_ = c.cmd.Process.Kill()
	<-c.exited
}

func (c *child) pid() int { return c.cmd.Process.Pid }

// childStats is the Go runtime's view of a worker process, after a GC.
type childStats struct {
	HeapAlloc  uint64 `json:"heap_alloc"`
	HeapInuse  uint64 `json:"heap_inuse"`
	StackInuse uint64 `json:"stack_inuse"`
	Sys        uint64 `json:"sys"`
	Goroutines int    `json:"goroutines"`
}

func (c *child) stats(ctx context.Context) (childStats, error) {
	var st childStats
	if _, err := io.WriteString(c.stdin, "stats\n"); err != nil {
		return st, err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		line, err := c.next(ctx)
		if err != nil {
			return st, err
		}
		if data, ok := strings.CutPrefix(line, "stats "); ok {
			return st, json.Unmarshal([]byte(data), &st)
		}
	}
}

// rssKiB reads a process's resident set size from /proc (Linux only).
func rssKiB(pid int) (float64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("read RSS: %w", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) >= 1 {
				return strconv.ParseFloat(f[0], 64)
			}
		}
	}
	return 0, errors.New("no VmRSS in /proc status")
}

// procCPU reads a process's CPU time (user + system) from /proc (Linux
// only), in clock ticks of 1/100 s: the USER_HZ every Linux build uses,
// which Go cannot ask sysconf for without cgo.
func procCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("read CPU time: %w", err)
	}
	// The command name may hold spaces: the fields that follow start
	// after its closing parenthesis, with field 3 (state).
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, errors.New("no command name in /proc stat")
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 13 {
		return 0, errors.New("short /proc stat")
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64) // field 14
	stime, err2 := strconv.ParseInt(f[12], 10, 64) // field 15
	if err1 != nil || err2 != nil {
		return 0, errors.New("unreadable CPU time in /proc stat")
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}

// cappedBuffer keeps the first max bytes written to it.
type cappedBuffer struct {
	mu  sync.Mutex
	max int
	buf bytes.Buffer
}

func (b *cappedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (b *cappedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
