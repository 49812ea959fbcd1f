package workerproc

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/bus"
)

// The test binary doubles as a NATS server process too: with serverEnv
// set it runs serverMain, a JetStream server with its file store in
// envStore listening on envListen, until it is killed. A test kills it
// with SIGKILL (nothing is flushed or closed: a kill -9) and starts it
// again on the same store and port.
const (
	serverEnv = "NATSAGENT_WORKERPROC_SERVER"
	envStore  = "WORKERPROC_STORE"
	envListen = "WORKERPROC_LISTEN"
)

func serverMain() error {
	e, err := bus.StartEmbedded(bus.EmbeddedConfig{StoreDir: os.Getenv(envStore), Listen: os.Getenv(envListen), ServerName: "workerproc"})
	if err != nil {
		return err
	}
	fmt.Println("ready")
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	<-sig
	e.Server.Shutdown()
	return nil
}

// serverProc is a NATS server process on a fixed loopback port.
type serverProc struct {
	t      *testing.T
	store  string
	listen string
	cmd    *exec.Cmd
	exited chan struct{}
}

// startServerProc starts a server process on a free loopback port.
func startServerProc(t *testing.T) *serverProc {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	listen := ln.Addr().String()
	_ = ln.Close()
	s := &serverProc{t: t, store: filepath.Join(t.TempDir(), "jetstream"), listen: listen}
	s.start()
	t.Cleanup(func() { s.kill() })
	return s
}

// URL is the server's client URL.
func (s *serverProc) URL() string { return "nats://" + s.listen }

// start launches the process and waits until it serves.
func (s *serverProc) start() {
	s.t.Helper()
	s.cmd = exec.Command(os.Args[0], "-test.run=^$")
	s.cmd.Env = append(os.Environ(), serverEnv+"=1", envStore+"="+s.store, envListen+"="+s.listen)
	s.cmd.Stderr = os.Stderr
	out, err := s.cmd.StdoutPipe()
	if err != nil {
		s.t.Fatal(err)
	}
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	exited := make(chan struct{})
	s.exited = exited
	cmd := s.cmd
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		ok := false
		for sc.Scan() {
			if sc.Text() == "ready" && !ok {
				ok = true
				ready <- true
			}
		}
		if !ok {
			ready <- false
		}
	}()
	select {
	case ok := <-ready:
		if !ok {
			s.t.Fatal("the server process did not start")
		}
	case <-time.After(startWithin):
		s.t.Fatalf("the server process did not start in %s", startWithin)
	}
}

// kill ends the process with SIGKILL and waits until it is gone.
func (s *serverProc) kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	select {
	case <-s.exited:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.exited
}
