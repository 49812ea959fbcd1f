// Command natsagent is the command-line companion of a natsagent
// deployment. Its client commands (run, tail, steer, cancel, approve,
// reject, answer, runs, threads, usage) talk to the deployment over NATS
// directly, so they need no gateway; `natsagent bench` runs the benchmark
// scenarios against an embedded server (or an existing one) with the
// project's real workers, the way the maintainers measure it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// command is one subcommand. Hidden commands serve natsagent itself and
// are left out of the help.
type command struct {
	name    string
	summary string
	hidden  bool
	run     func(ctx context.Context, args []string, std stdio) error
}

type stdio struct {
	in       io.Reader
	out, err io.Writer
	// errFile is stderr as a file, to tell whether it is a terminal.
	errFile *os.File
	// outFile is stdout as a file: colours only when it is a terminal.
	outFile *os.File
}

func commands() []command {
	return []command{
		{name: "run", summary: "submit a run and stream its answer, tool calls as they happen", run: runRun},
		{name: "tail", summary: "follow a run's or a thread's events", run: runTail},
		{name: "steer", summary: "redirect a thread's active run with a new message", run: runSteer},
		{name: "cancel", summary: "cancel a run (pending or running)", run: runCancel},
		{name: "approve", summary: "approve the tool calls a thread waits on (all, or by number)", run: runApprove},
		{name: "reject", summary: "reject the tool calls a thread waits on, with a reason", run: runReject},
		{name: "answer", summary: "answer the question a thread waits on", run: runAnswer},
		{name: "runs", summary: "list a thread's runs, newest first (runs delete: delete a finished run)", run: runRuns},
		{name: "threads", summary: "list threads, most recently active first (threads delete: delete one)", run: runThreads},
		{name: "users", summary: "erase a user of a tenant: their threads and memory (administrators)", run: runUsers},
		{name: "usage", summary: "token usage of a run or a thread", run: runUsage},
		{name: "tenant", summary: "add a tenant (its own NATS account) to a static accounts file, or list them", run: runTenant},
		{name: "compact", summary: "summarize an idle thread's older messages (a job on the queue)", run: runCompact},
		{name: "bench", summary: "measure throughput, CPU and stored messages per run, latency, streaming, steer/cancel, long threads, scaling and memory", run: runBench},
		{name: "bench-worker", summary: "a worker process started by bench", hidden: true, run: runBenchWorker},
		{name: "soak", summary: "run runs under node, worker and model faults and audit every one", run: runSoak},
		{name: "jwt", summary: "NATS JWT auth: operator, tenant accounts and users, server config, push", run: runJWT},
		{name: "help", summary: "show the commands, or a command's flags (help <command>)"},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], stdio{in: os.Stdin, out: os.Stdout, err: os.Stderr, errFile: os.Stderr, outFile: os.Stdout})
	stop()
	os.Exit(code)
}

// errUsage is returned for a command line that could not be understood;
// the message was already printed.
var errUsage = errors.New("usage")

func run(ctx context.Context, args []string, std stdio) int {
	if len(args) == 0 {
		usage(std.err)
		return 2
	}
	name, rest := args[0], args[1:]
	switch name {
	case "help", "-h", "-help", "--help":
		// help runs delete is runs delete -h: a subcommand's own help.
		if len(rest) > 0 && rest[0] != "help" {
			return run(ctx, append(rest, "-h"), std)
		}
		usage(std.out)
		return 0
	}
	for _, c := range commands() {
		if c.name != name || c.run == nil {
			continue
		}
		err := c.run(ctx, rest, std)
		switch {
		case err == nil, errors.Is(err, flag.ErrHelp):
			return 0
		case errors.Is(err, errUsage):
			return 2
		}
		fmt.Fprintf(std.err, "natsagent %s: %v\n", name, err)
		if errors.Is(err, errIncomplete) {
			return 3
		}
		return 1
	}
	fmt.Fprintf(std.err, "natsagent: unknown command %q\n\n", name)
	usage(std.err)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "Usage: natsagent <command> [flags]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Commands:")
	for _, c := range commands() {
		if !c.hidden {
			fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run `natsagent help <command>` (or `natsagent <command> -h`) for what a command does, its flags and examples.")
}
