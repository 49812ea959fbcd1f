package soak

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/gateway"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/worker"
)

// Fault kinds a soak injects.
const (
	// FaultNode shuts a cluster node down abruptly (the runs stream's
	// leader every other time) and restarts it a moment later. Cluster
	// mode only.
	FaultNode = "node"
	// FaultWorker kills a worker: its connection closes with no goodbye,
	// its runs are left to redelivery and lease takeover, and a new
	// worker takes its place.
	FaultWorker = "worker"
	// FaultModel makes some model calls fail the way a provider does:
	// HTTP 503, HTTP 429 or a truncated stream.
	FaultModel = "model"
)

// Faults lists the fault kinds, in the order --faults documents them.
var Faults = []string{FaultNode, FaultWorker, FaultModel}

// Config bounds and shapes a soak. Zero values take defaults.
type Config struct {
	// Runs is how many runs are submitted (default 300), two per thread.
	Runs int
	// Duration bounds the soak (default 60s), counted from when its
	// servers, gateway and workers are up: runs are submitted over
	// SubmitWindow, and what has not finished when it ends is reported
	// lost.
	Duration time.Duration
	// SubmitWindow is how long submissions are spread over (default
	// half of Duration); faults are injected until it ends, and a
	// submission caught by a fault may be accepted until half-way through
	// the rest.
	SubmitWindow time.Duration
	// Stall, when set, lets a soak go on past Duration while runs keep
	// finishing: it ends once every run settled or none finished for
	// Stall. On a starved machine (a loaded CI host) a run still
	// progressing at Duration is slow, not lost; a wedged one still stops
	// finishing and is counted lost. Zero: the soak ends at Duration.
	Stall time.Duration
	// AckWait is the runs consumer's ack wait (default 3s): how soon a
	// killed worker's runs are taken over, and how long a starved worker
	// may go without a confirmed heartbeat before its lease fence stops
	// its runs (3/4 of it).
	AckWait time.Duration
	// Workers is how many workers run (default 3), each on its own
	// connection.
	Workers int
	// Cluster runs a 3-node JetStream cluster with R3 streams and buckets
	// instead of one server.
	Cluster bool
	// Faults are the fault kinds to inject (FaultNode, FaultWorker,
	// FaultModel).
	Faults []string
	// FaultEvery is the pause between node and worker faults (default 4s).
	FaultEvery time.Duration
	// ModelFaultRate is the share of model calls that fail with
	// FaultModel (default 0.05).
	ModelFaultRate float64
	// Steps is how many tool calls a run makes before answering (default 2).
	Steps int
	// Progress receives a progress line every ProgressEvery (default 5s);
	// nil prints none.
	Progress      io.Writer
	ProgressEvery time.Duration
	// Dir holds the servers' stores (default: a temp dir, removed after).
	Dir string
	// Logger receives the components' logs (default: none).
	Logger *zap.Logger
}

func (c Config) withDefaults() Config {
	if c.Runs <= 0 {
		c.Runs = 300
	}
	if c.Duration <= 0 {
		c.Duration = 60 * time.Second
	}
	if c.SubmitWindow <= 0 || c.SubmitWindow > c.Duration {
		c.SubmitWindow = c.Duration / 2
	}
	if c.Workers <= 0 {
		c.Workers = 3
	}
	if c.AckWait <= 0 {
		c.AckWait = 3 * time.Second
	}
	if c.FaultEvery <= 0 {
		c.FaultEvery = 4 * time.Second
	}
	if c.ModelFaultRate <= 0 {
		c.ModelFaultRate = 0.05
	}
	if c.Steps <= 0 {
		c.Steps = 2
	}
	if c.ProgressEvery <= 0 {
		c.ProgressEvery = 5 * time.Second
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	return c
}

// Result is what a soak did and what the audit found.
type Result struct {
	Audit *Audit
	// NotAccepted counts runs the gateway had not accepted when
	// submissions stopped (not audited).
	NotAccepted int
	// Injected counts the faults injected, by kind.
	Injected map[string]int
	// Retries counts re-sent submissions by what the attempt before got.
	Retries map[string]int
	Elapsed time.Duration
}

// OK reports a soak with nothing lost, duplicated or overlapping, no
// attempts of a run at once and no stale events visible (Audit.OK).
func (r *Result) OK() bool { return r.Audit.OK() }

// Summary is the result in a few lines.
func (r *Result) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "soak finished in %s\n", r.Elapsed.Round(100*time.Millisecond))
	b.WriteString(r.Audit.Summary())
	if r.NotAccepted > 0 {
		fmt.Fprintf(&b, "not accepted before submissions stopped (not audited): %d\n", r.NotAccepted)
	}
	fmt.Fprintf(&b, "faults injected: %s\n", formatCounts(r.Injected))
	fmt.Fprintf(&b, "submissions re-sent: %s\n", formatCounts(r.Retries))
	return b.String()
}

// Report is the result for machines (natsagent soak --json). Lists of
// runs are empty, not absent, when nothing went wrong.
type Report struct {
	OK          bool           `json:"ok"`
	ElapsedMS   int64          `json:"elapsed_ms"`
	Submitted   int            `json:"submitted"`
	Succeeded   int            `json:"succeeded"`
	Failed      map[string]int `json:"failed"`
	NotAccepted int            `json:"not_accepted"`
	// Attempts counts runs by how many attempts ran them ("1": runs
	// that ran once).
	Attempts        map[string]int `json:"attempts"`
	Lost            []string       `json:"lost"`
	Duplicated      []string       `json:"duplicated"`
	Overlapping     []string       `json:"overlapping"`
	AttemptOverlaps []string       `json:"overlapping_attempts"`
	Stale           []string       `json:"stale_events_visible"`
	Repeated        []string       `json:"repeated_seqs"`
	Mismatched      []string       `json:"inconsistent"`
	Gaps            []string       `json:"event_gaps"`
	Marked          []string       `json:"events_marked_lost"`
	FaultsInjected  map[string]int `json:"faults_injected"`
	Resent          map[string]int `json:"submissions_resent"`
}

// Report is the result as Report.
func (r *Result) Report() Report {
	a := r.Audit
	list := func(l []string) []string { return append([]string{}, l...) }
	counts := func(m map[string]int) map[string]int {
		out := make(map[string]int, len(m))
		for k, v := range m {
			out[k] = v
		}
		return out
	}
	attempts := make(map[string]int, len(a.Attempts))
	for n, c := range a.Attempts {
		attempts[fmt.Sprint(n)] = c
	}
	return Report{OK: r.OK(), ElapsedMS: r.Elapsed.Milliseconds(), Submitted: a.Submitted, Succeeded: a.Succeeded,
		Failed: counts(a.Failed), NotAccepted: r.NotAccepted, Attempts: attempts,
		Lost: list(a.Lost), Duplicated: list(a.Duplicated), Overlapping: list(a.Overlapping), AttemptOverlaps: list(a.AttemptOverlaps),
		Stale: list(a.Stale), Repeated: list(a.Repeated), Mismatched: list(a.Mismatched), Gaps: list(a.Gaps), Marked: list(a.Marked),
		FaultsInjected: counts(r.Injected), Resent: counts(r.Retries)}
}

func formatCounts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for _, k := range sortedKeys(m) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// ValidateFaults checks fault kinds against the mode.
func ValidateFaults(faults []string, cluster bool) error {
	for _, f := range faults {
		switch f {
		case FaultWorker, FaultModel:
		case FaultNode:
			if !cluster {
				return errors.New("the node fault needs --cluster")
			}
		default:
			return fmt.Errorf("unknown fault %q (known: %s)", f, strings.Join(Faults, ", "))
		}
	}
	return nil
}

// soak is one running soak.
type soak struct {
	cfg      Config
	settings bus.Settings
	urls     string
	cluster  *bus.Cluster
	log      *zap.Logger

	calls    CallLog  // every model call, by run and worker
	injected sync.Map // kind -> *atomic.Int64
	finished sync.Map // run key -> struct{}
	nFin     atomic.Int64
	nFailed  atomic.Int64
	nSub     atomic.Int64
}

// Run runs a soak: embedded servers on loopback, a gateway, workers and a
// client submitting runs through the gateway's HTTP API, faults on a
// schedule, then an audit of every submitted run. The error is for a soak
// that could not run; what it found is in the Result.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	cfg = cfg.withDefaults()
	if err := ValidateFaults(cfg.Faults, cfg.Cluster); err != nil {
		return nil, err
	}
	start := time.Now()
	if cfg.Dir == "" {
		dir, err := os.MkdirTemp("", "natsagent-soak-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		cfg.Dir = dir
	}
	s := &soak{cfg: cfg, log: cfg.Logger}
	s.settings = bus.Settings{Replicas: 1, AckWait: cfg.AckWait, MaxDeliver: 20}.WithDefaults()

	startCtx, cancelStart := context.WithTimeout(ctx, 60*time.Second)
	defer cancelStart()
	if cfg.Cluster {
		c, err := bus.StartCluster(startCtx, bus.ClusterConfig{Dir: cfg.Dir, Nodes: 3, Name: "natsagent-soak"})
		if err != nil {
			return nil, err
		}
		defer c.Close()
		s.cluster = c
		s.urls = strings.Join(c.ClientURLs(), ",")
		s.settings.Replicas = 3
	} else {
		e, err := bus.StartEmbedded(bus.EmbeddedConfig{StoreDir: cfg.Dir, Listen: "127.0.0.1:-1", ServerName: "natsagent-soak"})
		if err != nil {
			return nil, err
		}
		defer e.Server.Shutdown()
		s.urls = e.ClientURL()
	}

	admin, err := bus.Connect(s.urls, "soak-admin")
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	js, err := jetstream.New(admin)
	if err != nil {
		return nil, err
	}
	if err := bus.Provision(startCtx, js, s.settings); err != nil {
		return nil, fmt.Errorf("provision: %w", err)
	}
	// Progress: run.finished events as they are published (a live count;
	// the audit reads the stream afterwards).
	sub, err := admin.Subscribe(s.settings.Names.EventsSubjects(), s.onEvent)
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()

	runCtx, stop := context.WithCancel(ctx)
	defer stop()

	// The gateway, on a loopback port.
	gwNC, err := bus.Connect(s.urls, "soak-gateway")
	if err != nil {
		return nil, err
	}
	defer gwNC.Close()
	gw, err := gateway.New(runCtx, gwNC, gateway.Config{Settings: s.settings, Logger: s.log.Named("gateway")})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	web := &http.Server{Handler: gw.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = web.Serve(ln) }()
	defer web.Close()

	// The workers, each with the model logged as its own.
	pool := &workerPool{s: s, ctx: runCtx}
	for i := range cfg.Workers {
		if err := pool.start(i); err != nil {
			return nil, err
		}
	}
	defer pool.stopAll()
	// The soak's clock starts now, with everything up: on a starved host
	// starting a cluster takes seconds, and measured from the call it ate
	// the submit window and the faults' (under stress-ng --cpu 6 the start
	// took about 16 s of a 12 s window).
	ready := time.Now()

	// The runs: two per thread, submitted over the first half.
	refs := make([]RunRef, cfg.Runs)
	for i := range refs {
		refs[i] = RunRef{Tenant: protocol.DefaultTenant, Thread: fmt.Sprintf("soak-t%05d", i/2), Run: fmt.Sprintf("soak-r%05d", i)}
	}
	deadline := ready.Add(cfg.Duration)
	submitter := &Submitter{BaseURL: "http://" + ln.Addr().String(), Timeout: 5 * time.Second}
	// Submissions are paced over SubmitWindow; one caught by a fault may
	// take a while to be accepted. Faults stop with the window, and the
	// rest is for the runs to finish.
	submitDone := make(chan struct{})
	var accepted []RunRef
	go func() {
		defer close(submitDone)
		accepted = s.submitAll(runCtx, submitter, refs, cfg.SubmitWindow, ready.Add(cfg.SubmitWindow+(cfg.Duration-cfg.SubmitWindow)/2))
	}()

	faultsDone := make(chan struct{})
	go func() {
		defer close(faultsDone)
		faultCtx, cancel := context.WithDeadline(runCtx, ready.Add(cfg.SubmitWindow))
		defer cancel()
		s.injectFaults(faultCtx, runCtx, pool)
	}()

	tick := time.NewTicker(cfg.ProgressEvery)
	defer tick.Stop()
	timeUp := time.NewTimer(time.Until(deadline))
	defer timeUp.Stop()
	lastFin, lastProgress := s.nFin.Load(), time.Now()
	var overtime <-chan time.Time // ticks past Duration, with Stall set
wait:
	for {
		if n := s.nFin.Load(); n != lastFin {
			lastFin, lastProgress = n, time.Now()
		}
		select {
		case <-ctx.Done():
			break wait
		case <-timeUp.C:
			if cfg.Stall <= 0 {
				break wait
			}
			t := time.NewTicker(time.Second)
			defer t.Stop()
			overtime = t.C
		case <-overtime:
			if time.Since(lastProgress) >= cfg.Stall {
				break wait
			}
		case <-tick.C:
			s.progress(ready, len(refs))
		case <-time.After(500 * time.Millisecond):
			select {
			case <-submitDone:
				// The records decide: the live count may miss events
				// while the admin connection reconnects, and it counts
				// runs whose submission went unanswered (not accepted,
				// not audited) that ran anyway, so it can reach the
				// accepted count with an accepted run still running.
				if Settled(ctx, js, s.settings.Names, accepted) == len(accepted) {
					break wait
				}
			default:
			}
		}
	}
	stop()
	<-submitDone
	<-faultsDone
	s.progress(ready, len(refs))
	// Every node back before the audit reads the stream and the records.
	if s.cluster != nil {
		for _, name := range s.cluster.Names() {
			if s.cluster.Server(name) == nil {
				if _, err := s.cluster.Restart(name); err != nil {
					return nil, err
				}
			}
		}
		readyCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := s.cluster.WaitReady(readyCtx)
		cancel()
		if err != nil {
			return nil, err
		}
	}
	pool.stopAll()

	auditCtx, cancelAudit := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancelAudit()
	a, err := RunAudit(auditCtx, js, s.settings.Names, accepted)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	a.AttemptOverlaps = s.calls.Overlaps()
	res := &Result{Audit: a, NotAccepted: len(refs) - len(accepted), Injected: map[string]int{}, Retries: submitter.Retries(), Elapsed: time.Since(start)}
	s.injected.Range(func(k, v any) bool {
		res.Injected[k.(string)] = int(v.(*atomic.Int64).Load())
		return true
	})
	return res, nil
}

func (s *soak) onEvent(m *nats.Msg) {
	var ev struct {
		Type   string `json:"type"`
		Tenant string `json:"tenant"`
		RunID  string `json:"run_id"`
		Data   struct {
			Status protocol.Status `json:"status"`
		} `json:"data"`
	}
	if json.Unmarshal(m.Data, &ev) != nil || ev.Type != protocol.EventRunFinished {
		return
	}
	if _, dup := s.finished.LoadOrStore(bus.Key(ev.Tenant, ev.RunID), struct{}{}); dup {
		return
	}
	s.nFin.Add(1)
	if ev.Data.Status != protocol.StatusSuccess {
		s.nFailed.Add(1)
	}
}

func (s *soak) count(kind string) {
	v, _ := s.injected.LoadOrStore(kind, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

func (s *soak) progress(start time.Time, total int) {
	if s.cfg.Progress == nil {
		return
	}
	var faults []string
	for _, k := range Faults {
		if v, ok := s.injected.Load(k); ok {
			faults = append(faults, fmt.Sprintf("%s %d", k, v.(*atomic.Int64).Load()))
		}
	}
	f := "none"
	if len(faults) > 0 {
		f = strings.Join(faults, ", ")
	}
	fmt.Fprintf(s.cfg.Progress, "soak %5.1fs: submitted %d/%d, finished %d (%d not succeeded), faults: %s\n",
		time.Since(start).Seconds(), s.nSub.Load(), total, s.nFin.Load(), s.nFailed.Load(), f)
}

// submitAll submits refs in order, paced to spread them over window, 16
// at a time, each retried like a careful client until accepted or the
// deadline, and returns the accepted ones. A run never accepted is not
// audited (the client would not know of it either).
func (s *soak) submitAll(ctx context.Context, sub *Submitter, refs []RunRef, window time.Duration, deadline time.Time) []RunRef {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	gap := window / time.Duration(len(refs))
	accepted := make([]bool, len(refs))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	next := time.Now()
	for i, ref := range refs {
		if d := time.Until(next); d > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(d):
			}
		}
		next = next.Add(gap)
		if ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := sub.Submit(ctx, ref, "soak run "+ref.Run); err != nil {
				s.log.Warn("submission not accepted", zap.String("run", ref.Run), zap.Error(err))
				return
			}
			accepted[i] = true
			s.nSub.Add(1)
		}()
	}
	wg.Wait()
	var out []RunRef
	for i, ok := range accepted {
		if ok {
			out = append(out, refs[i])
		}
	}
	return out
}

// injectFaults injects node and worker faults in turn every FaultEvery
// until ctx ends; model faults are injected by the model all along.
// injectFaults injects node and worker faults in turn, one every
// FaultEvery, until ctx ends; then, within run, once more each kind not
// injected yet: on a starved host one slow node fault could otherwise
// fill the whole window, and a soak asked for both kinds would exercise
// one.
func (s *soak) injectFaults(ctx, run context.Context, pool *workerPool) {
	var kinds []string
	for _, f := range s.cfg.Faults {
		if f == FaultNode || f == FaultWorker {
			kinds = append(kinds, f)
		}
	}
	if len(kinds) == 0 {
		return
	}
	injected := make(map[string]bool)
	inject := func(ctx context.Context, kind string, i int) {
		switch kind {
		case FaultNode:
			if err := s.nodeFault(ctx, i); err != nil {
				s.log.Warn("node fault", zap.Error(err))
				return
			}
		case FaultWorker:
			if err := pool.kill(rand.IntN(s.cfg.Workers)); err != nil {
				s.log.Warn("worker fault", zap.Error(err))
				return
			}
		}
		injected[kind] = true
		s.count(kind)
	}
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			for j, kind := range kinds {
				if !injected[kind] && run.Err() == nil {
					inject(run, kind, i+j)
				}
			}
			return
		case <-time.After(s.cfg.FaultEvery):
		}
		inject(ctx, kinds[i%len(kinds)], i)
	}
}

// nodeFault shuts down a node (the runs stream's leader every other
// time, else a random one), keeps it down for half of FaultEvery, starts
// it again and waits until the cluster is whole.
func (s *soak) nodeFault(ctx context.Context, i int) error {
	c := s.cluster
	names := c.Names()
	name := names[rand.IntN(len(names))]
	if i%2 == 0 {
		if l := c.StreamLeader(s.settings.Names.RunsStream()); l != nil {
			name = l.Name()
		}
	}
	s.log.Info("fault: node shut down", zap.String("node", name))
	if err := c.Shutdown(name); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
	case <-time.After(s.cfg.FaultEvery / 2):
	}
	s.log.Info("fault: node restarted", zap.String("node", name))
	if _, err := c.Restart(name); err != nil {
		return err
	}
	readyCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return c.WaitReady(readyCtx)
}

// model is the soak's offline model: Steps tool calls then an answer,
// 5-40ms a call, and with FaultModel some calls failing like a provider.
func (s *soak) model() model.Model {
	faults := false
	for _, f := range s.cfg.Faults {
		faults = faults || f == FaultModel
	}
	return model.Func(func(ctx context.Context, req *model.Request, onDelta func(model.Delta)) (*model.Response, error) {
		r := StepReply(s.cfg.Steps, req)
		r.Delay = time.Duration(5+rand.IntN(35)) * time.Millisecond
		if faults && rand.Float64() < s.cfg.ModelFaultRate {
			s.count(FaultModel)
			switch rand.IntN(3) {
			case 0:
				return nil, &model.APIError{StatusCode: http.StatusServiceUnavailable, Type: "server_error", Message: "soak: injected 503"}
			case 1:
				return nil, &model.APIError{StatusCode: http.StatusTooManyRequests, Type: "rate_limit_error", Message: "soak: injected 429"}
			default:
				// Part of the answer streams, then the stream ends early.
				if onDelta != nil {
					onDelta(model.Delta{Content: "trunc"})
				}
				return nil, model.ErrTruncated
			}
		}
		return model.NewFixed(r).Generate(ctx, req, onDelta)
	})
}

// workerPool runs the in-process workers, each on its own connection (a
// killed worker's connection drops like a crashed process's).
type workerPool struct {
	s     *soak
	ctx   context.Context // the workers' lifetime (not a fault's)
	mu    sync.Mutex
	slots []*workerSlot
	gen   int
}

type workerSlot struct {
	nc     *nats.Conn
	cancel context.CancelFunc
	done   chan struct{}
}

func (p *workerPool) start(i int) error {
	ctx := p.ctx
	p.mu.Lock()
	p.gen++
	id := fmt.Sprintf("soak-w%d-%d", i, p.gen)
	p.mu.Unlock()
	agents, err := Agents(p.s.calls.logged(p.s.model(), id))
	if err != nil {
		return err
	}
	nc, err := bus.Connect(p.s.urls, id)
	if err != nil {
		return err
	}
	w, err := worker.New(ctx, nc, worker.Config{
		Settings: p.s.settings, ID: id, Concurrency: 32, Agents: agents,
		Logger: p.s.log.Named(id), WaitPoll: 250 * time.Millisecond, ShutdownGrace: time.Second,
		StaleLease: 2 * p.s.settings.AckWait,
	})
	if err != nil {
		nc.Close()
		return err
	}
	wctx, cancel := context.WithCancel(ctx)
	slot := &workerSlot{nc: nc, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(slot.done)
		if err := w.Run(wctx); err != nil && !errors.Is(err, context.Canceled) {
			p.s.log.Warn("worker stopped", zap.String("worker", id), zap.Error(err))
		}
	}()
	p.mu.Lock()
	for len(p.slots) <= i {
		p.slots = append(p.slots, nil)
	}
	p.slots[i] = slot
	p.mu.Unlock()
	return nil
}

// kill drops worker i's connection, then stops what is left of it, and
// starts a new worker (a new id) in its place.
func (p *workerPool) kill(i int) error {
	p.mu.Lock()
	var slot *workerSlot
	if i < len(p.slots) {
		slot = p.slots[i]
	}
	p.mu.Unlock()
	if slot == nil {
		return errors.New("no worker to kill")
	}
	p.s.log.Info("fault: worker killed", zap.Int("slot", i))
	slot.nc.Close()
	slot.cancel()
	<-slot.done
	return p.start(i)
}

func (p *workerPool) stopAll() {
	p.mu.Lock()
	slots := p.slots
	p.slots = nil
	p.mu.Unlock()
	for _, sl := range slots {
		if sl != nil {
			sl.cancel()
		}
	}
	for _, sl := range slots {
		if sl != nil {
			<-sl.done
			sl.nc.Close()
		}
	}
}
