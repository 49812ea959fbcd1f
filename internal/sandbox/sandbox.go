// Package sandbox runs one shell command in an isolated, limited, throwaway
// environment built with bubblewrap (bwrap): new user, pid, network, ipc,
// uts and (where available) cgroup namespaces, an unprivileged uid, the
// system read only, one host directory writable at /workdir, a private
// size-limited /tmp, resource limits, a seccomp filter, and a wall time
// that kills every process of the sandbox. It owns how a command is confined; it knows
// nothing of workdirs, runs or tools (internal/tools/execute.go decides
// what directory to give it).
package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Isolation modes.
const (
	// Bubblewrap confines every command (the default).
	Bubblewrap = "bubblewrap"
	// None runs commands as the worker's own user, with the worker's view
	// of the file system and network: only for a worker that is itself a
	// disposable, isolated container.
	None = "none"
)

// Workdir is where the command finds its directory, and its HOME.
const Workdir = "/workdir"

// sandboxUID is the uid and gid commands run as: nobody.
const sandboxUID = "65534"

// hostUID is the host uid a root worker runs bwrap as: nobody.
const hostUID = 65534

// Limits bound one command. Zero fields take the defaults.
type Limits struct {
	// Processes bounds the processes (and threads) of the sandbox
	// (RLIMIT_NPROC, counted in the sandbox's own user namespace).
	Processes int
	// MemoryBytes bounds the address space of each process (RLIMIT_AS).
	MemoryBytes int64
	// OpenFiles bounds the open files of each process (RLIMIT_NOFILE).
	OpenFiles int
	// FileBytes bounds the size of a file a process writes (RLIMIT_FSIZE).
	FileBytes int64
	// TmpBytes is the size of the private /tmp (a tmpfs).
	TmpBytes int64
}

// Default limits.
const (
	DefaultProcesses   = 64
	DefaultMemoryBytes = 1 << 30
	DefaultOpenFiles   = 256
	DefaultFileBytes   = 32 << 20
	DefaultTmpBytes    = 64 << 20
)

func (l Limits) withDefaults() Limits {
	if l.Processes <= 0 {
		l.Processes = DefaultProcesses
	}
	if l.MemoryBytes <= 0 {
		l.MemoryBytes = DefaultMemoryBytes
	}
	if l.OpenFiles <= 0 {
		l.OpenFiles = DefaultOpenFiles
	}
	if l.FileBytes <= 0 {
		l.FileBytes = DefaultFileBytes
	}
	if l.TmpBytes <= 0 {
		l.TmpBytes = DefaultTmpBytes
	}
	return l
}

// Config configures a Sandbox.
type Config struct {
	// Isolation is Bubblewrap (default) or None.
	Isolation string
	Limits    Limits
	// Bwrap is the bubblewrap binary; default: "bwrap" looked up on PATH.
	Bwrap string
}

// ErrUnavailable wraps every reason New cannot offer a bubblewrap sandbox.
var ErrUnavailable = errors.New("the command sandbox is not available")

// Enable says how to make the sandbox available; it ends New's errors.
const Enable = "install bubblewrap (Debian: apt-get install bubblewrap; 0.8 or newer) and allow unprivileged user " +
	"namespaces (sysctl user.max_user_namespaces above 0, and kernel.unprivileged_userns_clone=1 where it exists; " +
	"in a container, a seccomp profile that permits them), " +
	"or set files.sandbox.isolation: none where the worker is itself a disposable container, " +
	"or turn files.sandbox.enabled off"

// Sandbox runs commands. It holds no state between commands and is safe
// for concurrent use.
type Sandbox struct {
	isolation string
	limits    Limits
	bwrap     string
	seccomp   []byte // the filter bwrap loads (seccompFilter)
}

// New checks that commands can be confined here, by running a trivial one
// in a sandbox exactly as Run builds it, and returns the Sandbox. With
// Isolation None it checks nothing.
func New(ctx context.Context, cfg Config) (*Sandbox, error) {
	s := &Sandbox{isolation: cfg.Isolation, limits: cfg.Limits.withDefaults()}
	switch s.isolation {
	case "", Bubblewrap:
		s.isolation = Bubblewrap
	case None:
		return s, nil
	default:
		return nil, fmt.Errorf("sandbox isolation %q is not one of %s, %s", cfg.Isolation, Bubblewrap, None)
	}
	name := cfg.Bwrap
	if name == "" {
		name = "bwrap"
	}
	bwrap, err := exec.LookPath(name)
	if err != nil {
		return nil, fmt.Errorf("%w: %s is not installed or not on PATH: %s", ErrUnavailable, name, Enable)
	}
	s.bwrap = bwrap
	if s.seccomp, err = seccompFilter(); err != nil {
		return nil, fmt.Errorf("%w: build the seccomp filter: %v", ErrUnavailable, err)
	}
	trial, err := s.TempDir()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	defer func() { _ = RemoveAll(trial) }()
	var out bytes.Buffer
	res := s.Run(ctx, trial, "id -u", 10*time.Second, &out)
	if res.Err != nil || res.ExitCode != 0 || strings.TrimSpace(out.String()) != sandboxUID {
		why := strings.TrimSpace(out.String())
		if res.Err != nil {
			why = strings.TrimSpace(res.Err.Error() + ": " + why)
		}
		return nil, fmt.Errorf("%w: a trial command in bubblewrap (%s) failed (%s): %s", ErrUnavailable, bwrap, why, Enable)
	}
	return s, nil
}

// etcFiles are the passwd and group the sandbox sees: only nobody, so
// programs that look the user up work and nothing of the host's users
// shows. bwrap copies them in from pipes (--ro-bind-data).
var etcFiles = []struct{ path, content string }{
	{"/etc/passwd", "nobody:x:" + sandboxUID + ":" + sandboxUID + ":nobody:" + Workdir + ":/bin/sh\n"},
	{"/etc/group", "nogroup:x:" + sandboxUID + ":\n"},
}

// Result is how a command ended.
type Result struct {
	// ExitCode is the command's exit status (128+n when signal n killed
	// it, as a shell reports it); -1 when it did not finish.
	ExitCode int
	// TimedOut is set when the wall time stopped it.
	TimedOut bool
	// Err is set when the command could not run, or ctx stopped it.
	Err error
}

// Run runs `sh -c command` with dir as its working directory (at /workdir
// under bubblewrap) and the output, stdout and stderr together, written to
// out. When it returns, every process the command started has ended.
func (s *Sandbox) Run(ctx context.Context, dir, command string, timeout time.Duration, out io.Writer) Result {
	runCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var cmd *exec.Cmd
	if s.isolation == None {
		cmd = exec.CommandContext(runCtx, "/bin/sh", "-c", command)
		cmd.Dir = dir
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + dir}
	} else {
		cmd = exec.CommandContext(runCtx, s.bwrap, s.args(dir, command)...)
		cmd.Env = []string{"PATH=/usr/bin:/bin"}
	}
	// Its own process group, so stopping it reaches everything it started
	// outside a pid namespace (isolation none); under bubblewrap, killing
	// bwrap kills the namespace's init, and the kernel every process in it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if s.isolation != None && os.Geteuid() == 0 {
		// The kernel never applies RLIMIT_NPROC to host uid 0, whatever
		// namespace a process is in, and the sandbox's uid maps to the uid
		// that started bwrap: a root worker starts it as nobody.
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: hostUID, Gid: hostUID}
		if err := chownTree(dir, hostUID); err != nil {
			return Result{ExitCode: -1, Err: fmt.Errorf("prepare the command's directory: %w", err)}
		}
	}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// A process holding the output open must not hold the tool.
	cmd.WaitDelay = time.Second
	var info *os.File
	if s.isolation != None {
		// Extra files: bwrap tells the host pid of the sandbox's init on
		// fd 3 (--info-fd); fds 4 and up carry etcFiles and the seccomp
		// filter.
		r, w, err := os.Pipe()
		if err != nil {
			return Result{ExitCode: -1, Err: fmt.Errorf("the command could not run: %w", err)}
		}
		defer r.Close()
		defer w.Close()
		info = r
		cmd.ExtraFiles = []*os.File{w}
		extra := []string{"--info-fd", "3"}
		pass := func(flag, content, dest string) error {
			data, err := dataPipe(content)
			if err != nil {
				return fmt.Errorf("the command could not run: %w", err)
			}
			cmd.ExtraFiles = append(cmd.ExtraFiles, data)
			extra = append(extra, flag, strconv.Itoa(2+len(cmd.ExtraFiles)))
			if dest != "" {
				extra = append(extra, dest)
			}
			return nil
		}
		defer func() {
			for _, f := range cmd.ExtraFiles {
				_ = f.Close()
			}
		}()
		for _, f := range etcFiles {
			if err := pass("--ro-bind-data", f.content, f.path); err != nil {
				return Result{ExitCode: -1, Err: err}
			}
		}
		if s.seccomp != nil {
			if err := pass("--seccomp", string(s.seccomp), ""); err != nil {
				return Result{ExitCode: -1, Err: err}
			}
		}
		cmd.Args = slices.Insert(cmd.Args, 1, extra...)
	}
	if err := cmd.Start(); err != nil {
		return Result{ExitCode: -1, Err: fmt.Errorf("the command could not run: %w", err)}
	}
	for _, f := range cmd.ExtraFiles {
		_ = f.Close() // bwrap has its copies
	}
	var init *sandboxInit
	if info != nil {
		init = watchInit(runCtx, info, cmd.Process.Pid)
	}
	err := cmd.Wait()
	if s.isolation == None {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	if init != nil {
		// Whatever the command left running dies with the namespace's
		// init; the call returns once it has.
		if err := init.kill(5 * time.Second); err != nil {
			return Result{ExitCode: -1, Err: err}
		}
	}
	var exit *exec.ExitError
	switch {
	case errors.Is(runCtx.Err(), context.DeadlineExceeded) && ctx.Err() == nil:
		return Result{ExitCode: -1, TimedOut: true}
	case ctx.Err() != nil:
		return Result{ExitCode: -1, Err: ctx.Err()}
	case err == nil, errors.Is(err, exec.ErrWaitDelay):
		return Result{}
	case errors.As(err, &exit):
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return Result{ExitCode: 128 + int(ws.Signal())}
		}
		return Result{ExitCode: exit.ExitCode()}
	}
	return Result{ExitCode: -1, Err: fmt.Errorf("the command could not run: %w", err)}
}

// args builds bwrap's command line. Every mount is named: what is not
// here does not exist in the sandbox.
func (s *Sandbox) args(dir, command string) []string {
	l := s.limits
	a := []string{
		"--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
		// No user namespace inside: they are the kernel's widest door.
		"--disable-userns",
		"--uid", sandboxUID, "--gid", sandboxUID,
		"--hostname", "sandbox",
		"--die-with-parent", "--new-session",
		"--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", Workdir,
		"--ro-bind", "/usr", "/usr",
	}
	// The root's links into /usr (merged /usr), or the directories
	// themselves on older systems.
	for _, d := range []string{"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"} {
		fi, err := os.Lstat(d)
		switch {
		case err != nil:
		case fi.Mode()&os.ModeSymlink != 0:
			if target, err := os.Readlink(d); err == nil {
				a = append(a, "--symlink", target, d)
			}
		case fi.IsDir():
			a = append(a, "--ro-bind", d, d)
		}
	}
	// What programs need of /etc: the dynamic linker's cache, Debian's
	// alternatives (awk, editors), and a passwd naming only the sandbox's
	// user.
	for _, f := range []string{"/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/localtime"} {
		a = append(a, "--ro-bind-try", f, f)
	}
	a = append(a,
		"--proc", "/proc",
		"--dev", "/dev",
		"--size", strconv.FormatInt(l.TmpBytes, 10), "--tmpfs", "/tmp",
		"--bind", dir, Workdir,
		"--chdir", Workdir,
		"--",
		// Limits are set inside the sandbox, after its user namespace
		// exists: RLIMIT_NPROC then counts the sandbox's processes only,
		// not every process of the worker's user on the host.
		"/usr/bin/prlimit",
		"--nproc="+strconv.Itoa(l.Processes),
		"--as="+strconv.FormatInt(l.MemoryBytes, 10),
		"--nofile="+strconv.Itoa(l.OpenFiles),
		"--fsize="+strconv.FormatInt(l.FileBytes, 10),
		"--core=0",
		"--",
		"/bin/sh", "-c", command,
	)
	return a
}

// TempDir creates a directory for a command to work in, in the system's
// temporary directory, where the user bwrap runs as can reach it. The
// caller removes it with RemoveAll.
func (s *Sandbox) TempDir() (string, error) {
	dir, err := os.MkdirTemp("", "natsagent-exec-")
	if err != nil {
		return "", fmt.Errorf("create a directory for the command: %w", err)
	}
	return dir, nil
}

// chownTree gives dir and everything under it to uid, without following
// symbolic links.
func chownTree(dir string, uid int) error {
	return filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, uid)
	})
}

// RemoveAll removes a directory a command worked in, even where the
// command took the permission to enter or change it away. Permissions are
// restored through an os.Root, so a link planted in the directory never
// makes it change anything outside.
func RemoveAll(dir string) error {
	if r, err := os.OpenRoot(dir); err == nil {
		// WalkDir calls fn on a directory before reading it.
		_ = fs.WalkDir(r.FS(), ".", func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				_ = r.Chmod(p, 0o700)
			}
			return nil
		})
		_ = r.Close()
	}
	return os.RemoveAll(dir)
}

// dataPipe returns the read end of a pipe that holds content and is closed
// for writing. content must fit the pipe's buffer (64 KiB on Linux).
func dataPipe(content string) (*os.File, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	_, err = w.WriteString(content)
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = r.Close()
		return nil, err
	}
	return r, nil
}

// sandboxInit is the init process of a sandbox's pid namespace, held by a
// pidfd so its pid cannot name another process later.
type sandboxInit struct{ pidfd int }

// watchInit reads the host pid of the sandbox's init from bwrap's info
// fd and opens a pidfd on it. It is called before bwrap is reaped: while
// bwrap (pid parent) is unreaped, no other process can be its child, so
// checking the parent proves the pidfd names the sandbox's init. nil when
// bwrap ended before telling or the init has gone already.
func watchInit(ctx context.Context, info *os.File, bwrap int) *sandboxInit {
	pid := make(chan int, 1)
	go func() {
		var v struct {
			ChildPID int `json:"child-pid"`
		}
		_ = json.NewDecoder(info).Decode(&v)
		pid <- v.ChildPID
	}()
	var p int
	select {
	case p = <-pid:
	case <-ctx.Done():
		return nil
	}
	if p <= 0 {
		return nil
	}
	fd, err := unix.PidfdOpen(p, 0)
	if err != nil {
		return nil
	}
	status, err := os.ReadFile("/proc/" + strconv.Itoa(p) + "/status")
	if err != nil || !strings.Contains(string(status), "\nPPid:\t"+strconv.Itoa(bwrap)+"\n") {
		_ = unix.Close(fd)
		return nil
	}
	return &sandboxInit{pidfd: fd}
}

// kill kills the sandbox's init, which makes the kernel kill every
// process of its pid namespace, and waits until it has exited: by then
// they all have.
func (i *sandboxInit) kill(wait time.Duration) error {
	defer unix.Close(i.pidfd)
	if err := unix.PidfdSendSignal(i.pidfd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("stop the command's processes: %w", err)
	}
	fds := []unix.PollFd{{Fd: int32(i.pidfd), Events: unix.POLLIN}}
	deadline := time.Now().Add(wait)
	for {
		n, err := unix.Poll(fds, int(time.Until(deadline).Milliseconds()))
		if n > 0 {
			return nil
		}
		if err != nil && errors.Is(err, unix.EINTR) && time.Now().Before(deadline) {
			continue
		}
		return fmt.Errorf("the command's processes did not stop within %s", wait)
	}
}
