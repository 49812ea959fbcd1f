// Package worker owns the execution side of the run queue: pulling run
// requests from the shared durable consumer, the per-thread lease and
// ordering, the run record's lifecycle, heartbeats, steer and cancel,
// recovery after a worker dies, and dead-lettering. It drives the agent
// loop through a Host and never decides what a middleware does.
package worker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/events"
	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/intake"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/limits"
	"github.com/natsagent/natsagent/internal/metrics"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/subagents"
)

// Config configures a worker. Zero values take defaults.
type Config struct {
	// Settings must equal the deployment's provisioning settings.
	Settings bus.Settings
	// ID names the worker in leases and logs (default "w-<random>").
	ID string
	// Concurrency is how many runs execute at once (default 8).
	Concurrency int
	// MaxWaiting bounds runs held while they wait for their thread
	// (default 1000); beyond it a waiting run keeps its slot, so the
	// worker stops pulling instead of hoarding work.
	MaxWaiting int
	// WaitPoll is how often a waiting run re-checks its thread when no
	// event woke it (default 1s).
	WaitPoll time.Duration
	// RunTimeout bounds a run's wall time unless the request sets one
	// (default 1h); the run ends "timeout".
	RunTimeout time.Duration
	// ShutdownGrace is how long in-flight runs get to reach a safe
	// boundary on shutdown before their contexts are cancelled (default 10s).
	ShutdownGrace time.Duration
	// StaleLease is how long a thread lease may go unrenewed before a
	// waiting run may break it, or the lease sweep may settle its run
	// (default 5 × AckWait, beyond the redelivery of the holder's own
	// request).
	StaleLease time.Duration
	// ReapEvery is how often the worker sweeps the threads for stale
	// leases whose runs no worker will continue (reaper.go), jittered
	// (default StaleLease; negative: never).
	ReapEvery time.Duration
	// StoreFullWait is how long a run waits, holding its request (no
	// delivery is spent), for JetStream to take a write it refused for
	// lack of room before it ends "error" with stop_reason store_full
	// (storefull.go; default 5m; negative: it ends at once).
	StoreFullWait time.Duration
	Agents        *agent.Agents
	Logger        *zap.Logger
	// Files opens a thread's workdir; nil means runs have none (file
	// tools then answer with an error).
	Files func(tenant, thread string) files.Workdir
	// Jobs runs background jobs (memory extraction) beside the runs, for
	// as long as Run does; nil runs none.
	Jobs interface {
		Run(ctx context.Context) error
	}
	// Metrics receives the worker's measurements (nil: none).
	Metrics metrics.Recorder
	// Traces records the runs' spans, each under the span its request
	// carries; nil traces nothing.
	Traces trace.TracerProvider
	// Submit holds the policy hooks of the submit service the worker
	// serves for tenants in their own NATS accounts (intake.go).
	Submit intake.Hooks
	// Limits enforces the tenants' limits (run time, steps, running runs);
	// nil enforces none beyond the protocol's bounds.
	Limits *limits.Limiter
	// KeyTTLs expire the tenants' finished runs and usage totals by the
	// server (the configuration's retention); zero keeps them.
	KeyTTLs kv.TTLs
}

func (c Config) withDefaults() Config {
	c.Settings = c.Settings.WithDefaults()
	if c.ID == "" {
		c.ID = "w-" + nuid.Next()
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 8
	}
	if c.MaxWaiting <= 0 {
		c.MaxWaiting = 1000
	}
	if c.WaitPoll <= 0 {
		c.WaitPoll = time.Second
	}
	if c.RunTimeout <= 0 {
		c.RunTimeout = time.Hour
	}
	if c.ShutdownGrace <= 0 {
		c.ShutdownGrace = 10 * time.Second
	}
	if c.StaleLease <= 0 {
		c.StaleLease = 5 * c.Settings.AckWait
	}
	if c.ReapEvery == 0 {
		c.ReapEvery = c.StaleLease
	}
	if c.StoreFullWait == 0 {
		c.StoreFullWait = DefaultStoreFullWait
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	c.Metrics = metrics.Or(c.Metrics)
	return c
}

// DefaultStoreFullWait is Config.StoreFullWait's default.
const DefaultStoreFullWait = 5 * time.Minute

// Causes a run's context is cancelled with.
var (
	// ErrCancelled: a person or a parent cancelled the run.
	ErrCancelled = errors.New("run cancelled")
	// ErrCancelRollback: cancelled with action rollback; the thread goes
	// back to where it was before the run (errors.Is ErrCancelled).
	ErrCancelRollback = fmt.Errorf("%w and rolled back", ErrCancelled)
	// ErrShutdown: the worker is stopping; the run is handed back.
	ErrShutdown = errors.New("worker shutting down")
	// ErrRolledBack: a rollback run replaced this run.
	ErrRolledBack = errors.New("run rolled back by a newer run")
	// ErrRunTimeout: the run exceeded its time limit.
	ErrRunTimeout = errors.New("run exceeded its time limit")
)

// Worker executes runs.
type Worker struct {
	cfg        Config
	names      bus.Names
	nc         *nats.Conn
	js         jetstream.JetStream
	stores     *kv.Stores
	pub        *events.Publisher
	runsStream jetstream.Stream
	consumer   jetstream.Consumer
	log        *zap.Logger
	tracer     trace.Tracer // nil when the process does not trace
	// subagents serves the subagent micro service and the lead runs'
	// delegation tools.
	subagents *subagents.Service

	slots chan struct{}
	// next hands a delivered request to a goroutine waiting for one
	// (dispatch).
	next chan jetstream.Msg

	// jobIDs numbers the deliveries this worker holds (job.id).
	jobIDs atomic.Uint64

	mu sync.Mutex
	// held is every request held, by job id: a request delivered again
	// to this worker while an earlier delivery of it still runs here is
	// held twice, each delivery with its own in-progress signals.
	held    map[uint64]*job
	running map[string]*job // running jobs by tenant.run
	// cancelAsked holds cancels signalled for runs not running here yet
	// (by tenant.run): a cancel may see a run's lease before the worker
	// that took it got to setRunning.
	cancelAsked map[string]cancelAsk
	// renewSlots bounds the lease renewals out at once (renewLeases).
	renewSlots chan struct{}
	waiters    map[string]*waiter // per thread, runs waiting for it
	// unheld: requests the lease sweep found held by no worker, and when
	// it first did (reaper.go), by stream seq.
	unheld   map[uint64]time.Time
	waiting  int
	draining bool
	// drainEnds is when the shutdown grace ends, once draining.
	drainEnds time.Time

	subs []*nats.Subscription
	wg   sync.WaitGroup

	// handlers counts the goroutines of subscription callbacks (cancel
	// requests, advisories); hmu orders their Add before its Wait.
	hmu      sync.Mutex
	handlers sync.WaitGroup
	hclosed  bool
}

// New binds a worker to a connection. The deployment's assets must exist
// (bus.Provision).
func New(ctx context.Context, nc *nats.Conn, cfg Config) (*Worker, error) {
	cfg = cfg.withDefaults()
	if cfg.Agents == nil {
		return nil, errors.New("worker: no agents configured")
	}
	if !protocol.ValidToken(cfg.ID) {
		return nil, fmt.Errorf("worker id %q is not valid: use A-Z, a-z, 0-9, '_' and '-'", cfg.ID)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	names := cfg.Settings.Names
	stores, err := kv.Open(ctx, js, names)
	if err != nil {
		return nil, err
	}
	stores.SetTTLs(cfg.KeyTTLs)
	stores.Observe(cfg.Logger, cfg.Metrics)
	pub, err := events.NewPublisher(ctx, js, names, cfg.Logger.With(zap.String("worker", cfg.ID)))
	if err != nil {
		return nil, err
	}
	st, err := js.Stream(ctx, names.RunsStream())
	if err != nil {
		return nil, fmt.Errorf("open stream %s: %w", names.RunsStream(), err)
	}
	cons, err := js.Consumer(ctx, names.RunsStream(), bus.RunsConsumer)
	if err != nil {
		return nil, fmt.Errorf("open consumer %s: %w", bus.RunsConsumer, err)
	}
	sa, err := subagents.New(ctx, nc, subagents.Config{Settings: cfg.Settings, Catalog: cfg.Agents, Logger: cfg.Logger.With(zap.String("worker", cfg.ID))})
	if err != nil {
		return nil, err
	}
	return &Worker{
		cfg:         cfg,
		names:       names,
		nc:          nc,
		js:          js,
		stores:      stores,
		pub:         pub,
		runsStream:  st,
		consumer:    cons,
		subagents:   sa,
		log:         cfg.Logger.With(zap.String("worker", cfg.ID)),
		slots:       make(chan struct{}, cfg.Concurrency),
		next:        make(chan jetstream.Msg),
		held:        make(map[uint64]*job),
		running:     make(map[string]*job),
		cancelAsked: make(map[string]cancelAsk),
		renewSlots:  make(chan struct{}, 16),
		waiters:     make(map[string]*waiter),
		tracer:      tracerOf(cfg.Traces),
	}, nil
}

// ID returns the worker's id.
func (w *Worker) ID() string { return w.cfg.ID }

// Run pulls and executes runs until ctx is done, then shuts down
// gracefully: it stops pulling, lets running runs stop at a safe boundary
// (cancelling them after ShutdownGrace) and hands every held request back
// for redelivery.
func (w *Worker) Run(ctx context.Context) error {
	// Deferred first, so it runs last: the acks published without waiting
	// (of runs that finished in the grace, of the background jobs) reach
	// the server before the process may exit (a drain of the connection
	// does not wait).
	defer w.flushAcks()
	if err := w.subscribe(); err != nil {
		return err
	}
	defer w.stopHandlers()
	defer w.observe()()
	if err := w.subagents.Serve(); err != nil {
		return fmt.Errorf("serve the subagent service: %w", err)
	}
	// Stopped after the runs: their waits on children end with them.
	defer w.subagents.Stop()
	stopIntake, serr := w.serveIntake()
	if serr != nil {
		return serr
	}
	defer stopIntake()
	stopDelete, derr := w.serveDelete(ctx)
	if derr != nil {
		return derr
	}
	defer stopDelete()
	if w.cfg.Jobs != nil {
		jobsCtx, stopRunner := context.WithCancel(ctx)
		runnerDone := make(chan struct{})
		go func() {
			defer close(runnerDone)
			if err := w.cfg.Jobs.Run(jobsCtx); err != nil {
				w.log.Error("job runner stopped", zap.Error(err))
			}
		}()
		defer func() { stopRunner(); <-runnerDone }()
	}

	base, stopJobs := context.WithCancelCause(context.WithoutCancel(ctx))
	defer stopJobs(ErrShutdown)

	hbDone := make(chan struct{})
	go w.heartbeats(base, hbDone)
	if w.cfg.ReapEvery > 0 {
		reapCtx, stopReaper := context.WithCancel(ctx)
		reaperDone := make(chan struct{})
		go func() {
			defer close(reaperDone)
			w.reapLoop(reapCtx)
		}()
		defer func() { stopReaper(); <-reaperDone }()
	}

	w.log.Info("worker started", zap.Int("concurrency", w.cfg.Concurrency))
	guesses := w.cfg.Agents.VisionGuesses()
	for _, name := range slices.Sorted(maps.Keys(guesses)) {
		middleware.LogVisionGuess(w.log, name, guesses[name])
	}
	err := w.pull(ctx, base)

	grace := w.cfg.ShutdownGrace
	if w.nc.IsClosed() {
		// Nothing can be checkpointed or handed back any more: stop now.
		grace = 0
	}
	w.mu.Lock()
	w.draining = true
	w.drainEnds = time.Now().Add(grace)
	jobs := make([]*job, 0, len(w.held))
	for _, j := range w.held {
		jobs = append(jobs, j)
	}
	w.mu.Unlock()
	for _, j := range jobs {
		j.drain()
	}
	done := make(chan struct{})
	go func() { w.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		w.log.Warn("runs did not reach a safe boundary in time; cancelling them", zap.Duration("grace", w.cfg.ShutdownGrace))
		stopJobs(ErrShutdown)
		<-done
	}
	close(hbDone)
	w.log.Info("worker stopped")
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// ErrConnectionClosed ends Run when the worker's NATS connection was
// closed for good (not a disconnect: those reconnect on their own).
var ErrConnectionClosed = errors.New("worker: NATS connection closed")

// pull fetches one request per free slot, so no request ages in a client
// buffer while earlier runs execute.
func (w *Worker) pull(ctx, base context.Context) error {
	// Ends the goroutines waiting for a request (dispatch) once no more
	// come.
	stop := make(chan struct{})
	defer close(stop)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case w.slots <- struct{}{}:
		}
		free := 1
	more:
		for free < cap(w.slots) {
			select {
			case w.slots <- struct{}{}:
				free++
			default:
				break more
			}
		}
		fetchCtx, cancelFetch := context.WithTimeout(ctx, 5*time.Second)
		batch, err := w.consumer.Fetch(free, jetstream.FetchContext(fetchCtx))
		if err != nil {
			cancelFetch()
			w.releaseSlots(free)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if w.nc.IsClosed() {
				return ErrConnectionClosed
			}
			w.log.Warn("fetch failed", zap.Error(err))
			sleep(ctx, 250*time.Millisecond)
			continue
		}
		got := 0
		for msg := range batch.Messages() {
			got++
			w.dispatch(base, msg, stop)
		}
		cancelFetch()
		w.releaseSlots(free - got)
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			w.log.Debug("fetch ended", zap.Error(err))
		}
	}
}

func (w *Worker) releaseSlots(n int) {
	for range n {
		<-w.slots
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func jitter(d time.Duration) time.Duration {
	return d/2 + rand.N(d)
}

// heartbeats keeps every held request alive (InProgress) and renews the
// leases of running runs, on its own goroutine: a long model call or tool
// never lets a second worker start the same run.
func (w *Worker) heartbeats(ctx context.Context, done <-chan struct{}) {
	every := w.cfg.Settings.AckWait / 3
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		w.mu.Lock()
		jobs := make([]*job, 0, len(w.held))
		for _, j := range w.held {
			jobs = append(jobs, j)
		}
		w.mu.Unlock()
		// Every request's InProgress goes first: one publish each, no
		// waiting. Lease renewals are KV round trips; done between them,
		// one after another, they delayed the heartbeats of the requests
		// behind past the ack wait when a worker held many runs, and
		// those requests were delivered again while they ran.
		var leases []*leaseHandle
		for _, j := range jobs {
			if l := j.heartbeat(); l != nil {
				leases = append(leases, l)
			}
		}
		renewLeases(ctx, leases, every, w.renewSlots, (*leaseHandle).renew)
	}
}

// renewLeases starts renew for each lease whose last renewal is not still
// out, and returns without waiting for them: a renewal the server is slow
// to answer held the next tick (every request's in-progress signal, every
// other lease's renewal) until it returned. Each renewal is bounded by
// bound (the heartbeat period: the next tick tries again), and at most
// cap(slots) are sent at once.
func renewLeases(ctx context.Context, leases []*leaseHandle, bound time.Duration, slots chan struct{}, renew func(*leaseHandle, context.Context)) {
	for _, l := range leases {
		if !l.renewing.CompareAndSwap(false, true) {
			continue // the last tick's renewal is still out
		}
		go func() {
			defer l.renewing.Store(false)
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				return
			}
			defer func() { <-slots }()
			rctx, cancel := context.WithTimeout(ctx, bound)
			defer cancel()
			renew(l, rctx)
		}()
	}
}

func (w *Worker) track(j *job) {
	w.mu.Lock()
	w.held[j.id] = j
	w.mu.Unlock()
}

func (w *Worker) untrack(j *job) {
	w.mu.Lock()
	delete(w.held, j.id)
	if j.key != "" && w.running[j.key] == j {
		delete(w.running, j.key)
	}
	w.mu.Unlock()
}

// setRunning makes j the running job of its run, for control signals,
// and returns the cause of a cancel signalled for the run before (nil:
// none). j.cancelRun must be set first.
func (w *Worker) setRunning(j *job) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.running[j.key] = j
	ask, ok := w.cancelAsked[j.key]
	if !ok {
		return nil
	}
	delete(w.cancelAsked, j.key)
	return ask.cause
}

// cancelAsk is a cancel signalled for a run not running on this worker
// (yet), with when it came.
type cancelAsk struct {
	cause error
	at    time.Time
}

// cancelAskTTL is how long a cancel for a run not running here is kept:
// far longer than a run takes from its lease to setRunning.
const cancelAskTTL = time.Minute

// runningOrAsked returns the running job of run or, when none runs here,
// notes the cancel for the job that is about to (setRunning), atomically
// with setRunning. Notes older than cancelAskTTL are dropped on the way.
func (w *Worker) runningOrAsked(tenant, run string, cause error) *job {
	key := bus.Key(tenant, run)
	w.mu.Lock()
	defer w.mu.Unlock()
	if j := w.running[key]; j != nil {
		return j
	}
	now := time.Now()
	for k, a := range w.cancelAsked {
		if now.Sub(a.at) > cancelAskTTL {
			delete(w.cancelAsked, k)
		}
	}
	w.cancelAsked[key] = cancelAsk{cause: cause, at: now}
	return nil
}

func (w *Worker) runningJob(tenant, run string) *job {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.running[bus.Key(tenant, run)]
}

// workdir returns a thread's workdir, or nil.
func (w *Worker) workdir(tenant, thread string) files.Workdir {
	if w.cfg.Files == nil {
		return nil
	}
	return w.cfg.Files(tenant, thread)
}

// handBackConfirm is the least time a hand-back waits for the server to
// confirm it (the runs cancelled at the end of the grace hand back after
// it), and the bound of the final flush.
const handBackConfirm = 3 * time.Second

// flushAcks waits until the server has everything the worker published,
// bounded by handBackConfirm; what is lost then comes back after the ack
// wait and is settled by its next delivery.
func (w *Worker) flushAcks() {
	if w.nc.IsClosed() {
		return
	}
	if err := w.nc.FlushTimeout(handBackConfirm); err != nil {
		w.log.Warn("could not flush the last acks; their requests come back after the ack wait and are settled then", zap.Error(err))
	}
}

// handBackDeadline bounds a hand-back's wait for its confirmation: the end
// of the shutdown grace, and at least handBackConfirm from now.
func (w *Worker) handBackDeadline() time.Time {
	w.mu.Lock()
	end := w.drainEnds
	w.mu.Unlock()
	if least := time.Now().Add(handBackConfirm); end.Before(least) {
		end = least
	}
	return end
}

func (w *Worker) isDraining() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.draining
}
