package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/protocol"
)

// The raw ceiling is natsagent's write set for one no-op run, done with
// plain nats.go calls and no natsagent code: the same stored messages, in
// the same sequential stages, at the same concurrency, pulled the way the
// worker pulls (one fetch per free slot). natsagent's burst divided by it
// is how much of what the server allows its own code leaves on the table;
// the write set itself is protocol v2's to shrink.
//
// The stages follow internal/worker/job.go (and admit.go, lease.go,
// usage.go) for the first delivery of a request a plain publish sent, on
// a new thread; each numbered stage waits for the server:
//
//  0. client: the request, published async with Nats-Msg-Id (runs stream)
//  1. look: thread record get ∥ the thread's oldest request (direct get)
//     ∥ the lease, a create of the thread record carrying the attempt
//     (threads; protocol v2 revision 3: a tentative lease taken beside
//     the look on a new thread) ∥ the thread's creation index key
//     (threads, created once per thread); then run.started async
//     (events), no record write
//     loop: 1 more event async (message.completed) and 2 live ones,
//     core publishes outside the stream (thread.titled, message.delta)
//  2. finalize: the last step's checkpoint delta (checkpoints)
//  3. the lease's release with the run's terminal summary, last_run (CAS
//     update, threads)
//  4. the terminal record, created (runs)
//  5. the events emitted so far are confirmed stored (usually answered
//     already: no round trip of its own)
//  6. run.finished, with its Nats-Msg-Id (events)
//     then the request is acked (not waited for)
//
// Protocol v2 folds, each removing writes from this list:
//
//   - usage: the run's totals live in its terminal record, the thread's in
//     the thread record's release (no usage bucket write: 2 fewer)
//
//   - usage.model: its data rides in message.completed's meta.usage (1
//     event fewer)
//
//   - run.queued: a run a worker creates from a plain publish has none; its
//     run.started (seq 1) carries the queued data (1 event fewer)
//
//   - run index: the lease's write lists the run in the thread record's
//     recent_runs; its index key is written only when it leaves that list
//     (none for a thread's first 32 runs: 1 thread write fewer)
//
//   - live events: thread.titled and message.delta are core publishes
//     (2 events fewer)
//
//   - the running record: the lease says the run runs; the release carries
//     the terminal summary and goes before the terminal record, which is
//     the record's only write (1 run record fewer; the release and the
//     record, in parallel before, are now one after the other)
//
//   - the thread's creation index key (threads.search by created_at, issue
//     18): written once per thread, beside the lease, so a run that
//     creates its thread (every run here) stores 1 thread write more, and
//     a run on an existing thread none
//
// ceilingWrites stored messages: 1 request, 3 events, 1 run record, 3
// thread writes (the index key, the lease, the release), 1 checkpoint.
// When the protocol changes what a run writes, this list changes with it.
// ceilingWrites is how many messages the write set above stores a run.
const ceilingWrites = 9

type ceiling struct {
	e     *env
	names bus.Names
	wnc   *nats.Conn // the "worker"
	wjs   jetstream.JetStream
	cnc   *nats.Conn // the client
	cjs   jetstream.JetStream
	onc   *nats.Conn // the observer
	obs   *observer

	runs                             jetstream.Stream
	cons                             jetstream.Consumer
	kvRuns, kvThreads, kvCheckpoints jetstream.KeyValue

	wg       sync.WaitGroup
	mu       sync.Mutex
	firstErr error // the first run that failed
}

// Payloads shaped like what natsagent writes for a no-op run. Their sizes
// are close, not equal (natsagent's records carry more fields); at a few
// hundred bytes a write's cost barely depends on its size.
var (
	ceilThread     = []byte(`{"thread_id":"%s","tenant":"default","status":"busy","epoch":1,"last_run_id":"%s","lease":{"run_id":"%s","worker":"ceiling","epoch":1,"msg_seq":1,"acquired_at":"2026-12-01T00:00:00Z","renewed_at":"2026-12-01T00:00:00Z","attempt":1,"agent":"chatbot","created_at":"2026-12-01T00:00:00Z"},"created_at":"2026-12-01T00:00:00Z","recent_runs":["%s"]}`)
	ceilRecord     = []byte(`{"run_id":"%s","thread_id":"%s","tenant":"default","agent":"chatbot","status":"%s","attempt":1,"worker":"ceiling","epoch":1,"seq":%d,"msg_seq":1,"multitask_strategy":"enqueue","created_at":"2026-12-01T00:00:00Z","started_at":"2026-12-01T00:00:00Z","output":{"role":"assistant","content":"ok"}}`)
	ceilCheckpoint = []byte(`{"id":"1-1","parent":"","run_id":"%s","step":1,"time":"2026-12-01T00:00:00Z","update":{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"ok"}]}}`)
	// The thread's usage, which the release carries since protocol v2.
	ceilThreadUsage = `,"usage":{"thread_id":"%s","tenant":"default","total":{"input_tokens":10,"output_tokens":1,"total_tokens":11,"calls":1,"main":{"input_tokens":10,"output_tokens":1,"total_tokens":11,"calls":1},"summary":{"input_tokens":0,"output_tokens":0,"total_tokens":0,"calls":0},"models":{"bench":{"main":{"input_tokens":10,"output_tokens":1,"total_tokens":11,"calls":1}}}},"runs":{"%s":{"usage":{"input_tokens":10,"output_tokens":1,"total_tokens":11,"calls":1,"main":{"input_tokens":10,"output_tokens":1,"total_tokens":11,"calls":1},"summary":{"input_tokens":0,"output_tokens":0,"total_tokens":0,"calls":0},"models":{"bench":{"main":{"input_tokens":10,"output_tokens":1,"total_tokens":11,"calls":1}}}},"seq":1}},"applied":1,"updated_at":"2026-12-01T00:00:00Z"}`
)

func (e *env) newCeiling(ctx context.Context, suffix string) (*ceiling, error) {
	names, err := bus.NewNames(e.cfg.Prefix + "-" + suffix)
	if err != nil {
		return nil, err
	}
	// Provisioned like a deployment, so each write costs the server what
	// it costs natsagent (storage, duplicate window, direct gets, history).
	settings := bus.Settings{Names: names}.WithDefaults()
	c := &ceiling{e: e, names: names}
	if err := bus.Provision(ctx, e.js, settings); err != nil {
		c.close()
		return nil, fmt.Errorf("provision the ceiling's assets: %w", err)
	}
	if err := c.open(ctx); err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

func (c *ceiling) open(ctx context.Context) error {
	var err error
	if c.wnc, err = c.e.connect("natsagent-bench-ceiling-worker"); err != nil {
		return err
	}
	if c.wjs, err = jetstream.New(c.wnc); err != nil {
		return err
	}
	if c.cnc, err = c.e.connect("natsagent-bench-ceiling-client"); err != nil {
		return err
	}
	if c.cjs, err = jetstream.New(c.cnc, jetstream.WithPublishAsyncMaxPending(4096)); err != nil {
		return err
	}
	if c.onc, err = c.e.connect("natsagent-bench-ceiling-observer"); err != nil {
		return err
	}
	if c.obs, err = newObserver(c.onc, c.names.Prefix+".events.*.*.*."+protocol.KindLifecycle, func() { c.e.progress.add(1) }); err != nil {
		return err
	}
	if c.runs, err = c.wjs.Stream(ctx, c.names.RunsStream()); err != nil {
		return err
	}
	if c.cons, err = c.wjs.Consumer(ctx, c.names.RunsStream(), bus.RunsConsumer); err != nil {
		return err
	}
	for _, kv := range []struct {
		dst    *jetstream.KeyValue
		bucket string
	}{{&c.kvRuns, c.names.RunsBucket()}, {&c.kvThreads, c.names.ThreadsBucket()}, {&c.kvCheckpoints, c.names.CheckpointsBucket()}} {
		if *kv.dst, err = c.wjs.KeyValue(ctx, kv.bucket); err != nil {
			return err
		}
	}
	return nil
}

func (c *ceiling) close() {
	c.wg.Wait()
	if c.obs != nil {
		c.obs.close()
	}
	for _, nc := range []*nats.Conn{c.wnc, c.cnc, c.onc} {
		if nc != nil {
			nc.Close()
		}
	}
	d := &deployment{e: c.e, names: c.names}
	d.deleteAssets()
}

// requests builds n run requests, one thread each, before the measured
// window, as the burst does.
func (c *ceiling) requests(n int) []*nats.Msg {
	out := make([]*nats.Msg, n)
	for i := range out {
		thread, run := "t"+strconv.Itoa(i), "r"+strconv.Itoa(i)
		m := nats.NewMsg(c.names.RunSubject(protocol.DefaultTenant, thread))
		m.Data = request(thread, run, "hi", "")
		m.Header.Set(nats.MsgIdHdr, protocol.RunMsgID(protocol.DefaultTenant, run))
		out[i] = m
	}
	return out
}

// run executes the requests at concurrency slots and returns what the
// observer saw, as the burst does for natsagent; with interval > 0 the
// requests are sent one every interval, as the paced runs are.
func (c *ceiling) run(ctx context.Context, reqs []*nats.Msg, slots int, interval time.Duration) (outcome, bool, error) {
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	pulled := make(chan error, 1)
	go func() { pulled <- c.pull(wctx, ctx, slots) }()
	tracks := make([]*track, 0, len(reqs))
	start := time.Now()
	for i, m := range reqs {
		if ctx.Err() != nil {
			break
		}
		if wait := time.Until(start.Add(time.Duration(i) * interval)); interval > 0 && wait > 0 {
			time.Sleep(wait)
		}
		tracks = append(tracks, c.obs.expect("r"+strconv.Itoa(i)))
		if _, err := c.cjs.PublishMsgAsync(m, jetstream.WithStallWait(30*time.Second)); err != nil {
			c.fail(fmt.Errorf("publish request: %w", err))
			break
		}
	}
	done := c.obs.waitAll(ctx, tracks)
	err := c.settle(stop, pulled, "ceiling run")
	return c.obs.outcome(tracks), done, err
}

// settle stops the pull loop, waits for the runs it started and returns
// the first error of a run or of the loop, named what.
func (c *ceiling) settle(stop context.CancelFunc, pulled <-chan error, what string) error {
	stop()
	c.fail(<-pulled)
	c.wg.Wait()
	c.mu.Lock()
	err := c.firstErr
	c.mu.Unlock()
	if err != nil {
		err = fmt.Errorf("%s: %w", what, err)
	}
	return err
}

// pull is the worker's pull loop: one fetch for every free slot, one
// goroutine per request. It stops when ctx ends; the runs it started go
// on under runCtx (the run.finished the observer saw may not be
// acknowledged yet).
func (c *ceiling) pull(ctx, runCtx context.Context, slots int) error {
	free := make(chan struct{}, slots)
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
			return nil
		case free <- struct{}{}:
		}
		n := 1
	more:
		for n < slots {
			select {
			case free <- struct{}{}:
				n++
			default:
				break more
			}
		}
		fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		batch, err := c.cons.Fetch(n, jetstream.FetchContext(fctx))
		if err != nil {
			cancel()
			for range n {
				<-free
			}
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("ceiling fetch: %w", err)
		}
		got := 0
		for msg := range batch.Messages() {
			got++
			c.wg.Add(1)
			go func() {
				defer c.wg.Done()
				defer func() { <-free }()
				if err := c.handle(runCtx, msg); runCtx.Err() == nil {
					c.fail(err)
				}
			}()
		}
		cancel()
		for range n - got {
			<-free
		}
	}
	return nil
}

// fail keeps the first error of a run.
func (c *ceiling) fail(err error) {
	if err == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.firstErr == nil {
		c.firstErr = err
	}
}

// handle is one run's write set, stage by stage (see ceiling).
func (c *ceiling) handle(ctx context.Context, msg jetstream.Msg) error {
	tenant, thread, ok := c.names.ParseRunSubject(msg.Subject())
	if !ok {
		return fmt.Errorf("subject %s", msg.Subject())
	}
	run := protocol.RunIDFromMsgID(tenant, msg.Headers().Get(nats.MsgIdHdr))
	threadKey, runKey := tenant+"."+thread, tenant+"."+run

	// 1. The thread record ∥ the thread's oldest request ∥ the lease, the
	// thread record created (refused if the thread exists).
	var wg sync.WaitGroup
	var headErr, leaseErr, indexErr error
	var thRev uint64
	wg.Add(3)
	go func() {
		defer wg.Done()
		_, headErr = c.runs.GetMsg(ctx, 0, jetstream.WithGetMsgSubject(msg.Subject()))
	}()
	go func() {
		defer wg.Done()
		_, indexErr = c.kvThreads.Update(ctx, threadKey+".created._", []byte(`{"created_at":"2026-12-01T00:00:00Z"}`), 0)
	}()
	go func() {
		defer wg.Done()
		thRev, leaseErr = c.kvThreads.Update(ctx, threadKey, fmt.Appendf(nil, string(ceilThread), thread, run, run, run), 0)
	}()
	_, thErr := c.kvThreads.Get(ctx, threadKey)
	wg.Wait()
	if headErr != nil {
		return fmt.Errorf("head: %w", headErr)
	}
	if thErr != nil && thErr != jetstream.ErrKeyNotFound {
		return fmt.Errorf("thread: %w", thErr)
	}
	if leaseErr != nil {
		return fmt.Errorf("lease: %w", leaseErr)
	}
	if indexErr != nil {
		return fmt.Errorf("creation index: %w", indexErr)
	}

	// run.started and the loop's events; no record write.
	var futures []jetstream.PubAckFuture
	emit := func(seq int, kind, typ, msgID string, extra string) error {
		m := nats.NewMsg(c.names.EventSubject(tenant, thread, run, kind))
		m.Data = fmt.Appendf(nil, `{"v":2,"type":%q,"seq":%d,"run_id":%q,"thread_id":%q,"tenant":%q,"time":"2026-12-01T00:00:00Z","data":{"attempt":1%s}}`, typ, seq, run, thread, tenant, extra)
		if msgID != "" {
			m.Header.Set(nats.MsgIdHdr, msgID)
		}
		f, err := c.wjs.PublishMsgAsync(m)
		futures = append(futures, f)
		return err
	}
	if err := emit(1, protocol.KindLifecycle, protocol.EventRunStarted, run+".started.1", `,"multitask_strategy":"enqueue","queued_at":"2026-12-01T00:00:00Z"`); err != nil {
		return err
	}
	for i, ev := range []struct{ kind, typ string }{
		{protocol.KindUpdates, "thread.titled"},
		{protocol.KindMessages, protocol.EventMessageDelta},
	} {
		live := fmt.Appendf(nil, `{"v":2,"type":%q,"live":true,"after":1,"index":%d,"run_id":%q,"thread_id":%q,"tenant":%q,"time":"2026-12-01T00:00:00Z","data":{"delta":"ok"}}`, ev.typ, i+1, run, thread, tenant)
		if err := c.wjs.Conn().Publish(c.names.LiveSubject(tenant, thread, run, ev.kind), live); err != nil {
			return err
		}
	}
	if err := emit(2, protocol.KindMessages, protocol.EventMessageCompleted, "", `,"delta":"ok"`); err != nil {
		return err
	}

	// 3. The last step's checkpoint.
	if _, err := c.kvCheckpoints.Put(ctx, threadKey+".1-1", fmt.Appendf(nil, string(ceilCheckpoint), run)); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}

	// 4. The release, with the run's terminal summary.
	final := fmt.Appendf(nil, string(ceilRecord), run, thread, "success", 3)
	release := []byte(`{"thread_id":"` + thread + `","tenant":"default","status":"idle","epoch":1,"head":"1-1","last_run_id":"` + run + `","created_at":"2026-12-01T00:00:00Z"` + fmt.Sprintf(ceilThreadUsage, thread, run) + `,"recent_runs":["` + run + `"],"last_run":` + string(final) + `}`)
	if _, err := c.kvThreads.Update(ctx, threadKey, release, thRev); err != nil {
		return fmt.Errorf("release: %w", err)
	}

	// 5. The terminal record.
	if _, err := c.kvRuns.Create(ctx, runKey, final); err != nil {
		return fmt.Errorf("record: %w", err)
	}

	// 6. The events are stored.
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return fmt.Errorf("event: %w", err)
		case <-ctx.Done():
			return ctx.Err()
		}
	}

	// 7. run.finished.
	fin := nats.NewMsg(c.names.EventSubject(tenant, thread, run, protocol.KindLifecycle))
	fin.Data = fmt.Appendf(nil, `{"v":2,"type":%q,"seq":3,"run_id":%q,"thread_id":%q,"tenant":%q,"time":"2026-12-01T00:00:00Z","data":{"status":"success","output":{"role":"assistant","content":"ok"}}}`, protocol.EventRunFinished, run, thread, tenant)
	fin.Header.Set(nats.MsgIdHdr, run+".finished")
	if _, err := c.wjs.PublishMsg(ctx, fin); err != nil {
		return fmt.Errorf("run.finished: %w", err)
	}
	_ = msg.Ack()
	return nil
}

// ceilingStages is the stage list for the report.
var ceilingStages = strings.Join([]string{
	"request", "thread ∥ head reads ∥ lease create ∥ creation index key (+ events async)",
	"checkpoint", "release (+ thread usage, last_run)", "terminal record create", "events confirmed", "run.finished",
}, " → ")

// idle runs n of the write set one at a time, each request published
// when the previous run.finished arrived, as the latency scenario's idle
// runs are: the floor under natsagent's idle latency with this write
// set. The first warm runs are not counted.
func (c *ceiling) idle(ctx context.Context, warm, n int) (outcome, error) {
	wctx, stop := context.WithCancel(ctx)
	pulled := make(chan error, 1)
	go func() { pulled <- c.pull(wctx, ctx, 1) }()
	reqs := c.requests(warm + n)
	var tracks []*track
	for i, m := range reqs {
		if ctx.Err() != nil {
			break
		}
		// Published async like the latency scenario's submit: a lost
		// request shows as a lost run.
		t := c.obs.expect("r" + strconv.Itoa(i))
		if _, err := c.cjs.PublishMsgAsync(m, jetstream.WithStallWait(30*time.Second)); err != nil {
			c.fail(fmt.Errorf("publish request: %w", err))
			break
		}
		if i >= warm {
			tracks = append(tracks, t)
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		c.obs.wait(wctx, t)
		cancel()
	}
	err := c.settle(stop, pulled, "ceiling idle runs")
	return c.obs.outcome(tracks), err
}
