package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/gateway"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/worker"
)

// TestNodeLossWith500RunsInFlight (issue 7, node loss): a 3-node cluster
// with R3 streams and buckets loses the node that leads the JetStream meta
// group, the runs stream and the workers' consumer while 500 multi-step
// runs are in flight, and submissions go on through the loss. Every run
// reaches exactly one terminal status and exactly one run.finished, none
// is lost or run twice at once (no two attempts of a run call the model
// at the same time, no event of an older attempt is stored after a newer
// one's run.started: the lease decides, not the consumer's new leader),
// and the gateway and the workers reconnect by themselves.
func TestNodeLossWith500RunsInFlight(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster and runs 500 runs")
	}
	const (
		runs         = 500
		beforeLoss   = 400 // submitted before the node goes
		runsOfThread = 2
		workers      = 3
	)
	c := natstest.StartCluster(t, 3)
	// The ack wait bounds how long a starved worker may go without a
	// confirmed heartbeat before its lease fence stops a run: at 3 s a
	// loaded CI host stopped and re-took runs in a loop. No worker dies
	// here, so a longer one costs this test nothing.
	settings := bus.Settings{Replicas: 3, AckWait: 10 * time.Second, MaxDeliver: 20}.WithDefaults()
	admin := c.Connect()
	natstest.Provision(t, admin, settings)
	js, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// Every client dials the cluster the way the binaries do.
	connect := func(name string) *nats.Conn {
		nc, err := bus.Connect(c.URLs(), name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	gwNC := connect("gateway")
	gw, err := gateway.New(ctx, gwNC, gateway.Config{Settings: settings, Logger: log.Named("gateway")})
	if err != nil {
		t.Fatal(err)
	}
	web := httptest.NewServer(gw.Handler())
	t.Cleanup(web.Close)

	// Two tool calls, then an answer. Until the node is lost, every run
	// holds at its second model call, so all the runs submitted by then
	// are in flight at the loss (running, or queued behind them); after
	// it, they go on over the next 1.5s, through the elections.
	lost := make(chan struct{})
	m := model.Func(func(ctx context.Context, req *model.Request, onDelta func(model.Delta)) (*model.Response, error) {
		r := StepReply(2, req)
		r.Delay = time.Duration(20+rand.IntN(80)) * time.Millisecond
		if len(r.ToolCalls) > 0 && r.ToolCalls[0].ID == "call-2" {
			select {
			case <-lost:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			r.Delay = time.Duration(rand.IntN(1500)) * time.Millisecond
		}
		return model.NewFixed(r).Generate(ctx, req, onDelta)
	})
	// Every model call is logged by worker: two attempts of a run calling
	// the model at once (the consumer's new leader handing a request to
	// another worker while the first still runs it) fail the audit.
	var calls CallLog
	var wg sync.WaitGroup
	workerNCs := make([]*nats.Conn, workers)
	for i := range workers {
		agents, err := Agents(calls.logged(m, fmt.Sprintf("w%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		nc := connect(fmt.Sprintf("worker-%d", i))
		workerNCs[i] = nc
		w, err := worker.New(ctx, nc, worker.Config{Settings: settings, ID: fmt.Sprintf("w%d", i), Concurrency: 64,
			Agents: agents, Logger: log.Named(fmt.Sprintf("w%d", i)), WaitPoll: 250 * time.Millisecond, ShutdownGrace: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.Run(ctx); err != nil {
				t.Errorf("worker %d: %v", i, err)
			}
		}()
	}
	t.Cleanup(func() { cancel(); wg.Wait() })

	refs := make([]RunRef, runs)
	for i := range refs {
		refs[i] = RunRef{Tenant: protocol.DefaultTenant, Thread: fmt.Sprintf("h%03d", i/runsOfThread), Run: fmt.Sprintf("r%03d", i)}
	}
	sub := &Submitter{BaseURL: web.URL}
	// A bound, not a target: 500 submissions take 15 s here under -race,
	// minutes on a starved host.
	submitCtx, stopSubmitting := context.WithTimeout(ctx, 3*time.Minute)
	defer stopSubmitting()
	var accepted atomic.Int32
	submit := func(batch []RunRef) {
		var g sync.WaitGroup
		work := make(chan RunRef)
		for range 32 {
			g.Add(1)
			go func() {
				defer g.Done()
				for ref := range work {
					if err := sub.Submit(submitCtx, ref, "run "+ref.Run); err != nil {
						t.Error(err)
						continue
					}
					accepted.Add(1)
				}
			}()
		}
		for _, ref := range batch {
			work <- ref
		}
		close(work)
		g.Wait()
	}
	start := time.Now()
	submit(refs[:beforeLoss])

	// The node that leads the meta group also leads the runs stream and
	// the workers' consumer: with R3, losing two nodes would be no quorum.
	down := c.Leader().Name()
	moveCtx, cancelMove := context.WithTimeout(ctx, 15*time.Second)
	if err := c.MoveStreamLeader(moveCtx, settings.Names.RunsStream(), down); err != nil {
		t.Fatal(err)
	}
	if err := c.MoveConsumerLeader(moveCtx, settings.Names.RunsStream(), bus.RunsConsumer, down); err != nil {
		t.Fatal(err)
	}
	cancelMove()
	finished := countTerminal(t, js, settings.Names, refs[:beforeLoss])
	t.Logf("%d runs accepted in %s; %d of them finished; shutting down %s (meta, runs stream and consumer leader)",
		accepted.Load(), time.Since(start).Round(time.Millisecond), finished, down)
	if inFlight := beforeLoss - finished; inFlight < beforeLoss {
		t.Fatalf("only %d runs in flight at the loss: the test would prove little", inFlight)
	}
	wasOn := make([]bool, workers)
	for i, nc := range workerNCs {
		wasOn[i] = nc.ConnectedServerName() == down
	}
	gwWasOn := gwNC.ConnectedServerName() == down
	c.Shutdown(down)
	lossAt := time.Now()
	close(lost)

	submit(refs[beforeLoss:])
	t.Logf("all %d runs accepted %s after the loss; retries by cause: %v", accepted.Load(), time.Since(lossAt).Round(time.Millisecond), sub.Retries())

	// Liveness, not speed: runs must keep finishing. A loaded CI host may
	// take minutes; a wedged run stops the count for good.
	settled, lastProgress := 0, time.Now()
	for {
		n := Settled(ctx, js, settings.Names, refs)
		if n == runs {
			break
		}
		if n > settled {
			settled, lastProgress = n, time.Now()
		}
		if time.Since(lastProgress) > 30*time.Second {
			t.Fatalf("%d of %d runs finished, and none for 30s", n, runs)
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("every run finished %s after the loss", time.Since(lossAt).Round(time.Millisecond))
	finishHist(t, js, settings.Names, refs, lossAt)

	auditCtx, cancelAudit := context.WithTimeout(ctx, 30*time.Second)
	defer cancelAudit()
	a, err := RunAudit(auditCtx, js, settings.Names, refs)
	if err != nil {
		t.Fatal(err)
	}
	a.AttemptOverlaps = calls.Overlaps()
	t.Logf("audit: %s attempts: %v", a.Summary(), a.Attempts)
	if !a.OK() || a.Succeeded != runs {
		t.Fatalf("node loss broke a guarantee:\n%s", a.Summary())
	}

	// Nobody restarted the gateway or the workers: their connections moved
	// to the surviving nodes on their own.
	for i, nc := range workerNCs {
		if !nc.IsConnected() || nc.ConnectedServerName() == down {
			t.Errorf("worker %d is not connected to a live node (%s, %s)", i, nc.Status(), nc.ConnectedServerName())
		}
		if wasOn[i] && nc.Stats().Reconnects == 0 {
			t.Errorf("worker %d was on %s and never reconnected", i, down)
		}
	}
	if !gwNC.IsConnected() || (gwWasOn && gwNC.Stats().Reconnects == 0) {
		t.Errorf("gateway connection: %s, %d reconnects", gwNC.Status(), gwNC.Stats().Reconnects)
	}
}

// countTerminal counts the runs whose record is terminal.
func countTerminal(t *testing.T, js jetstream.JetStream, names bus.Names, refs []RunRef) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stores, err := kv.Open(ctx, js, names)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, ref := range refs {
		rec, err := getRecord(ctx, stores, ref)
		if err == nil && rec.Status.Terminal() {
			n++
		}
	}
	return n
}
