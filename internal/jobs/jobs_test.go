package jobs

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/testdeploy"
)

// eventually bounds the waits for what must happen, not for how fast it
// does: each ends as soon as its condition holds. The retry-and-dead-
// letter cycle of TestFailingJobRetriesThenDeadLetters takes about 2 s
// under stress-ng, and ran past its former 5 s bound in loaded runs of
// the whole suite (.ci/stress).
const eventually = 30 * time.Second

type env struct {
	t        *testing.T
	srv      *natstest.Server
	js       jetstream.JetStream
	settings bus.Settings
}

// newEnv's ack wait is long: a runner's heartbeat or ack can be seconds
// late on a loaded machine, and a short ack wait then redelivers a job
// that ran, which the tests count as a duplicate or a second attempt.
func newEnv(t *testing.T) *env {
	t.Helper()
	return newEnvAckWait(t, 30*time.Second)
}

func newEnvAckWait(t *testing.T, ackWait time.Duration) *env {
	t.Helper()
	srv := natstest.Start(t)
	nc := srv.Connect()
	settings := bus.Settings{AckWait: ackWait, MaxDeliver: 3}.WithDefaults()
	natstest.Provision(t, nc, settings)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, srv: srv, js: js, settings: settings}
}

// start runs a runner on its own connection until the test ends.
func (e *env) start(handlers map[string]Handler, adjust func(*Config)) (stop func()) {
	e.t.Helper()
	js, err := jetstream.New(e.srv.Connect())
	if err != nil {
		e.t.Fatal(err)
	}
	cfg := Config{Settings: e.settings, Handlers: handlers, Logger: zaptest.NewLogger(e.t),
		Backoff: func(int) time.Duration { return 50 * time.Millisecond }, ShutdownGrace: time.Second}
	if adjust != nil {
		adjust(&cfg)
	}
	r, err := NewRunner(context.Background(), js, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					e.t.Errorf("runner: %v", err)
				}
			case <-time.After(10 * time.Second):
				e.t.Error("runner did not stop")
			}
		})
	}
	e.t.Cleanup(stop)
	return stop
}

func (e *env) enqueue(spec Spec) Enqueued {
	e.t.Helper()
	out, err := Enqueue(context.Background(), e.js, e.settings.Names, spec)
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

// dlq returns the dead-lettered jobs of a kind.
func (e *env) dlq(kind string) []jetstream.Msg {
	e.t.Helper()
	ctx := context.Background()
	c, err := e.js.OrderedConsumer(ctx, e.settings.Names.DLQStream(), jetstream.OrderedConsumerConfig{FilterSubjects: []string{e.settings.Names.DLQJobSubject(kind)}})
	if err != nil {
		e.t.Fatal(err)
	}
	var out []jetstream.Msg
	for {
		b, err := c.Fetch(10, jetstream.FetchMaxWait(300*time.Millisecond))
		if err != nil {
			e.t.Fatal(err)
		}
		n := 0
		for m := range b.Messages() {
			out = append(out, m)
			n++
		}
		if n == 0 {
			return out
		}
	}
}

func (e *env) jobsLeft() uint64 {
	e.t.Helper()
	st, err := e.js.Stream(context.Background(), e.settings.Names.JobsStream())
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := st.Info(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	return info.State.Msgs
}

func TestDueJobWaitsAndDedupes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	type got struct {
		at  time.Time
		job Job
	}
	ch := make(chan got, 4)
	e.start(map[string]Handler{"demo": func(ctx context.Context, j *Job) error {
		ch <- got{time.Now(), *j}
		return nil
	}}, nil)
	due := time.Now().Add(1500 * time.Millisecond).Truncate(time.Second).Add(time.Second)
	first := e.enqueue(Spec{Kind: "demo", Tokens: []string{"t", "u"}, Key: "h", ID: "demo.t.u.h.1", Due: due, Data: []byte("one")})
	second := e.enqueue(Spec{Kind: "demo", Tokens: []string{"t", "u"}, Key: "h", ID: "demo.t.u.h.1", Due: due, Data: []byte("two")})
	if first.Duplicate || !second.Duplicate {
		t.Fatalf("duplicates: first %v, second %v", first.Duplicate, second.Duplicate)
	}
	select {
	case g := <-ch:
		if g.at.Before(due.Add(-50 * time.Millisecond)) {
			t.Fatalf("job ran at %s, before it was due at %s", g.at, due)
		}
		if string(g.job.Data) != "one" || g.job.Kind != "demo" || g.job.ID != "demo.t.u.h.1" || g.job.Attempt != 1 ||
			len(g.job.Tokens) != 2 || g.job.Tokens[1] != "u" || !g.job.Due.Equal(due) {
			t.Fatalf("job %+v", g.job)
		}
	case <-time.After(eventually):
		t.Fatal("the due job never ran")
	}
	select {
	case g := <-ch:
		t.Fatalf("a duplicate job ran: %+v", g.job)
	case <-time.After(500 * time.Millisecond):
	}
	testdeploy.WaitFor(t, eventually, "the jobs stream to empty", func() bool { return e.jobsLeft() == 0 })
}

func TestFailingJobRetriesThenDeadLetters(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var calls atomic.Int32
	e.start(map[string]Handler{"flaky": func(ctx context.Context, j *Job) error {
		if int(calls.Add(1)) != j.Attempt {
			t.Errorf("attempt %d on call %d", j.Attempt, calls.Load())
		}
		return errors.New("model answered nonsense")
	}}, nil)
	// Scheduled, so the job carries the server's schedule headers.
	e.enqueue(Spec{Kind: "flaky", Tokens: []string{"t"}, Key: "k", ID: "flaky-1", Data: []byte(`{}`), Due: time.Now().Add(time.Second)})
	var dead []jetstream.Msg
	testdeploy.WaitFor(t, eventually, "the dead letter", func() bool { dead = e.dlq("flaky"); return len(dead) == 1 })
	if n := calls.Load(); n != 3 {
		t.Fatalf("handler ran %d times, want MaxDeliver = 3", n)
	}
	h := dead[0].Headers()
	if h.Get(HeaderDLQReason) != "model answered nonsense" || h.Get(HeaderDLQDeliveries) != "3" || h.Get(HeaderJobID) != "flaky-1" {
		t.Fatalf("dead letter headers %v", h)
	}
	testdeploy.WaitFor(t, eventually, "the jobs stream to empty", func() bool { return e.jobsLeft() == 0 })
}

func TestPermanentErrorAndUnknownKindDeadLetterAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var calls atomic.Int32
	e.start(map[string]Handler{"strict": func(ctx context.Context, j *Job) error {
		calls.Add(1)
		return Permanent(errors.New("payload is not JSON"))
	}}, nil)
	e.enqueue(Spec{Kind: "strict", Key: "k", ID: "strict-1"})
	e.enqueue(Spec{Kind: "nobody", Key: "k", ID: "nobody-1"})
	testdeploy.WaitFor(t, eventually, "two dead letters", func() bool { return len(e.dlq("strict")) == 1 && len(e.dlq("nobody")) == 1 })
	if calls.Load() != 1 {
		t.Fatalf("a permanent failure was retried: %d calls", calls.Load())
	}
	if r := e.dlq("nobody")[0].Headers().Get(HeaderDLQReason); r != `no handler for job kind "nobody" on this worker` {
		t.Fatalf("reason %q", r)
	}
}

// heartbeatAckWait is short, so a job outlasts it within the test, and
// not shorter: a heartbeat (every third of it) late by more than two
// thirds of it under load would let the job be redelivered.
const heartbeatAckWait = 2 * time.Second

func TestLongJobIsHeartbeated(t *testing.T) {
	t.Parallel()
	e := newEnvAckWait(t, heartbeatAckWait) // the job outlasts the ack wait: heartbeats hold it
	var calls atomic.Int32
	done := make(chan struct{})
	e.start(map[string]Handler{"slow": func(ctx context.Context, j *Job) error {
		calls.Add(1)
		select {
		case <-time.After(5 * heartbeatAckWait / 2):
		case <-ctx.Done():
			return ctx.Err()
		}
		close(done)
		return nil
	}}, func(c *Config) { c.Concurrency = 4 })
	e.enqueue(Spec{Kind: "slow", Key: "k", ID: "slow-1"})
	select {
	case <-done:
	case <-time.After(eventually):
		t.Fatal("the slow job never finished")
	}
	time.Sleep(300 * time.Millisecond)
	if n := calls.Load(); n != 1 {
		t.Fatalf("a heartbeated job was redelivered: %d calls", n)
	}
}

func TestShutdownHandsTheJobBack(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	started := make(chan struct{}, 1)
	stop := e.start(map[string]Handler{"wait": func(ctx context.Context, j *Job) error {
		started <- struct{}{}
		<-ctx.Done()
		return ctx.Err()
	}}, func(c *Config) { c.ShutdownGrace = 100 * time.Millisecond })
	e.enqueue(Spec{Kind: "wait", Key: "k", ID: "wait-1"})
	select {
	case <-started:
	case <-time.After(eventually):
		t.Fatal("job never started")
	}
	stop()
	ran := make(chan int, 1)
	e.start(map[string]Handler{"wait": func(ctx context.Context, j *Job) error {
		ran <- j.Attempt
		return nil
	}}, nil)
	select {
	case a := <-ran:
		if a != 2 {
			t.Fatalf("attempt %d, want 2", a)
		}
	case <-time.After(eventually):
		t.Fatal("the job was not handed back to another runner")
	}
	if d := e.dlq("wait"); len(d) != 0 {
		t.Fatal("a job stopped by a shutdown was dead-lettered")
	}
}
