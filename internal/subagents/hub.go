package subagents

import (
	"bytes"
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/protocol"
)

// hub holds the awaits of this process: per awaited run one core
// subscription to its lifecycle events, and per await a callback and a
// timer. No goroutine waits for a run; its run.finished (or the timer, or
// a periodic re-read in case an event was missed while disconnected)
// answers every await of the run.
type hub struct {
	nc      *nats.Conn
	names   bus.Names
	max     int
	recheck time.Duration
	read    func(ctx context.Context, tenant, run string) (*protocol.Run, error)
	log     *zap.Logger

	mu      sync.Mutex
	runs    map[string]*watch // by tenant.run
	n       int
	closed  bool
	stopped chan struct{}
	ticking sync.Once // rechecks start with the first await
}

type watch struct {
	tenant, run string
	sub         *nats.Subscription
	waiters     map[*waiter]struct{}
}

type waiter struct {
	once  sync.Once
	fn    func(rec *protocol.Run, timedOut bool, err error)
	timer *time.Timer
}

func (w *waiter) fire(rec *protocol.Run, timedOut bool, err error) {
	w.once.Do(func() {
		if w.timer != nil {
			w.timer.Stop()
		}
		w.fn(rec, timedOut, err)
	})
}

func newHub(nc *nats.Conn, names bus.Names, max int, recheck time.Duration, read func(context.Context, string, string) (*protocol.Run, error), log *zap.Logger) *hub {
	return &hub{nc: nc, names: names, max: max, recheck: recheck, read: read, log: log, runs: make(map[string]*watch), stopped: make(chan struct{})}
}

var finishedMarker = []byte(`"type":"run.finished"`)

// add registers fn to be called once: when the run ends (its record), when
// timeout passes (its record then, timedOut true), or with an error. The
// returned cancel removes it without a call.
func (h *hub) add(tenant, thread, run string, timeout time.Duration, fn func(*protocol.Run, bool, error)) (cancel func(), err error) {
	key := bus.Key(tenant, run)
	w := &waiter{fn: fn}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, ErrStopping
	}
	if h.n >= h.max {
		h.mu.Unlock()
		return nil, ErrTooManyAwaits
	}
	wt := h.runs[key]
	if wt == nil {
		wt = &watch{tenant: tenant, run: run, waiters: make(map[*waiter]struct{})}
		sub, err := h.nc.Subscribe(h.names.EventSubject(tenant, thread, run, protocol.KindLifecycle), func(m *nats.Msg) {
			if bytes.Contains(m.Data, finishedMarker) {
				go h.check(key)
			}
		})
		if err != nil {
			h.mu.Unlock()
			return nil, err
		}
		wt.sub = sub
		h.runs[key] = wt
	}
	wt.waiters[w] = struct{}{}
	h.n++
	h.ticking.Do(func() { go h.rechecks() })
	w.timer = time.AfterFunc(timeout, func() { h.expire(key, w) })
	h.mu.Unlock()
	// The run may have ended before the subscription existed.
	go h.check(key)
	return func() { h.remove(key, w) }, nil
}

// remove takes a waiter out; it reports whether it was still there.
func (h *hub) remove(key string, w *waiter) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	wt := h.runs[key]
	if wt == nil {
		return false
	}
	if _, ok := wt.waiters[w]; !ok {
		return false
	}
	delete(wt.waiters, w)
	h.n--
	if w.timer != nil {
		w.timer.Stop()
	}
	if len(wt.waiters) == 0 {
		_ = wt.sub.Unsubscribe()
		delete(h.runs, key)
	}
	return true
}

// expire answers one waiter whose timeout passed, with the run as it is.
func (h *hub) expire(key string, w *waiter) {
	h.mu.Lock()
	wt := h.runs[key]
	h.mu.Unlock()
	if wt == nil || !h.remove(key, w) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rec, err := h.read(ctx, wt.tenant, wt.run)
	if err != nil {
		w.fire(nil, false, err)
		return
	}
	w.fire(rec, !rec.Status.Terminal(), nil)
}

// check reads the run and answers all its waiters if it ended.
func (h *hub) check(key string) {
	h.mu.Lock()
	wt := h.runs[key]
	h.mu.Unlock()
	if wt == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rec, err := h.read(ctx, wt.tenant, wt.run)
	if err != nil {
		h.log.Debug("awaited run not read; its next event or check answers", zap.String("run_id", wt.run), zap.Error(err))
		return
	}
	if !rec.Status.Terminal() {
		return
	}
	h.mu.Lock()
	if h.runs[key] != wt {
		h.mu.Unlock()
		return
	}
	delete(h.runs, key)
	_ = wt.sub.Unsubscribe()
	waiters := wt.waiters
	h.n -= len(waiters)
	h.mu.Unlock()
	for w := range waiters {
		w.fire(rec, false, nil)
	}
}

// rechecks re-reads every awaited run now and then, so an event missed
// while the connection was down delays an answer, never loses it.
func (h *hub) rechecks() {
	t := time.NewTicker(h.recheck)
	defer t.Stop()
	for {
		select {
		case <-h.stopped:
			return
		case <-t.C:
		}
		h.mu.Lock()
		keys := make([]string, 0, len(h.runs))
		for k := range h.runs {
			keys = append(keys, k)
		}
		h.mu.Unlock()
		for _, k := range keys {
			h.check(k)
		}
	}
}

// close answers every waiter with ErrStopping and refuses new ones.
func (h *hub) close() {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	h.closed = true
	close(h.stopped)
	var all []*waiter
	for key, wt := range h.runs {
		_ = wt.sub.Unsubscribe()
		for w := range wt.waiters {
			all = append(all, w)
		}
		delete(h.runs, key)
	}
	h.n = 0
	h.mu.Unlock()
	for _, w := range all {
		w.fire(nil, false, ErrStopping)
	}
}
