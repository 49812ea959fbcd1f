package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/testdeploy"
	"github.com/natsagent/natsagent/internal/testdeploy/jobworker"
	"github.com/natsagent/natsagent/internal/tools"
)

// cliEnv is a real embedded JetStream server with a deployment
// provisioned under its own prefix (so a test also proves --prefix), and
// an in-process worker running a scripted model, whose threads' workdirs
// the test can read.
type cliEnv struct {
	t        *testing.T
	srv      *natstest.Server
	settings bus.Settings
	stores   *kv.Stores

	mu       sync.Mutex
	workdirs map[string]*files.Memory
}

const testPrefix = "clitest"

func newCLIEnv(t *testing.T, m model.Model) *cliEnv {
	t.Helper()
	// 30 s: no test here waits for a redelivery, and a 2 s ack wait under
	// load paused healthy runs' lease fences (events held for seconds).
	d := testdeploy.Start(t, bus.Settings{Names: bus.Names{Prefix: testPrefix}, AckWait: 30 * time.Second, MaxDeliver: 5})
	e := &cliEnv{t: t, srv: d.Server, settings: d.Settings, stores: d.Stores, workdirs: make(map[string]*files.Memory)}
	e.startWorker(m)
	return e
}

// startWorker runs a worker with the chatbot profile (file tools, the
// default approval and clarification middlewares) on its own connection.
func (e *cliEnv) startWorker(m model.Model) {
	e.t.Helper()
	agents, err := agent.NewAgents(m, tools.NewRegistry(), agent.Chatbot())
	if err != nil {
		e.t.Fatal(err)
	}
	workdir := func(tenant, thread string) files.Workdir { return e.workdir(tenant, thread) }
	// Compaction jobs (natsagent compact) are served beside the runs.
	jobworker.Start(e.t, e.srv.URL(), e.settings, agents, workdir, 4)
}

func (e *cliEnv) workdir(tenant, thread string) *files.Memory {
	e.mu.Lock()
	defer e.mu.Unlock()
	key := tenant + "/" + thread
	if e.workdirs[key] == nil {
		e.workdirs[key] = files.NewMemory()
	}
	return e.workdirs[key]
}

// result is what one invocation of the CLI did.
type result struct {
	code     int
	out, err string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\n--- stdout\n%s--- stderr\n%s", r.code, r.out, r.err)
}

// cli runs a command against the environment's server and prefix.
// A command gets two minutes: a run that streams in 3 s alone took over
// 30 s under -race on a machine shared with stress-ng.
func (e *cliEnv) cli(args ...string) result {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return e.cliCtx(ctx, args...)
}

func (e *cliEnv) cliCtx(ctx context.Context, args ...string) result {
	full := append([]string{args[0], "--server", e.srv.URL(), "--prefix", testPrefix}, args[1:]...)
	return invoke(ctx, full...)
}

func invoke(ctx context.Context, args ...string) result {
	var out, errOut syncBuffer
	code := run(ctx, args, stdio{in: strings.NewReader(""), out: &out, err: &errOut})
	return result{code: code, out: out.String(), err: errOut.String()}
}

// syncBuffer is a buffer a test may read while a command writes to it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// must fails the test unless the command exited with code.
func (r result) must(t *testing.T, code int) result {
	t.Helper()
	if r.code != code {
		t.Fatalf("want exit %d, got %s", code, r)
	}
	return r
}

// has fails the test unless stdout holds every string.
func (r result) has(t *testing.T, want ...string) result {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(r.out, w) {
			t.Fatalf("stdout lacks %q:\n%s", w, r)
		}
	}
	return r
}

// says fails the test unless stderr holds every string.
func (r result) says(t *testing.T, want ...string) result {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(r.err, w) {
			t.Fatalf("stderr lacks %q:\n%s", w, r)
		}
	}
	return r
}

func (e *cliEnv) record(run string) *protocol.Run {
	e.t.Helper()
	rec, _, err := e.stores.Runs.Get(context.Background(), protocol.DefaultTenant, run)
	if err != nil {
		e.t.Fatalf("run %s: %v", run, err)
	}
	return rec
}

// waitStatus waits until a run's record has the status.
func (e *cliEnv) waitStatus(run string, want protocol.Status) *protocol.Run {
	e.t.Helper()
	var rec *protocol.Run
	testdeploy.WaitFor(e.t, 10*time.Second, fmt.Sprintf("run %s %s", run, want), func() bool {
		r, err := e.stores.FindRunView(context.Background(), protocol.DefaultTenant, run)
		rec = r
		return err == nil && r.Status == want
	})
	return rec
}

// events decodes the JSON lines of --json output.
func decodeEvents(t *testing.T, out string) []protocol.Event {
	t.Helper()
	var evs []protocol.Event
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var ev protocol.Event
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("line %q is not an event: %v", line, err)
		}
		evs = append(evs, ev)
	}
	return evs
}

// closedPort is a loopback port nothing listens on.
func closedPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return port
}
