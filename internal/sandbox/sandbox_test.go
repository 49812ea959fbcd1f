package sandbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/natsagent/natsagent/internal/sandbox"
	"github.com/natsagent/natsagent/internal/sandbox/sandboxtest"
)

// run runs command in a fresh directory and returns the result, the
// output and the directory (on the host).
func run(t *testing.T, s *sandbox.Sandbox, command string, timeout time.Duration) (sandbox.Result, string, string) {
	t.Helper()
	dir, err := s.TempDir()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sandbox.RemoveAll(dir) })
	var out bytes.Buffer
	res := s.Run(context.Background(), dir, command, timeout, &out)
	if res.Err != nil {
		t.Fatalf("%s: %v\n%s", command, res.Err, out.String())
	}
	return res, out.String(), dir
}

// marker is an argument unique to this test, so its processes can be
// found in /proc.
func marker(t *testing.T) string {
	return fmt.Sprintf("%d.%d", 30+time.Now().Nanosecond()%1000, os.Getpid())
}

// processesWith lists the host's processes whose command line holds m.
func processesWith(t *testing.T, m string) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !bytes.Contains(cmdline, []byte(m)) {
			continue
		}
		if stat, err := os.ReadFile("/proc/" + e.Name() + "/stat"); err == nil && bytes.Contains(stat, []byte(") Z ")) {
			continue // dead, waiting for its reaper
		}
		out = append(out, e.Name()+": "+strings.ReplaceAll(string(cmdline), "\x00", " "))
	}
	return out
}

func TestIdentityAndView(t *testing.T) {
	s := sandboxtest.New(t, sandbox.Config{})
	t.Setenv("NATSAGENT_TEST_SECRET", "leak")
	res, out, dir := run(t, s, "id -u; id -g; id -un; pwd; echo \"$HOME\"; hostname; env | sort; ls /; echo made > out.txt; exit 3", 10*time.Second)
	if res.ExitCode != 3 {
		t.Fatalf("exit code %d, want 3: %s", res.ExitCode, out)
	}
	want := "65534\n65534\nnobody\n/workdir\n/workdir\nsandbox\n"
	if !strings.HasPrefix(out, want) {
		t.Errorf("identity: got %q, want it to start with %q", out, want)
	}
	if strings.Contains(out, "NATSAGENT_TEST_SECRET") || !strings.Contains(out, "PATH=/usr/bin:/bin\n") {
		t.Errorf("environment not scrubbed: %q", out)
	}
	for _, host := range []string{"root\n", "home\n", "work\n", "var\n", "etc\n"} {
		if host == "etc\n" {
			continue // a minimal /etc exists
		}
		if strings.Contains(out, "\n"+host) {
			t.Errorf("the host's /%s is visible: %q", strings.TrimSpace(host), out)
		}
	}
	if got, err := os.ReadFile(filepath.Join(dir, "out.txt")); err != nil || string(got) != "made\n" {
		t.Errorf("file written in /workdir: %q, %v", got, err)
	}
}

func TestCannotReadOutside(t *testing.T) {
	s := sandboxtest.New(t, sandbox.Config{})
	secret := filepath.Join(t.TempDir(), "secret.txt")
	if err := os.WriteFile(secret, []byte("TOP-SECRET-42"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Dir(secret), 0o755); err != nil {
		t.Fatal(err)
	}
	self := strconv.Itoa(os.Getpid())
	cmd := strings.Join([]string{
		"cat " + secret,
		"cat /etc/shadow",
		"cat /etc/hostname",
		"ls -a /root",
		"ls /work",
		"ls " + filepath.Dir(secret),
		"cat /proc/" + self + "/cmdline",
		"cat /proc/" + self + "/environ",
		"ls /proc | grep -c '^[0-9]'",
	}, "; ")
	_, out, _ := run(t, s, cmd, 10*time.Second)
	for _, leak := range []string{"TOP-SECRET-42", "\nsecret.txt\n", "root:", os.Args[0]} {
		if strings.Contains(out, leak) {
			t.Errorf("read %q from outside the workdir:\n%s", leak, out)
		}
	}
	if host, err := os.Hostname(); err == nil && strings.Contains(out, host) {
		t.Errorf("the host's name %q is visible:\n%s", host, out)
	}
	// Its own pid namespace: a handful of processes, not the host's.
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if n, err := strconv.Atoi(lines[len(lines)-1]); err != nil || n > 5 {
		t.Errorf("processes seen in /proc: %q", lines[len(lines)-1])
	}
}

func TestCannotWriteOutside(t *testing.T) {
	s := sandboxtest.New(t, sandbox.Config{})
	outside := t.TempDir()
	if err := os.Chmod(outside, 0o777); err != nil {
		t.Fatal(err)
	}
	tmpName := "natsagent-sandbox-" + marker(t)
	cmd := fmt.Sprintf("echo x > %s/planted; touch /usr/planted; echo x > /tmp/%s; cat /tmp/%s; mkdir /etc/x; echo done",
		outside, tmpName, tmpName)
	_, out, _ := run(t, s, cmd, 10*time.Second)
	if !strings.Contains(out, "x\ndone") {
		t.Errorf("the private /tmp is not writable: %q", out)
	}
	for _, p := range []string{filepath.Join(outside, "planted"), "/usr/planted", filepath.Join(os.TempDir(), tmpName), "/etc/x"} {
		if _, err := os.Lstat(p); err == nil {
			_ = os.Remove(p)
			t.Errorf("the command wrote %s on the host", p)
		}
	}
}

func TestNoNetwork(t *testing.T) {
	s := sandboxtest.New(t, sandbox.Config{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var accepted atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			_ = c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	_, out, _ := run(t, s, fmt.Sprintf("bash -c 'echo hi > /dev/tcp/127.0.0.1/%d' && echo CONNECTED; cat /proc/net/dev | grep -c :", port), 10*time.Second)
	time.Sleep(100 * time.Millisecond)
	if n := accepted.Load(); n != 0 || strings.Contains(out, "CONNECTED") {
		t.Errorf("the sandbox reached the host's loopback (%d connections): %q", n, out)
	}
	// Only its own loopback interface.
	if !strings.HasSuffix(strings.TrimSpace(out), "\n1") {
		t.Errorf("interfaces: %q", out)
	}
}

func TestNothingLeftBehind(t *testing.T) {
	s := sandboxtest.New(t, sandbox.Config{})
	m := marker(t)
	start := time.Now()
	cmd := fmt.Sprintf("(sleep 1; echo x > /workdir/late) & nohup sleep %s >/dev/null 2>&1 & setsid sleep %s & "+
		"(setsid sh -c 'sleep 1; echo y > /workdir/late2' &) ; echo started", m, m)
	res, out, dir := run(t, s, cmd, 20*time.Second)
	if res.ExitCode != 0 || !strings.Contains(out, "started") {
		t.Fatalf("exit %d: %q", res.ExitCode, out)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("the call waited for background processes: %s", d)
	}
	if left := processesWith(t, m); len(left) > 0 {
		t.Errorf("processes left behind after the call returned: %v", left)
	}
	time.Sleep(1500 * time.Millisecond)
	for _, f := range []string{"late", "late2"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			t.Errorf("a background process wrote %s after the call returned", f)
		}
	}
}

func TestWallTimeKillsEverything(t *testing.T) {
	s := sandboxtest.New(t, sandbox.Config{})
	m := marker(t)
	start := time.Now()
	// One of them lets go of the output, so the call cannot wait for it
	// through the pipe: only the pid namespace's end stops it.
	res, out, _ := run(t, s, fmt.Sprintf("sleep %s & setsid sleep %s & setsid sh -c 'exec >/dev/null 2>&1; while :; do :; done # %s' & echo started; sleep %s", m, m, m, m), time.Second)
	if !res.TimedOut || !strings.Contains(out, "started") {
		t.Errorf("result %+v, output %q", res, out)
	}
	if d := time.Since(start); d > 4*time.Second {
		t.Errorf("the time limit took %s", d)
	}
	if left := processesWith(t, m); len(left) > 0 {
		t.Errorf("processes left behind after the time limit: %v", left)
	}
}

func TestProcessLimit(t *testing.T) {
	s := sandboxtest.New(t, sandbox.Config{Limits: sandbox.Limits{Processes: 16}})
	// Each iteration records how many processes started so far; the
	// shell gives up when fork fails.
	res, _, dir := run(t, s, "i=0; while [ $i -lt 100 ]; do sleep 5 & i=$((i+1)); echo $i > started; done", 20*time.Second)
	data, err := os.ReadFile(filepath.Join(dir, "started"))
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := strconv.Atoi(strings.TrimSpace(string(data))); n >= 16 || n == 0 {
		t.Errorf("%d processes started under a limit of 16 (exit %d)", n, res.ExitCode)
	}

	// A fork bomb ends at the limit and the wall time, and leaves nothing.
	m := marker(t)
	start := time.Now()
	res, _, _ = run(t, s, "f(){ f | f & }; f; sleep 30 # "+m, 2*time.Second)
	if d := time.Since(start); d > 6*time.Second {
		t.Errorf("the fork bomb held the call %s", d)
	}
	if left := processesWith(t, m); len(left) > 0 {
		t.Errorf("%d fork bomb processes left behind, e.g. %s", len(left), left[0])
	}
	_ = res
}

func TestMemoryAndFileLimits(t *testing.T) {
	s := sandboxtest.New(t, sandbox.Config{Limits: sandbox.Limits{MemoryBytes: 128 << 20, FileBytes: 1 << 20, TmpBytes: 4 << 20, OpenFiles: 32}})
	// awk doubles a string to 512 MiB: over the address space limit.
	cmd := strings.Join([]string{
		`awk 'BEGIN{s="x"; for(i=0;i<29;i++) s=s s; print "length", length(s)}'`,
		"head -c 3000000 /dev/zero > big",
		"for i in 1 2 3 4 5 6 7 8; do head -c 1000000 /dev/zero > /tmp/f$i; done; echo tmp $(cat /tmp/f* | wc -c)",
		"ulimit -n",
		"unshare -U true && echo NESTED-USERNS",
	}, "; ")
	_, out, dir := run(t, s, cmd, 20*time.Second)
	if strings.Contains(out, "length 536870912") {
		t.Errorf("a 512 MiB string under a 128 MiB limit: %q", out)
	}
	if fi, err := os.Stat(filepath.Join(dir, "big")); err != nil || fi.Size() > 1<<20 {
		t.Errorf("a file over the 1 MiB limit: %v, %v", fi, err)
	}
	if n := tmpBytes(out); n < 3000000 || n > 4<<20 {
		t.Errorf("/tmp not bounded to 4 MiB: %q", out)
	}
	if !strings.Contains(out, "\n32\n") {
		t.Errorf("open files limit: %q", out)
	}
	if strings.Contains(out, "NESTED-USERNS") {
		t.Errorf("a user namespace inside the sandbox: %q", out)
	}
}

func TestUnavailable(t *testing.T) {
	_, err := sandbox.New(context.Background(), sandbox.Config{Bwrap: filepath.Join(t.TempDir(), "bwrap")})
	if !errors.Is(err, sandbox.ErrUnavailable) || !strings.Contains(err.Error(), "apt-get install bubblewrap") || !strings.Contains(err.Error(), "isolation: none") {
		t.Errorf("without bwrap: %v", err)
	}
	// A bwrap that cannot create namespaces fails the trial command.
	// Where bwrap's user (nobody, for a root test) can run it.
	fakeDir, err := os.MkdirTemp("", "natsagent-fake-bwrap-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(fakeDir)
	if err := os.Chmod(fakeDir, 0o755); err != nil {
		t.Fatal(err)
	}
	fake := filepath.Join(fakeDir, "bwrap")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err = sandbox.New(context.Background(), sandbox.Config{Bwrap: fake})
	if !errors.Is(err, sandbox.ErrUnavailable) || !strings.Contains(err.Error(), "No permissions to create new namespace") || !strings.Contains(err.Error(), "user namespaces") {
		t.Errorf("bwrap without namespaces: %v", err)
	}
	if _, err := sandbox.New(context.Background(), sandbox.Config{Isolation: "chroot"}); err == nil {
		t.Error("unknown isolation accepted")
	}
}

// tmpBytes reads "tmp N" from the output.
func tmpBytes(out string) int {
	_, rest, _ := strings.Cut(out, "tmp ")
	line, _, _ := strings.Cut(rest, "\n")
	n, _ := strconv.Atoi(line)
	return n
}

// The kernel interfaces a command has no use for fail with EPERM; the
// others work. perl (perl-base, always on Debian) makes the raw calls:
// io_uring_setup with no parameters, keyctl(KEYCTL_GET_KEYRING_ID,
// KEY_SPEC_SESSION_KEYRING), getpid.
func TestSeccompDenies(t *testing.T) {
	if auditArch := map[string]bool{"amd64": true, "arm64": true}; !auditArch[runtime.GOARCH] {
		t.Skipf("no seccomp filter on %s", runtime.GOARCH)
	}
	s := sandboxtest.New(t, sandbox.Config{})
	perl := func(nr uintptr, args string) string {
		return fmt.Sprintf(`perl -e '$r = syscall(%d%s); print $r == -1 ? "$!\n" : "ok\n"'`, nr, args)
	}
	cmd := strings.Join([]string{
		perl(unix.SYS_IO_URING_SETUP, ", 1, 0"),
		perl(unix.SYS_KEYCTL, ", 0, -3, 0"),
		perl(unix.SYS_GETPID, ""),
	}, "; ")
	_, out, _ := run(t, s, cmd, 10*time.Second)
	if out != "Operation not permitted\nOperation not permitted\nok\n" {
		t.Errorf("io_uring_setup, keyctl, getpid: %q", out)
	}
}

// What a command leaves behind is removed, a directory it closed included,
// and a link it planted changes nothing outside.
func TestRemoveAll(t *testing.T) {
	s := sandboxtest.New(t, sandbox.Config{})
	outside := t.TempDir()
	if err := os.Chmod(outside, 0o751); err != nil {
		t.Fatal(err)
	}
	dir, err := s.TempDir()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	res := s.Run(context.Background(), dir, "mkdir -p a/b && echo x > a/b/f && chmod 000 a/b a && ln -s "+outside+" link", 10*time.Second, &out)
	if res.Err != nil || res.ExitCode != 0 {
		t.Fatalf("%+v %s", res, out.String())
	}
	if err := sandbox.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(dir); !os.IsNotExist(err) {
		t.Errorf("the directory is still there: %v", err)
	}
	if fi, err := os.Stat(outside); err != nil || fi.Mode().Perm() != 0o751 {
		t.Errorf("the linked directory outside changed: %v, %v", fi.Mode(), err)
	}
}
