package bench

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/tools"
	"github.com/natsagent/natsagent/internal/worker"
)

// env is the NATS server the bench runs against (embedded, or the one
// --nats-url names) and what every scenario shares.
type env struct {
	cfg      Config
	url      string
	emb      *bus.Embedded
	storeDir string
	nc       *nats.Conn // administration: provisioning, stream info, cleanup
	js       jetstream.JetStream
	progress *progress
	// serverLog holds the embedded server's warnings and errors.
	serverLog *serverLog
}

// serverLog is a server.Logger keeping the first warnings and errors.
type serverLog struct {
	mu    sync.Mutex
	lines []string
	more  int
}

func (l *serverLog) keep(level, format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.lines) < 10 {
		l.lines = append(l.lines, level+" "+fmt.Sprintf(format, v...))
	} else {
		l.more++
	}
}

func (l *serverLog) Noticef(string, ...any)         {}
func (l *serverLog) Debugf(string, ...any)          {}
func (l *serverLog) Tracef(string, ...any)          {}
func (l *serverLog) Warnf(format string, v ...any)  { l.keep("warning:", format, v...) }
func (l *serverLog) Errorf(format string, v ...any) { l.keep("error:", format, v...) }
func (l *serverLog) Fatalf(format string, v ...any) { l.keep("fatal:", format, v...) }

// take returns the kept lines and forgets them.
func (l *serverLog) take() []string {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.lines
	if l.more > 0 {
		out = append(out, fmt.Sprintf("... and %d more", l.more))
	}
	l.lines, l.more = nil, 0
	return out
}

func newEnv(cfg Config, p *progress) (*env, error) {
	e := &env{cfg: cfg, url: cfg.NATSURL, progress: p}
	if e.url == "" {
		dir, err := os.MkdirTemp("", "natsagent-bench-")
		if err != nil {
			return nil, err
		}
		e.storeDir = dir
		// A loopback TCP listener on a free port: worker processes started
		// by the bench connect to it like to any server.
		emb, err := bus.StartEmbedded(bus.EmbeddedConfig{StoreDir: dir, Listen: "127.0.0.1:-1", ServerName: "natsagent-bench"})
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		e.emb, e.url = emb, emb.ClientURL()
		// Keep the server's warnings (slow consumers, store failures): the
		// report shows them.
		e.serverLog = &serverLog{}
		emb.Server.SetLogger(e.serverLog, false, false)
	}
	nc, err := e.connect("natsagent-bench")
	if err != nil {
		e.close()
		return nil, err
	}
	e.nc = nc
	if e.js, err = jetstream.New(nc); err != nil {
		e.close()
		return nil, err
	}
	if e.emb != nil {
		// nats-server (2.15) removes an account's store directory in the
		// background when its last stream is deleted, racing with the
		// next stream's creation ("could not create storage directory"):
		// every scenario deletes all it made, so one file stream stays for
		// the whole invocation.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := e.js.CreateStream(ctx, jetstream.StreamConfig{Name: strings.ToUpper(cfg.Prefix) + "_KEEP", Subjects: []string{cfg.Prefix + ".keep"}, Storage: jetstream.FileStorage})
		cancel()
		if err != nil {
			e.close()
			return nil, fmt.Errorf("create the bench's store anchor: %w", err)
		}
	}
	return e, nil
}

// connect opens a connection of its own: over TCP (loopback for the
// embedded server) like a real deployment, or in-process with
// --in-process-conn.
func (e *env) connect(name string) (*nats.Conn, error) {
	if e.cfg.InProcessConn && e.emb != nil {
		return e.emb.Connect(name)
	}
	return bus.Connect(e.url, name)
}

func (e *env) close() {
	if e.nc != nil {
		e.nc.Close()
	}
	if e.emb != nil {
		e.emb.Shutdown()
	}
	if e.storeDir != "" {
		_ = os.RemoveAll(e.storeDir)
	}
}

func (e *env) describe() string {
	kind := "embedded"
	if e.emb == nil {
		kind = "external"
	}
	conn := "TCP"
	if e.cfg.InProcessConn && e.emb != nil {
		conn = "in-process connections"
	}
	version := ""
	if e.nc != nil {
		version = " v" + e.nc.ConnectedServerVersion()
	}
	return fmt.Sprintf("%s nats-server%s at %s (%s, file storage)", kind, version, e.url, conn)
}

// randomPrefix is a prefix no real deployment uses, unique per invocation.
func randomPrefix() string {
	const letters = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = letters[int(b[i])%len(letters)]
	}
	return "bench" + string(b)
}

// deployment is one natsagent deployment (its own prefix, so its own
// streams, consumer and buckets) provisioned for one measurement and
// deleted after it: every measurement starts from empty streams.
type deployment struct {
	e        *env
	settings bus.Settings
	names    bus.Names
	pubNC    *nats.Conn
	js       jetstream.JetStream // publishing run requests
	obsNC    *nats.Conn
	obs      *observer

	mu      sync.Mutex
	futures []jetstream.PubAckFuture
	workers []*inProcessWorker
	closers []func()
}

func (e *env) deploy(ctx context.Context, suffix string) (*deployment, error) {
	names, err := bus.NewNames(e.cfg.Prefix + "-" + suffix)
	if err != nil {
		return nil, err
	}
	settings := bus.Settings{Names: names, MaxAckPending: max(bus.DefaultMaxAckPending, 2*e.cfg.MemoryRuns)}.WithDefaults()
	d := &deployment{e: e, settings: settings, names: names}
	provCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := bus.Provision(provCtx, e.js, settings); err != nil {
		d.deleteAssets()
		return nil, fmt.Errorf("provision %s: %w", names.Prefix, err)
	}
	if d.pubNC, err = e.connect("natsagent-bench-client"); err != nil {
		d.close()
		return nil, err
	}
	if d.js, err = jetstream.New(d.pubNC, jetstream.WithPublishAsyncMaxPending(4096)); err != nil {
		d.close()
		return nil, err
	}
	if d.obsNC, err = e.connect("natsagent-bench-observer"); err != nil {
		d.close()
		return nil, err
	}
	if d.obs, err = newObserver(d.obsNC, names.Prefix+".events.*.*.*."+protocol.KindLifecycle, func() { e.progress.add(1) }); err != nil {
		d.close()
		return nil, err
	}
	return d, nil
}

// close stops what the deployment started and deletes its assets.
func (d *deployment) close() {
	var wg sync.WaitGroup
	for _, w := range d.workers {
		wg.Add(1)
		go func() { defer wg.Done(); w.stop() }()
	}
	wg.Wait()
	for i := len(d.closers) - 1; i >= 0; i-- {
		d.closers[i]()
	}
	if d.obs != nil {
		d.obs.close()
	}
	if d.obsNC != nil {
		d.obsNC.Close()
	}
	if d.pubNC != nil {
		d.pubNC.Close()
	}
	d.deleteAssets()
}

func (d *deployment) deleteAssets() {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	n := d.names
	for _, s := range []string{n.RunsStream(), n.EventsStream(), n.DLQStream(), n.JobsStream()} {
		_ = d.e.js.DeleteStream(ctx, s)
	}
	for _, b := range []string{n.RunsBucket(), n.ThreadsBucket(), n.CheckpointsBucket(), n.UsageBucket(), n.MemoryBucket(), n.LimitsBucket(), n.AssistantsBucket(), n.CronsBucket(), n.StoreBucket()} {
		_ = d.e.js.DeleteKeyValue(ctx, b)
	}
	_ = d.e.js.DeleteObjectStore(ctx, n.FilesBucket())
}

// meter starts metering a window of the deployment: the process's CPU
// time and what the deployment's streams store.
func (d *deployment) meter(ctx context.Context) (*meter, error) {
	return startMeter(ctx, d.e.js, d.names.Prefix)
}

// model returns the model a scenario asked for: in-process, or the same
// answers from an OpenAI-compatible server on loopback.
func (d *deployment) model(p policy) (model.Model, error) {
	if d.e.cfg.Model != ModelHTTP {
		return inProcessModel(p), nil
	}
	srv, err := startModelServer(p)
	if err != nil {
		return nil, err
	}
	d.closers = append(d.closers, srv.close)
	return srv.client()
}

// modelURL starts an HTTP model server for worker processes, or returns ""
// in in-process mode (the processes then build the model themselves).
func (d *deployment) modelURL(p policy) (string, error) {
	if d.e.cfg.Model != ModelHTTP {
		return "", nil
	}
	srv, err := startModelServer(p)
	if err != nil {
		return "", err
	}
	d.closers = append(d.closers, srv.close)
	return srv.url, nil
}

// request encodes a run request with one user message.
func request(thread, run, content, strategy string) []byte {
	data, _ := json.Marshal(newRequest(thread, run, content, strategy))
	return data
}

// newRequest is the run request request encodes, for a caller that sets
// more of it.
func newRequest(thread, run, content, strategy string) *protocol.RunRequest {
	req := &protocol.RunRequest{
		RunID: run, ThreadID: thread, Tenant: protocol.DefaultTenant, Agent: protocol.DefaultAgent,
		Input:             &protocol.Input{Messages: []model.Message{{Role: model.RoleUser, Content: content}}},
		MultitaskStrategy: strategy,
	}
	req.Normalize()
	return req
}

// submit publishes a run request the way any client does (async JetStream
// publish, Nats-Msg-Id = "<tenant>.<run id>") and stamps its submit time just before.
func (d *deployment) submit(thread, run string, data []byte) (*track, error) {
	m := nats.NewMsg(d.names.RunSubject(protocol.DefaultTenant, thread))
	m.Data = data
	m.Header.Set(nats.MsgIdHdr, protocol.RunMsgID(protocol.DefaultTenant, run))
	t := d.obs.expect(run)
	f, err := d.js.PublishMsgAsync(m, jetstream.WithStallWait(30*time.Second))
	if err != nil {
		return t, fmt.Errorf("publish run %s: %w", run, err)
	}
	d.mu.Lock()
	d.futures = append(d.futures, f)
	d.mu.Unlock()
	return t, nil
}

// publishErrors waits for the outstanding PubAcks and counts the failed
// publishes.
func (d *deployment) publishErrors() int {
	select {
	case <-d.js.PublishAsyncComplete():
	case <-time.After(10 * time.Second):
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, f := range d.futures {
		select {
		case <-f.Ok():
		case <-f.Err():
			n++
		default:
			n++ // no answer after 10s
		}
	}
	return n
}

// inProcessWorker is a real worker (worker.New/Run) in this process, on a
// connection of its own.
type inProcessWorker struct {
	nc     *nats.Conn
	cancel context.CancelFunc
	done   chan error
}

// startWorkers starts n in-process workers and waits until each is
// pulling.
func (d *deployment) startWorkers(ctx context.Context, m model.Model, concurrency, n int) error {
	agents, err := agent.NewAgents(m, tools.NewRegistry(), agent.Chatbot())
	if err != nil {
		return err
	}
	for range n {
		nc, err := d.e.connect("natsagent-bench-worker")
		if err != nil {
			return err
		}
		w, err := worker.New(ctx, nc, worker.Config{
			Settings:      d.settings,
			Concurrency:   concurrency,
			Agents:        agents,
			Logger:        zap.NewNop(),
			ShutdownGrace: 2 * time.Second,
			Metrics:       d.e.cfg.Metrics,
		})
		if err != nil {
			nc.Close()
			return err
		}
		runCtx, cancel := context.WithCancel(context.Background())
		iw := &inProcessWorker{nc: nc, cancel: cancel, done: make(chan error, 1)}
		go func() { iw.done <- w.Run(runCtx) }()
		d.workers = append(d.workers, iw)
	}
	return d.waitPulling(ctx, n)
}

func (w *inProcessWorker) stop() {
	w.cancel()
	select {
	case <-w.done:
	case <-time.After(15 * time.Second):
	}
	w.nc.Close()
}

// waitPulling waits until n pull requests wait on the runs consumer: the
// workers are subscribed and fetching, so a measurement does not start
// with their start-up. The worker has no "ready" signal of its own.
func (d *deployment) waitPulling(ctx context.Context, n int) error {
	cons, err := d.e.js.Consumer(ctx, d.names.RunsStream(), bus.RunsConsumer)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, w := range d.workers {
			select {
			case err := <-w.done:
				w.done <- err
				return fmt.Errorf("worker stopped at start: %v", err)
			default:
			}
		}
		info, err := cons.Info(ctx)
		if err == nil && info.NumWaiting >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("workers not pulling after 10s (%d of %d pull requests waiting)", numWaiting(info), n)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func numWaiting(info *jetstream.ConsumerInfo) int {
	if info == nil {
		return 0
	}
	return info.NumWaiting
}

// streamBytes returns the bytes a stream holds.
func (e *env) streamBytes(ctx context.Context, stream jetstream.Stream) (uint64, error) {
	info, err := stream.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.State.Bytes, nil
}

var errOutOfTime = errors.New("out of time")
