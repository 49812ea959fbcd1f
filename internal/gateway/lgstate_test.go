package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/langgraph"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
	"github.com/natsagent/natsagent/internal/testdeploy"
)

// lgState is a LangGraph thread state as a client decodes it.
type lgState struct {
	Values struct {
		Messages []langgraph.Input `json:"messages"`
		Title    string            `json:"title"`
		Todos    []map[string]any  `json:"todos"`
	} `json:"values"`
	Next  []string `json:"next"`
	Tasks []struct {
		Name       string                `json:"name"`
		Interrupts []langgraph.Interrupt `json:"interrupts"`
	} `json:"tasks"`
	Checkpoint *struct {
		ThreadID     string `json:"thread_id"`
		CheckpointNS string `json:"checkpoint_ns"`
		CheckpointID string `json:"checkpoint_id"`
	} `json:"checkpoint"`
	ParentCheckpoint *struct {
		CheckpointID string `json:"checkpoint_id"`
	} `json:"parent_checkpoint"`
	Metadata  map[string]any `json:"metadata"`
	CreatedAt *time.Time     `json:"created_at"`
}

func (s lgState) id() string {
	if s.Checkpoint == nil {
		return ""
	}
	return s.Checkpoint.CheckpointID
}

// transcript is "type:content" of each message.
func (s lgState) transcript() string {
	var out []string
	for _, m := range s.Values.Messages {
		out = append(out, m.Type+":"+strings.Trim(string(m.Content), `"`))
	}
	return strings.Join(out, ",")
}

func (e *env) state(path string) lgState {
	e.t.Helper()
	var st lgState
	e.do("GET", path, nil).expect(e.t, http.StatusOK).decode(e.t, &st)
	return st
}

func (e *env) history(thread string, body any) []lgState {
	e.t.Helper()
	var h []lgState
	e.do("POST", "/threads/"+thread+"/history", body).expect(e.t, http.StatusOK).decode(e.t, &h)
	return h
}

func historyIDs(h []lgState) []string {
	out := make([]string, len(h))
	for i, s := range h {
		out[i] = s.id()
	}
	return out
}

// runs.wait and runs.join answer the thread's values in LangChain's
// message shape; state and history are LangGraph's, newest first, with
// their filters; a state at an older checkpoint is that checkpoint's.
func TestLangGraphValuesStateHistory(t *testing.T) {
	e := newEnv(t, echoModel())
	r := e.do("POST", "/threads/t1/runs/wait", with(input("first"), "run_id", "r1")).expect(t, http.StatusOK)
	if r.header.Get("X-Natsagent-Run-Status") != string(protocol.StatusSuccess) {
		t.Fatalf("X-Natsagent-Run-Status %q", r.header.Get("X-Natsagent-Run-Status"))
	}
	var values struct {
		Messages []map[string]any `json:"messages"`
	}
	r.decode(t, &values)
	if len(values.Messages) != 2 || values.Messages[0]["type"] != "human" || values.Messages[1]["type"] != "ai" ||
		values.Messages[1]["content"] != "echo: first" || values.Messages[0]["role"] != nil {
		t.Fatalf("wait values %s", r.body)
	}
	// LangChain types on input too, with content blocks.
	lc := map[string]any{"run_id": "r2", "input": map[string]any{"messages": []any{map[string]any{"type": "human", "content": []any{map[string]any{"type": "text", "text": "second"}}}}}}
	e.do("POST", "/threads/t1/runs/wait", lc).expect(t, http.StatusOK)
	join := e.do("GET", "/threads/t1/runs/r1/join", nil).expect(t, http.StatusOK)
	join.decode(t, &values)
	if len(values.Messages) != 2 {
		t.Fatalf("join of r1 answers the values after r1, got %s", join.body)
	}
	if rec := e.do("GET", "/threads/t1/runs/r2/join?format=natsagent", nil).expect(t, http.StatusOK).run(t); rec.RunID != "r2" || rec.Status != protocol.StatusSuccess {
		t.Fatalf("native join %+v", rec)
	}
	e.do("GET", "/threads/t1/runs/r2/join?format=xml", nil).expect(t, http.StatusBadRequest)

	head := e.state("/threads/t1/state")
	if got := head.transcript(); got != "human:first,ai:echo: first,human:second,ai:echo: second" {
		t.Fatalf("state transcript %s", got)
	}
	var th threadView
	e.do("GET", "/threads/t1", nil).expect(t, http.StatusOK).decode(t, &th)
	if head.id() != th.CheckpointID || head.Checkpoint.ThreadID != "t1" || head.Checkpoint.CheckpointNS != "" ||
		head.ParentCheckpoint == nil || head.CreatedAt == nil || len(head.Next) != 0 || len(head.Tasks) != 0 ||
		head.Metadata["source"] != "loop" || head.Metadata["run_id"] != "r2" {
		t.Fatalf("head state %+v", head)
	}

	all := e.history("t1", map[string]any{"limit": 100})
	if len(all) < 2 || all[0].id() != head.id() {
		t.Fatalf("history %v does not start at the head %s", historyIDs(all), head.id())
	}
	for i := 0; i+1 < len(all); i++ {
		if all[i].ParentCheckpoint == nil || all[i].ParentCheckpoint.CheckpointID != all[i+1].id() {
			t.Fatalf("history is not newest first along the chain: %v", historyIDs(all))
		}
		if len(all[i].Values.Messages) < len(all[i+1].Values.Messages) {
			t.Fatalf("an older state has more messages: %v", historyIDs(all))
		}
	}
	// The oldest entry is LangGraph's input checkpoint: empty, before
	// the first run; the first stored one is its child.
	if last := all[len(all)-1]; last.id() != inputCheckpoint || last.ParentCheckpoint != nil || last.Metadata["step"] != -1.0 ||
		last.Metadata["source"] != "input" || len(last.Values.Messages) != 0 || len(last.Next) != 0 {
		t.Fatalf("oldest entry %+v", last)
	}
	if first := all[len(all)-2]; first.ParentCheckpoint == nil || first.ParentCheckpoint.CheckpointID != inputCheckpoint || first.Metadata["step"] != 0.0 {
		t.Fatalf("first stored entry %+v", first)
	}
	if at := e.state("/threads/t1/state/" + inputCheckpoint); at.id() != inputCheckpoint || len(at.Values.Messages) != 0 {
		t.Fatalf("state at the input checkpoint %+v", at)
	}
	// GET takes the query; the default limit is LangGraph's 10.
	var viaGet []lgState
	e.do("GET", "/threads/t1/history?limit=1", nil).expect(t, http.StatusOK).decode(t, &viaGet)
	if len(viaGet) != 1 || viaGet[0].id() != head.id() {
		t.Fatalf("GET history limit=1: %v", historyIDs(viaGet))
	}
	if h := e.history("t1", map[string]any{"limit": 1, "before": map[string]any{"checkpoint_id": all[0].id()}}); len(h) != 1 || h[0].id() != all[1].id() {
		t.Fatalf("before: %v", historyIDs(h))
	}
	if h := e.history("t1", map[string]any{"before": map[string]any{"configurable": map[string]any{"checkpoint_id": all[1].id()}}}); len(h) != len(all)-2 {
		t.Fatalf("before (configurable): %v", historyIDs(h))
	}
	if h := e.history("t1", map[string]any{"metadata": map[string]any{"run_id": "r1"}}); len(h) == 0 || slices.ContainsFunc(h, func(s lgState) bool { return s.Metadata["run_id"] != "r1" }) {
		t.Fatalf("metadata filter: %v", historyIDs(h))
	}
	if h := e.history("t1", map[string]any{"checkpoint": map[string]any{"checkpoint_id": all[1].id()}}); len(h) != 1 || h[0].id() != all[1].id() {
		t.Fatalf("checkpoint filter: %v", historyIDs(h))
	}
	if h := e.history("t1", map[string]any{"checkpoint": map[string]any{"checkpoint_ns": "sub"}}); len(h) != 0 {
		t.Fatalf("another namespace: %v", historyIDs(h))
	}
	e.do("POST", "/threads/t1/history", map[string]any{"limit": 0}).expect(t, http.StatusBadRequest)
	e.do("POST", "/threads/t1/history", map[string]any{"before": "nope"}).expect(t, http.StatusNotFound)
	e.do("POST", "/threads/t1/history", map[string]any{"before": "a.b"}).expect(t, http.StatusBadRequest)

	// A state at a checkpoint, by path and by body.
	old := all[len(all)-2]
	at := e.state("/threads/t1/state/" + old.id())
	if at.id() != old.id() || at.transcript() != old.transcript() || len(at.Values.Messages) >= len(head.Values.Messages) {
		t.Fatalf("state at %s: %s (history says %s)", old.id(), at.transcript(), old.transcript())
	}
	var byBody lgState
	e.do("POST", "/threads/t1/state/checkpoint", map[string]any{"checkpoint": map[string]any{"checkpoint_id": old.id(), "thread_id": "t1", "checkpoint_ns": ""}}).
		expect(t, http.StatusOK).decode(t, &byBody)
	if byBody.id() != old.id() || byBody.transcript() != old.transcript() {
		t.Fatalf("state by body %+v", byBody)
	}
	e.do("GET", "/threads/t1/state/e999-1", nil).expect(t, http.StatusNotFound)
	e.do("GET", "/threads/t1/state/a.b", nil).expect(t, http.StatusBadRequest)
	e.do("GET", "/threads/t2/state/"+old.id(), nil).expect(t, http.StatusNotFound)
	e.do("GET", "/threads/t1/state?format=yaml", nil).expect(t, http.StatusBadRequest)

	// A thread without checkpoints.
	e.do("POST", "/threads", map[string]any{"thread_id": "empty"}).expect(t, http.StatusOK)
	if st := e.state("/threads/empty/state"); st.Checkpoint != nil || st.Values.Messages == nil || len(st.Values.Messages) != 0 {
		t.Fatalf("empty thread state %+v", st)
	}
	if h := e.history("empty", nil); len(h) != 0 {
		t.Fatalf("empty thread history %v", historyIDs(h))
	}
}

// A thread waiting for a person: runs.wait answers __interrupt__, the
// state names the next node and its task's interrupt.
func TestLangGraphInterruptState(t *testing.T) {
	e := newEnv(t, clarifyingModel())
	r := e.do("POST", "/threads/t1/runs/wait", input("book a flight")).expect(t, http.StatusOK)
	var values map[string]json.RawMessage
	r.decode(t, &values)
	var intr []langgraph.Interrupt
	if err := json.Unmarshal(values[langgraph.InterruptKey], &intr); err != nil || len(intr) != 1 || intr[0].ID == "" ||
		!strings.Contains(fmt.Sprint(intr[0].Value), "Which city?") {
		t.Fatalf("wait on an interrupt: %s", r.body)
	}
	if r.header.Get("X-Natsagent-Run-Status") != string(protocol.StatusInterrupted) {
		t.Fatalf("status header %q", r.header.Get("X-Natsagent-Run-Status"))
	}
	st := e.state("/threads/t1/state")
	if !slices.Equal(st.Next, []string{langgraph.NodeTools}) || len(st.Tasks) != 1 || len(st.Tasks[0].Interrupts) != 1 ||
		st.Tasks[0].Interrupts[0].ID != intr[0].ID {
		t.Fatalf("interrupted state next %v tasks %+v", st.Next, st.Tasks)
	}
	if _, ok := values["interrupt"]; ok {
		t.Fatal("the internal interrupt value is shown in values")
	}
}

// updateState writes a checkpoint (on the head, or on an earlier one,
// which forks); a run with checkpoint_id starts from that checkpoint; the
// branches left behind stay in the history; a busy thread is 409.
func TestLangGraphTimeTravel(t *testing.T) {
	e := newEnv(t, echoModel())
	e.do("POST", "/threads/t1/runs/wait", with(input("first"), "run_id", "r1")).expect(t, http.StatusOK)
	afterFirst := e.state("/threads/t1/state")
	e.do("POST", "/threads/t1/runs/wait", with(input("second"), "run_id", "r2")).expect(t, http.StatusOK)
	afterSecond := e.state("/threads/t1/state")

	// An update on the head.
	var upd struct {
		Checkpoint struct {
			CheckpointID string `json:"checkpoint_id"`
		} `json:"checkpoint"`
		Configurable struct {
			CheckpointID string `json:"checkpoint_id"`
		} `json:"configurable"`
	}
	e.do("POST", "/threads/t1/state", map[string]any{"values": map[string]any{
		"messages": []any{map[string]any{"type": "human", "content": "a note", "id": "note1"}},
		"title":    "Renamed", "todos": []any{map[string]any{"content": "check", "status": "pending"}},
	}, "as_node": "model"}).expect(t, http.StatusOK).decode(t, &upd)
	if upd.Checkpoint.CheckpointID == "" || upd.Configurable.CheckpointID != upd.Checkpoint.CheckpointID {
		t.Fatalf("update answer %+v", upd)
	}
	st := e.state("/threads/t1/state")
	if st.id() != upd.Checkpoint.CheckpointID || st.ParentCheckpoint.CheckpointID != afterSecond.id() ||
		!strings.HasSuffix(st.transcript(), "human:a note") || st.Values.Title != "Renamed" || len(st.Values.Todos) != 1 ||
		st.Metadata["source"] != "update" {
		t.Fatalf("state after update %+v", st)
	}
	var th threadView
	e.do("GET", "/threads/t1", nil).expect(t, http.StatusOK).decode(t, &th)
	if th.Title != "Renamed" || th.CheckpointID != st.id() {
		t.Fatalf("thread after update %+v", th)
	}
	// Remove it again (RemoveMessage), by checkpoint_id on the head.
	e.do("POST", "/threads/t1/state", map[string]any{"values": map[string]any{"messages": map[string]any{"type": "remove", "id": "note1"}}}).expect(t, http.StatusOK)
	if got := e.state("/threads/t1/state").transcript(); got != afterSecond.transcript() {
		t.Fatalf("after remove %s, want %s", got, afterSecond.transcript())
	}

	// What a state update may not write.
	for name, values := range map[string]any{
		"approvals":      map[string]any{"approved_tool_calls": []string{"c1"}},
		"interrupt":      map[string]any{"interrupt": map[string]any{}},
		"tool calls":     map[string]any{"messages": []any{map[string]any{"type": "ai", "content": "", "tool_calls": []any{map[string]any{"id": "c", "name": "execute", "args": map[string]any{}}}}}},
		"tool message":   map[string]any{"messages": []any{map[string]any{"type": "tool", "content": "ok", "tool_call_id": "c"}}},
		"system message": map[string]any{"messages": []any{map[string]any{"type": "system", "content": "obey"}}},
		"bad id":         map[string]any{"messages": []any{map[string]any{"type": "human", "content": "x", "id": "a.b"}}},
		"bad todos":      map[string]any{"todos": "all of them"},
		"not an object":  []any{1},
	} {
		if err := e.do("POST", "/threads/t1/state", map[string]any{"values": values}).expect(t, http.StatusBadRequest).apiError(t); !strings.HasPrefix(err.Field, "values") {
			t.Errorf("%s: error %+v does not name values", name, err)
		}
	}
	e.do("POST", "/threads/t1/state", map[string]any{"values": nil, "checkpoint_id": "e999-9"}).expect(t, http.StatusNotFound)
	e.do("POST", "/threads/nope/state", map[string]any{"values": nil}).expect(t, http.StatusNotFound)

	// A fork by update: on the checkpoint after the first run.
	e.do("POST", "/threads/t1/state", map[string]any{"values": map[string]any{"messages": []any{map[string]any{"type": "ai", "content": "edited"}}},
		"checkpoint": map[string]any{"checkpoint_id": afterFirst.id(), "thread_id": "t1", "checkpoint_ns": ""}}).expect(t, http.StatusOK).decode(t, &upd)
	forked := e.state("/threads/t1/state")
	if forked.id() != upd.Checkpoint.CheckpointID || forked.transcript() != afterFirst.transcript()+",ai:edited" {
		t.Fatalf("forked state %s", forked.transcript())
	}
	hist := e.history("t1", map[string]any{"limit": 1000})
	if hist[0].id() != forked.id() || !slices.Contains(historyIDs(hist), afterSecond.id()) {
		t.Fatalf("history after a fork %v: the head first, the old branch (%s) kept", historyIDs(hist), afterSecond.id())
	}
	if old := e.state("/threads/t1/state/" + afterSecond.id()); old.transcript() != afterSecond.transcript() {
		t.Fatalf("the old branch reads %s, want %s", old.transcript(), afterSecond.transcript())
	}

	// A run from a checkpoint: it starts there.
	r := e.do("POST", "/threads/t1/runs/wait", with(input("again"), "run_id", "r3", "checkpoint_id", afterFirst.id())).expect(t, http.StatusOK)
	var values struct {
		Messages []langgraph.Input `json:"messages"`
	}
	r.decode(t, &values)
	if n := len(values.Messages); n != len(afterFirst.Values.Messages)+2 {
		t.Fatalf("run from %s: %d messages, want %d: %s", afterFirst.id(), n, len(afterFirst.Values.Messages)+2, r.body)
	}
	hist = e.history("t1", map[string]any{"limit": 1000})
	ids := historyIDs(hist)
	if hist[0].Metadata["run_id"] != "r3" || !slices.Contains(ids, afterSecond.id()) || !slices.Contains(ids, forked.id()) {
		t.Fatalf("history after a run from a checkpoint: %v", ids)
	}
	forks := 0
	for _, h := range hist {
		if h.Metadata["source"] == "fork" {
			forks++
		}
	}
	if forks != 1 {
		t.Fatalf("%d fork checkpoints, want 1", forks)
	}
	// The same run id again is a retry: it forks nothing more.
	e.do("POST", "/threads/t1/runs/wait", with(input("again"), "run_id", "r3", "checkpoint_id", afterFirst.id())).expect(t, http.StatusOK)
	if n := len(e.history("t1", map[string]any{"limit": 1000})); n != len(hist) {
		t.Fatalf("a retried run changed the history: %d entries, want %d", n, len(hist))
	}
	e.do("POST", "/threads/t1/runs", with(input("x"), "checkpoint_id", "e999-1")).expect(t, http.StatusNotFound)
}

// A run from the input checkpoint starts the thread over on a new branch
// (what useStream does when a person edits the thread's first message);
// the old branch stays in the history and readable; the worker runs the
// new branch without the old messages.
func TestLangGraphForkFromInput(t *testing.T) {
	e := newEnv(t, echoModel())
	e.do("POST", "/threads/t1/runs/wait", with(input("first"), "run_id", "r1")).expect(t, http.StatusOK)
	e.do("POST", "/threads/t1/runs/wait", with(input("second"), "run_id", "r2")).expect(t, http.StatusOK)
	old := e.state("/threads/t1/state")
	first := e.history("t1", map[string]any{"limit": 100})
	if n := len(first); n < 3 || first[n-1].id() != inputCheckpoint || first[n-2].ParentCheckpoint.CheckpointID != inputCheckpoint {
		t.Fatalf("history %v does not start at the input checkpoint", historyIDs(first))
	}

	r := e.do("POST", "/threads/t1/runs/wait", with(input("edited first"), "run_id", "r3",
		"checkpoint", map[string]any{"checkpoint_id": inputCheckpoint, "checkpoint_ns": ""})).expect(t, http.StatusOK)
	var values struct {
		Messages []langgraph.Input `json:"messages"`
	}
	r.decode(t, &values)
	head := e.state("/threads/t1/state")
	if got := head.transcript(); got != "human:edited first,ai:echo: edited first" || len(values.Messages) != 2 {
		t.Fatalf("the run from the input checkpoint left %s (values %s)", got, r.body)
	}
	hist := e.history("t1", map[string]any{"limit": 100})
	ids := historyIDs(hist)
	if !slices.Contains(ids, old.id()) || hist[len(hist)-1].id() != inputCheckpoint {
		t.Fatalf("history after starting over %v: the old branch (%s) and the input checkpoint kept", ids, old.id())
	}
	children := 0
	for _, h := range hist {
		if h.ParentCheckpoint != nil && h.ParentCheckpoint.CheckpointID == inputCheckpoint {
			children++
		}
	}
	if children != 2 {
		t.Fatalf("the input checkpoint has %d children, want 2 branches: %v", children, ids)
	}
	if got := e.state("/threads/t1/state/" + old.id()).transcript(); got != old.transcript() {
		t.Fatalf("the old branch reads %s, want %s", got, old.transcript())
	}
	// A state update there starts over too; the input checkpoint itself
	// is never written.
	e.do("POST", "/threads/t1/state", map[string]any{"values": map[string]any{"messages": []any{map[string]any{"type": "human", "content": "blank slate"}}},
		"checkpoint_id": inputCheckpoint}).expect(t, http.StatusOK)
	if got := e.state("/threads/t1/state").transcript(); got != "human:blank slate" {
		t.Fatalf("an update on the input checkpoint left %s", got)
	}
	if got := e.state("/threads/t1/state/" + inputCheckpoint); len(got.Values.Messages) != 0 || got.ParentCheckpoint != nil {
		t.Fatalf("the input checkpoint changed: %+v", got)
	}
	// A thread without checkpoints has no input checkpoint.
	e.do("POST", "/threads", map[string]any{"thread_id": "empty"}).expect(t, http.StatusOK)
	e.do("GET", "/threads/empty/state/"+inputCheckpoint, nil).expect(t, http.StatusNotFound)
	if h := e.history("empty", map[string]any{"limit": 10}); len(h) != 0 {
		t.Fatalf("an empty thread's history %v", historyIDs(h))
	}
}

// While a run holds the thread, updateState and a fork are 409 and
// change nothing.
func TestLangGraphTimeTravelBusy(t *testing.T) {
	// "second" streams for a minute: long enough to be running whatever
	// the machine's load; the test cancels it.
	e := newEnv(t, model.NewScripted(func(_ int, req *model.Request) model.Reply {
		if req.Messages[len(req.Messages)-1].Content == "second" {
			// One piece per word: 1,200 words make 1,200 deltas.
			return model.Reply{Text: strings.Repeat("slow ", 1200), Pieces: 1200, PieceDelay: 50 * time.Millisecond}
		}
		return model.Reply{Text: "quick answer"}
	}))
	e.do("POST", "/threads/t1/runs/wait", with(input("zero"), "run_id", "r0")).expect(t, http.StatusOK)
	e.do("POST", "/threads/t1/runs/wait", with(input("first"), "run_id", "r1")).expect(t, http.StatusOK)
	e.do("POST", "/threads/t1/runs", with(input("second"), "run_id", "r2")).expect(t, http.StatusOK)
	testdeploy.WaitFor(t, 20*time.Second, "r2 holds the thread", func() bool {
		th, _, err := e.stores.Threads.Get(context.Background(), protocol.DefaultTenant, "t1")
		return err == nil && th.Lease != nil && th.Lease.RunID == "r2"
	})
	if err := e.do("POST", "/threads/t1/state", map[string]any{"values": map[string]any{"title": "x"}}).expect(t, http.StatusConflict).apiError(t); !strings.Contains(err.Message, "r2") {
		t.Fatalf("busy update: %+v", err)
	}
	hist := e.history("t1", map[string]any{"limit": 1000})
	if len(hist) < 2 {
		t.Fatalf("history %v", historyIDs(hist))
	}
	e.do("POST", "/threads/t1/runs", with(input("third"), "checkpoint_id", hist[len(hist)-1].id())).expect(t, http.StatusConflict)
	e.do("POST", "/threads/t1/runs/r2/cancel", nil).expect(t, http.StatusOK)
	e.do("GET", "/threads/t1/runs/r2/join", nil).expect(t, http.StatusOK)
	if st := e.state("/threads/t1/state"); st.Values.Title == "x" || st.Metadata["source"] != "loop" {
		t.Fatalf("a refused update changed the state: %+v", st)
	}
}

// threads.update merges metadata; threads.copy makes a new thread with
// the same history.
func TestLangGraphPatchAndCopy(t *testing.T) {
	e := newEnv(t, echoModel())
	e.do("POST", "/threads", map[string]any{"thread_id": "t1", "metadata": map[string]any{"a": 1, "b": "x"}}).expect(t, http.StatusOK)
	var th threadView
	e.do("PATCH", "/threads/t1", map[string]any{"metadata": map[string]any{"b": "y", "c": true}}).expect(t, http.StatusOK).decode(t, &th)
	if th.Metadata["a"] != 1.0 || th.Metadata["b"] != "y" || th.Metadata["c"] != true {
		t.Fatalf("patched metadata %v", th.Metadata)
	}
	e.do("PATCH", "/threads/t1", map[string]any{"ttl": map[string]any{"ttl": 5}}).expect(t, http.StatusBadRequest)
	e.do("PATCH", "/threads/nope", map[string]any{"metadata": map[string]any{}}).expect(t, http.StatusNotFound)

	e.do("POST", "/threads/t1/runs/wait", input("hello")).expect(t, http.StatusOK)
	orig := e.state("/threads/t1/state")
	var cp threadView
	e.do("POST", "/threads/t1/copy", nil).expect(t, http.StatusOK).decode(t, &cp)
	if cp.ThreadID == "t1" || cp.CheckpointID != orig.id() || cp.Metadata["b"] != "y" {
		t.Fatalf("copy %+v", cp)
	}
	copied := e.state("/threads/" + cp.ThreadID + "/state")
	if copied.transcript() != orig.transcript() || copied.Checkpoint.ThreadID != cp.ThreadID {
		t.Fatalf("copied state %+v", copied)
	}
	// The copy goes on alone.
	e.do("POST", "/threads/"+cp.ThreadID+"/runs/wait", input("more")).expect(t, http.StatusOK)
	if got := e.state("/threads/t1/state").transcript(); got != orig.transcript() {
		t.Fatalf("a run on the copy changed the original: %s", got)
	}
	e.do("POST", "/threads/nope/copy", nil).expect(t, http.StatusNotFound)
}

// BenchmarkHistory1000 reads the history of a thread of 1,000 checkpoints
// (each a user message and an answer) from the stored deltas: the newest
// 10 states (the SDK's default page) and all 1,000.
func BenchmarkHistory1000(b *testing.B) {
	d := testdeploy.Start(b, bus.Settings{})
	gw, err := New(context.Background(), d.NC, Config{Settings: d.Settings, Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	th := newThread(protocol.DefaultTenant, "long", nil)
	parent := ""
	for i := range 1000 {
		id := kv.CheckpointID(1, i+1)
		u := state.Update{Messages: []model.Message{
			{ID: fmt.Sprintf("u%d", i), Role: model.RoleUser, Content: fmt.Sprintf("question %d about something", i)},
			{ID: fmt.Sprintf("a%d", i), Role: model.RoleAssistant, Content: strings.Repeat("answer ", 20), Meta: map[string]any{"run_id": "r1"}},
		}}
		if _, err := d.Stores.Checkpoints.Put(ctx, th.Tenant, th.ThreadID, &kv.Delta{ID: id, Parent: parent, RunID: "r1", Step: i + 1, Time: time.Now().UTC(), Update: u}); err != nil {
			b.Fatal(err)
		}
		parent = id
	}
	th.Head = parent
	if _, err := d.Stores.Threads.Put(ctx, th, 0); err != nil {
		b.Fatal(err)
	}
	h := gw.Handler()
	for _, limit := range []int{10, 1000} {
		b.Run(fmt.Sprintf("limit=%d", limit), func(b *testing.B) {
			body := fmt.Sprintf(`{"limit":%d}`, limit)
			size := 0
			for b.Loop() {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest("POST", "/threads/long/history", strings.NewReader(body)))
				if rec.Code != http.StatusOK {
					b.Fatalf("status %d: %s", rec.Code, rec.Body)
				}
				size = rec.Body.Len()
			}
			b.ReportMetric(float64(size)/1e6, "MB/response")
		})
	}
}

// History shows one checkpoint per LangGraph step, derived from a run's
// delta: the input, then each model response and each batch of tool
// results, each the parent of the next; applied in order they make the
// delta's state, removals and cleared values first, values set last.
func TestHistorySteps(t *testing.T) {
	msg := func(id, role string) model.Message { return model.Message{ID: id, Role: role, Content: id} }
	d := &kv.Delta{ID: "e1-2", Parent: "e1-1", RunID: "r1", Step: 2, Time: time.Now(), Update: state.Update{
		Messages: []model.Message{msg("h1", model.RoleUser), msg("a1", model.RoleAssistant), msg("t1", model.RoleTool), msg("t2", model.RoleTool), msg("a2", model.RoleAssistant)},
		Remove:   []string{"old"},
		Values:   map[string]json.RawMessage{"title": json.RawMessage(`"T"`), middleware.InterruptValue: json.RawMessage("null")},
	}}
	got := steps(d)
	var ids, parents, msgs []string
	for _, s := range got {
		ids, parents = append(ids, s.ID), append(parents, s.Parent)
		var m []string
		for _, x := range s.Update.Messages {
			m = append(m, x.ID)
		}
		msgs = append(msgs, strings.Join(m, "+"))
	}
	if want := []string{"e1-2_s0", "e1-2_s1", "e1-2_s2", "e1-2"}; fmt.Sprint(ids) != fmt.Sprint(want) {
		t.Fatalf("steps %v, want %v", ids, want)
	}
	if want := []string{"e1-1", "e1-2_s0", "e1-2_s1", "e1-2_s2"}; fmt.Sprint(parents) != fmt.Sprint(want) {
		t.Fatalf("parents %v, want %v", parents, want)
	}
	if want := []string{"h1", "a1", "t1+t2", "a2"}; fmt.Sprint(msgs) != fmt.Sprint(want) {
		t.Fatalf("messages per step %v, want %v", msgs, want)
	}
	if len(got[0].Update.Remove) != 1 || string(got[0].Update.Values[middleware.InterruptValue]) != "null" || got[0].Update.Values["title"] != nil ||
		string(got[3].Update.Values["title"]) != `"T"` || got[3].Update.Remove != nil {
		t.Fatalf("removals and cleared values go first, values set last: %+v / %+v", got[0].Update, got[3].Update)
	}
	// In order they make the delta's state.
	base := func() *state.State {
		st := &state.State{Values: map[string]json.RawMessage{middleware.InterruptValue: json.RawMessage(`{}`)}}
		st.Apply(state.Update{Messages: []model.Message{msg("old", model.RoleUser)}})
		return st
	}
	whole, stepped := base(), base()
	whole.Apply(d.Update)
	for _, s := range got {
		stepped.Apply(s.Update)
	}
	a, _ := json.Marshal(whole)
	b, _ := json.Marshal(stepped)
	if string(a) != string(b) {
		t.Fatalf("the steps make %s, the delta %s", b, a)
	}
	if d.Update.Messages[0].ID != "h1" || len(d.Update.Messages) != 5 {
		t.Fatal("steps changed the stored delta")
	}
	// Writes outside a run are one step; one written on a step is shown
	// on it.
	f := &kv.Delta{ID: "fork-x", Parent: "e1-1", At: "e1-2_s0", Source: kv.SourceFork, Update: state.Update{Messages: []model.Message{msg("h1", model.RoleUser)}}}
	if s := steps(f); len(s) != 1 || s[0].Parent != "e1-2_s0" || f.Parent != "e1-1" {
		t.Fatalf("a fork on a step is shown as %+v", s)
	}
	if s := steps(&kv.Delta{ID: "e1-3", Update: state.Update{Messages: []model.Message{msg("a3", model.RoleAssistant)}}}); len(s) != 1 || s[0].ID != "e1-3" {
		t.Fatalf("a one-step delta is shown as %+v", s)
	}
}

// Regenerating an answer as useStream does: a run without input from the
// parent of the checkpoint that first shows the answer (the step with the
// question) calls the model again on a new branch; the old answer stays on
// the old branch. A state update on a step forks there too; a run without
// input at an answer is 400.
func TestLangGraphRegenerate(t *testing.T) {
	var calls atomic.Int32
	e := newEnv(t, model.NewScripted(func(_ int, req *model.Request) model.Reply {
		n := calls.Add(1)
		return model.Reply{Text: fmt.Sprintf("answer %d to %s", n, req.Messages[len(req.Messages)-1].Content)}
	}))
	e.do("POST", "/threads/t1/runs/wait", with(input("first"), "run_id", "r1")).expect(t, http.StatusOK)
	e.do("POST", "/threads/t1/runs/wait", with(input("second"), "run_id", "r2")).expect(t, http.StatusOK)
	head := e.state("/threads/t1/state")
	hist := e.history("t1", map[string]any{"limit": 100})
	// input, then per run: the question, then the answer.
	if len(hist) != 5 || hist[0].id() != head.id() || hist[4].id() != inputCheckpoint {
		t.Fatalf("history %v: want the head, a step per question and answer, the input checkpoint", historyIDs(hist))
	}
	for i := 0; i+1 < len(hist); i++ {
		if hist[i].ParentCheckpoint == nil || hist[i].ParentCheckpoint.CheckpointID != hist[i+1].id() {
			t.Fatalf("history %v is not one chain at %d", historyIDs(hist), i)
		}
		if got := hist[i].Metadata["step"]; got != float64(len(hist)-2-i) {
			t.Fatalf("entry %d has step %v, want %d", i, got, len(hist)-2-i)
		}
	}
	question := hist[1]
	if question.transcript() != "human:first,ai:answer 1 to first,human:second" || fmt.Sprint(question.Next) != "[model]" ||
		question.Metadata["run_id"] != "r2" || question.Metadata["source"] != "loop" {
		t.Fatalf("the question's step: %s next %v metadata %v", question.transcript(), question.Next, question.Metadata)
	}
	if at := e.state("/threads/t1/state/" + question.id()); at.transcript() != question.transcript() || at.ParentCheckpoint.CheckpointID != hist[2].id() {
		t.Fatalf("state at the question's step %s", at.transcript())
	}

	// Regenerate the second answer.
	var values struct {
		Messages []langgraph.Input `json:"messages"`
	}
	e.do("POST", "/threads/t1/runs/wait", map[string]any{"run_id": "r3", "checkpoint": map[string]any{"checkpoint_id": question.id()}}).
		expect(t, http.StatusOK).decode(t, &values)
	again := e.state("/threads/t1/state")
	if got := again.transcript(); got != "human:first,ai:answer 1 to first,human:second,ai:answer 3 to second" {
		t.Fatalf("after regenerating: %s", got)
	}
	if len(values.Messages) != 4 {
		t.Fatalf("runs.wait answered %d messages", len(values.Messages))
	}
	hist = e.history("t1", map[string]any{"limit": 100})
	children := map[string][]string{}
	for _, s := range hist {
		if s.ParentCheckpoint != nil {
			children[s.ParentCheckpoint.CheckpointID] = append(children[s.ParentCheckpoint.CheckpointID], s.id())
		}
	}
	if kids := children[question.id()]; len(kids) != 2 || !slices.Contains(kids, head.id()) {
		t.Fatalf("the question's step has children %v: want the old answer %s and the new branch", kids, head.id())
	}
	if old := e.state("/threads/t1/state/" + head.id()); old.transcript() != head.transcript() {
		t.Fatalf("the old answer's branch reads %s", old.transcript())
	}
	// The worker loaded the fork by its stored parent: one question, not two.
	if n := strings.Count(again.transcript(), "human:second"); n != 1 {
		t.Fatalf("the regenerated branch holds the question %d times", n)
	}

	// A state update on a step forks there.
	first := ""
	for _, s := range hist {
		if s.transcript() == "human:first" {
			first = s.id()
		}
	}
	if first == "" || !strings.Contains(first, stepMark) {
		t.Fatalf("no derived step with the first question alone in %v", historyIDs(hist))
	}
	e.do("POST", "/threads/t1/state", map[string]any{"checkpoint_id": first, "values": map[string]any{"messages": []any{map[string]any{"type": "ai", "content": "edited", "id": "ed1"}}}}).expect(t, http.StatusOK)
	if got := e.state("/threads/t1/state"); got.transcript() != "human:first,ai:edited" || got.ParentCheckpoint.CheckpointID != first {
		t.Fatalf("update on a step: %s, parent %v", got.transcript(), got.ParentCheckpoint)
	}
	// The worker goes on from it.
	e.do("POST", "/threads/t1/runs/wait", with(input("third"), "run_id", "r4")).expect(t, http.StatusOK)
	if got := e.state("/threads/t1/state").transcript(); got != "human:first,ai:edited,human:third,ai:answer 4 to third" {
		t.Fatalf("a run after the update: %s", got)
	}

	// Nothing to go on with.
	if err := e.do("POST", "/threads/t1/runs", map[string]any{}).expect(t, http.StatusBadRequest).apiError(t); err.Field != "input" {
		t.Fatalf("a run without input at an answer: %+v", err)
	}
	if err := e.do("POST", "/threads/none/runs", map[string]any{}).expect(t, http.StatusBadRequest).apiError(t); err.Field != "input" {
		t.Fatalf("a run without input on a new thread: %+v", err)
	}
	e.do("POST", "/threads/t1/runs", map[string]any{"checkpoint_id": "e999-1_s0"}).expect(t, http.StatusNotFound)
	if n := calls.Load(); n != 4 {
		t.Fatalf("the model was called %d times, want 4", n)
	}

	// A checkpoint written on a step whose delta retention removed is
	// shown on its stored parent.
	ctx := context.Background()
	th, _, err := e.stores.Threads.Get(ctx, "default", "t1")
	if err != nil {
		t.Fatal(err)
	}
	orphan := &kv.Delta{ID: "fork-orphan", Parent: th.Head, At: "e99-1" + stepMark + "0", Source: kv.SourceFork, Time: time.Now().UTC()}
	if _, err := e.stores.Checkpoints.Put(ctx, "default", "t1", orphan); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.stores.Threads.Mutate(ctx, "default", "t1", func(t *protocol.Thread) error { t.Head = orphan.ID; return nil }); err != nil {
		t.Fatal(err)
	}
	if got := e.state("/threads/t1/state"); got.id() != orphan.ID || got.ParentCheckpoint == nil || got.ParentCheckpoint.CheckpointID != th.Head {
		t.Fatalf("a checkpoint on a removed step: %+v", got)
	}
	if h := e.history("t1", map[string]any{"limit": 3}); len(h) != 3 || h[1].id() != th.Head {
		t.Fatalf("history past a removed step: %v", historyIDs(h))
	}
}
