package worker

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
)

// goroutineID is the id the runtime prints for the calling goroutine.
func goroutineID() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	id, _, _ := bytes.Cut(bytes.TrimPrefix(buf, []byte("goroutine ")), []byte(" "))
	return string(id)
}

// alive reports whether a goroutine with id runs in this process.
func alive(id string) bool {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return bytes.Contains(buf[:n], []byte("goroutine "+id+" ["))
		}
		buf = make([]byte, 2*len(buf))
	}
}

// countHandlers counts the requests each goroutine handled (by goroutine
// id) until the test ends; the function returns a copy of the counts.
func countHandlers(t *testing.T) func() map[string]int {
	var mu sync.Mutex
	seen := map[string]int{}
	testHookHandling = func() {
		mu.Lock()
		seen[goroutineID()]++
		mu.Unlock()
	}
	t.Cleanup(func() { testHookHandling = nil })
	return func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(seen)
	}
}

// Requests delivered one after another are handled on the same goroutine,
// whose stack the first run grew, and that goroutine ends with the worker.
func TestRequestsReuseTheirGoroutine(t *testing.T) {
	handled := countHandlers(t)
	idle := make(chan struct{}, 1)
	testHookIdle = func() { idle <- struct{}{} }
	t.Cleanup(func() { testHookIdle = nil })
	h := newHarness(t)
	wh := h.startWorker(textModel("ok", 1, 0), nil)
	const runs = 5
	for i := range runs {
		id := "r" + strconv.Itoa(i)
		w := h.watch(protocol.DefaultTenant, "t"+strconv.Itoa(i), id)
		h.submit(request("t"+strconv.Itoa(i), id, "hi"))
		if fd := w.finished(t, 30*time.Second); fd.Status != protocol.StatusSuccess {
			t.Fatalf("run %s ended %s: %s", id, fd.Status, fd.Error)
		}
		// run.finished is stored before the request's ack: the next
		// request goes out once the goroutine is done with this one.
		natstest.Recv(t, idle, "the run's goroutine to wait for the next request")
	}
	wh.stop()
	seen := handled()
	if len(seen) != 1 {
		t.Fatalf("%d runs, one at a time, were handled on %d goroutines (%v); want 1, kept from the first", runs, len(seen), seen)
	}
	for id, n := range seen {
		if n != runs {
			t.Fatalf("the goroutine handled %d requests, want %d", n, runs)
		}
		if alive(id) {
			t.Fatalf("goroutine %s, which waited for requests, outlived its worker", id)
		}
	}
}

// Requests delivered while others run get goroutines of their own: a
// goroutine busy with a run is never handed another.
func TestConcurrentRequestsGetTheirOwnGoroutines(t *testing.T) {
	handled := countHandlers(t)
	h := newHarness(t)
	// No run answers before all four called the model: they overlap.
	var called atomic.Int32
	all := make(chan struct{})
	m := model.Func(func(ctx context.Context, req *model.Request, onDelta func(model.Delta)) (*model.Response, error) {
		if called.Add(1) == 4 {
			close(all)
		}
		select {
		case <-all:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return model.NewFixed(model.Reply{Text: "ok"}).Generate(ctx, req, onDelta)
	})
	h.startWorker(m, func(c *Config) { c.Concurrency = 4 })
	var ws []*watcher
	for i := range 4 {
		id := fmt.Sprintf("c%d", i)
		ws = append(ws, h.watch(protocol.DefaultTenant, "tc"+id, id))
		h.submit(request("tc"+id, id, "hi"))
	}
	for _, w := range ws {
		if fd := w.finished(t, 30*time.Second); fd.Status != protocol.StatusSuccess {
			t.Fatalf("run ended %s: %s", fd.Status, fd.Error)
		}
	}
	if seen := handled(); len(seen) != 4 {
		t.Fatalf("4 overlapping runs were handled on %d goroutines (%v); want 4", len(seen), seen)
	}
}
