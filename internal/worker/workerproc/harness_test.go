package workerproc

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/testdeploy"
)

// deployment is an embedded JetStream server with natsagent provisioned,
// the shared execution log, and every run event, collected as stored.
type deployment struct {
	t        *testing.T
	srv      *natstest.Server // nil when the server is a process (serverProc)
	url      string
	nc       *nats.Conn
	js       jetstream.JetStream
	settings bus.Settings
	stores   *kv.Stores
	dir      string
	logPath  string

	// warm workers build their token encoder before they are ready
	// (child_test.go): for tests that time how soon a worker continues a
	// run. The kill test keeps cold ones, replaced without waiting for it.
	warm bool

	mu     sync.Mutex
	events map[string][]protocol.Event // by run id
	procs  []*proc
}

func newDeployment(t *testing.T, ackWait time.Duration, maxDeliver int) *deployment {
	t.Helper()
	dep := testdeploy.Start(t, bus.Settings{AckWait: ackWait, MaxDeliver: maxDeliver})
	d := &deployment{t: t, srv: dep.Server, url: dep.Server.URL(), nc: dep.NC, js: dep.JS, settings: dep.Settings, stores: dep.Stores}
	d.collect()
	return d
}

// newDeploymentOn is newDeployment on a server at url that the test runs
// itself (a serverProc): natsagent is provisioned on it.
func newDeploymentOn(t *testing.T, url string, ackWait time.Duration, maxDeliver int) *deployment {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	settings := bus.Settings{AckWait: ackWait, MaxDeliver: maxDeliver}.WithDefaults()
	natstest.Provision(t, nc, settings)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stores, err := kv.Open(context.Background(), js, settings.Names)
	if err != nil {
		t.Fatal(err)
	}
	d := &deployment{t: t, url: url, nc: nc, js: js, settings: settings, stores: stores}
	d.collect()
	return d
}

// collect starts collecting every run event as stored, and the
// deployment's working directory.
func (d *deployment) collect() {
	t, js, settings := d.t, d.js, d.settings
	d.dir = t.TempDir()
	d.logPath = filepath.Join(d.dir, "executions.jsonl")
	d.events = map[string][]protocol.Event{}
	oc, err := js.OrderedConsumer(context.Background(), settings.Names.EventsStream(), jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{settings.Names.EventsSubjects()},
	})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := oc.Consume(func(m jetstream.Msg) {
		var ev protocol.Event
		if err := json.Unmarshal(m.Data(), &ev); err != nil {
			t.Errorf("undecodable event: %v", err)
			return
		}
		d.mu.Lock()
		d.events[ev.RunID] = append(d.events[ev.RunID], ev)
		d.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cc.Stop)
	t.Cleanup(func() {
		if t.Failed() {
			d.dumpWorkerLogs()
		}
	})
}

// submit publishes a run request the way a plain NATS client does.
func (d *deployment) submit(thread, run, text string) {
	d.t.Helper()
	body, _ := json.Marshal(map[string]any{
		"run_id": run, "thread_id": thread, "tenant": protocol.DefaultTenant,
		"input": map[string]any{"messages": []any{map[string]any{"role": "user", "content": text}}},
	})
	m := nats.NewMsg(d.settings.Names.RunSubject(protocol.DefaultTenant, thread))
	m.Data = body
	m.Header.Set(nats.MsgIdHdr, protocol.RunMsgID(protocol.DefaultTenant, run))
	if _, err := d.js.PublishMsg(context.Background(), m); err != nil {
		d.t.Fatal(err)
	}
}

func (d *deployment) runEvents(run string) []protocol.Event {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]protocol.Event(nil), d.events[run]...)
}

// finished reports whether every run has its run.finished event.
func (d *deployment) finished(runs []string) bool {
	for _, r := range runs {
		done := false
		for _, ev := range d.runEvents(r) {
			if ev.Type == protocol.EventRunFinished {
				done = true
			}
		}
		if !done {
			return false
		}
	}
	return true
}

func (d *deployment) waitFinished(runs []string, timeout time.Duration) {
	d.t.Helper()
	testdeploy.WaitFor(d.t, timeout, "every run to finish", func() bool { return d.finished(runs) })
}

// started returns the data and time of each run.started of run.
func (d *deployment) started(run string) []startedAt {
	var out []startedAt
	for _, ev := range d.runEvents(run) {
		if ev.Type == protocol.EventRunStarted {
			var s protocol.StartedData
			_ = json.Unmarshal(ev.Data, &s)
			out = append(out, startedAt{StartedData: s, at: ev.Time})
		}
	}
	return out
}

type startedAt struct {
	protocol.StartedData
	at time.Time
}

// checkEvents checks what the protocol promises about a finished run's
// events: seq from 1 without gaps or repeats, exactly one run.finished,
// last, with status success.
func (d *deployment) checkEvents(run string) protocol.FinishedData {
	d.t.Helper()
	evs := d.runEvents(run)
	var fin *protocol.FinishedData
	for i, ev := range evs {
		if ev.Seq != uint64(i+1) {
			d.t.Fatalf("run %s: event %d (%s) has seq %d: a gap or a repeat", run, i, ev.Type, ev.Seq)
		}
		if ev.Type == protocol.EventRunFinished {
			if fin != nil {
				d.t.Fatalf("run %s: a second run.finished", run)
			}
			fin = new(protocol.FinishedData)
			if err := json.Unmarshal(ev.Data, fin); err != nil {
				d.t.Fatal(err)
			}
		}
	}
	if fin == nil || evs[len(evs)-1].Type != protocol.EventRunFinished {
		d.t.Fatalf("run %s: run.finished missing or not last", run)
	}
	if fin.Status != protocol.StatusSuccess {
		d.t.Fatalf("run %s ended %s: %s", run, fin.Status, fin.Error)
	}
	return *fin
}

// chain loads a thread's checkpoint chain.
func (d *deployment) chain(thread string) []*kv.Delta {
	d.t.Helper()
	th, _, err := d.stores.Threads.Get(context.Background(), protocol.DefaultTenant, thread)
	if err != nil {
		d.t.Fatalf("thread %s: %v", thread, err)
	}
	_, chain, err := d.stores.Checkpoints.Load(context.Background(), protocol.DefaultTenant, thread, th.Head)
	if err != nil {
		d.t.Fatal(err)
	}
	return chain
}

// checkQueuesEmpty checks that no request is left in the runs stream and
// nothing was dead-lettered.
func (d *deployment) checkQueuesEmpty() {
	d.t.Helper()
	ctx := context.Background()
	testdeploy.WaitFor(d.t, 10*time.Second, "the runs stream to empty", func() bool {
		st, err := d.js.Stream(ctx, d.settings.Names.RunsStream())
		if err != nil {
			return false
		}
		info, err := st.Info(ctx)
		return err == nil && info.State.Msgs == 0
	})
	st, err := d.js.Stream(ctx, d.settings.Names.DLQStream())
	if err != nil {
		d.t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		d.t.Fatal(err)
	}
	if info.State.Msgs != 0 {
		d.t.Fatalf("%d requests dead-lettered", info.State.Msgs)
	}
}

// proc is one worker process.
type proc struct {
	id     string
	cmd    *exec.Cmd
	ready  time.Time
	exited chan struct{}
	// exitAt is when the process was seen gone (after Wait), exitErr how.
	exitAt  time.Time
	exitErr error
	killed  bool
	errLog  string
}

// startWithin bounds a worker process's start, a warm one's token
// encoder build included: generous, since it measures nothing.
const startWithin = 2 * time.Minute

// start launches a worker process and waits until its worker runs.
func (d *deployment) start(id string, concurrency int, grace time.Duration) *proc {
	d.t.Helper()
	p := &proc{id: id, exited: make(chan struct{}), errLog: filepath.Join(d.dir, id+".log")}
	errFile, err := os.Create(p.errLog)
	if err != nil {
		d.t.Fatal(err)
	}
	defer errFile.Close()
	p.cmd = exec.Command(os.Args[0], "-test.run=^$")
	p.cmd.Env = append(os.Environ(),
		childEnv+"=1",
		envURL+"="+d.url,
		envID+"="+id,
		envAckWait+"="+d.settings.AckWait.String(),
		envMaxDeliver+"="+fmt.Sprint(d.settings.MaxDeliver),
		envConcurrency+"="+fmt.Sprint(concurrency),
		envGrace+"="+grace.String(),
		envLog+"="+d.logPath,
	)
	if d.warm {
		p.cmd.Env = append(p.cmd.Env, envWarm+"=1")
	}
	p.cmd.Stderr = errFile
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		d.t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	readyc := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		ok := false
		for sc.Scan() {
			if sc.Text() == "ready" && !ok {
				ok = true
				readyc <- true
			}
		}
		if !ok {
			readyc <- false
		}
	}()
	go func() {
		err := p.cmd.Wait()
		p.exitAt, p.exitErr = time.Now(), err
		close(p.exited)
	}()
	select {
	case ok := <-readyc:
		if !ok {
			<-p.exited
			d.t.Fatalf("worker %s did not start: %v\n%s", id, p.exitErr, tail(p.errLog, 20))
		}
	case <-time.After(startWithin):
		d.t.Fatalf("worker %s not ready in %s", id, startWithin)
	}
	p.ready = time.Now()
	d.mu.Lock()
	d.procs = append(d.procs, p)
	d.mu.Unlock()
	d.t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
			<-p.exited
		}
	})
	return p
}

// kill ends the process with SIGKILL and returns once it is gone: it
// executes nothing after the returned time.
func (p *proc) kill() time.Time {
	p.killed = true
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
	return p.exitAt
}

// pause stops the process with SIGSTOP (it runs nothing until resume)
// and returns the time it was sent.
func (p *proc) pause() time.Time {
	_ = p.cmd.Process.Signal(syscall.SIGSTOP)
	return time.Now()
}

// resume continues a paused process (SIGCONT) and returns the time.
func (p *proc) resume() time.Time {
	at := time.Now()
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	return at
}

// term sends SIGTERM and returns the time it was sent.
func (p *proc) term() time.Time {
	at := time.Now()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	return at
}

// wait waits for the process to exit.
func (p *proc) wait(t *testing.T, timeout time.Duration) error {
	t.Helper()
	select {
	case <-p.exited:
		return p.exitErr
	case <-time.After(timeout):
		t.Fatalf("worker %s still running %s after it was told to stop", p.id, timeout)
		return nil
	}
}

func (d *deployment) dumpWorkerLogs() {
	d.mu.Lock()
	procs := append([]*proc(nil), d.procs...)
	d.mu.Unlock()
	for _, p := range procs {
		d.t.Logf("--- worker %s (killed %v, exit %v), last lines:\n%s", p.id, p.killed, p.exitErr, tail(p.errLog, 15))
	}
}

func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// toolResults maps each tool call id answered in a chain to its result
// and the delta that stored it.
type storedResult struct {
	msg   model.Message
	delta *kv.Delta
}

func toolResults(chain []*kv.Delta) (map[string][]storedResult, map[string]bool) {
	results := map[string][]storedResult{}
	calls := map[string]bool{}
	for _, d := range chain {
		for _, m := range d.Update.Messages {
			switch m.Role {
			case model.RoleTool:
				results[m.ToolCallID] = append(results[m.ToolCallID], storedResult{msg: m, delta: d})
			case model.RoleAssistant:
				for _, c := range m.ToolCalls {
					calls[c.ID] = true
				}
			}
		}
	}
	return results, calls
}
