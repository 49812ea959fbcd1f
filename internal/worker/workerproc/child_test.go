package workerproc

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/tokens"
	"github.com/natsagent/natsagent/internal/tools"
	"github.com/natsagent/natsagent/internal/worker"
)

// The test binary doubles as a worker process: with childEnv set it runs
// childMain instead of the tests, configured by the variables below.
const (
	childEnv       = "NATSAGENT_WORKERPROC_CHILD"
	envURL         = "WORKERPROC_NATS_URL"
	envID          = "WORKERPROC_ID"
	envAckWait     = "WORKERPROC_ACK_WAIT"
	envMaxDeliver  = "WORKERPROC_MAX_DELIVER"
	envConcurrency = "WORKERPROC_CONCURRENCY"
	envGrace       = "WORKERPROC_GRACE"
	envLog         = "WORKERPROC_LOG"
	envWarm        = "WORKERPROC_WARM"
)

func TestMain(m *testing.M) {
	if os.Getenv(serverEnv) == "1" {
		if err := serverMain(); err != nil {
			fmt.Fprintln(os.Stderr, "server process:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if os.Getenv(childEnv) == "1" {
		if err := childMain(); err != nil {
			fmt.Fprintln(os.Stderr, "worker process:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// childMain is a worker process as cmd/worker builds one (signals, a
// connection drained on the way out), with an offline multi-step model
// and a tool that record every execution in a shared log.
func childMain() error {
	ackWait, err := time.ParseDuration(os.Getenv(envAckWait))
	if err != nil {
		return err
	}
	grace, err := time.ParseDuration(os.Getenv(envGrace))
	if err != nil {
		return err
	}
	maxDeliver, _ := strconv.Atoi(os.Getenv(envMaxDeliver))
	concurrency, _ := strconv.Atoi(os.Getenv(envConcurrency))
	id := os.Getenv(envID)
	logFile, err := os.OpenFile(os.Getenv(envLog), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	rec := &recorder{f: logFile, worker: id}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	nc, err := nats.Connect(os.Getenv(envURL), nats.Name("workerproc-"+id), nats.MaxReconnects(-1))
	if err != nil {
		return err
	}
	// As cmd/worker does: the drain is asynchronous, so whatever the
	// worker must get to the server before the process exits is its own
	// business.
	defer func() { _ = nc.Drain() }()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	settings := bus.Settings{AckWait: ackWait, MaxDeliver: maxDeliver}.WithDefaults()
	provCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = bus.Provision(provCtx, js, settings)
	cancel()
	if err != nil {
		return err
	}
	reg := tools.NewRegistry()
	reg.Register(&recordTool{rec: rec})
	chatbot := agent.Chatbot()
	chatbot.Tools = []string{"record"}
	agents, err := agent.NewAgents(&stepModel{rec: rec}, reg, chatbot)
	if err != nil {
		return err
	}
	zl, err := zap.NewDevelopment()
	if err != nil {
		return err
	}
	w, err := worker.New(ctx, nc, worker.Config{
		Settings: settings, ID: id, Concurrency: concurrency, ShutdownGrace: grace,
		WaitPoll: 200 * time.Millisecond, Agents: agents, Logger: zl,
	})
	if err != nil {
		return err
	}
	// The token counter's encoder is built once per process, on the first
	// count. Under the race detector on a loaded machine that takes 10 to
	// 20 seconds, and a run's first model call waits for it: a warm worker
	// builds it before "ready", so what a test times is the worker, not
	// this cold start.
	if os.Getenv(envWarm) == "1" {
		if _, err := tokens.ForEncoding(tokens.DefaultEncoding); err != nil {
			return err
		}
	}
	fmt.Println("ready")
	return w.Run(ctx)
}

// execution is one line of the shared execution log: a model call or a
// tool call starting, ending or being stopped, in one worker process.
type execution struct {
	Kind   string `json:"kind"` // model, tool
	Ev     string `json:"ev"`   // start, end, abort
	Run    string `json:"run"`
	Step   int    `json:"step"`
	Call   string `json:"call,omitempty"`
	Nonce  string `json:"nonce,omitempty"`
	Worker string `json:"worker"`
	T      int64  `json:"t"` // unix nanoseconds
}

// recorder appends executions to the log file; each line is one write to
// a file opened O_APPEND, so lines of concurrent processes never mix, and
// a SIGKILL loses nothing already written.
type recorder struct {
	f      *os.File
	worker string
	n      atomic.Int64
	mu     sync.Mutex
}

func (r *recorder) add(e execution) {
	e.Worker, e.T = r.worker, time.Now().UnixNano()
	line, _ := json.Marshal(e)
	r.mu.Lock()
	defer r.mu.Unlock()
	_, _ = r.f.Write(append(line, '\n'))
}

// spec is what a run asks of the step model, in its user message:
// "run=<id> steps=<n> model=<min>-<max> tool=<min>-<max> hang=<step>"
// (milliseconds; hang makes the tool of that step wait until cancelled).
type spec struct {
	run                    string
	steps                  int
	modelMin, modelMax     int
	toolMin, toolMax, hang int
}

func parseSpec(s string) spec {
	sp := spec{steps: 2, modelMin: 50, modelMax: 50, toolMin: 50, toolMax: 50}
	for _, f := range strings.Fields(s) {
		k, v, _ := strings.Cut(f, "=")
		lo, hi, _ := strings.Cut(v, "-")
		a, _ := strconv.Atoi(lo)
		b, err := strconv.Atoi(hi)
		if err != nil {
			b = a
		}
		switch k {
		case "run":
			sp.run = v
		case "steps":
			sp.steps = a
		case "model":
			sp.modelMin, sp.modelMax = a, b
		case "tool":
			sp.toolMin, sp.toolMax = a, b
		case "hang":
			sp.hang = a
		}
	}
	return sp
}

func between(lo, hi int) time.Duration {
	if hi <= lo {
		return time.Duration(lo) * time.Millisecond
	}
	return time.Duration(lo+rand.IntN(hi-lo+1)) * time.Millisecond
}

// stepModel calls the record tool once per step of the run its last user
// message describes, then answers; it streams each answer in pieces over
// the model delay, so a kill can land mid-stream.
type stepModel struct{ rec *recorder }

func (m *stepModel) Generate(ctx context.Context, req *model.Request, onDelta func(model.Delta)) (*model.Response, error) {
	last, done := -1, 0
	for i, msg := range req.Messages {
		switch msg.Role {
		case model.RoleUser:
			last, done = i, 0
		case model.RoleTool:
			done++
		}
	}
	if last < 0 {
		return nil, fmt.Errorf("step model: no user message")
	}
	sp := parseSpec(req.Messages[last].Content)
	step := done + 1
	m.rec.add(execution{Kind: "model", Ev: "start", Run: sp.run, Step: step})
	const pieces = 4
	delay := between(sp.modelMin, sp.modelMax)
	text := fmt.Sprintf("step %d of %s ", step, sp.run)
	if done >= sp.steps {
		text = fmt.Sprintf("done %s after %d steps", sp.run, sp.steps)
	}
	// Each piece is due at its time from the call's start, like data a
	// provider streamed: a process that was paused finds the pieces due
	// meanwhile all there at once when it resumes, as in its socket.
	began := time.Now()
	for i := range pieces {
		if wait := time.Until(began.Add(delay * time.Duration(i+1) / pieces)); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				m.rec.add(execution{Kind: "model", Ev: "abort", Run: sp.run, Step: step})
				return nil, fmt.Errorf("model call stopped: %w", ctx.Err())
			case <-t.C:
			}
		}
		if onDelta != nil {
			onDelta(model.Delta{Content: text[i*len(text)/pieces : (i+1)*len(text)/pieces]})
		}
	}
	resp := &model.Response{Message: model.Message{Role: model.RoleAssistant, Content: text}, FinishReason: model.FinishStop, Model: "step"}
	if done < sp.steps {
		ms := between(sp.toolMin, sp.toolMax).Milliseconds()
		if sp.hang == step {
			ms = -1
		}
		args, _ := json.Marshal(map[string]any{"run": sp.run, "step": step, "ms": ms})
		resp.Message.ToolCalls = []model.ToolCall{{ID: fmt.Sprintf("c-%s-%d-%d", sp.run, step, rand.Int64()), Name: "record", Arguments: string(args)}}
		resp.FinishReason = model.FinishToolCalls
	}
	m.rec.add(execution{Kind: "model", Ev: "end", Run: sp.run, Step: step})
	return resp, nil
}

// recordTool is a tool with a side effect the test can count: every
// execution gets a nonce, logged when it starts and ends and returned as
// its result, so the test knows which execution's result a checkpoint
// holds.
type recordTool struct{ rec *recorder }

func (t *recordTool) Spec() model.ToolSpec {
	return model.ToolSpec{Name: "record", Description: "Records a step.", Parameters: json.RawMessage(`{"type":"object","properties":{"run":{"type":"string"},"step":{"type":"integer"},"ms":{"type":"integer"}}}`)}
}

func (t *recordTool) Call(ctx context.Context, c *tools.Call) (*tools.Result, error) {
	var a struct {
		Run  string `json:"run"`
		Step int    `json:"step"`
		MS   int64  `json:"ms"`
	}
	if err := json.Unmarshal(c.Args, &a); err != nil {
		return nil, err
	}
	nonce := fmt.Sprintf("%s#%d", t.rec.worker, t.rec.n.Add(1))
	t.rec.add(execution{Kind: "tool", Ev: "start", Run: a.Run, Step: a.Step, Call: c.ID, Nonce: nonce})
	d := time.Duration(a.MS) * time.Millisecond
	if a.MS < 0 {
		d = time.Hour
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		t.rec.add(execution{Kind: "tool", Ev: "abort", Run: a.Run, Step: a.Step, Call: c.ID, Nonce: nonce})
		return nil, ctx.Err()
	case <-timer.C:
	}
	t.rec.add(execution{Kind: "tool", Ev: "end", Run: a.Run, Step: a.Step, Call: c.ID, Nonce: nonce})
	return tools.Text("recorded " + nonce), nil
}

// readLog reads the execution log.
func readLog(t *testing.T, path string) []execution {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		t.Fatal(err)
	}
	defer f.Close()
	var out []execution
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var e execution
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("execution log line %q: %v", sc.Text(), err)
		}
		out = append(out, e)
	}
	return out
}
