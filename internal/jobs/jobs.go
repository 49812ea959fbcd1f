// Package jobs owns natsagent's background jobs: work that follows a run
// but must neither delay it nor live in one process's memory (memory
// extraction). A job is a message in the jobs stream (work-queue
// retention) consumed through one durable consumer shared by every
// worker; a job due later waits in the stream as a message schedule. The
// Runner pulls one job per free slot, heartbeats long jobs, retries
// failures with backoff and dead-letters poison. It knows nothing of what
// a job does: handlers are registered by kind. It must not touch runs,
// threads or leases.
package jobs

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/bus"
)

// Job is one delivery of a job to its handler.
type Job struct {
	// ID is the id the job was enqueued with.
	ID   string
	Kind string
	// Tokens are the subject tokens after the kind.
	Tokens []string
	Data   []byte
	// Attempt counts deliveries, from 1.
	Attempt int
	// Due is when the job became due (zero when unknown).
	Due time.Time
	// Stored is when the jobs stream stored the job: for a job a
	// message schedule fired, when it fired.
	Stored time.Time
}

// Handler runs a job. A nil error acks it; an error retries it with
// backoff until the runner's MaxDeliver, then dead-letters it; an error
// wrapped with Permanent dead-letters it at once. Handlers must be
// idempotent: a job whose worker died runs again.
type Handler func(ctx context.Context, job *Job) error

type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks an error that retrying cannot fix (a payload that does
// not decode): the job is dead-lettered without further attempts.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err was marked with Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// Headers set on dead-lettered jobs (the same names the worker uses for
// dead-lettered run requests).
const (
	HeaderDLQReason     = "Natsagent-Dlq-Reason"
	HeaderDLQSubject    = "Natsagent-Dlq-Subject"
	HeaderDLQStreamSeq  = "Natsagent-Dlq-Stream-Seq"
	HeaderDLQDeliveries = "Natsagent-Dlq-Deliveries"
)

// Config configures a Runner. Zero values take defaults.
type Config struct {
	// Settings must equal the deployment's provisioning settings.
	Settings bus.Settings
	// Handlers by job kind. A job of a kind without a handler is
	// dead-lettered.
	Handlers map[string]Handler
	// Concurrency is how many jobs run at once (default 2).
	Concurrency int
	// MaxDeliver bounds attempts before a failing job is dead-lettered
	// (default Settings.MaxDeliver).
	MaxDeliver int
	// Timeout bounds one attempt (default 5m).
	Timeout time.Duration
	// ShutdownGrace is how long running jobs may finish after Run's
	// context is done before they are cancelled and handed back (default
	// 10s).
	ShutdownGrace time.Duration
	// Backoff is the delay before attempt+1 after a failed attempt
	// (default 2s doubling to 5m, jittered).
	Backoff func(attempt int) time.Duration
	Logger  *zap.Logger
}

func (c Config) withDefaults() Config {
	c.Settings = c.Settings.WithDefaults()
	if c.Concurrency <= 0 {
		c.Concurrency = 2
	}
	if c.MaxDeliver <= 0 {
		c.MaxDeliver = c.Settings.MaxDeliver
	}
	if c.Timeout <= 0 {
		c.Timeout = 5 * time.Minute
	}
	if c.ShutdownGrace <= 0 {
		c.ShutdownGrace = 10 * time.Second
	}
	if c.Backoff == nil {
		c.Backoff = DefaultBackoff
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	return c
}

// DefaultBackoff waits 2s after the first failure, doubling to 5m, with
// ±25% jitter so failing jobs of many workers spread out.
func DefaultBackoff(attempt int) time.Duration {
	d := 2 * time.Second
	for i := 1; i < attempt && d < 5*time.Minute; i++ {
		d *= 2
	}
	d = min(d, 5*time.Minute)
	return d*3/4 + rand.N(d/2+1)
}

// Runner pulls jobs from the shared consumer and runs their handlers.
type Runner struct {
	cfg      Config
	names    bus.Names
	js       jetstream.JetStream
	consumer jetstream.Consumer
	log      *zap.Logger
}

// NewRunner binds a runner to the jobs consumer, which must exist
// (bus.Provision).
func NewRunner(ctx context.Context, js jetstream.JetStream, cfg Config) (*Runner, error) {
	cfg = cfg.withDefaults()
	for kind, h := range cfg.Handlers {
		if h == nil {
			return nil, fmt.Errorf("jobs: the handler of %q is nil", kind)
		}
	}
	names := cfg.Settings.Names
	cons, err := js.Consumer(ctx, names.JobsStream(), bus.JobsConsumer)
	if err != nil {
		return nil, fmt.Errorf("open consumer %s on %s: %w", bus.JobsConsumer, names.JobsStream(), err)
	}
	return &Runner{cfg: cfg, names: names, js: js, consumer: cons, log: cfg.Logger}, nil
}

// ErrConnectionClosed ends Run when the runner's NATS connection was
// closed for good.
var ErrConnectionClosed = errors.New("jobs: NATS connection closed")

// Run pulls and runs jobs until ctx is done. Then it stops pulling, gives
// running jobs ShutdownGrace to finish, cancels the rest and hands them
// back for another worker, and returns.
func (r *Runner) Run(ctx context.Context) error {
	base, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	var wg sync.WaitGroup
	slots := make(chan struct{}, r.cfg.Concurrency)
	err := r.pull(ctx, base, slots, &wg)

	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(r.cfg.ShutdownGrace):
		r.log.Warn("jobs did not finish in time; handing them back", zap.Duration("grace", r.cfg.ShutdownGrace))
		cancel()
		<-done
	}
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// pull fetches one job per free slot, so no job ages in a client buffer.
func (r *Runner) pull(ctx, base context.Context, slots chan struct{}, wg *sync.WaitGroup) error {
	release := func(n int) {
		for range n {
			<-slots
		}
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case slots <- struct{}{}:
		}
		free := 1
	more:
		for free < cap(slots) {
			select {
			case slots <- struct{}{}:
				free++
			default:
				break more
			}
		}
		fetchCtx, cancelFetch := context.WithTimeout(ctx, 5*time.Second)
		batch, err := r.consumer.Fetch(free, jetstream.FetchContext(fetchCtx))
		if err != nil {
			cancelFetch()
			release(free)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if r.js.Conn().IsClosed() {
				return ErrConnectionClosed
			}
			r.log.Warn("job fetch failed", zap.Error(err))
			pause(ctx, 250*time.Millisecond)
			continue
		}
		got := 0
		for msg := range batch.Messages() {
			got++
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer release(1)
				r.handle(base, msg)
			}()
		}
		cancelFetch()
		release(free - got)
		if r.js.Conn().IsClosed() {
			return ErrConnectionClosed
		}
	}
}

func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// handle runs one delivery and settles it: ack, retry later, hand back
// (shutdown) or dead-letter.
func (r *Runner) handle(base context.Context, msg jetstream.Msg) {
	job := &Job{ID: msg.Headers().Get(HeaderJobID), Data: msg.Data(), Attempt: 1}
	var seq uint64
	if md, err := msg.Metadata(); err == nil {
		job.Attempt, seq, job.Stored = int(md.NumDelivered), md.Sequence.Stream, md.Timestamp
	}
	if due, err := time.Parse(time.RFC3339, msg.Headers().Get(HeaderJobDue)); err == nil {
		job.Due = due
	}
	rest, ok := strings.CutPrefix(msg.Subject(), r.names.Prefix+".jobs.")
	if ok {
		parts := strings.Split(rest, ".")
		job.Kind, job.Tokens = parts[0], parts[1:]
	}
	log := r.log.With(zap.String("job_kind", job.Kind), zap.String("job_id", job.ID), zap.Int("attempt", job.Attempt), zap.Uint64("stream_seq", seq))

	h := r.cfg.Handlers[job.Kind]
	switch {
	case !ok || job.Kind == "":
		r.deadLetter(base, msg, job, seq, fmt.Errorf("subject %q is not a job subject", msg.Subject()), log)
		return
	case h == nil:
		r.deadLetter(base, msg, job, seq, fmt.Errorf("no handler for job kind %q on this worker", job.Kind), log)
		return
	case job.Attempt > r.cfg.MaxDeliver:
		// Every earlier delivery ended without a verdict: its worker died
		// or was stopped mid-job.
		r.deadLetter(base, msg, job, seq, fmt.Errorf("delivered %d times without finishing", job.Attempt), log)
		return
	}

	ctx, cancel := context.WithTimeout(base, r.cfg.Timeout)
	stopBeat := r.heartbeat(ctx, msg)
	err := call(ctx, h, job)
	stopBeat()
	cancel()
	switch {
	case err == nil:
		if aerr := msg.Ack(); aerr != nil {
			log.Warn("job ack failed; it will run again", zap.Error(aerr))
		}
		log.Debug("job done")
	case base.Err() != nil:
		// Shutting down: another worker takes the job now.
		_ = msg.Nak()
	case IsPermanent(err) || job.Attempt >= r.cfg.MaxDeliver:
		r.deadLetter(base, msg, job, seq, err, log)
	default:
		delay := r.cfg.Backoff(job.Attempt)
		log.Warn("job failed; retrying", zap.Error(err), zap.Duration("retry_in", delay))
		_ = msg.NakWithDelay(delay)
	}
}

// heartbeat keeps a long job's delivery alive (InProgress) every ack
// wait / 3, on its own goroutine.
func (r *Runner) heartbeat(ctx context.Context, msg jetstream.Msg) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(r.cfg.Settings.AckWait / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				_ = msg.InProgress()
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

// call runs a handler, turning a panic into an error so a bad job cannot
// take the worker down.
func call(ctx context.Context, h Handler, job *Job) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("job handler panicked: %v\n%s", p, debug.Stack())
		}
	}()
	return h(ctx, job)
}

// deadLetter copies a job to the dead-letter stream with the reason and
// removes it from the jobs stream. If the copy fails the job stays, to be
// tried again.
func (r *Runner) deadLetter(ctx context.Context, msg jetstream.Msg, job *Job, seq uint64, reason error, log *zap.Logger) {
	kind := job.Kind
	if kind == "" || strings.ContainsAny(kind, "*>") {
		kind = "invalid"
	}
	m := nats.NewMsg(r.names.DLQJobSubject(kind))
	for k, v := range msg.Headers() {
		// The server's own headers (dedupe id, schedule, expectations) mean
		// nothing in the dead-letter stream and would make it refuse the
		// copy (a scheduled job carries Nats-Schedule-Next).
		if strings.HasPrefix(strings.ToLower(k), "nats-") {
			continue
		}
		m.Header[k] = v
	}
	text := clip(reason.Error(), 1024)
	m.Header.Set(HeaderDLQReason, text)
	m.Header.Set(HeaderDLQSubject, msg.Subject())
	m.Header.Set(HeaderDLQStreamSeq, strconv.FormatUint(seq, 10))
	m.Header.Set(HeaderDLQDeliveries, strconv.Itoa(job.Attempt))
	m.Data = msg.Data()
	pubCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if _, err := r.js.PublishMsg(pubCtx, m, jetstream.WithMsgID(r.names.JobsStream()+"-"+strconv.FormatUint(seq, 10))); err != nil {
		log.Error("could not dead-letter the job; handing it back", zap.Error(err))
		_ = msg.NakWithDelay(time.Second)
		return
	}
	log.Warn("job dead-lettered", zap.String("reason", text))
	_ = msg.TermWithReason(clip(text, 256))
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
