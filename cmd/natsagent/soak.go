package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/natsagent/natsagent/internal/soak"
)

// errSoakFailed is a soak that ran and found lost, duplicated or
// overlapping runs, overlapping attempts of a run, or stale events
// visible; the summary says which.
var errSoakFailed = errors.New("runs were lost, duplicated or overlapped, or an attempt ran or published beside another")

// runSoak runs natsagent under faults on embedded servers on loopback and
// audits every submitted run (internal/soak).
func runSoak(ctx context.Context, args []string, std stdio) error {
	fs := newFlagSet("soak", "[flags]", `
Runs natsagent under faults on embedded NATS servers on loopback (one server, or a 3-node
cluster with --cluster), submitting runs over the HTTP API of an in-process gateway to
in-process workers with an offline model, then audits every submitted run: each must end exactly
once, none may be lost, duplicated or run beside another run of its thread. Faults: node (a
cluster node shut down and restarted), worker (a worker's connection cut mid-run) and model (503,
429 and cut streams).
The summary goes to stdout, progress to stderr; the exit status is 1 when the audit failed.`, std)
	runs := fs.Int("runs", 300, "runs to submit, two per thread")
	duration := fs.Duration("duration", 60*time.Second, "bound on the soak, from when its servers and workers are up; runs are submitted over its first half")
	stall := fs.Duration("stall", 0, "go on past --duration while runs keep finishing, until none finished for this long (0: end at --duration)")
	window := fs.Duration("submit-window", 0, "how long submissions are spread over, faults injected meanwhile (default: half of --duration)")
	workers := fs.Int("workers", 3, "in-process workers, each on its own NATS connection")
	cluster := fs.Bool("cluster", false, "run a 3-node JetStream cluster (R3) instead of one server")
	faults := fs.String("faults", "", "comma-separated faults to inject: "+strings.Join(soak.Faults, ", ")+" (node needs --cluster)")
	faultEvery := fs.Duration("fault-every", 4*time.Second, "pause between node and worker faults")
	modelRate := fs.Float64("model-fault-rate", 0.05, "share of model calls failing with 503, 429 or a truncated stream (with the model fault)")
	quiet := fs.Bool("quiet", false, "no progress lines")
	asJSON := fs.Bool("json", false, "print the audit as one JSON object (ok, counts, the runs of each finding) instead of the summary")
	logLevel := fs.String("log", "", "write the gateway's and workers' logs at this level (debug, info, warn, error) to stderr as JSON lines (default: none)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(std.err, "natsagent soak: unexpected argument %q\n", fs.Arg(0))
		return errUsage
	}
	var kinds []string
	for _, f := range strings.Split(*faults, ",") {
		if f = strings.TrimSpace(f); f != "" {
			kinds = append(kinds, f)
		}
	}
	if err := soak.ValidateFaults(kinds, *cluster); err != nil {
		fmt.Fprintf(std.err, "natsagent soak: %v\n", err)
		return errUsage
	}
	if *runs <= 0 || *workers <= 0 || *duration <= 0 {
		fmt.Fprintln(std.err, "natsagent soak: --runs, --workers and --duration must be positive")
		return errUsage
	}
	cfg := soak.Config{Runs: *runs, Duration: *duration, Stall: *stall, SubmitWindow: *window, Workers: *workers, Cluster: *cluster,
		Faults: kinds, FaultEvery: *faultEvery, ModelFaultRate: *modelRate}
	if !*quiet {
		cfg.Progress = std.err
	}
	if *logLevel != "" {
		level, err := zapcore.ParseLevel(*logLevel)
		if err != nil {
			fmt.Fprintf(std.err, "natsagent soak: --log: %v\n", err)
			return errUsage
		}
		cfg.Logger = zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.Lock(zapcore.AddSync(std.err)), level))
		defer func() { _ = cfg.Logger.Sync() }()
	}
	mode := "one server"
	if *cluster {
		mode = "3-node cluster, R3"
	}
	fmt.Fprintf(std.err, "soak: %d runs, %d workers, %s, faults: %s, at most %s\n", *runs, *workers, mode, orNone(kinds), *duration)
	res, err := soak.Run(ctx, cfg)
	if err != nil {
		return err
	}
	if *asJSON {
		if err := writeJSON(std.out, res.Report()); err != nil {
			return err
		}
	} else {
		fmt.Fprint(std.out, res.Summary())
	}
	if !res.OK() {
		return errSoakFailed
	}
	return nil
}

func orNone(list []string) string {
	if len(list) == 0 {
		return "none"
	}
	return strings.Join(list, ", ")
}
