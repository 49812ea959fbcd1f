package main

// bench and the hidden bench-worker: an operator's command that runs the
// project's real workers in-process (internal/bench), so it may import the
// engine (TestClientsDependOnTheWireOnly lists it).

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"

	"github.com/natsagent/natsagent/internal/bench"
	"github.com/natsagent/natsagent/internal/metrics/prom"
)

func runBench(ctx context.Context, args []string, std stdio) error {
	def := bench.DefaultConfig()
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(std.err)
	fs.Usage = func() {
		fmt.Fprintln(std.err, "Usage: natsagent bench [flags]")
		fmt.Fprintln(std.err)
		fmt.Fprintln(std.err, "Starts an embedded NATS server on loopback (or uses --nats-url), the project's real workers and a")
		fmt.Fprintln(std.err, "model of configurable latency, and measures through the public path: a run request published,")
		fmt.Fprintln(std.err, "lifecycle events read until run.finished. Each figure is printed next to the raw JetStream baseline")
		fmt.Fprintln(std.err, "measured on the same server, with the CPU time and the stored messages per run of every window, and the")
		fmt.Fprintln(std.err, "burst beside the raw ceiling of natsagent's own write set (plain nats.go calls, same stages and")
		fmt.Fprintln(std.err, "concurrency). Every asset it creates has its own prefix and is deleted afterwards.")
		writeExamples(std.err, "bench")
		fmt.Fprintln(std.err)
		fmt.Fprintln(std.err, "Flags:")
		fs.PrintDefaults()
	}
	scenarios := fs.String("scenarios", strings.Join(def.Scenarios, ","), "scenarios to run, comma-separated: "+strings.Join(bench.AllScenarios(), ","))
	runs := fs.Int("runs", def.Runs, "no-op runs per burst")
	concurrency := intList(def.Concurrency)
	fs.Var(&concurrency, "concurrency", "worker concurrencies of the burst, comma-separated (the largest also serves latency, steer and cancel)")
	streamRuns := fs.Int("stream-runs", def.StreamRuns, "runs of the streaming scenario")
	streamDeltas := fs.Int("stream-deltas", def.StreamDeltas, "deltas each run's model streams in the streaming scenario")
	idleRuns := fs.Int("idle-runs", def.IdleRuns, "runs measured one at a time")
	pacedRate := fs.Int("paced-rate", def.PacedRate, "runs per second of the paced latency measurement")
	pacedRuns := fs.Int("paced-runs", def.PacedRuns, "runs of the paced latency measurement")
	steerRuns := fs.Int("steer-runs", def.SteerRuns, "samples of each of steer and cancel")
	steerParallel := fs.Int("steer-parallel", def.SteerParallel, "steer or cancel samples measured at once")
	threadSizes := intList(def.ThreadSizes)
	fs.Var(&threadSizes, "thread-sizes", "history lengths (messages) of the long-thread scenario, comma-separated")
	scalingProcs := intList(def.ScalingProcs)
	fs.Var(&scalingProcs, "scaling-procs", "worker process counts of the scaling scenario, comma-separated")
	scalingConcurrency := fs.Int("scaling-concurrency", def.ScalingConcurrency, "slots of each worker process in the scaling scenario")
	scalingLatency := fs.Duration("scaling-latency", def.ScalingLatency, "model latency in the scaling scenario")
	scalingBusy := fs.Duration("scaling-busy", def.ScalingBusy, "how long each step of the scaling scenario keeps its workers busy")
	memoryRuns := fs.Int("memory-runs", def.MemoryRuns, "runs held in flight by one worker process in the memory scenario")
	memoryLatency := fs.Duration("memory-latency", def.MemoryLatency, "model latency in the memory scenario (runs must stay in flight while measured)")
	modelMode := fs.String("model", def.Model, "model: in-process (behind the model interface: the queue's own cost) or http (an OpenAI-compatible server on loopback: end to end)")
	modelLatency := fs.Duration("model-latency", def.ModelLatency, "time of a whole model answer in the burst and latency scenarios (0: no-op runs)")
	modelPieces := fs.Int("model-pieces", def.ModelPieces, "pieces a model answer streams in")
	natsURL := fs.String("nats-url", "", "use this NATS server instead of an embedded one (assets get a unique prefix and are deleted afterwards)")
	prefix := fs.String("prefix", "", "prefix of every asset the bench creates (default bench<random>)")
	inProcessConn := fs.Bool("in-process-conn", false, "connect in-process workers and clients to the embedded server without TCP")
	asJSON := fs.Bool("json", false, "print the results as JSON instead of a table")
	timeout := fs.Duration("timeout", def.Timeout, "bound on the whole invocation; each scenario gets a share")
	quiet := fs.Bool("quiet", false, "no progress line")
	progress := fs.Bool("progress", false, "progress line on stderr even when it is not a terminal")
	withMetrics := fs.Bool("metrics", false, "record Prometheus metrics in the in-process workers, to measure what they cost")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole invocation (server, workers, clients) to this file, for go tool pprof")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(std.err, "natsagent bench: unexpected argument %q\n", fs.Arg(0))
		return errUsage
	}
	cfg := bench.Config{
		Runs:               *runs,
		Concurrency:        concurrency,
		StreamRuns:         *streamRuns,
		StreamDeltas:       *streamDeltas,
		IdleRuns:           *idleRuns,
		PacedRate:          *pacedRate,
		PacedRuns:          *pacedRuns,
		SteerRuns:          *steerRuns,
		SteerParallel:      *steerParallel,
		ThreadSizes:        threadSizes,
		ScalingProcs:       scalingProcs,
		ScalingConcurrency: *scalingConcurrency,
		ScalingLatency:     *scalingLatency,
		ScalingBusy:        *scalingBusy,
		MemoryRuns:         *memoryRuns,
		MemoryLatency:      *memoryLatency,
		Model:              *modelMode,
		ModelLatency:       *modelLatency,
		ModelPieces:        *modelPieces,
		NATSURL:            *natsURL,
		Prefix:             *prefix,
		InProcessConn:      *inProcessConn,
		Timeout:            *timeout,
	}
	for _, s := range strings.Split(*scenarios, ",") {
		if s = strings.TrimSpace(s); s != "" {
			cfg.Scenarios = append(cfg.Scenarios, s)
		}
	}
	if len(cfg.Scenarios) == 0 {
		fmt.Fprintln(std.err, "natsagent bench: --scenarios names no scenario")
		return errUsage
	}
	if *withMetrics {
		rec, err := prom.New(prom.Options{})
		if err != nil {
			return err
		}
		cfg.Metrics = rec
	}
	if exe, err := os.Executable(); err == nil {
		cfg.WorkerCommand = []string{exe, "bench-worker"}
	}
	if !*quiet && (*progress || (std.errFile != nil && bench.IsTerminal(std.errFile))) {
		cfg.Progress = std.err
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("cpu profile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	rep, err := bench.Run(ctx, cfg)
	if rep == nil {
		return err
	}
	var werr error
	if *asJSON {
		werr = rep.WriteJSON(std.out)
	} else {
		werr = rep.WriteTable(std.out)
	}
	if err != nil {
		return err
	}
	return werr
}

func runBenchWorker(ctx context.Context, args []string, std stdio) error {
	return bench.WorkerMain(ctx, args, std.in, std.out)
}

// intList is a comma-separated list of positive integers.
type intList []int

func (l *intList) String() string {
	parts := make([]string, len(*l))
	for i, n := range *l {
		parts[i] = strconv.Itoa(n)
	}
	return strings.Join(parts, ",")
}

func (l *intList) Set(s string) error {
	var out []int
	for _, p := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || n < 1 {
			return fmt.Errorf("%q is not a positive integer", p)
		}
		out = append(out, n)
	}
	*l = out
	return nil
}
