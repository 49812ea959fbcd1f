package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
	"github.com/natsagent/natsagent/internal/testdeploy"
)

func TestBackgroundRunThenPoll(t *testing.T) {
	m, release := blockingModel()
	e := newEnv(t, m)
	t.Cleanup(release)
	r := e.do("POST", "/threads/t1/runs", input("hi")).expect(t, http.StatusOK)
	rec := r.run(t)
	// A worker may pick the run up before the answer: it is pending or
	// running, never finished, since the model blocks.
	if rec.Status.Terminal() || rec.ThreadID != "t1" || !protocol.ValidToken(rec.RunID) || rec.MsgSeq == 0 {
		t.Fatalf("submitted record %+v", rec)
	}
	if loc := r.header.Get("Content-Location"); loc != "/threads/t1/runs/"+rec.RunID {
		t.Fatalf("Content-Location %q", loc)
	}
	release()
	var got protocol.Run
	testdeploy.WaitFor(t, 10*time.Second, "run success", func() bool {
		got = e.do("GET", "/threads/t1/runs/"+rec.RunID, nil).expect(t, http.StatusOK).run(t)
		return got.Status.Terminal()
	})
	if got.Status != protocol.StatusSuccess || got.Output == nil || got.Output.Content != "ok" {
		t.Fatalf("final record %+v", got)
	}
	// The thread was created on the way.
	e.do("GET", "/threads/t1", nil).expect(t, http.StatusOK)
	// A run is only found on its own thread.
	e.do("GET", "/threads/other/runs/"+rec.RunID, nil).expect(t, http.StatusNotFound)
	e.do("GET", "/threads/t1/runs/nope", nil).expect(t, http.StatusNotFound)
}

func TestStreamRun(t *testing.T) {
	e := newEnv(t, textModel("one two three four", 4, 0))
	// A first run makes stream sequences differ from envelope seqs.
	e.do("POST", "/threads/warm/runs/wait?format=natsagent", input("hi")).expect(t, http.StatusOK)
	s := e.openStream("POST", "/threads/t1/runs/stream", input("hi"))
	loc := s.resp.Header.Get("Content-Location")
	if !strings.HasPrefix(loc, "/threads/t1/runs/") {
		t.Fatalf("Content-Location %q", loc)
	}
	for _, h := range [][2]string{{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}} {
		if got := s.resp.Header.Get(h[0]); got != h[1] {
			t.Fatalf("%s %q, want %q", h[0], got, h[1])
		}
	}
	evs := s.rest(10 * time.Second)
	// Middleware may add events of other kinds (a thread title, usage);
	// the fixed ones come in this order.
	want := "run.queued,run.started,message.delta,message.delta,message.delta,message.delta,message.completed,run.finished"
	if got := strings.Join(fixedTypes(evs), ","); got != want {
		t.Fatalf("events\n got %s\nwant %s", got, want)
	}
	runID := strings.TrimPrefix(loc, "/threads/t1/runs/")
	var lastID uint64
	var text strings.Builder
	for _, ev := range evs {
		if ev.env.Type != ev.event || ev.env.RunID != runID || ev.env.ThreadID != "t1" || ev.env.Tenant != "default" || ev.env.V != protocol.EnvelopeVersion {
			t.Fatalf("frame %q carries %+v", ev.event, ev.env)
		}
		// Deltas are live: no id (Last-Event-ID stays a stream sequence)
		// and no seq; the stored events count without them.
		if ev.event == protocol.EventMessageDelta {
			if ev.id != "" || !ev.env.Live || ev.env.Seq != 0 {
				t.Fatalf("a delta with id %q: %+v", ev.id, ev.env)
			}
			var d protocol.DeltaData
			_ = json.Unmarshal(ev.env.Data, &d)
			text.WriteString(d.Delta)
		}
	}
	if got := text.String(); got != "one two three four" {
		t.Fatalf("the deltas made %q", got)
	}
	for i, ev := range storedOnly(evs) {
		if ev.env.Seq != uint64(i+1) || ev.env.Live {
			t.Fatalf("stored event %d has seq %d; seqs must count from 1 without gaps", i, ev.env.Seq)
		}
		id, err := strconv.ParseUint(ev.id, 10, 64)
		if err != nil || id <= lastID {
			t.Fatalf("event %d has id %q after %d; ids are increasing stream sequences", i, ev.id, lastID)
		}
		lastID = id
	}
	// The id is the event's stream sequence, and data is the stored
	// envelope byte for byte.
	st, err := e.js.Stream(context.Background(), e.settings.Names.EventsStream())
	if err != nil {
		t.Fatal(err)
	}
	stored, err := st.GetMsg(context.Background(), lastID)
	if err != nil {
		t.Fatal(err)
	}
	if string(stored.Data) != evs[len(evs)-1].data {
		t.Fatalf("data %s, stored %s", evs[len(evs)-1].data, stored.Data)
	}
	if fin := finished(t, evs[len(evs)-1]); fin.Status != protocol.StatusSuccess || fin.Output.Content != "one two three four" {
		t.Fatalf("finished %+v", fin)
	}
}

func TestWaitStateAndRunList(t *testing.T) {
	e := newEnv(t, echoModel())
	r := e.do("POST", "/threads/t1/runs/wait?format=natsagent", input("first")).expect(t, http.StatusOK)
	first := r.run(t)
	if first.Status != protocol.StatusSuccess || first.Output == nil || first.Output.Content != "echo: first" {
		t.Fatalf("first run %+v", first)
	}
	if r.header.Get("Content-Location") != "/threads/t1/runs/"+first.RunID {
		t.Fatalf("Content-Location %q", r.header.Get("Content-Location"))
	}
	second := e.do("POST", "/threads/t1/runs/wait?format=natsagent", with(input("second"), "agent", "chatbot")).expect(t, http.StatusOK).run(t)
	if second.Output == nil || second.Output.Content != "echo: second" {
		t.Fatalf("second run %+v", second)
	}

	var st stateView
	e.do("GET", "/threads/t1/state?format=natsagent", nil).expect(t, http.StatusOK).decode(t, &st)
	var msgs []model.Message
	if err := json.Unmarshal(st.Values["messages"], &msgs); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range msgs {
		got = append(got, m.Role+":"+m.Content)
	}
	if want := "user:first,assistant:echo: first,user:second,assistant:echo: second"; strings.Join(got, ",") != want {
		t.Fatalf("state messages %v, want %s", got, want)
	}
	var th threadView
	e.do("GET", "/threads/t1", nil).expect(t, http.StatusOK).decode(t, &th)
	if st.CheckpointID == nil || *st.CheckpointID != th.CheckpointID || th.CheckpointID == "" || st.ThreadID != "t1" || st.Status != protocol.ThreadIdle {
		t.Fatalf("state %+v, thread %+v", st, th)
	}

	// History: newest checkpoint first; replaying the changes oldest first
	// rebuilds the state.
	var hist []historyEntry
	e.do("GET", "/threads/t1/history?format=natsagent", nil).expect(t, http.StatusOK).decode(t, &hist)
	if len(hist) < 2 || hist[0].CheckpointID != *st.CheckpointID || hist[len(hist)-1].ParentCheckpointID != "" {
		t.Fatalf("history %+v", hist)
	}
	rebuilt := &state.State{}
	for i := len(hist) - 1; i >= 0; i-- {
		if i < len(hist)-1 && hist[i].ParentCheckpointID != hist[i+1].CheckpointID {
			t.Fatalf("history is not one chain: %+v", hist)
		}
		rebuilt.Apply(hist[i].Changes)
	}
	if len(rebuilt.Messages) != len(msgs) {
		t.Fatalf("history rebuilds %d messages, state has %d", len(rebuilt.Messages), len(msgs))
	}
	var page1 []historyEntry
	e.do("GET", "/threads/t1/history?format=natsagent&limit=1&offset=1", nil).expect(t, http.StatusOK).decode(t, &page1)
	if len(page1) != 1 || page1[0].CheckpointID != hist[1].CheckpointID {
		t.Fatalf("history page %+v", page1)
	}

	var runs []protocol.Run
	e.do("GET", "/threads/t1/runs", nil).expect(t, http.StatusOK).decode(t, &runs)
	if len(runs) != 2 || runs[0].RunID != second.RunID || runs[1].RunID != first.RunID {
		t.Fatalf("runs %v, want [%s %s]", runIDs(runs), second.RunID, first.RunID)
	}
	e.do("GET", "/threads/t1/runs?limit=1", nil).expect(t, http.StatusOK).decode(t, &runs)
	if len(runs) != 1 || runs[0].RunID != second.RunID {
		t.Fatalf("limit=1: %v", runIDs(runs))
	}
	e.do("GET", "/threads/t1/runs?status=error", nil).expect(t, http.StatusOK).decode(t, &runs)
	if len(runs) != 0 {
		t.Fatalf("status=error: %v", runIDs(runs))
	}
	e.do("GET", "/threads/t1/runs?status=sucess", nil).expect(t, http.StatusBadRequest)
	e.do("GET", "/threads/nope/runs", nil).expect(t, http.StatusNotFound)

	// A thread without checkpoints has empty messages.
	e.do("POST", "/threads", map[string]any{"thread_id": "empty"}).expect(t, http.StatusOK)
	var empty stateView
	r = e.do("GET", "/threads/empty/state?format=natsagent", nil).expect(t, http.StatusOK)
	r.decode(t, &empty)
	if string(empty.Values["messages"]) != "[]" || empty.CheckpointID != nil {
		t.Fatalf("empty state %s", r.body)
	}
}

// fixedTypes lists the types of the events whose order the protocol
// fixes.
func fixedTypes(evs []sseEvent) []string {
	var out []string
	for _, ev := range evs {
		switch ev.event {
		case protocol.EventRunQueued, protocol.EventRunStarted, protocol.EventRunFinished,
			protocol.EventMessageDelta, protocol.EventMessageCompleted, protocol.EventToolStarted, protocol.EventToolFinished:
			out = append(out, ev.event)
		}
	}
	return out
}

func runIDs(runs []protocol.Run) []string {
	out := make([]string, len(runs))
	for i, r := range runs {
		out[i] = r.RunID
	}
	return out
}

func TestStatelessRuns(t *testing.T) {
	e := newEnv(t, echoModel())
	rec := e.do("POST", "/runs/wait?format=natsagent", input("hello")).expect(t, http.StatusOK).run(t)
	if rec.Status != protocol.StatusSuccess || !protocol.ValidToken(rec.ThreadID) || rec.Output.Content != "echo: hello" {
		t.Fatalf("stateless wait %+v", rec)
	}
	e.do("GET", "/threads/"+rec.ThreadID, nil).expect(t, http.StatusOK)

	s := e.openStream("POST", "/runs/stream", input("again"))
	evs := s.rest(10 * time.Second)
	if len(evs) == 0 || finished(t, evs[len(evs)-1]).Status != protocol.StatusSuccess {
		t.Fatalf("stateless stream %v", types(evs))
	}
	if evs[0].env.ThreadID == rec.ThreadID {
		t.Fatal("two stateless runs share a thread")
	}

	bg := e.do("POST", "/runs", input("bg")).expect(t, http.StatusOK).run(t)
	if !protocol.ValidToken(bg.ThreadID) || bg.ThreadID == rec.ThreadID || bg.ThreadID == evs[0].env.ThreadID {
		t.Fatalf("stateless background run %+v", bg)
	}
	final := e.do("GET", "/threads/"+bg.ThreadID+"/runs/"+bg.RunID+"/join?format=natsagent", nil).expect(t, http.StatusOK).run(t)
	if final.Status != protocol.StatusSuccess || final.Output.Content != "echo: bg" {
		t.Fatalf("joined %+v", final)
	}
}

func TestRunIDMakesRetriesIdempotent(t *testing.T) {
	m := echoModel()
	e := newEnv(t, m)
	body := with(input("once"), "run_id", "fixed")
	a := e.do("POST", "/threads/t1/runs", body).expect(t, http.StatusOK).run(t)
	b := e.do("POST", "/threads/t1/runs", body).expect(t, http.StatusOK).run(t)
	if a.RunID != "fixed" || b.RunID != "fixed" || !a.CreatedAt.Equal(b.CreatedAt) || a.MsgSeq != b.MsgSeq {
		t.Fatalf("retry gave another run: %+v vs %+v", a, b)
	}
	final := e.do("POST", "/threads/t1/runs/wait?format=natsagent", body).expect(t, http.StatusOK).run(t)
	if final.Status != protocol.StatusSuccess {
		t.Fatalf("final %+v", final)
	}
	// Retried after it finished: the same finished run, streamed again.
	evs := e.openStream("POST", "/threads/t1/runs/stream", body).rest(10 * time.Second)
	if n := len(evs); n == 0 || evs[0].event != protocol.EventRunQueued || evs[n-1].event != protocol.EventRunFinished {
		t.Fatalf("stream of the retried run: %v", types(evs))
	}
	time.Sleep(200 * time.Millisecond)
	if m.Calls() != 1 {
		t.Fatalf("model called %d times, want 1", m.Calls())
	}
	var runs []protocol.Run
	e.do("GET", "/threads/t1/runs", nil).expect(t, http.StatusOK).decode(t, &runs)
	if len(runs) != 1 {
		t.Fatalf("thread lists %d runs, want 1", len(runs))
	}
	// The same run id on another thread is a conflict, not another run.
	if er := e.do("POST", "/threads/t2/runs", body).expect(t, http.StatusConflict).apiError(t); !strings.Contains(er.Message, "t1") {
		t.Fatalf("run id reused on another thread: %+v", er)
	}
}

// blockingModel blocks its first call until release is closed.
func blockingModel() (*model.Scripted, func()) {
	release := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	m := model.NewScripted(func(n int, req *model.Request) model.Reply {
		if n == 0 {
			<-release
		}
		return model.Reply{Text: "ok"}
	})
	return m, open
}

func TestRejectWhileThreadBusy(t *testing.T) {
	m, release := blockingModel()
	e := newEnv(t, m)
	t.Cleanup(release) // before the worker stops
	first := e.do("POST", "/threads/t1/runs", input("one")).expect(t, http.StatusOK).run(t)
	testdeploy.WaitFor(t, 5*time.Second, "first run calling the model", func() bool { return m.Calls() == 1 })

	r := e.do("POST", "/threads/t1/runs", with(input("two"), "multitask_strategy", "reject", "run_id", "second")).expect(t, http.StatusConflict)
	er := r.apiError(t)
	if er.Code != protocol.CodeConflict || !strings.Contains(er.Message, first.RunID) {
		t.Fatalf("reject: %+v, want a conflict naming %s", er, first.RunID)
	}
	rec := e.do("GET", "/threads/t1/runs/second", nil).expect(t, http.StatusOK).run(t)
	if rec.Status != protocol.StatusRejected || rec.FinishedAt == nil || rec.Seq != 2 {
		t.Fatalf("rejected record %+v", rec)
	}
	evs := e.openStream("GET", "/threads/t1/runs/second/stream", nil).rest(5 * time.Second)
	if got := strings.Join(types(evs), ","); got != "run.queued,run.finished" {
		t.Fatalf("rejected run events %s", got)
	}
	if finished(t, evs[1]).Status != protocol.StatusRejected || evs[1].env.Seq != 2 {
		t.Fatalf("run.finished %+v", evs[1].env)
	}
	// A retry gets the same answer, and the stream endpoint answers 409
	// before any event.
	e.do("POST", "/threads/t1/runs", with(input("two"), "multitask_strategy", "reject", "run_id", "second")).expect(t, http.StatusConflict)
	e.do("POST", "/threads/t1/runs/stream", with(input("three"), "multitask_strategy", "reject")).expect(t, http.StatusConflict)

	release()
	final := e.do("GET", "/threads/t1/runs/"+first.RunID+"/join?format=natsagent", nil).expect(t, http.StatusOK).run(t)
	if final.Status != protocol.StatusSuccess {
		t.Fatalf("first run %+v", final)
	}
	// Idle again: reject runs are accepted.
	ok := e.do("POST", "/threads/t1/runs/wait?format=natsagent", with(input("four"), "multitask_strategy", "reject")).expect(t, http.StatusOK).run(t)
	if ok.Status != protocol.StatusSuccess {
		t.Fatalf("reject run on an idle thread %+v", ok)
	}
	var runs []protocol.Run
	e.do("GET", "/threads/t1/runs?status=rejected", nil).expect(t, http.StatusOK).decode(t, &runs)
	if len(runs) != 2 {
		t.Fatalf("rejected runs %v, want 2", runIDs(runs))
	}
}

func TestRejectWhileRequestQueued(t *testing.T) {
	// No worker: the first request waits in the runs stream, which makes
	// the thread busy.
	e := newEnv(t, nil)
	first := e.do("POST", "/threads/t1/runs", input("one")).expect(t, http.StatusOK).run(t)
	er := e.do("POST", "/threads/t1/runs", with(input("two"), "multitask_strategy", "reject")).expect(t, http.StatusConflict).apiError(t)
	if !strings.Contains(er.Message, first.RunID) {
		t.Fatalf("reject: %+v", er)
	}
}

func TestCancelStreamingRun(t *testing.T) {
	e := newEnv(t, textModel(strings.Repeat("y ", 500), 500, 20*time.Millisecond))
	s := e.openStream("POST", "/threads/t1/runs/stream", with(input("go"), "run_id", "long"))
	for {
		ev, ok := s.next(10 * time.Second)
		if !ok {
			t.Fatal("stream ended before the model streamed")
		}
		if ev.event == protocol.EventMessageDelta {
			break
		}
	}
	begin := time.Now()
	var reply protocol.CancelReply
	e.do("POST", "/threads/t1/runs/long/cancel", nil).expect(t, http.StatusOK).decode(t, &reply)
	if reply.RunID != "long" || reply.Status != protocol.StatusCancelled {
		t.Fatalf("cancel reply %+v", reply)
	}
	if time.Since(begin) > 5*time.Second {
		t.Fatalf("cancel took %s", time.Since(begin))
	}
	evs := s.rest(10 * time.Second)
	if fin := finished(t, evs[len(evs)-1]); fin.Status != protocol.StatusCancelled {
		t.Fatalf("stream ended with %+v", fin)
	}
	if er := e.do("POST", "/threads/t1/runs/long/cancel", nil).expect(t, http.StatusConflict).apiError(t); er.Code != protocol.CodeConflict {
		t.Fatalf("second cancel %+v", er)
	}
	if er := e.do("POST", "/threads/t1/runs/nope/cancel", nil).expect(t, http.StatusNotFound).apiError(t); er.Code != protocol.CodeNotFound {
		t.Fatalf("unknown run cancel %+v", er)
	}
	e.do("POST", "/threads/t1/runs/a.b/cancel", nil).expect(t, http.StatusBadRequest)
}

func TestCancelWithoutWorkers(t *testing.T) {
	e := newEnv(t, nil)
	er := e.do("POST", "/threads/t1/runs/r1/cancel", nil).expect(t, http.StatusServiceUnavailable).apiError(t)
	if er.Code != protocol.CodeUnavailable || er.Message != "no worker is serving cancel requests" {
		t.Fatalf("cancel without workers %+v", er)
	}
}

func TestJoinFinishedRunWithLastEventID(t *testing.T) {
	e := newEnv(t, textModel("a b c d e f", 6, 0))
	// A first run makes stream sequences differ from envelope seqs.
	e.do("POST", "/threads/warm/runs/wait?format=natsagent", input("hi")).expect(t, http.StatusOK)
	streamed := e.openStream("POST", "/threads/t1/runs/stream", with(input("hi"), "run_id", "r1")).rest(10 * time.Second)
	if len(fixedTypes(streamed)) != 10 {
		t.Fatalf("run has events %v, want 10 of the fixed types", types(streamed))
	}
	// The deltas went out live; a finished run replays its stored events.
	all := storedOnly(streamed)
	if len(fixedTypes(all)) != 4 {
		t.Fatalf("run stored %v, want the 4 fixed types without deltas", types(all))
	}
	n := len(all)
	for _, k := range []int{1, 3, n - 1} {
		got := e.openStream("GET", "/threads/t1/runs/r1/stream", nil, "Last-Event-ID", all[k-1].id).rest(5 * time.Second)
		if strings.Join(ids(got), ",") != strings.Join(ids(all[k:]), ",") {
			t.Fatalf("after %d events: got ids %v, want %v", k, ids(got), ids(all[k:]))
		}
	}
	// The query parameter works the same.
	got := e.openStream("GET", "/threads/t1/runs/r1/stream?last_event_id="+all[1].id, nil).rest(5 * time.Second)
	if strings.Join(ids(got), ",") != strings.Join(ids(all[2:]), ",") {
		t.Fatalf("?last_event_id: got %v, want %v", ids(got), ids(all[2:]))
	}
	// From the start, and after the last event: nothing more, and the
	// stream ends at once.
	if got := e.openStream("GET", "/threads/t1/runs/r1/stream", nil).rest(5 * time.Second); strings.Join(ids(got), ",") != strings.Join(ids(all), ",") {
		t.Fatalf("replay %v, want %v", ids(got), ids(all))
	}
	if got := e.openStream("GET", "/threads/t1/runs/r1/stream", nil, "Last-Event-ID", all[n-1].id).rest(2 * time.Second); len(got) != 0 {
		t.Fatalf("after the last event got %v", ids(got))
	}
	e.do("GET", "/threads/t1/runs/r1/stream", nil, "Last-Event-ID", "ten").expect(t, http.StatusBadRequest)
	e.do("GET", "/threads/t1/runs/nope/stream", nil).expect(t, http.StatusNotFound)
	e.do("GET", "/threads/t2/runs/r1/stream", nil).expect(t, http.StatusNotFound)
}

// A run with a resumable stream stores its deltas: a client that rejoins
// with Last-Event-ID misses none of them.
func TestLiveJoinResumesWithoutGapsOrDuplicates(t *testing.T) {
	e := newEnv(t, textModel(strings.TrimSpace(strings.Repeat("w ", 40)), 40, 25*time.Millisecond))
	e.do("POST", "/threads/t1/runs", with(input("hi"), "run_id", "r1", "stream_resumable", true)).expect(t, http.StatusOK)

	const k = 5
	s := e.openStream("GET", "/threads/t1/runs/r1/stream", nil)
	head := s.take(k)
	s.close() // the client goes away mid-run
	if rec := e.do("GET", "/threads/t1/runs/r1", nil).run(t); rec.Status.Terminal() {
		t.Fatalf("run finished before the rejoin (%s): the test must join live", rec.Status)
	}
	tail := e.openStream("GET", "/threads/t1/runs/r1/stream", nil, "Last-Event-ID", head[k-1].id).rest(15 * time.Second)
	got := append(head, tail...)

	all := e.openStream("GET", "/threads/t1/runs/r1/stream", nil).rest(5 * time.Second)
	if strings.Join(ids(got), ",") != strings.Join(ids(all), ",") {
		t.Fatalf("joined ids %v\nwant %v", ids(got), ids(all))
	}
	for i, ev := range got {
		if ev.env.Seq != uint64(i+1) {
			t.Fatalf("event %d has seq %d: a gap or a duplicate", i, ev.env.Seq)
		}
	}
	if len(fixedTypes(all)) != 1+1+40+1+1 || finished(t, got[len(got)-1]).Status != protocol.StatusSuccess {
		t.Fatalf("events %v", types(all))
	}
	// Every stream, the abandoned one included, removed its consumer.
	e.noConsumersLeft()
}

// Issue 16: without stream_resumable the deltas are live. A client cut
// mid-message rejoins with Last-Event-ID: it gets the stored events it
// missed once each, the deltas streamed from then on, and the stored
// message.completed with the whole text, which replaces the partial one.
func TestResumeMidMessageGetsTheWholeMessage(t *testing.T) {
	var words []string
	for i := range 40 {
		words = append(words, fmt.Sprintf("w%d", i))
	}
	text := strings.Join(words, " ")
	e := newEnv(t, textModel(text, 40, 25*time.Millisecond))
	deltas := func(evs []sseEvent) string {
		var b strings.Builder
		for _, ev := range evs {
			if ev.event == protocol.EventMessageDelta {
				var d protocol.DeltaData
				_ = json.Unmarshal(ev.env.Data, &d)
				b.WriteString(d.Delta)
			}
		}
		return b.String()
	}
	// Created and followed in one request: the stream follows the run
	// before it is published, so it has every delta from the first.
	s := e.openStream("POST", "/threads/t1/runs/stream", with(input("hi"), "run_id", "r1"))
	var head []sseEvent
	for n := 0; n < 3; {
		ev, ok := s.next(15 * time.Second)
		if !ok {
			t.Fatalf("stream ended after %v", types(head))
		}
		head = append(head, ev)
		if ev.event == protocol.EventMessageDelta {
			n++
		}
	}
	s.close() // cut mid-message
	if rec := e.do("GET", "/threads/t1/runs/r1", nil).run(t); rec.Status.Terminal() {
		t.Fatalf("run finished before the rejoin (%s): the test must join live", rec.Status)
	}
	time.Sleep(100 * time.Millisecond) // a few deltas go by unseen
	tail := e.openStream("GET", "/threads/t1/runs/r1/stream", nil, "Last-Event-ID", lastID(head)).rest(20 * time.Second)

	before, after := deltas(head), deltas(tail)
	// A head and a tail of the text, without a delta twice (the ones
	// streamed while the client was away are gone).
	if !strings.HasPrefix(text, before) || !strings.HasSuffix(text, after) || after == "" || len(before)+len(after) > len(text) {
		t.Fatalf("deltas before the cut %q, after %q: want a head and a tail of %q", before, after, text)
	}
	var completed *model.Message
	for i, ev := range tail {
		if ev.event == protocol.EventMessageCompleted {
			completed = &model.Message{}
			if err := json.Unmarshal(ev.env.Data, completed); err != nil {
				t.Fatal(err)
			}
			for _, later := range tail[i:] {
				if later.event == protocol.EventMessageDelta {
					t.Fatal("a delta after message.completed")
				}
			}
		}
	}
	if completed == nil || completed.Content != text {
		t.Fatalf("message.completed %+v, want the whole text", completed)
	}
	// The stored events: each once, seqs without gaps, as a replay has
	// them.
	got := storedOnly(append(head, tail...))
	all := e.openStream("GET", "/threads/t1/runs/r1/stream", nil).rest(5 * time.Second)
	if strings.Join(ids(got), ",") != strings.Join(ids(all), ",") {
		t.Fatalf("joined ids %v\nwant %v", ids(got), ids(all))
	}
	for i, ev := range got {
		if ev.env.Seq != uint64(i+1) {
			t.Fatalf("stored event %d has seq %d: a gap or a duplicate", i, ev.env.Seq)
		}
	}
	e.noConsumersLeft()
}

func TestJoinAfterEventsExpired(t *testing.T) {
	e := newEnv(t, echoModel())
	rec := e.do("POST", "/threads/t1/runs/wait?format=natsagent", with(input("hi"), "run_id", "r1")).expect(t, http.StatusOK).run(t)
	st, err := e.js.Stream(context.Background(), e.settings.Names.EventsStream())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Purge(context.Background(), jetstream.WithPurgeSubject(e.settings.Names.RunEvents("default", "t1", "r1"))); err != nil {
		t.Fatal(err)
	}
	evs := e.openStream("GET", "/threads/t1/runs/r1/stream", nil).rest(5 * time.Second)
	if len(evs) != 1 || evs[0].id != "" {
		t.Fatalf("got %v (ids %v), want one synthesized run.finished without an id", types(evs), ids(evs))
	}
	fin := finished(t, evs[0])
	if fin.Status != protocol.StatusSuccess || fin.Output.Content != "echo: hi" || evs[0].env.Seq != rec.Seq || evs[0].env.RunID != "r1" {
		t.Fatalf("synthesized %+v / %+v", evs[0].env, fin)
	}
	// join answers from the record.
	if got := e.do("GET", "/threads/t1/runs/r1/join?format=natsagent", nil).expect(t, http.StatusOK).run(t); got.Status != protocol.StatusSuccess {
		t.Fatalf("join %+v", got)
	}
}

func TestWaitClientLeavesRunGoesOn(t *testing.T) {
	m, release := blockingModel()
	e := newEnv(t, m)
	t.Cleanup(release)
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, "POST", e.http.URL+"/threads/t1/runs/wait?format=natsagent",
		strings.NewReader(`{"run_id":"r1","input":{"messages":[{"role":"user","content":"hi"}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		resp, err := e.http.Client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	testdeploy.WaitFor(t, 5*time.Second, "run calling the model", func() bool { return m.Calls() == 1 })
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("the wait answered before the run finished")
	}
	release()
	if rec := e.do("GET", "/threads/t1/runs/r1/join?format=natsagent", nil).expect(t, http.StatusOK).run(t); rec.Status != protocol.StatusSuccess {
		t.Fatalf("run after the client left: %+v", rec)
	}
}

func TestValidation(t *testing.T) {
	e := newEnv(t, nil)
	cases := []struct {
		name   string
		body   any
		status int
		field  string
	}{
		{"bad JSON", `{"input":`, http.StatusBadRequest, ""},
		{"trailing data", `{} {}`, http.StatusBadRequest, ""},
		{"wrong type", `{"input":{"messages":"hi"}}`, http.StatusBadRequest, "input.messages"},
		{"wrong type in config", `{"input":{"messages":[{"role":"user","content":"x"}]},"config":{"max_steps":"5"}}`, http.StatusBadRequest, "config.max_steps"},
		{"input and command", with(input("hi"), "command", map[string]any{"resume": "yes"}), http.StatusBadRequest, "command"},
		{"neither input nor command", map[string]any{}, http.StatusBadRequest, "input"},
		{"no messages", map[string]any{"input": map[string]any{"messages": []any{}}}, http.StatusBadRequest, "input.messages"},
		{"assistant role", map[string]any{"input": map[string]any{"messages": []any{map[string]any{"role": "assistant", "content": "x"}}}}, http.StatusBadRequest, "input.messages[0].role"},
		{"bad run id", with(input("hi"), "run_id", "a b"), http.StatusBadRequest, "run_id"},
		{"bad strategy", with(input("hi"), "multitask_strategy", "sometimes"), http.StatusBadRequest, "multitask_strategy"},
		{"bad if_not_exists", with(input("hi"), "if_not_exists", "maybe"), http.StatusBadRequest, "if_not_exists"},
		{"stream_resumable not a boolean", with(input("hi"), "stream_resumable", "yes"), http.StatusBadRequest, "stream_resumable"},
		{"two agents", with(input("hi"), "agent", "a", "assistant_id", "b"), http.StatusBadRequest, "agent"},
		{"bad agent", with(input("hi"), "assistant_id", "no/slash"), http.StatusBadRequest, "agent"},
		{"negative max steps", with(input("hi"), "config", map[string]any{"max_steps": -1}), http.StatusBadRequest, "config.max_steps"},
		{"bad configurable", with(input("hi"), "config", map[string]any{"configurable": map[string]any{"max_steps": "many"}}), http.StatusBadRequest, "config.configurable.max_steps"},
		{"command update of a middleware's key", map[string]any{"command": map[string]any{"resume": "y", "update": map[string]any{"approved_tool_calls": []string{"c1"}}}}, http.StatusBadRequest, "command.update.approved_tool_calls"},
		{"unknown field", with(input("hi"), "bogus", true), http.StatusBadRequest, "bogus"},
		{"missing thread with reject", with(input("hi"), "if_not_exists", "reject"), http.StatusNotFound, ""},
		{"too large", `{"metadata":{"x":"` + strings.Repeat("x", DefaultMaxBodyBytes) + `"}}`, http.StatusRequestEntityTooLarge, ""},
		{"request over the stream limit", with(input(strings.Repeat("x", 300<<10))), http.StatusRequestEntityTooLarge, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := e.do("POST", "/threads/t1/runs", c.body).expect(t, c.status)
			er := r.apiError(t)
			if er.Field != c.field {
				t.Fatalf("field %q, want %q (%s)", er.Field, c.field, er.Message)
			}
			wantCode := protocol.CodeInvalid
			if c.status == http.StatusNotFound {
				wantCode = protocol.CodeNotFound
			}
			if er.Code != wantCode {
				t.Fatalf("code %q, want %q", er.Code, wantCode)
			}
		})
	}
	// Nothing invalid reached the runs stream.
	st, err := e.js.Stream(context.Background(), e.settings.Names.RunsStream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 0 {
		t.Fatalf("%d requests published", info.State.Msgs)
	}
}

func TestUnknownAgentEndsAsErrorRun(t *testing.T) {
	// The gateway knows nothing of agents: it accepts the run and the
	// worker ends it as an error. The worker starts after the submission,
	// so it finds the gateway's pending record (see the report on the
	// race when it is faster).
	e := newEnv(t, nil)
	rec := e.do("POST", "/threads/t1/runs", with(input("hi"), "assistant_id", "nobody")).expect(t, http.StatusOK).run(t)
	if rec.Status != protocol.StatusPending || rec.Agent != "nobody" {
		t.Fatalf("submitted %+v", rec)
	}
	s := e.openStream("GET", "/threads/t1/runs/"+rec.RunID+"/stream", nil)
	m := echoModel()
	e.startWorker(m)
	evs := s.rest(10 * time.Second)
	if got := strings.Join(types(evs), ","); got != "run.queued,run.finished" {
		t.Fatalf("events %s", got)
	}
	fin := finished(t, evs[1])
	if fin.Status != protocol.StatusError || !strings.Contains(fin.Error, `"nobody"`) || evs[1].env.Seq != 2 {
		t.Fatalf("run.finished seq %d %+v, want an error naming the agent", evs[1].env.Seq, fin)
	}
	final := e.do("GET", "/threads/t1/runs/"+rec.RunID+"/join?format=natsagent", nil).expect(t, http.StatusOK).run(t)
	if final.Status != protocol.StatusError || !strings.Contains(final.Error, `"nobody"`) {
		t.Fatalf("record %+v", final)
	}
	if m.Calls() != 0 {
		t.Fatal("the model was called for an unknown agent")
	}
}

func TestLangGraphShapes(t *testing.T) {
	m := echoModel()
	e := newEnv(t, m)
	body := map[string]any{
		"assistant_id": "chatbot",
		"input": map[string]any{"messages": []any{
			map[string]any{"type": "human", "content": []any{map[string]any{"type": "text", "text": "from "}, map[string]any{"type": "text", "text": "blocks"}}},
		}},
		"config":             map[string]any{"configurable": map[string]any{"model": "configured", "thread_id": "ignored"}},
		"stream_mode":        []string{"values"},
		"multitask_strategy": "interrupt",
		"metadata":           map[string]any{"n": 12345678901234567},
	}
	r := e.do("POST", "/threads/t1/runs/wait?format=natsagent", body).expect(t, http.StatusOK)
	rec := r.run(t)
	if rec.Status != protocol.StatusSuccess || rec.Output.Content != "echo: from blocks" {
		t.Fatalf("run %+v", rec)
	}
	if rec.MultitaskStrategy != protocol.StrategySteer {
		t.Fatalf("interrupt became %q, want steer", rec.MultitaskStrategy)
	}
	if rec.Metadata["n"] == nil {
		t.Fatalf("metadata lost: %s", r.body)
	}
	reqs := m.Requests()
	if len(reqs) != 1 || reqs[0].Model != "configured" {
		t.Fatalf("model name %q, want configured from config.configurable", reqs[0].Model)
	}
	// The top level wins over configurable.
	body["config"] = map[string]any{"model": "top", "configurable": map[string]any{"model": "configured"}}
	e.do("POST", "/threads/t1/runs/wait?format=natsagent", body).expect(t, http.StatusOK)
	if reqs := m.Requests(); reqs[len(reqs)-1].Model != "top" {
		t.Fatalf("model name %q, want top", reqs[len(reqs)-1].Model)
	}
}

func TestSubmitWithoutWorkerIsPendingAndQueued(t *testing.T) {
	e := newEnvWith(t, nil, func(s *Server) { s.keepAlive = 50 * time.Millisecond })
	r := e.do("POST", "/threads/t1/runs", with(input("hi"), "metadata", map[string]any{"n": 12345678901234567})).expect(t, http.StatusOK)
	rec := r.run(t)
	if rec.Status != protocol.StatusPending || rec.Seq != 1 || rec.MsgSeq != 1 || rec.Agent != protocol.DefaultAgent {
		t.Fatalf("pending record %+v", rec)
	}
	if !strings.Contains(string(r.body), `"n":12345678901234567`) {
		t.Fatalf("metadata lost precision: %s", r.body)
	}
	s := e.openStream("GET", "/threads/t1/runs/"+rec.RunID+"/stream", nil)
	ev := s.take(1)[0]
	if ev.event != protocol.EventRunQueued || ev.env.Seq != 1 {
		t.Fatalf("first event %+v", ev.env)
	}
	var runs []protocol.Run
	e.do("GET", "/threads/t1/runs", nil).expect(t, http.StatusOK).decode(t, &runs)
	if len(runs) != 1 || runs[0].RunID != rec.RunID {
		t.Fatalf("runs %v", runIDs(runs))
	}
	// Nothing more arrives, but the stream stays open with keep-alives.
	s2 := e.openStream("GET", "/threads/t1/runs/"+rec.RunID+"/stream", nil, "Last-Event-ID", ev.id)
	testdeploy.WaitFor(t, 5*time.Second, "a keep-alive comment", func() bool {
		s2.mu.Lock()
		defer s2.mu.Unlock()
		return s2.comments > 0
	})
}
