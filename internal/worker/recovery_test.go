package worker

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/events"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/testdeploy"
	"github.com/natsagent/natsagent/internal/tools"
)

// A worker that dies mid-run (its connection closed, no cleanup at all) is
// replaced: another worker continues from the last checkpoint, the tool
// that already ran is not run again, and the run has one terminal event.
func TestWorkerDeathContinuesFromCheckpoint(t *testing.T) {
	h := newRedeliveryHarness(t) // the dead worker's run is redelivered
	var toolRuns atomic.Int32
	h.tools.Register(tools.Func(model.ToolSpec{Name: "side_effect"}, func(ctx context.Context, _ json.RawMessage) (string, error) {
		toolRuns.Add(1)
		return "done once", nil
	}))
	stuck := make(chan struct{})
	dying := model.NewScripted(func(n int, req *model.Request) model.Reply {
		if n == 0 {
			return model.Reply{Text: "working", ToolCalls: []model.ToolCall{{ID: "c1", Name: "side_effect", Arguments: "{}"}}}
		}
		close(stuck)
		// Hangs until its context ends, like a process frozen mid-call.
		return model.Reply{Delay: time.Hour}
	})
	a := h.startWorker(dying, nil)
	w := h.watch("default", "t1", "r1")
	h.submit(request("t1", "r1", "do the thing"))
	natstest.Recv(t, stuck, "the second model call of run r1")
	a.nc.Close() // the worker is gone: no acks, no heartbeats, no writes

	healthy := model.NewScripted(func(n int, req *model.Request) model.Reply {
		return model.Reply{Text: "finished after " + req.Messages[len(req.Messages)-1].Content}
	})
	h.startWorker(healthy, nil)
	fin := w.finished(t, 20*time.Second)
	if fin.Status != protocol.StatusSuccess || fin.Output.Content != "finished after done once" {
		t.Fatalf("run ended %s with %+v", fin.Status, fin.Output)
	}
	if n := toolRuns.Load(); n != 1 {
		t.Fatalf("the tool ran %d times; the checkpointed tool call must not run again", n)
	}
	if n := healthy.Calls(); n != 1 {
		t.Fatalf("the replacement made %d model calls, want 1 (continue, not restart)", n)
	}
	time.Sleep(300 * time.Millisecond)
	if n := w.count(protocol.EventRunFinished); n != 1 {
		t.Fatalf("%d run.finished events, want exactly 1", n)
	}
	var attempts []int
	for i, ev := range w.all() {
		if ev.Seq != uint64(i+1) {
			t.Fatalf("event %d has seq %d: %v", i, ev.Seq, w.types())
		}
		if ev.Type == protocol.EventRunStarted {
			var d protocol.StartedData
			_ = json.Unmarshal(ev.Data, &d)
			attempts = append(attempts, d.Attempt)
		}
	}
	if len(attempts) != 2 || attempts[0] != 1 || attempts[1] != 2 {
		t.Fatalf("run.started attempts %v, want [1 2]", attempts)
	}
	// Every event carries the attempt that published it, so a client can
	// drop late events of a worker that was replaced.
	second := false
	for _, ev := range w.all() {
		if ev.Type == protocol.EventRunStarted && ev.Attempt == 2 {
			second = true
		}
		if second && ev.Attempt != 2 {
			t.Fatalf("event %s after the takeover has attempt %d", ev.Type, ev.Attempt)
		}
	}
	if rec := h.run("default", "r1"); rec.Attempt != 2 || rec.Epoch != 2 {
		t.Fatalf("record attempt %d epoch %d, want 2 and 2", rec.Attempt, rec.Epoch)
	}
}

// Every kind of bad input ends as an error run with a reason, lands in the
// dead-letter stream, and the worker goes on serving.
func TestBadInputIsDeadLettered(t *testing.T) {
	h := newHarness(t)
	h.startWorker(textModel("fine", 1, 0), nil)
	valid := func(mut func(map[string]any)) []byte {
		r := map[string]any{"run_id": "x", "thread_id": "t1", "tenant": "default", "input": map[string]any{"messages": []any{map[string]any{"role": "user", "content": "hi"}}}}
		mut(r)
		data, _ := json.Marshal(r)
		return data
	}
	cases := []struct {
		name, run, subjectThread string
		data                     []byte
		reason                   string
	}{
		{"bad json", "bad-json", "t1", []byte(`{"run_id": "bad-json", "thread_id": `), "not valid JSON"},
		{"thread mismatch", "mismatch", "t2", valid(func(r map[string]any) { r["run_id"] = "mismatch" }), "does not match the subject's thread"},
		{"unknown agent", "noagent", "t1", valid(func(r map[string]any) { r["run_id"] = "noagent"; r["agent"] = "ghost" }), `unknown agent "ghost"`},
		{"input and command", "both", "t1", valid(func(r map[string]any) { r["run_id"] = "both"; r["command"] = map[string]any{"resume": true} }), "input and command are exclusive"},
		{"oversized", "huge", "t1", valid(func(r map[string]any) {
			r["run_id"] = "huge"
			r["input"] = map[string]any{"messages": []any{map[string]any{"role": "user", "content": strings.Repeat("a", 300<<10)}}}
		}), "over the limit"},
		{"invalid utf8", "badutf", "t1", append(valid(func(r map[string]any) { r["run_id"] = "badutf" })[:10:10], 0xff, 0xfe), "not valid UTF-8"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := h.watch("default", c.subjectThread, c.run)
			seq := h.publishRaw(h.names.RunSubject("default", c.subjectThread), c.data, c.run)
			fin := w.finished(t, 10*time.Second)
			if fin.Status != protocol.StatusError || !strings.Contains(fin.Error, c.reason) {
				t.Fatalf("run ended %s with %q, want error containing %q", fin.Status, fin.Error, c.reason)
			}
			rec := h.run("default", c.run)
			if rec.Status != protocol.StatusError || !strings.Contains(rec.Error, c.reason) {
				t.Fatalf("record %+v", rec)
			}
			m := h.deadLetter(t, "default", c.subjectThread, seq)
			if !strings.Contains(m.Header.Get(HeaderDLQReason), c.reason) {
				t.Fatalf("dead letter reason %q", m.Header.Get(HeaderDLQReason))
			}
			checkDeadLetterBody(t, m, c.data)
		})
	}
	// The worker still serves good runs, on the threads the bad ones named.
	w := h.watch("default", "t1", "good")
	h.submit(request("t1", "good", "hello"))
	if fin := w.finished(t, 10*time.Second); fin.Status != protocol.StatusSuccess {
		t.Fatalf("good run %s: %s", fin.Status, fin.Error)
	}
	h.waitRunsStreamEmpty(t)
}

// waitRunsStreamEmpty waits until every request was acked or removed.
func (h *harness) waitRunsStreamEmpty(t *testing.T) {
	t.Helper()
	testdeploy.WaitFor(t, 10*time.Second, "runs stream empty", func() bool {
		st, err := h.js.Stream(context.Background(), h.names.RunsStream())
		if err != nil {
			return false
		}
		info, err := st.Info(context.Background())
		return err == nil && info.State.Msgs == 0
	})
}

// deadLetter finds the dead letter of the request stored at seq in the
// runs stream.
func (h *harness) deadLetter(t *testing.T, tenant, thread string, seq uint64) *jetstream.RawStreamMsg {
	t.Helper()
	st, err := h.js.Stream(context.Background(), h.names.DLQStream())
	if err != nil {
		t.Fatal(err)
	}
	var found *jetstream.RawStreamMsg
	testdeploy.WaitFor(t, 5*time.Second, "dead letter", func() bool {
		for next := uint64(0); ; {
			m, err := st.GetMsg(context.Background(), next, jetstream.WithGetMsgSubject(h.names.DLQSubject(tenant, thread)))
			if err != nil {
				return false
			}
			if m.Header.Get(HeaderDLQStreamSeq) == strconv.FormatUint(seq, 10) {
				found = m
				return true
			}
			next = m.Sequence + 1
		}
	})
	return found
}

// A client that uses only nats.go — no natsagent package — submits a
// hand-written run request and follows its events.
func TestPlainNATSClient(t *testing.T) {
	h := newHarness(t)
	h.startWorker(toolThenText("current_time", `{}`, "it is"), nil)

	nc, err := nats.Connect(h.srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	type event struct {
		Type  string          `json:"type"`
		Seq   uint64          `json:"seq"`
		RunID string          `json:"run_id"`
		Data  json.RawMessage `json:"data"`
	}
	got := make(chan event, 100)
	cons, err := js.OrderedConsumer(ctx, "AGENT_EVENTS", jetstream.OrderedConsumerConfig{FilterSubjects: []string{"agent.events.acme.chat-1.run-1.>"}})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		var e event
		if err := json.Unmarshal(m.Data(), &e); err != nil {
			t.Error(err)
		}
		got <- e
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()

	// Token deltas are live: core NATS, outside the events stream.
	live, err := nc.SubscribeSync("agent.live.acme.chat-1.run-1.>")
	if err != nil {
		t.Fatal(err)
	}
	body := `{"run_id":"run-1","thread_id":"chat-1","tenant":"acme","agent":"chatbot",
	  "input":{"messages":[{"role":"user","content":"what time is it?"}]},
	  "multitask_strategy":"enqueue","config":{"max_steps":5},"metadata":{"source":"raw"}}`
	if _, err := js.Publish(ctx, "agent.runs.acme.chat-1", []byte(body), jetstream.WithMsgID("acme.run-1")); err != nil {
		t.Fatal(err)
	}
	var types []string
	for {
		select {
		case e := <-got:
			if e.RunID != "run-1" {
				t.Fatalf("event for run %q", e.RunID)
			}
			if e.Seq != uint64(len(types)+1) {
				t.Fatalf("seq %d after %v", e.Seq, types)
			}
			types = append(types, e.Type)
			if e.Type == "run.finished" {
				var d struct {
					Status string `json:"status"`
				}
				_ = json.Unmarshal(e.Data, &d)
				if d.Status != "success" {
					t.Fatalf("run ended %s", d.Status)
				}
				joined := strings.Join(types, " ")
				for _, want := range []string{"run.started", "tool.started", "tool.finished", "message.completed"} {
					if !strings.Contains(joined, want) {
						t.Fatalf("no %s in %v", want, types)
					}
				}
				// Protocol v2: a plain publish's run starts at seq 1 with
				// run.started, which carries run.queued's data.
				if types[0] != "run.started" || strings.Contains(joined, "run.queued") {
					t.Fatalf("events %v", types)
				}
				m, err := live.NextMsg(10 * time.Second)
				if err != nil {
					t.Fatalf("no live event: %v", err)
				}
				var le struct {
					V     int    `json:"v"`
					Type  string `json:"type"`
					Live  bool   `json:"live"`
					Index uint64 `json:"index"`
				}
				if err := json.Unmarshal(m.Data, &le); err != nil || le.V != 2 || !le.Live || le.Index != 1 || !strings.HasPrefix(m.Subject, "agent.live.acme.chat-1.run-1.") {
					t.Fatalf("live event on %s: %s", m.Subject, m.Data)
				}
				return
			}
		case <-ctx.Done():
			t.Fatalf("no run.finished; got %v", types)
		}
	}
}

// The gateway publishes run.queued and creates the pending record before a
// worker sees the request; an invalid request must still end that record
// (not leave it pending forever) and number its events after run.queued.
func TestInvalidRequestWithGatewayRecord(t *testing.T) {
	h := newHarness(t)
	req := request("t1", "ghostly", "hi")
	req.Agent = "ghost"
	req.Normalize()
	w := h.watch("default", "t1", "ghostly")
	seq := h.submit(req)
	pub, err := events.NewPublisher(context.Background(), h.js, h.names, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.PublishQueued(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	rec := kv.NewRun(req, seq, time.Now().UTC())
	rec.Seq = 1
	if _, err := h.stores.Runs.Create(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	h.startWorker(textModel("x", 1, 0), nil)
	fin := w.finished(t, 10*time.Second)
	if fin.Status != protocol.StatusError || !strings.Contains(fin.Error, `unknown agent "ghost"`) {
		t.Fatalf("run ended %s: %s", fin.Status, fin.Error)
	}
	if got := strings.Join(w.types(), ","); got != "run.queued,run.finished" {
		t.Fatalf("events %s", got)
	}
	for i, ev := range w.all() {
		if ev.Seq != uint64(i+1) {
			t.Fatalf("seq %d at %d", ev.Seq, i)
		}
	}
	if r := h.run("default", "ghostly"); r.Agent != "ghost" || r.Status != protocol.StatusError {
		t.Fatalf("record %+v", r)
	}
}

// A run whose workers keep dying is delivered MaxDeliver times; then the
// server gives up, and the advisory makes it an error run in the
// dead-letter stream instead of a request stuck at the head of its thread.
func TestMaxDeliveriesDeadLetters(t *testing.T) {
	h := newHarnessWith(t, bus.Settings{AckWait: time.Second, MaxDeliver: 2}) // both deliveries run out within the test
	calls := make(chan struct{}, 4)
	hang := model.NewScripted(func(int, *model.Request) model.Reply {
		calls <- struct{}{}
		return model.Reply{Delay: time.Hour}
	})
	w := h.watch("default", "t1", "doomed")
	seq := h.submit(request("t1", "doomed", "crash me"))
	for range 2 {
		wh := h.startWorker(hang, nil)
		natstest.Recv(t, calls, "the model call of a delivery of run doomed")
		wh.nc.Close() // the worker dies mid-run
	}
	h.startWorker(textModel("ok", 1, 0), nil)
	h.maxDeliveriesEnded(t, w, seq)
}

// A run id already used on another thread cannot get a record of its own:
// the request is dead-lettered and its sender learns why on the thread it
// asked for, instead of waiting forever.
func TestRunIDOfAnotherThread(t *testing.T) {
	h := newHarness(t)
	h.startWorker(textModel("ok", 1, 0), nil)
	w1 := h.watch("default", "t1", "shared")
	h.submit(request("t1", "shared", "first"))
	w1.finished(t, 10*time.Second)
	w2 := h.watch("default", "t2", "shared")
	// Within the duplicate window the stream drops the copy (the publisher
	// sees PubAck.Duplicate); after it, the worker must deal with it.
	req := request("t2", "shared", "second")
	req.Normalize()
	data, _ := json.Marshal(req)
	seq := h.publishRaw(h.names.RunSubject("default", "t2"), data, "")
	fin := w2.finished(t, 10*time.Second)
	if fin.Status != protocol.StatusError || !strings.Contains(fin.Error, `already used by a run on thread "t1"`) {
		t.Fatalf("run on t2 ended %s: %q", fin.Status, fin.Error)
	}
	h.deadLetter(t, "default", "t2", seq)
	if r := h.run("default", "shared"); r.ThreadID != "t1" || r.Status != protocol.StatusSuccess {
		t.Fatalf("the first run's record changed: %+v", r)
	}
}

// Over NATS the subject names the tenant and thread; a request that leaves
// them out of its body takes them from the subject.
func TestTenantAndThreadFromSubject(t *testing.T) {
	h := newHarness(t)
	h.startWorker(textModel("ok", 1, 0), nil)
	w := h.watch("acme", "demo", "bare")
	h.publishRaw(h.names.RunSubject("acme", "demo"), []byte(`{"run_id":"bare","input":{"messages":[{"role":"user","content":"hi"}]}}`), "bare")
	if fin := w.finished(t, 10*time.Second); fin.Status != protocol.StatusSuccess {
		t.Fatalf("run ended %s: %s", fin.Status, fin.Error)
	}
	if r := h.run("acme", "bare"); r.Tenant != "acme" || r.ThreadID != "demo" {
		t.Fatalf("record %+v", r)
	}
}

// A submitter's request (Natsagent-Submitter set) whose run.queued is
// stored before the submitter created its record, while the worker
// creates the record first: the worker publishes the same run.queued
// (stored once) and numbers run.started after it, so seqs have no
// repeat. Only a plain publish's run folds run.queued into run.started.
func TestSubmitterRunKeepsRunQueued(t *testing.T) {
	h := newHarness(t)
	req := request("t1", "r1", "hi")
	req.Normalize()
	w := h.watch("default", "t1", "r1")
	data, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(h.names.RunSubject(req.Tenant, req.ThreadID))
	m.Data = data
	m.Header.Set(nats.MsgIdHdr, protocol.RunMsgID(req.Tenant, req.RunID))
	m.Header.Set(protocol.HeaderSubmitter, "test")
	if _, err := h.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	pub, err := events.NewPublisher(context.Background(), h.js, h.names, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.PublishQueued(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	h.startWorker(textModel("x", 1, 0), nil)
	if fin := w.finished(t, 10*time.Second); fin.Status != protocol.StatusSuccess {
		t.Fatalf("run ended %s: %s", fin.Status, fin.Error)
	}
	types := w.types()
	if len(types) < 3 || types[0] != protocol.EventRunQueued || types[1] != protocol.EventRunStarted {
		t.Fatalf("events %v", types)
	}
	for i, ev := range w.all() {
		if ev.Seq != uint64(i+1) {
			t.Fatalf("event %d (%s) has seq %d: %v", i, ev.Type, ev.Seq, types)
		}
	}
	var started protocol.StartedData
	if err := json.Unmarshal(w.all()[1].Data, &started); err != nil || started.QueuedAt != nil {
		t.Fatalf("run.started after run.queued carries queued data: %+v (%v)", started, err)
	}
}
