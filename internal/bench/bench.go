// Package bench measures a natsagent deployment the way its users run it:
// a NATS server (embedded, or an existing one), the project's real
// workers in this process or in worker processes, and a model with a
// configurable latency behind the model interface or an OpenAI-compatible
// HTTP server. Runs go through the public path only (a run request
// published to the runs stream, lifecycle events read until run.finished),
// and every throughput and latency is printed next to the raw JetStream
// baseline measured on the same server in the same invocation. Every
// measured window also reports what stays put on a noisy machine: the CPU
// time and the stored messages per run (accounting.go), and the burst
// stands beside the raw ceiling of natsagent's own write set (ceiling.go). It is the
// engine of `natsagent bench`, after River's riverbench. It owns nothing a
// deployment uses: every asset it creates carries its own prefix and is
// deleted when a scenario ends.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/metrics"
)

// Scenario names, in the order they run.
const (
	ScenarioBurst   = "burst"
	ScenarioLatency = "latency"
	ScenarioStream  = "stream"
	ScenarioSteer   = "steer"
	ScenarioCancel  = "cancel"
	ScenarioThread  = "thread"
	ScenarioScaling = "scaling"
	ScenarioMemory  = "memory"
)

// Config configures one invocation. Zero values take the defaults of
// DefaultConfig.
type Config struct {
	// Scenarios to run (default all, in the order above).
	Scenarios []string

	// Runs is the number of no-op runs of each burst.
	Runs int
	// Concurrency lists the worker concurrencies of the burst; the largest
	// also serves the latency, steer and cancel scenarios.
	Concurrency []int

	// StreamRuns are runs whose model streams StreamDeltas pieces at once,
	// at the largest concurrency.
	StreamRuns   int
	StreamDeltas int

	// IdleRuns are measured one at a time; PacedRuns at PacedRate a second.
	IdleRuns  int
	PacedRate int
	PacedRuns int

	// SteerRuns samples each of steer and cancel, SteerParallel at once,
	// against a model streaming SteerPieces pieces SteerPieceDelay apart.
	SteerRuns       int
	SteerParallel   int
	SteerPieces     int
	SteerPieceDelay time.Duration

	// ThreadSizes are the history lengths (messages) the long-thread
	// scenario reports; ThreadSamples is the number of in-process loop
	// executions timed at each.
	ThreadSizes   []int
	ThreadSamples int

	// ScalingProcs lists worker process counts, each with
	// ScalingConcurrency slots and a model taking ScalingLatency; each
	// step is sized to keep them busy for about ScalingBusy.
	ScalingProcs       []int
	ScalingConcurrency int
	ScalingLatency     time.Duration
	ScalingBusy        time.Duration

	// MemoryRuns are held in flight by one worker process whose model
	// takes MemoryLatency.
	MemoryRuns    int
	MemoryLatency time.Duration

	// Model is ModelInProcess or ModelHTTP; ModelLatency is the whole
	// answer's time, streamed in ModelPieces pieces (burst and latency).
	Model        string
	ModelLatency time.Duration
	ModelPieces  int

	// NATSURL uses an existing server instead of the embedded one.
	NATSURL string
	// Prefix starts every asset name (default bench<random>); each
	// measurement adds a suffix to it.
	Prefix string
	// InProcessConn connects in-process workers and clients to the
	// embedded server without TCP.
	InProcessConn bool
	// Timeout bounds the whole invocation; each scenario gets a share.
	Timeout time.Duration

	// WorkerCommand starts a worker process: the command and its first
	// arguments (for natsagent: the executable and "bench-worker"); the
	// bench appends the worker flags. WorkerEnv is added to its
	// environment. Without it the scaling and memory scenarios are skipped.
	WorkerCommand []string
	WorkerEnv     []string

	// Progress receives the progress line (nil: none).
	Progress io.Writer

	// Metrics, when set, receives the in-process workers' measurements,
	// so a burst shows what recording them costs (`natsagent bench
	// --metrics`: a Prometheus recorder).
	Metrics metrics.Recorder
}

// DefaultConfig is the configuration of `natsagent bench` without flags.
func DefaultConfig() Config {
	return Config{
		Scenarios:          AllScenarios(),
		Runs:               20000,
		Concurrency:        []int{1, 16, 64},
		StreamRuns:         2000,
		StreamDeltas:       50,
		IdleRuns:           500,
		PacedRate:          1000,
		PacedRuns:          3000,
		SteerRuns:          200,
		SteerParallel:      8,
		SteerPieces:        200,
		SteerPieceDelay:    5 * time.Millisecond,
		ThreadSizes:        []int{10, 100, 1000},
		ThreadSamples:      1000,
		ScalingProcs:       []int{1, 2, 4},
		ScalingConcurrency: 16,
		ScalingLatency:     100 * time.Millisecond,
		ScalingBusy:        3 * time.Second,
		MemoryRuns:         1000,
		MemoryLatency:      20 * time.Second,
		Model:              ModelInProcess,
		ModelPieces:        1,
		Timeout:            3 * time.Minute,
	}
}

// AllScenarios lists every scenario in the order they run.
func AllScenarios() []string {
	return []string{ScenarioBurst, ScenarioLatency, ScenarioStream, ScenarioSteer, ScenarioCancel, ScenarioThread, ScenarioScaling, ScenarioMemory}
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if len(c.Scenarios) == 0 {
		c.Scenarios = d.Scenarios
	}
	setDefault(&c.Runs, d.Runs)
	if len(c.Concurrency) == 0 {
		c.Concurrency = d.Concurrency
	}
	setDefault(&c.StreamRuns, d.StreamRuns)
	setDefault(&c.StreamDeltas, d.StreamDeltas)
	setDefault(&c.IdleRuns, d.IdleRuns)
	setDefault(&c.PacedRate, d.PacedRate)
	setDefault(&c.PacedRuns, d.PacedRuns)
	setDefault(&c.SteerRuns, d.SteerRuns)
	setDefault(&c.SteerParallel, d.SteerParallel)
	setDefault(&c.SteerPieces, d.SteerPieces)
	setDefault(&c.SteerPieceDelay, d.SteerPieceDelay)
	if len(c.ThreadSizes) == 0 {
		c.ThreadSizes = d.ThreadSizes
	}
	setDefault(&c.ThreadSamples, d.ThreadSamples)
	if len(c.ScalingProcs) == 0 {
		c.ScalingProcs = d.ScalingProcs
	}
	setDefault(&c.ScalingConcurrency, d.ScalingConcurrency)
	setDefault(&c.ScalingLatency, d.ScalingLatency)
	setDefault(&c.ScalingBusy, d.ScalingBusy)
	setDefault(&c.MemoryRuns, d.MemoryRuns)
	setDefault(&c.MemoryLatency, d.MemoryLatency)
	if c.Model == "" {
		c.Model = d.Model
	}
	setDefault(&c.ModelPieces, d.ModelPieces)
	setDefault(&c.Timeout, d.Timeout)
	if c.Prefix == "" {
		c.Prefix = randomPrefix()
	}
	return c
}

func setDefault[T int | time.Duration](v *T, def T) {
	if *v == 0 {
		*v = def
	}
}

func (c Config) validate() error {
	for _, s := range c.Scenarios {
		if !slices.Contains(AllScenarios(), s) {
			return fmt.Errorf("unknown scenario %q (known: %s)", s, strings.Join(AllScenarios(), ", "))
		}
	}
	if c.Model != ModelInProcess && c.Model != ModelHTTP {
		return fmt.Errorf("model %q: use %s or %s", c.Model, ModelInProcess, ModelHTTP)
	}
	// Each measurement adds "-<suffix>" (up to 11 characters) to the
	// prefix, and a prefix has at most 32.
	if len(c.Prefix) > 20 {
		return fmt.Errorf("prefix %q is too long: use at most 20 characters", c.Prefix)
	}
	if _, err := bus.NewNames(c.Prefix); err != nil {
		return err
	}
	if c.InProcessConn && c.NATSURL != "" {
		return errors.New("in-process connections need the embedded server: drop --nats-url or --in-process-conn")
	}
	for _, n := range c.Concurrency {
		if n < 1 {
			return fmt.Errorf("concurrency %d: use at least 1", n)
		}
	}
	for _, n := range c.ScalingProcs {
		if n < 1 || n > 64 {
			return fmt.Errorf("scaling processes %d: use 1 to 64", n)
		}
	}
	for _, n := range c.ThreadSizes {
		if n < 4 || n > 5000 {
			return fmt.Errorf("thread size %d: use 4 to 5,000 messages", n)
		}
	}
	if c.Runs < 1 || c.StreamRuns < 1 || c.StreamDeltas < 1 || c.IdleRuns < 1 || c.PacedRuns < 1 || c.PacedRate < 1 || c.SteerRuns < 1 || c.MemoryRuns < 1 {
		return errors.New("run counts and rates must be positive")
	}
	return nil
}

// scenario is one named measurement with its share of the time budget.
type scenario struct {
	name   string
	weight float64
	run    func(ctx context.Context, e *env, s *scenarioRun) error
}

var scenarios = []scenario{
	{ScenarioBurst, 40, runBurst},
	{ScenarioLatency, 10, runLatency},
	{ScenarioStream, 10, runStream},
	{ScenarioSteer, 5, runSteer},
	{ScenarioCancel, 5, runCancel},
	{ScenarioThread, 8, runThread},
	{ScenarioScaling, 20, runScaling},
	{ScenarioMemory, 10, runMemory},
}

// scenarioRun collects what one scenario measured.
type scenarioRun struct {
	name      string
	rows      []Row
	notes     []string
	outOfTime bool
}

func (s *scenarioRun) add(r Row) {
	r.Scenario = s.name
	s.rows = append(s.rows, r)
}

func (s *scenarioRun) note(format string, args ...any) {
	s.notes = append(s.notes, fmt.Sprintf(format, args...))
}

// teardownReserve is kept out of each scenario's share for stopping
// workers and deleting its assets.
const teardownReserve = time.Second

// Run executes the configured scenarios and returns what they measured.
// A scenario that runs out of its share of cfg.Timeout reports what it
// measured until then; an error of one scenario is recorded and the next
// one runs.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	start := time.Now()
	deadline := start.Add(cfg.Timeout)
	p := newProgress(cfg.Progress, cfg.Timeout)
	defer p.close()
	p.stage("starting", 0)
	e, err := newEnv(cfg, p)
	if err != nil {
		return nil, err
	}
	defer e.close()

	rep := &Report{
		Started: start,
		Host:    Host{OS: runtime.GOOS + "/" + runtime.GOARCH, CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), Go: runtime.Version()},
		Server:  e.describe(),
		Model:   describeModel(cfg),
		Prefix:  cfg.Prefix,
		Settings: map[string]any{
			"scenarios": cfg.Scenarios, "runs": cfg.Runs, "concurrency": cfg.Concurrency,
			"stream_runs": cfg.StreamRuns, "stream_deltas": cfg.StreamDeltas,
			"idle_runs": cfg.IdleRuns, "paced_rate": cfg.PacedRate, "paced_runs": cfg.PacedRuns,
			"steer_runs": cfg.SteerRuns, "steer_parallel": cfg.SteerParallel, "steer_pieces": cfg.SteerPieces, "steer_piece_delay": cfg.SteerPieceDelay.String(),
			"thread_sizes": cfg.ThreadSizes, "thread_samples": cfg.ThreadSamples,
			"scaling_procs": cfg.ScalingProcs, "scaling_concurrency": cfg.ScalingConcurrency, "scaling_latency": cfg.ScalingLatency.String(), "scaling_busy": cfg.ScalingBusy.String(),
			"memory_runs": cfg.MemoryRuns, "memory_latency": cfg.MemoryLatency.String(),
			"model": cfg.Model, "model_latency": cfg.ModelLatency.String(), "model_pieces": cfg.ModelPieces,
			"in_process_conn": cfg.InProcessConn, "timeout": cfg.Timeout.String(),
		},
	}
	var selected []scenario
	for _, s := range scenarios {
		if slices.Contains(cfg.Scenarios, s.name) {
			selected = append(selected, s)
		}
	}
	for i, s := range selected {
		if ctx.Err() != nil {
			break
		}
		var weights float64
		for _, rest := range selected[i:] {
			weights += rest.weight
		}
		budget := time.Duration(float64(time.Until(deadline)) * s.weight / weights)
		sctx, cancel := context.WithTimeout(ctx, max(budget-teardownReserve, time.Second))
		sr := &scenarioRun{name: s.name}
		began := time.Now()
		err := s.run(sctx, e, sr)
		cancel()
		res := ScenarioResult{Name: s.name, Seconds: time.Since(began).Seconds(), Budget: budget.Seconds(), Notes: sr.notes}
		switch {
		case err == nil:
		case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, errOutOfTime):
			sr.outOfTime = true
		case ctx.Err() != nil:
			res.Error = "interrupted"
		default:
			res.Error = err.Error()
		}
		res.OutOfTime = sr.outOfTime
		for _, line := range e.serverLog.take() {
			res.Notes = append(res.Notes, "nats-server "+line)
		}
		rep.Rows = append(rep.Rows, sr.rows...)
		rep.Scenarios = append(rep.Scenarios, res)
	}
	rep.Seconds = time.Since(start).Seconds()
	return rep, ctx.Err()
}

func describeModel(cfg Config) string {
	what := "in-process (behind the model interface)"
	if cfg.Model == ModelHTTP {
		what = "OpenAI-compatible HTTP server on loopback (model.OpenAI)"
	}
	if cfg.ModelLatency > 0 {
		return fmt.Sprintf("%s, %s per answer in %d pieces", what, cfg.ModelLatency, cfg.ModelPieces)
	}
	return what + ", answers at once (no-op runs)"
}

// IsTerminal reports whether f is a terminal (a character device), for
// the progress line.
func IsTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
