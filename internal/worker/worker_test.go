package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/testdeploy"
	"github.com/natsagent/natsagent/internal/tools"
)

func TestRunWithToolCall(t *testing.T) {
	h := newHarness(t)
	h.startWorker(toolThenText("current_time", `{}`, "the time is"), nil)
	w := h.watch("default", "t1", "r1")
	h.submit(request("t1", "r1", "what time is it?"))
	fin := w.finished(t, 10*time.Second)
	if fin.Status != protocol.StatusSuccess {
		t.Fatalf("status %s (%s), want success", fin.Status, fin.Error)
	}
	if fin.Output == nil || !strings.HasPrefix(fin.Output.Content, "the time is: ") {
		t.Fatalf("output %+v", fin.Output)
	}
	evs := w.all()
	for i, ev := range evs {
		if ev.Seq != uint64(i+1) {
			t.Fatalf("event %d (%s) has seq %d; seqs must count from 1 without gaps: %v", i, ev.Type, ev.Seq, w.types())
		}
	}
	// Protocol v2: a request a plain publish sent has no run.queued; its
	// run.started (seq 1) carries the queued data. Stored: thread.titled
	// and the deltas go out live (events.Follow); usage rides in
	// message.completed.
	want := []string{"run.started", "message.completed", "tool.started", "tool.finished", "message.completed", "run.finished"}
	if got := strings.Join(w.types(), ","); got != strings.Join(want, ",") {
		t.Fatalf("events\n got %s\nwant %s", got, strings.Join(want, ","))
	}
	var started protocol.StartedData
	if err := json.Unmarshal(evs[0].Data, &started); err != nil {
		t.Fatal(err)
	}
	if started.Attempt != 1 || started.Agent != protocol.DefaultAgent || started.MultitaskStrategy != protocol.StrategyEnqueue || started.QueuedAt == nil || started.QueuedAt.IsZero() {
		t.Fatalf("run.started data %+v", started)
	}
	rec := h.run("default", "r1")
	if rec.Status != protocol.StatusSuccess || rec.Attempt != 1 || rec.FinishedAt == nil || rec.StartedAt == nil {
		t.Fatalf("record %+v", rec)
	}
	msgs := h.threadState("default", "t1")
	roles := make([]string, len(msgs))
	for i, m := range msgs {
		roles[i] = m.Role
	}
	if got := strings.Join(roles, ","); got != "user,assistant,tool,assistant" {
		t.Fatalf("thread messages %s", got)
	}
	th, _, err := h.stores.Threads.Get(context.Background(), "default", "t1")
	if err != nil || th.Title != "what time is it?" {
		t.Fatalf("thread title %q (%v), want the first user message", th.Title, err)
	}
}

func TestEnqueueKeepsThreadOrderAndOtherThreadsRunInParallel(t *testing.T) {
	h := newHarness(t)
	var mu sync.Mutex
	order := map[string][]string{}
	var inflight, peak atomic.Int32
	m := model.NewScripted(func(n int, req *model.Request) model.Reply {
		cur := inflight.Add(1)
		for {
			p := peak.Load()
			if cur <= p || peak.CompareAndSwap(p, cur) {
				break
			}
		}
		last := req.Messages[len(req.Messages)-1].Content
		thread, _, _ := strings.Cut(last, "/")
		mu.Lock()
		order[thread] = append(order[thread], last)
		mu.Unlock()
		if strings.HasPrefix(thread, "tb") {
			// Runs of other threads in parallel meet here: each waits
			// (generously: under load a run's own work dwarfs a model
			// call) for another model call to be in flight, instead of
			// hoping two 20 ms windows overlap. Runs taken one at a
			// time never meet, and the peak stays 1.
			for deadline := time.Now().Add(4 * time.Second); peak.Load() < 2 && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
		}
		time.Sleep(20 * time.Millisecond)
		inflight.Add(-1)
		return model.Reply{Text: "done " + last}
	})
	h.startWorker(m, func(c *Config) { c.Concurrency = 8 })
	h.startWorker(m, func(c *Config) { c.Concurrency = 8 })

	var watchers []*watcher
	for i := 0; i < 20; i++ {
		run := fmt.Sprintf("a%02d", i)
		watchers = append(watchers, h.watch("default", "ta", run))
		h.submit(request("ta", run, fmt.Sprintf("ta/%02d", i)))
	}
	for i := 0; i < 6; i++ {
		thread := fmt.Sprintf("tb%d", i)
		watchers = append(watchers, h.watch("default", thread, "b"+thread))
		h.submit(request(thread, "b"+thread, thread+"/00"))
	}
	for _, w := range watchers {
		if fin := w.finished(t, 30*time.Second); fin.Status != protocol.StatusSuccess {
			t.Fatalf("status %s: %s", fin.Status, fin.Error)
		}
	}
	mu.Lock()
	got := order["ta"]
	mu.Unlock()
	if len(got) != 20 {
		t.Fatalf("thread ta ran %d model calls, want 20", len(got))
	}
	for i, s := range got {
		if want := fmt.Sprintf("ta/%02d", i); s != want {
			t.Fatalf("thread ta ran out of order: %v", got)
		}
	}
	// Every run on ta saw all the earlier ones: the thread is one
	// conversation.
	msgs := h.threadState("default", "ta")
	if len(msgs) != 40 {
		t.Fatalf("thread ta has %d messages, want 40", len(msgs))
	}
	if peak.Load() < 2 {
		t.Fatalf("runs never overlapped (peak %d): other threads must run in parallel", peak.Load())
	}
}

func TestDuplicateRunIDGivesOneRun(t *testing.T) {
	h := newHarness(t)
	m := textModel("hello", 1, 0)
	h.startWorker(m, nil)
	w := h.watch("default", "t1", "dup")
	h.submit(request("t1", "dup", "hi"))
	h.submit(request("t1", "dup", "hi"))
	w.finished(t, 10*time.Second)
	// A copy published after the dedupe window: the stream takes it, the
	// worker must drop it.
	req := request("t1", "dup", "hi")
	req.Normalize()
	data, _ := json.Marshal(req)
	h.publishRaw(h.names.RunSubject("default", "t1"), data, "")
	h.waitRunsStreamEmpty(t)
	time.Sleep(200 * time.Millisecond)
	if n := m.Calls(); n != 1 {
		t.Fatalf("model called %d times, want 1", n)
	}
	if n := w.count(protocol.EventRunFinished); n != 1 {
		t.Fatalf("%d run.finished events, want 1", n)
	}
	if n := w.count(protocol.EventRunStarted); n != 1 {
		t.Fatalf("%d run.started events, want 1", n)
	}
}

// A copy of a running run's request, published without a message id (a
// plain `nats pub` sent twice), is dropped: the run started before any
// record existed (its lease names it), so the copy cannot find a record
// that owns it. Before, the copy took the older request for dead weight,
// deleted it, wrote the record itself and ran the run a second time: two
// run.started and two events with sequence 1.
func TestCopyOfARunningRequestIsDropped(t *testing.T) {
	h := newHarness(t)
	release := make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free) // before the harness stops the worker
	m := model.NewScripted(func(n int, req *model.Request) model.Reply {
		if n == 0 {
			<-release
		}
		return model.Reply{Text: "hello"}
	})
	h.startWorker(m, nil)
	w := h.watch("default", "t1", "copy")
	req := request("t1", "copy", "hi")
	req.Normalize()
	data, _ := json.Marshal(req)
	subject := h.names.RunSubject("default", "t1")
	first := h.publishRaw(subject, data, "")
	testdeploy.WaitFor(t, 30*time.Second, "the run's model call", func() bool { return m.Calls() == 1 })
	second := h.publishRaw(subject, data, "")
	st, err := h.js.Stream(context.Background(), h.names.RunsStream())
	if err != nil {
		t.Fatal(err)
	}
	// The copy is settled while the run still waits on its model: acked
	// and gone, the run's own request still there.
	testdeploy.WaitFor(t, 30*time.Second, "the copy settled", func() bool {
		_, err := st.GetMsg(context.Background(), second)
		return errors.Is(err, jetstream.ErrMsgNotFound)
	})
	if _, err := st.GetMsg(context.Background(), first); err != nil {
		t.Fatalf("the running run's request: %v", err)
	}
	free()
	if fin := w.finished(t, 30*time.Second); fin.Status != protocol.StatusSuccess {
		t.Fatalf("run ended %s: %s", fin.Status, fin.Error)
	}
	h.waitRunsStreamEmpty(t)
	if n := m.Calls(); n != 1 {
		t.Errorf("model called %d times, want 1", n)
	}
	seen := map[uint64]string{}
	for _, ev := range w.all() {
		if prev, ok := seen[ev.Seq]; ok {
			t.Errorf("event seq %d twice: %s and %s (events %v)", ev.Seq, prev, ev.Type, w.types())
		}
		seen[ev.Seq] = ev.Type
	}
	if n := w.count(protocol.EventRunStarted); n != 1 {
		t.Errorf("%d run.started events, want 1 (events %v)", n, w.types())
	}
	rec, _, err := h.stores.Runs.Get(context.Background(), "default", "copy")
	if err != nil {
		t.Fatal(err)
	}
	if rec.MsgSeq != first || rec.Status != protocol.StatusSuccess {
		t.Errorf("record names request %d and says %s, want %d and success", rec.MsgSeq, rec.Status, first)
	}
}

func TestRejectWhenBusy(t *testing.T) {
	h := newHarness(t)
	release := make(chan struct{})
	m := model.NewScripted(func(n int, req *model.Request) model.Reply {
		if n == 0 {
			<-release
		}
		return model.Reply{Text: "ok"}
	})
	h.startWorker(m, nil)
	w1 := h.watch("default", "t1", "first")
	h.submit(request("t1", "first", "one"))
	testdeploy.WaitFor(t, 5*time.Second, "first run running", func() bool { return m.Calls() == 1 })
	w2 := h.watch("default", "t1", "second")
	req := request("t1", "second", "two")
	req.MultitaskStrategy = protocol.StrategyReject
	h.submit(req)
	if fin := w2.finished(t, 10*time.Second); fin.Status != protocol.StatusRejected {
		t.Fatalf("second run %s, want rejected", fin.Status)
	}
	close(release)
	if fin := w1.finished(t, 10*time.Second); fin.Status != protocol.StatusSuccess {
		t.Fatalf("first run %s", fin.Status)
	}
	if m.Calls() != 1 {
		t.Fatalf("rejected run called the model")
	}
}

func TestSteerEndsActiveRunAtBoundary(t *testing.T) {
	h := newHarness(t)
	started := make(chan struct{}, 10)
	m := model.NewScripted(func(n int, req *model.Request) model.Reply {
		last := req.Messages[len(req.Messages)-1]
		if last.Content == "long task" {
			started <- struct{}{}
			// Streams for minutes: only a steer ends it early, however
			// late the steer reaches the run.
			return model.Reply{Text: strings.Repeat("word ", 200), Pieces: 200, PieceDelay: time.Second}
		}
		var seen []string
		for _, m := range req.Messages[1:] { // after the system prompt
			seen = append(seen, m.Role+":"+m.Content)
		}
		return model.Reply{Text: "steered answer after " + strings.Join(seen, "|")}
	})
	h.startWorker(m, nil)
	w1 := h.watch("default", "t1", "long")
	h.submit(request("t1", "long", "long task"))
	natstest.Recv(t, started, "the model call of run long")
	w2 := h.watch("default", "t1", "steer")
	req := request("t1", "steer", "actually, do this")
	req.MultitaskStrategy = protocol.StrategySteer
	h.submit(req)

	fin1 := w1.finished(t, 30*time.Second)
	if fin1.Status != protocol.StatusSteered || fin1.SupersededBy != "steer" {
		t.Fatalf("active run ended %s (superseded by %q), want steered by steer", fin1.Status, fin1.SupersededBy)
	}
	fin2 := w2.finished(t, 10*time.Second)
	if fin2.Status != protocol.StatusSuccess {
		t.Fatalf("steer run %s: %s", fin2.Status, fin2.Error)
	}
	// The steer run sees the steered run's input, not its aborted partial
	// answer.
	if want := "steered answer after user:long task|user:actually, do this"; fin2.Output.Content != want {
		t.Fatalf("steer run output %q, want %q", fin2.Output.Content, want)
	}
}

func TestSteerWaitsForToolBatch(t *testing.T) {
	h := newHarness(t)
	toolStarted := make(chan struct{})
	toolDone := atomic.Bool{}
	var wh atomic.Pointer[workerHandle] // set once the worker started
	h.tools.Register(tools.Func(model.ToolSpec{Name: "slow"}, func(ctx context.Context, _ json.RawMessage) (string, error) {
		close(toolStarted)
		// The batch lasts until the run knows of the steer: one that
		// reached it after the batch would find the run past it.
		for deadline := time.Now().Add(30 * time.Second); !wh.Load().steered("default", "a"); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Error("run a never learned of the steer")
				break
			}
		}
		toolDone.Store(true)
		return "slow result", nil
	}))
	m := model.NewScripted(func(n int, req *model.Request) model.Reply {
		last := req.Messages[len(req.Messages)-1]
		if last.Content == "use the tool" {
			return model.Reply{ToolCalls: []model.ToolCall{{ID: "c1", Name: "slow", Arguments: "{}"}}}
		}
		return model.Reply{Text: fmt.Sprintf("answer with %d messages", len(req.Messages)-1)}
	})
	wh.Store(h.startWorker(m, nil))
	w1 := h.watch("default", "t1", "a")
	h.submit(request("t1", "a", "use the tool"))
	natstest.Recv(t, toolStarted, "the tool of run a")
	req := request("t1", "s", "steer now")
	req.MultitaskStrategy = protocol.StrategySteer
	w2 := h.watch("default", "t1", "s")
	h.submit(req)
	fin1 := w1.finished(t, 10*time.Second)
	if fin1.Status != protocol.StatusSteered {
		t.Fatalf("active run %s", fin1.Status)
	}
	if !toolDone.Load() {
		t.Fatal("steer interrupted a tool batch")
	}
	fin2 := w2.finished(t, 10*time.Second)
	// user, assistant(tool call), tool result, user(steer): the tool result
	// was kept.
	if fin2.Output.Content != "answer with 4 messages" {
		t.Fatalf("steer run output %q", fin2.Output.Content)
	}
}

func TestRollbackDiscardsActiveRun(t *testing.T) {
	h := newHarness(t)
	started := make(chan struct{}, 4)
	m := model.NewScripted(func(n int, req *model.Request) model.Reply {
		last := req.Messages[len(req.Messages)-1]
		if last.Content == "long" {
			started <- struct{}{}
			return model.Reply{Text: strings.Repeat("x ", 100), Pieces: 100, PieceDelay: 20 * time.Millisecond}
		}
		var seen []string
		for _, m := range req.Messages[1:] {
			seen = append(seen, m.Content)
		}
		return model.Reply{Text: strings.Join(seen, "|")}
	})
	h.startWorker(m, nil)
	w0 := h.watch("default", "t1", "first")
	h.submit(request("t1", "first", "hello"))
	w0.finished(t, 10*time.Second)
	w1 := h.watch("default", "t1", "long")
	h.submit(request("t1", "long", "long"))
	natstest.Recv(t, started, "the model call of run long")
	w2 := h.watch("default", "t1", "rb")
	req := request("t1", "rb", "instead")
	req.MultitaskStrategy = protocol.StrategyRollback
	h.submit(req)
	fin1 := w1.finished(t, 10*time.Second)
	if fin1.Status != protocol.StatusCancelled || fin1.SupersededBy != "rb" {
		t.Fatalf("rolled back run %s by %q", fin1.Status, fin1.SupersededBy)
	}
	fin2 := w2.finished(t, 10*time.Second)
	if want := "hello|hello|instead"; fin2.Output.Content != want {
		t.Fatalf("rollback run saw %q, want %q (the rolled back run's messages must be gone)", fin2.Output.Content, want)
	}
}

func TestCancelPendingAndRunning(t *testing.T) {
	h := newHarness(t)
	started := make(chan struct{}, 4)
	m := model.NewScripted(func(n int, req *model.Request) model.Reply {
		started <- struct{}{}
		return model.Reply{Text: strings.Repeat("y ", 500), Pieces: 500, PieceDelay: 20 * time.Millisecond}
	})
	h.startWorker(m, nil)
	wRun := h.watch("default", "t1", "running")
	h.submit(request("t1", "running", "go"))
	natstest.Recv(t, started, "the model call of run running")
	wPend := h.watch("default", "t1", "pending")
	h.submit(request("t1", "pending", "later"))
	testdeploy.WaitFor(t, 5*time.Second, "pending run queued", func() bool { return wPend.count(protocol.EventRunQueued) == 1 })

	r, e := h.cancel("default", "t1", "pending")
	if e != nil || r.Status != protocol.StatusCancelled {
		t.Fatalf("cancel pending: %+v %+v", r, e)
	}
	if fin := wPend.finished(t, 5*time.Second); fin.Status != protocol.StatusCancelled {
		t.Fatalf("pending run %s", fin.Status)
	}
	begin := time.Now()
	r, e = h.cancel("default", "t1", "running")
	if e != nil || r.Status != protocol.StatusCancelled {
		t.Fatalf("cancel running: %+v %+v", r, e)
	}
	if time.Since(begin) > 5*time.Second {
		t.Fatalf("cancel took %s: the streaming model call was not interrupted", time.Since(begin))
	}
	if fin := wRun.finished(t, 5*time.Second); fin.Status != protocol.StatusCancelled {
		t.Fatalf("running run %s", fin.Status)
	}
	_, e = h.cancel("default", "t1", "running")
	if e == nil || e.Error.Code != protocol.CodeConflict {
		t.Fatalf("second cancel: %+v, want a conflict", e)
	}
	_, e = h.cancel("default", "t1", "nope")
	if e == nil || e.Error.Code != protocol.CodeNotFound {
		t.Fatalf("cancel unknown: %+v, want not_found", e)
	}
	if m.Calls() != 1 {
		t.Fatalf("model called %d times; the cancelled pending run must never start", m.Calls())
	}
	// The next run on the thread works.
	w3 := h.watch("default", "t1", "after")
	h.submit(request("t1", "after", "again"))
	natstest.Recv(t, started, "the model call of run after")
	if _, e := h.cancel("default", "t1", "after"); e != nil {
		t.Fatal(e)
	}
	w3.finished(t, 5*time.Second)
}

// Protocol v2: a run that takes its thread's lease is listed through the
// thread record (recent_runs), with no run index key of its own; the run
// pushed out of that list gets its key then, so the thread's listing
// keeps every run.
func TestRunsListedThroughTheThreadRecord(t *testing.T) {
	h := newHarness(t)
	h.startWorker(textModel("ok", 1, 0), nil)
	ctx := context.Background()
	indexed := func() map[string]bool {
		t.Helper()
		kv, err := h.js.KeyValue(ctx, h.names.ThreadsBucket())
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]bool{}
		lister, err := kv.ListKeysFiltered(ctx, "default.t1.run.*")
		if err != nil {
			t.Fatal(err)
		}
		for k := range lister.Keys() {
			got[strings.TrimPrefix(k, "default.t1.run.")] = true
		}
		return got
	}
	n := protocol.ThreadRecentRuns + 1
	for i := range n {
		run := fmt.Sprintf("r%d", i)
		w := h.watch("default", "t1", run)
		h.submit(request("t1", run, "hi"))
		if fin := w.finished(t, 20*time.Second); fin.Status != protocol.StatusSuccess {
			t.Fatalf("%s ended %s: %s", run, fin.Status, fin.Error)
		}
		if i == 0 {
			if keys := indexed(); len(keys) != 0 {
				t.Fatalf("the first run wrote index keys %v", keys)
			}
		}
	}
	// r0 left the recent list when r32 took the lease: its key is written
	// without waiting, so look until it is there.
	testdeploy.WaitFor(t, 10*time.Second, "r0's index key", func() bool { return indexed()["r0"] })
	if keys := indexed(); len(keys) != 1 {
		t.Fatalf("index keys %v, want r0's only", keys)
	}
	ids, err := h.stores.Threads.RunIDs(ctx, "default", "t1")
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != n {
		t.Fatalf("listed %d runs, want %d: %v", len(ids), n, ids)
	}
}
