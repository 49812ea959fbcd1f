// Package jobworker starts, for tests, a worker that also takes
// compaction jobs, as `natsagent worker` does. It is apart from
// testdeploy because it needs the worker, which the tests of the packages
// below the worker cannot import.
package jobworker

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/compact"
	"github.com/natsagent/natsagent/internal/compact/compactjob"
	"github.com/natsagent/natsagent/internal/events"
	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/jobs"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/worker"
)

// Start connects to url and runs, until the test ends, a worker with
// concurrency slots serving agents' runs and compaction jobs; workdir
// opens a thread's files (nil: none). It returns the worker's connection.
func Start(t testing.TB, url string, settings bus.Settings, agents *agent.Agents, workdir func(tenant, thread string) files.Workdir, concurrency int) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	stores, err := kv.Open(ctx, js, settings.Names)
	if err != nil {
		t.Fatal(err)
	}
	log := zaptest.NewLogger(t)
	pub, err := events.NewPublisher(ctx, js, settings.Names, log)
	if err != nil {
		t.Fatal(err)
	}
	runner, err := jobs.NewRunner(ctx, js, jobs.Config{Settings: settings, Logger: log,
		Handlers: map[string]jobs.Handler{compact.JobKind: compactjob.NewHandler(stores, pub, agents, workdir, log).Handle}})
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(ctx, nc, worker.Config{Settings: settings, Concurrency: concurrency, Agents: agents, Logger: log,
		WaitPoll: 200 * time.Millisecond, ShutdownGrace: 5 * time.Second, Jobs: runner, Files: workdir})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Error("worker did not stop")
		}
		nc.Close()
	})
	return nc
}
