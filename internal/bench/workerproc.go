package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/tokens"
	"github.com/natsagent/natsagent/internal/tools"
	"github.com/natsagent/natsagent/internal/worker"
)

// WorkerMain is a worker process for the bench (`natsagent bench-worker`):
// the project's worker with a model of the given latency, in process or
// at an OpenAI-compatible URL. It prints "ready <id>" once the worker
// runs, answers "stats" on stdin with a "stats {json}" line (Go runtime
// figures after a GC), and shuts down gracefully when ctx ends or stdin
// closes.
func WorkerMain(ctx context.Context, args []string, stdin io.Reader, stdout io.Writer) error {
	fs := flag.NewFlagSet("bench-worker", flag.ContinueOnError)
	url := fs.String("nats-url", "", "NATS server URL (required)")
	prefix := fs.String("prefix", "", "deployment prefix (required)")
	id := fs.String("id", "", "worker id (default random)")
	concurrency := fs.Int("concurrency", 8, "runs executed at once")
	latency := fs.Duration("model-latency", 0, "time of a whole model answer")
	pieces := fs.Int("model-pieces", 1, "pieces the answer streams in")
	modelURL := fs.String("model-url", "", "OpenAI-compatible base URL (default: an in-process model)")
	maxAckPending := fs.Int("max-ack-pending", 0, "the deployment's max ack pending (default 20,000)")
	grace := fs.Duration("shutdown-grace", 2*time.Second, "time runs get to stop at a safe boundary on shutdown")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *url == "" || *prefix == "" {
		return errors.New("bench-worker needs --nats-url and --prefix")
	}
	names, err := bus.NewNames(*prefix)
	if err != nil {
		return err
	}
	settings := bus.Settings{Names: names, MaxAckPending: *maxAckPending}.WithDefaults()
	nc, err := bus.Connect(*url, "natsagent-bench-worker")
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	provCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = bus.Provision(provCtx, js, settings)
	cancel()
	if err != nil {
		return err
	}
	var m model.Model
	if *modelURL != "" {
		m, err = (&modelServer{url: *modelURL}).client()
		if err != nil {
			return err
		}
	} else {
		m = inProcessModel(fixed(streamingReply(*latency, *pieces)))
	}
	agents, err := agent.NewAgents(m, tools.NewRegistry(), agent.Chatbot())
	if err != nil {
		return err
	}
	w, err := worker.New(ctx, nc, worker.Config{
		Settings:      settings,
		ID:            *id,
		Concurrency:   *concurrency,
		Agents:        agents,
		Logger:        zap.NewNop(),
		ShutdownGrace: *grace,
	})
	if err != nil {
		return err
	}
	// The chain builds its tokenizer in the background (tokens.Preload):
	// waiting for it here keeps the loader's temporary tables, several
	// MB, out of the idle figures the memory scenario subtracts.
	if _, err := tokens.ForEncoding(tokens.DefaultEncoding); err != nil {
		return err
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var out sync.Mutex
	println := func(format string, args ...any) {
		out.Lock()
		defer out.Unlock()
		fmt.Fprintf(stdout, format+"\n", args...)
	}
	go func() {
		sc := bufio.NewScanner(stdin)
		for sc.Scan() {
			if sc.Text() == "stats" {
				runtime.GC()
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				data, _ := json.Marshal(childStats{HeapAlloc: ms.HeapAlloc, HeapInuse: ms.HeapInuse, StackInuse: ms.StackInuse, Sys: ms.Sys, Goroutines: runtime.NumGoroutine()})
				println("stats %s", data)
			}
		}
		stop() // stdin closed: the bench is done with this process
	}()
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	println("ready %s", w.ID())
	return <-done
}
