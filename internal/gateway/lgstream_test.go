package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/tools"
)

func eventNames(evs []sseEvent) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = ev.event
	}
	return out
}

func only(evs []sseEvent, name string) []sseEvent {
	var out []sseEvent
	for _, ev := range evs {
		if ev.event == name {
			out = append(out, ev)
		}
	}
	return out
}

// lgMessages decodes the messages of a values part.
func lgMessages(t *testing.T, ev sseEvent) []map[string]any {
	t.Helper()
	var v struct {
		Messages []map[string]any `json:"messages"`
	}
	if err := json.Unmarshal([]byte(ev.data), &v); err != nil {
		t.Fatalf("values %s: %v", ev.data, err)
	}
	return v.Messages
}

// TestLangGraphStreamModes streams a run over real SSE in LangGraph's
// modes: metadata first, values after each step ending with the stored
// answer, message chunks that concatenate to it, updates by node, and
// the end.
func TestLangGraphStreamModes(t *testing.T) {
	e := newEnv(t, textModel("one two three four", 4, 0))
	s := e.openLangGraphStream("POST", "/threads/t1/runs/stream", with(input("hi"), "run_id", "r1",
		"stream_mode", []string{"values", "messages-tuple", "updates", "custom"}))
	if loc := s.resp.Header.Get("Location"); loc != "/threads/t1/runs/r1/stream?stream_mode=values&stream_mode=messages-tuple&stream_mode=updates&stream_mode=custom" {
		t.Fatalf("Location %q", loc)
	}
	evs := s.rest(10 * time.Second)
	names := eventNames(evs)
	if names[0] != "metadata" || names[len(names)-1] != "end" {
		t.Fatalf("events %v: want metadata first and end last", names)
	}
	var md map[string]any
	_ = json.Unmarshal([]byte(evs[0].data), &md)
	if md["run_id"] != "r1" || md["thread_id"] != "t1" || md["attempt"] != 1.0 {
		t.Fatalf("metadata %v", md)
	}
	for _, n := range names {
		if !slices.Contains([]string{"metadata", "values", "messages", "updates", "custom", "end"}, n) {
			t.Fatalf("event %q in %v: a native event leaked", n, names)
		}
	}
	values := only(evs, "values")
	if len(values) < 2 {
		t.Fatalf("values %d, want the input's and the answer's", len(values))
	}
	first := lgMessages(t, values[0])
	if len(first) != 1 || first[0]["type"] != "human" || first[0]["content"] != "hi" {
		t.Fatalf("first values %v, want the input", first)
	}
	last := lgMessages(t, values[len(values)-1])
	answer := last[len(last)-1]
	if answer["type"] != "ai" || answer["content"] != "one two three four" || last[0]["id"] != first[0]["id"] {
		t.Fatalf("last values %v, want the input (same id) and the answer", last)
	}
	// The chunks of the answer concatenate to it, under its id.
	var text strings.Builder
	for _, ev := range only(evs, "messages") {
		var pair []json.RawMessage
		if err := json.Unmarshal([]byte(ev.data), &pair); err != nil || len(pair) != 2 {
			t.Fatalf("messages %s", ev.data)
		}
		var c struct {
			Type, ID, Content string
		}
		var meta map[string]any
		_ = json.Unmarshal(pair[0], &c)
		_ = json.Unmarshal(pair[1], &meta)
		if c.Type != "AIMessageChunk" || c.ID != answer["id"] || meta["langgraph_node"] != "model" || meta["run_id"] != "r1" {
			t.Fatalf("chunk %s", ev.data)
		}
		text.WriteString(c.Content)
	}
	if text.String() != "one two three four" {
		t.Fatalf("chunks concatenate to %q", text.String())
	}
	if len(only(evs, "messages")) < 2 {
		t.Fatalf("%d chunks, want the streamed deltas", len(only(evs, "messages")))
	}
	var sawModel bool
	for _, ev := range only(evs, "updates") {
		var u map[string]json.RawMessage
		_ = json.Unmarshal([]byte(ev.data), &u)
		if _, ok := u["model"]; ok {
			sawModel = true
		}
	}
	if !sawModel {
		t.Fatalf("no model update in %v", only(evs, "updates"))
	}
	// The end carries the id of run.finished: a resume after it is empty.
	end := evs[len(evs)-1]
	if end.id == "" {
		t.Fatal("end has no id")
	}
	if got := e.openLangGraphStream("GET", "/threads/t1/runs/r1/stream", nil, "Last-Event-ID", end.id).rest(5 * time.Second); len(got) != 0 {
		t.Fatalf("resumed after the end: %v", eventNames(got))
	}
}

// TestLangGraphStreamDefaultAndResume: without stream_mode a stream
// sends values, as LangGraph does; a join resumed after a values event
// sends what followed it, and the same final values.
func TestLangGraphStreamDefaultAndResume(t *testing.T) {
	e := newEnv(t, echoModel())
	evs := e.openLangGraphStream("POST", "/threads/t1/runs/stream", with(input("hello"), "run_id", "r1")).rest(10 * time.Second)
	names := eventNames(evs)
	for _, n := range names {
		if n != "metadata" && n != "values" && n != "end" {
			t.Fatalf("default stream %v", names)
		}
	}
	values := only(evs, "values")
	last := lgMessages(t, values[len(values)-1])
	if got := last[len(last)-1]; got["content"] != "echo: hello" {
		t.Fatalf("last values %v", last)
	}
	// Joined from the start with useStream's -1, the same values.
	again := e.openLangGraphStream("GET", "/threads/t1/runs/r1/stream", nil, "Last-Event-ID", "-1").rest(5 * time.Second)
	// (The title is live, so a replay learns it from the final values.)
	if a, b := only(again, "values"), values; len(a) < 2 || a[len(a)-1].data != b[len(b)-1].data {
		t.Fatalf("joined values %v, want %v", again, values)
	}
	// Resumed after the first values event that has an id.
	k := slices.IndexFunc(evs, func(ev sseEvent) bool { return ev.event == "values" && ev.id != "" })
	rest := e.openLangGraphStream("GET", "/threads/t1/runs/r1/stream?stream_mode=values", nil, "Last-Event-ID", evs[k].id).rest(5 * time.Second)
	// What follows the input's values: values with the answer (the last
	// as before; a live title may add one), then the end.
	got := eventNames(rest)
	if len(got) < 2 || got[len(got)-1] != "end" || slices.Contains(got, "metadata") {
		t.Fatalf("resumed %v, want values then end", got)
	}
	for _, ev := range only(rest, "values") {
		if msgs := lgMessages(t, ev); len(msgs) != 2 {
			t.Fatalf("resumed values %s, want the answer in it", ev.data)
		}
	}
	if rest[len(rest)-2].data != values[len(values)-1].data {
		t.Fatalf("resumed final values %s, want %s", rest[len(rest)-2].data, values[len(values)-1].data)
	}
	// Native events on request.
	native := e.openLangGraphStream("GET", "/threads/t1/runs/r1/stream?stream_mode=natsagent", nil).rest(5 * time.Second)
	if native[0].event != "run.queued" || native[len(native)-1].event != "run.finished" {
		t.Fatalf("natsagent mode %v", eventNames(native))
	}
	e.do("GET", "/threads/t1/runs/r1/stream?stream_mode=valuez", nil).expect(t, http.StatusBadRequest)
	e.do("GET", "/threads/t1/runs/r1/stream?stream_mode=natsagent&stream_mode=values", nil).expect(t, http.StatusBadRequest)
	e.do("POST", "/threads/t1/runs/stream", with(input("x"), "stream_mode", 3)).expect(t, http.StatusBadRequest)
}

// TestLangGraphStreamError: a run that fails ends with error, then end.
func TestLangGraphStreamError(t *testing.T) {
	e := newEnv(t, sdkModel())
	evs := e.openLangGraphStream("POST", "/threads/t1/runs/stream", with(input("break it"), "stream_mode", "updates")).rest(10 * time.Second)
	names := eventNames(evs)
	if len(names) < 3 || names[len(names)-2] != "error" || names[len(names)-1] != "end" {
		t.Fatalf("events %v, want error then end", names)
	}
	var d map[string]any
	_ = json.Unmarshal([]byte(evs[len(evs)-2].data), &d)
	if d["error"] != "RunError" || !strings.Contains(d["message"].(string), "broken") {
		t.Fatalf("error %v", d)
	}
}

// TestLangGraphStreamInterrupt: a run that asks a person shows
// __interrupt__ in values and updates.
func TestLangGraphStreamInterrupt(t *testing.T) {
	e := newEnv(t, sdkModel())
	evs := e.openLangGraphStream("POST", "/threads/t1/runs/stream", with(input("ask me"), "stream_mode", []string{"values", "updates"})).rest(10 * time.Second)
	values := only(evs, "values")
	var in map[string]json.RawMessage
	_ = json.Unmarshal([]byte(values[len(values)-1].data), &in)
	if len(in) != 1 || in["__interrupt__"] == nil || !strings.Contains(string(in["__interrupt__"]), "Which city?") {
		t.Fatalf("last values %s, want the interrupt alone", values[len(values)-1].data)
	}
	if ups := only(evs, "updates"); !strings.Contains(ups[len(ups)-1].data, "__interrupt__") {
		t.Fatalf("updates %v", ups)
	}
}

// spawnTool stands for the subagent tool: it makes an existing run of
// another thread ("child1" on "kid") its child, as the subagent service
// records one, and names it as subagent.started does. With stranger set,
// it names "stranger" (no child of the run) first.
type spawnTool struct {
	runs     *kv.Runs
	stranger bool
}

func (spawnTool) Spec() model.ToolSpec {
	return model.ToolSpec{Name: "spawn", Description: "test", Parameters: json.RawMessage(`{"type":"object"}`)}
}

func (st spawnTool) Call(ctx context.Context, c *tools.Call) (*tools.Result, error) {
	_, _, err := st.runs.Mutate(ctx, c.Env.Tenant, "child1", func(r *protocol.Run) error {
		r.Parent = &protocol.Parent{RunID: c.Env.Run, ThreadID: c.Env.Thread, ToolCallID: c.ID}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if st.stranger {
		c.Env.Emit("subagent.started", map[string]any{"run_id": "stranger", "thread_id": "other", "subagent": "researcher", "tool_call_id": c.ID, "status": "running"})
	}
	c.Env.Emit("subagent.started", map[string]any{"run_id": "child1", "thread_id": "kid", "subagent": "researcher", "tool_call_id": c.ID, "status": "running"})
	c.Env.Emit("subagent.finished", map[string]any{"run_id": "child1", "thread_id": "kid", "subagent": "researcher", "tool_call_id": c.ID, "status": "success"})
	return tools.Text("child answer"), nil
}

// TestLangGraphStreamSubgraphs: with stream_subgraphs, a subagent run's
// parts come namespaced "<mode>|tools:<tool_call_id>", as the SDK
// splits them; without it, none.
func TestLangGraphStreamSubgraphs(t *testing.T) {
	m := model.NewScripted(func(_ int, req *model.Request) model.Reply {
		last := req.Messages[len(req.Messages)-1]
		switch {
		case last.Role == model.RoleUser && last.Content == "lead":
			return model.Reply{ToolCalls: []model.ToolCall{{ID: "call7", Name: "spawn", Arguments: `{}`}}}
		case last.Role == model.RoleTool:
			return model.Reply{Text: "lead done"}
		}
		return model.Reply{Text: "child says hi", Pieces: 3}
	})
	wd := &workdirs{m: map[string]*files.Memory{}}
	e := newEnvWith(t, nil, func(s *Server) { s.cfg.Files = wd.open })
	e.startFileWorker(m, wd, spawnTool{runs: e.stores.Runs, stranger: true})
	e.do("POST", "/threads/kid/runs/wait", with(input("child work"), "run_id", "child1")).expect(t, http.StatusOK)
	// "stranger" is a run of the tenant, but no child of the lead's.
	e.do("POST", "/threads/other/runs/wait", with(input("secret"), "run_id", "stranger")).expect(t, http.StatusOK)

	evs := e.openLangGraphStream("POST", "/threads/t1/runs/stream", with(input("lead"), "run_id", "lead1",
		"stream_mode", []string{"values", "messages-tuple"}, "stream_subgraphs", true)).rest(20 * time.Second)
	names := eventNames(evs)
	if names[len(names)-1] != "end" {
		t.Fatalf("events %v, want end last", names)
	}
	child := only(evs, "values|tools:call7")
	if len(child) == 0 || !slices.Contains(names, "messages|tools:call7") {
		t.Fatalf("events %v, want the child's values and messages namespaced", names)
	}
	last := lgMessages(t, child[len(child)-1])
	if got := last[len(last)-1]; got["content"] != "child says hi" || last[0]["content"] != "child work" {
		t.Fatalf("child values %v", last)
	}
	for _, ev := range evs {
		if strings.Contains(ev.event, "|") && ev.id != "" {
			t.Fatalf("a child's part %s has the id %s", ev.event, ev.id)
		}
		if strings.Contains(ev.data, "secret") {
			t.Fatalf("a run that is no child of the lead's was streamed: %s %s", ev.event, ev.data)
		}
	}
	lead := only(evs, "values")
	final := lgMessages(t, lead[len(lead)-1])
	if final[len(final)-1]["content"] != "lead done" || final[2]["type"] != "tool" {
		t.Fatalf("lead values %v", final)
	}
	// The tool message has its stored id from the step it came in.
	for _, ev := range lead {
		if msgs := lgMessages(t, ev); len(msgs) >= 3 && msgs[2]["id"] != final[2]["id"] {
			t.Fatalf("tool message id %v mid-run, %v after", msgs[2]["id"], final[2]["id"])
		}
	}

	// Without stream_subgraphs: the lead's parts only.
	evs = e.openLangGraphStream("GET", "/threads/t1/runs/lead1/stream?stream_mode=values", nil).rest(10 * time.Second)
	for _, n := range eventNames(evs) {
		if strings.Contains(n, "|") {
			t.Fatalf("a child's part %s without stream_subgraphs", n)
		}
	}
}
