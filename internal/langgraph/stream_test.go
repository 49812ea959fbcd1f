package langgraph

import (
	"context"
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
)

// fixedSource is a Source with given states.
type fixedSource struct {
	start, final *state.State
	starts       []int
}

func (f *fixedSource) Start(_ context.Context, attempt int, _ time.Time) (*state.State, error) {
	f.starts = append(f.starts, attempt)
	return f.start.Clone(), nil
}

func (f *fixedSource) Final(context.Context) (*state.State, error) { return f.final.Clone(), nil }

// events builds a run's native events: stored ones numbered from 1 (their
// SSE id is 100 + seq), live ones without an id.
type events struct {
	t   *testing.T
	seq int
	out []Native
}

func (e *events) add(typ string, live bool, attempt int, data any) {
	e.t.Helper()
	raw, err := json.Marshal(data)
	if err != nil {
		e.t.Fatal(err)
	}
	env := map[string]any{"v": 2, "type": typ, "run_id": "r1", "thread_id": "h1", "tenant": "default", "attempt": attempt, "time": time.Now(), "data": json.RawMessage(raw)}
	id := ""
	if live {
		env["live"] = true
	} else {
		e.seq++
		env["seq"] = e.seq
		id = strconv.Itoa(100 + e.seq)
	}
	b, _ := json.Marshal(env)
	e.out = append(e.out, Native{Data: b, ID: id})
}

// translate runs the events through a Stream.
func translate(t *testing.T, modes []string, src Source, evs []Native) []Part {
	t.Helper()
	m, err := ParseModes(modes, false)
	if err != nil {
		t.Fatal(err)
	}
	s := NewStream(m, Run{RunID: "r1", ThreadID: "h1", Agent: "chatbot"}, src, "interrupt")
	out := s.Open()
	for _, ev := range evs {
		parts, err := s.Next(context.Background(), ev)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, parts...)
	}
	if !s.Done() {
		t.Fatal("the stream did not end at run.finished")
	}
	return out
}

func decode(t *testing.T, raw json.RawMessage) any {
	t.Helper()
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("%s: %v", raw, err)
	}
	return v
}

func byEvent(parts []Part, event string) []Part {
	var out []Part
	for _, p := range parts {
		if p.Event == event {
			out = append(out, p)
		}
	}
	return out
}

// toolRun is a run that calls a tool, then answers, streamed in deltas.
func toolRun(t *testing.T) (*events, *fixedSource) {
	human := model.Message{ID: "u1", Role: model.RoleUser, Content: "time?"}
	start := &state.State{}
	start.Apply(state.Update{Messages: []model.Message{human}})
	final := start.Clone()
	final.Apply(state.Update{Messages: []model.Message{
		{ID: "a1", Role: model.RoleAssistant, ToolCalls: []model.ToolCall{{ID: "c1", Name: "clock", Arguments: `{"tz":"UTC"}`}}},
		{ID: "t1", Role: model.RoleTool, ToolCallID: "c1", Name: "clock", Content: "noon", Status: "success"},
		{ID: "a2", Role: model.RoleAssistant, Content: "It is noon."},
	}, Values: map[string]json.RawMessage{"title": json.RawMessage(`"Time"`)}})
	e := &events{t: t}
	e.add(protocol.EventRunQueued, false, 0, map[string]any{"agent": "chatbot"})
	e.add(protocol.EventRunStarted, false, 1, map[string]any{"attempt": 1})
	e.add(protocol.EventThreadTitled, true, 1, map[string]any{"title": "Time"})
	e.add("usage.model", false, 1, map[string]any{"message_id": "a1", "model": "gpt-x"})
	e.add(protocol.EventMessageCompleted, false, 1, model.Message{ID: "a1", Role: model.RoleAssistant, ToolCalls: []model.ToolCall{{ID: "c1", Name: "clock", Arguments: `{"tz":"UTC"}`}}})
	e.add(protocol.EventToolStarted, false, 1, protocol.ToolEventData{ToolCallID: "c1", Name: "clock", Arguments: `{"tz":"UTC"}`})
	e.add(protocol.EventToolFinished, false, 1, protocol.ToolEventData{ToolCallID: "c1", Name: "clock", Status: "success", Result: "noon", MessageID: "t1"})
	e.add(protocol.EventMessageDelta, true, 1, protocol.DeltaData{MessageID: "a2", Delta: "It is "})
	e.add(protocol.EventMessageDelta, true, 1, protocol.DeltaData{MessageID: "a2", Delta: "no"})
	e.add("loop.detected", false, 1, map[string]any{"action": "warn", "warnings": []string{"again"}})
	e.add(protocol.EventMessageCompleted, false, 1, model.Message{ID: "a2", Role: model.RoleAssistant, Content: "It is noon."})
	e.add(protocol.EventRunFinished, false, 1, protocol.FinishedData{Status: protocol.StatusSuccess})
	return e, &fixedSource{start: start, final: final}
}

func messageIDs(t *testing.T, values any) []string {
	t.Helper()
	var ids []string
	for _, m := range values.(map[string]any)["messages"].([]any) {
		ids = append(ids, m.(map[string]any)["type"].(string)+":"+m.(map[string]any)["id"].(string))
	}
	return ids
}

func TestStreamValues(t *testing.T) {
	e, src := toolRun(t)
	parts := translate(t, nil, src, e.out) // no mode: values
	if parts[0].Event != "metadata" || !reflect.DeepEqual(decode(t, parts[0].Data), map[string]any{"run_id": "r1", "thread_id": "h1", "attempt": 1.0}) {
		t.Fatalf("first part %s %s, want metadata", parts[0].Event, parts[0].Data)
	}
	var got [][]string
	for _, p := range byEvent(parts, "values") {
		got = append(got, messageIDs(t, decode(t, p.Data)))
	}
	// The values read after the run are those the events built (the
	// title came live): not sent twice.
	want := [][]string{
		{"human:u1"},
		{"human:u1", "ai:a1"},
		{"human:u1", "ai:a1", "tool:t1"},
		{"human:u1", "ai:a1", "tool:t1", "ai:a2"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("values messages\n%v\nwant\n%v", got, want)
	}
	last := decode(t, byEvent(parts, "values")[3].Data).(map[string]any)
	if last["title"] != "Time" {
		t.Fatalf("final values %v, want the title", last)
	}
	if end := parts[len(parts)-1]; end.Event != "end" || end.ID != "109" || !reflect.DeepEqual(decode(t, end.Data), map[string]any{"run_id": "r1", "status": "success"}) {
		t.Fatalf("last part %s %s id %q, want end with the run.finished id", end.Event, end.Data, end.ID)
	}
	if len(src.starts) != 1 || src.starts[0] != 1 {
		t.Fatalf("Start calls %v, want one for attempt 1", src.starts)
	}
	// Each stored event's last part carries its id; a live event's none.
	for _, p := range parts {
		if p.ID != "" {
			if _, err := strconv.Atoi(p.ID); err != nil {
				t.Fatalf("id %q", p.ID)
			}
		}
	}
}

func TestStreamMessagesTuple(t *testing.T) {
	e, src := toolRun(t)
	parts := translate(t, []string{"messages-tuple"}, src, e.out)
	tuples := byEvent(parts, "messages")
	text := map[string]string{}
	var nodes []string
	for _, p := range tuples {
		pair := decode(t, p.Data).([]any)
		msg, meta := pair[0].(map[string]any), pair[1].(map[string]any)
		if p.ID == "" && msg["type"] == "tool" {
			t.Fatal("a tool message from a stored event has no id")
		}
		text[msg["id"].(string)] += msg["content"].(string)
		nodes = append(nodes, msg["type"].(string)+"@"+meta["langgraph_node"].(string))
		if meta["run_id"] != "r1" || meta["thread_id"] != "h1" || meta["tags"] == nil {
			t.Fatalf("metadata %v", meta)
		}
	}
	if text["a2"] != "It is noon." {
		t.Fatalf("chunks of a2 concatenate to %q, want the completed text", text["a2"])
	}
	want := []string{"AIMessageChunk@model", "tool@tools", "AIMessageChunk@model", "AIMessageChunk@model", "AIMessageChunk@model"}
	if !reflect.DeepEqual(nodes, want) {
		t.Fatalf("tuples %v, want %v", nodes, want)
	}
	first := decode(t, tuples[0].Data).([]any)
	c := first[0].(map[string]any)
	calls := c["tool_call_chunks"].([]any)
	if len(calls) != 1 || calls[0].(map[string]any)["args"] != `{"tz":"UTC"}` || c["tool_calls"].([]any)[0].(map[string]any)["name"] != "clock" {
		t.Fatalf("tool call chunk %v", c)
	}
	if first[1].(map[string]any)["ls_model_name"] != "gpt-x" {
		t.Fatalf("metadata %v, want ls_model_name", first[1])
	}
	if len(byEvent(parts, "values")) != 0 {
		t.Fatal("values sent without being asked for")
	}
}

func TestStreamUpdatesAndCustom(t *testing.T) {
	e, src := toolRun(t)
	parts := translate(t, []string{"updates", "custom"}, src, e.out)
	var nodes []string
	for _, p := range byEvent(parts, "updates") {
		for node := range decode(t, p.Data).(map[string]any) {
			nodes = append(nodes, node)
		}
	}
	want := []string{"TitleMiddleware.before_agent", "model", "tools", "model"}
	if !reflect.DeepEqual(nodes, want) {
		t.Fatalf("updates %v, want %v", nodes, want)
	}
	model0 := decode(t, byEvent(parts, "updates")[1].Data).(map[string]any)["model"].(map[string]any)["messages"].([]any)[0].(map[string]any)
	if model0["type"] != "ai" || model0["id"] != "a1" {
		t.Fatalf("model update %v", model0)
	}
	custom := byEvent(parts, "custom")
	if len(custom) != 1 || !reflect.DeepEqual(decode(t, custom[0].Data), map[string]any{"type": "loop.detected", "data": map[string]any{"action": "warn", "warnings": []any{"again"}}}) {
		t.Fatalf("custom %v", custom)
	}
}

func TestStreamErrorAndInterrupt(t *testing.T) {
	e := &events{t: t}
	e.add(protocol.EventRunStarted, false, 1, map[string]any{"attempt": 1})
	e.add(protocol.EventRunFinished, false, 1, protocol.FinishedData{Status: protocol.StatusTimeout, Error: "the run took too long"})
	src := &fixedSource{start: &state.State{}, final: &state.State{}}
	parts := translate(t, []string{"values"}, src, e.out)
	errs := byEvent(parts, "error")
	if len(errs) != 1 || !reflect.DeepEqual(decode(t, errs[0].Data), map[string]any{"error": "TimeoutError", "message": "the run took too long"}) {
		t.Fatalf("error parts %v", parts)
	}
	if parts[len(parts)-1].Event != "end" {
		t.Fatal("no end after the error")
	}

	e = &events{t: t}
	e.add(protocol.EventRunStarted, false, 1, map[string]any{"attempt": 1})
	in := &protocol.Interrupt{Kind: protocol.InterruptApproval, RunID: "r1", ActionRequests: []protocol.ActionRequest{{ToolCallID: "c1", Name: "rm", Arguments: `{"path":"/x"}`}}, AllowedDecisions: []string{"approve", "reject"}}
	e.add(protocol.EventRunFinished, false, 1, protocol.FinishedData{Status: protocol.StatusInterrupted, Interrupt: in})
	parts = translate(t, []string{"values", "updates"}, src, e.out)
	vals := byEvent(parts, "values")
	got := decode(t, vals[len(vals)-1].Data).(map[string]any)
	ins, ok := got["__interrupt__"].([]any)
	if !ok || len(ins) != 1 || len(got) != 1 {
		t.Fatalf("last values %v, want {__interrupt__: [one]}", got)
	}
	if v := ins[0].(map[string]any)["value"].(map[string]any); v["action_requests"].([]any)[0].(map[string]any)["name"] != "rm" {
		t.Fatalf("interrupt %v", ins[0])
	}
	if ups := byEvent(parts, "updates"); len(ups) != 1 || !strings.Contains(string(ups[0].Data), "__interrupt__") {
		t.Fatalf("updates %v, want the interrupt", ups)
	}
	if len(byEvent(parts, "error")) != 0 {
		t.Fatal("an interrupted run sent an error")
	}
}

func TestStreamTakeover(t *testing.T) {
	e := &events{t: t}
	e.add(protocol.EventRunStarted, false, 1, map[string]any{"attempt": 1})
	e.add(protocol.EventMessageDelta, true, 1, protocol.DeltaData{MessageID: "a1", Delta: "lost"})
	e.add(protocol.EventRunStarted, false, 2, map[string]any{"attempt": 2})
	e.add(protocol.EventMessageCompleted, false, 2, model.Message{ID: "a2", Role: model.RoleAssistant, Content: "kept"})
	e.add(protocol.EventRunFinished, false, 2, protocol.FinishedData{Status: protocol.StatusSuccess})
	src := &fixedSource{start: &state.State{}, final: &state.State{}}
	parts := translate(t, []string{"values"}, src, e.out)
	if md := byEvent(parts, "metadata"); len(md) != 2 || decode(t, md[1].Data).(map[string]any)["attempt"] != 2.0 {
		t.Fatalf("metadata %v, want again for attempt 2", md)
	}
	if !reflect.DeepEqual(src.starts, []int{1, 2}) {
		t.Fatalf("Start calls %v, want each attempt's", src.starts)
	}
}

func TestParseModes(t *testing.T) {
	m, err := ParseModes(nil, false)
	if err != nil || !reflect.DeepEqual(m.List(), []string{"values"}) || m.Native() {
		t.Fatalf("default %v %v", m.List(), err)
	}
	m, err = ParseModes([]string{"updates", "messages-tuple", "updates"}, true)
	if err != nil || !reflect.DeepEqual(m.List(), []string{"updates", "messages-tuple"}) || !m.Subgraphs {
		t.Fatalf("list %v %v", m.List(), err)
	}
	if m, err := ParseModes([]string{"natsagent"}, false); err != nil || !m.Native() {
		t.Fatalf("native %v %v", m.List(), err)
	}
	for _, bad := range [][]string{{"valuez"}, {"natsagent", "values"}, {""}} {
		if _, err := ParseModes(bad, false); err == nil {
			t.Fatalf("%q accepted", bad)
		}
	}
}

func TestStreamMessagesDeprecated(t *testing.T) {
	e, src := toolRun(t)
	parts := translate(t, []string{"messages"}, src, e.out)
	var seq []string
	for _, p := range parts {
		switch p.Event {
		case "messages/metadata":
			for id := range decode(t, p.Data).(map[string]any) {
				seq = append(seq, "metadata:"+id)
			}
		case "messages/partial", "messages/complete":
			m := decode(t, p.Data).([]any)[0].(map[string]any)
			seq = append(seq, strings.TrimPrefix(p.Event, "messages/")+":"+m["id"].(string)+":"+m["content"].(string))
		}
	}
	want := []string{
		"metadata:a1", "complete:a1:", // no delta: metadata, then the whole message
		"complete:t1:noon",
		"metadata:a2", "partial:a2:It is ", "partial:a2:It is no", "complete:a2:It is noon.",
	}
	if !reflect.DeepEqual(seq, want) {
		t.Fatalf("messages parts\n%v\nwant\n%v", seq, want)
	}
}

func TestStreamEvents(t *testing.T) {
	e, src := toolRun(t)
	parts := translate(t, []string{"events"}, src, e.out)
	var seq []string
	for _, p := range byEvent(parts, "events") {
		ev := decode(t, p.Data).(map[string]any)
		seq = append(seq, ev["event"].(string)+":"+ev["name"].(string))
		if ev["tags"] == nil || ev["metadata"] == nil || ev["parent_ids"] == nil || ev["run_id"] == "" {
			t.Fatalf("event %v lacks a field", ev)
		}
	}
	want := []string{"on_chat_model_start:gpt-x", "on_chat_model_end:gpt-x", "on_tool_start:clock", "on_tool_end:clock",
		"on_chat_model_start:gpt-x", "on_chat_model_stream:gpt-x", "on_chat_model_stream:gpt-x", "on_chat_model_end:gpt-x", "on_chain_end:LangGraph"}
	if !reflect.DeepEqual(seq, want) {
		t.Fatalf("events\n%v\nwant\n%v", seq, want)
	}
	end := decode(t, byEvent(parts, "events")[8].Data).(map[string]any)["data"].(map[string]any)["output"]
	if ids := messageIDs(t, end); len(ids) != 4 || ids[2] != "tool:t1" {
		t.Fatalf("on_chain_end output %v, want the final values", ids)
	}
}

func TestStreamTasksCheckpointsDebug(t *testing.T) {
	e, src := toolRun(t)
	parts := translate(t, []string{"tasks", "checkpoints", "debug"}, src, e.out)
	var tasks []string
	for _, p := range byEvent(parts, "tasks") {
		task := decode(t, p.Data).(map[string]any)
		kind := "start"
		if _, ok := task["result"]; ok {
			kind = "result"
		}
		tasks = append(tasks, task["name"].(string)+":"+kind)
		if task["id"] == "" || task["interrupts"] == nil {
			t.Fatalf("task %v", task)
		}
	}
	if want := []string{"model:result", "tools:start", "tools:result", "model:result"}; !reflect.DeepEqual(tasks, want) {
		t.Fatalf("tasks %v, want %v", tasks, want)
	}
	var next [][]any
	for _, p := range byEvent(parts, "checkpoints") {
		cp := decode(t, p.Data).(map[string]any)
		next = append(next, cp["next"].([]any))
		cfg := cp["config"].(map[string]any)["configurable"].(map[string]any)
		if cfg["thread_id"] != "h1" || cp["checkpoint"].(map[string]any)["checkpoint_id"] != cfg["checkpoint_id"] || cp["values"] == nil {
			t.Fatalf("checkpoint %v", cp)
		}
	}
	if want := [][]any{{"tools"}, {"model"}, {}}; !reflect.DeepEqual(next, want) {
		t.Fatalf("checkpoints' next %v, want %v", next, want)
	}
	var kinds []string
	for _, p := range byEvent(parts, "debug") {
		d := decode(t, p.Data).(map[string]any)
		kinds = append(kinds, d["type"].(string))
		if d["payload"] == nil || d["timestamp"] == nil {
			t.Fatalf("debug %v", d)
		}
	}
	if want := []string{"task_result", "checkpoint", "task", "task_result", "checkpoint", "task_result", "checkpoint"}; !reflect.DeepEqual(kinds, want) {
		t.Fatalf("debug %v, want %v", kinds, want)
	}
}

func TestStreamChildren(t *testing.T) {
	e := &events{t: t}
	e.add(protocol.EventRunStarted, false, 1, map[string]any{"attempt": 1})
	child := map[string]any{"run_id": "k1", "thread_id": "kid", "tool_call_id": "c9", "subagent": "researcher"}
	e.add("subagent.started", false, 1, child)
	e.add("subagent.started", false, 1, child) // again (a takeover's): followed once
	e.add(protocol.EventRunFinished, false, 1, protocol.FinishedData{Status: protocol.StatusSuccess})
	src := &fixedSource{start: &state.State{}, final: &state.State{}}
	for _, sub := range []bool{false, true} {
		m, _ := ParseModes([]string{"values"}, sub)
		s := NewStream(m, Run{RunID: "r1", ThreadID: "h1"}, src)
		var kids []Child
		for _, ev := range e.out {
			if _, err := s.Next(context.Background(), ev); err != nil {
				t.Fatal(err)
			}
			kids = append(kids, s.Children()...)
		}
		want := []Child(nil)
		if sub {
			want = []Child{{RunID: "k1", ThreadID: "kid", ToolCallID: "c9"}}
		}
		if !reflect.DeepEqual(kids, want) {
			t.Fatalf("subgraphs %v: children %v, want %v", sub, kids, want)
		}
	}
	parts := Subgraph([]Part{{Event: "metadata"}, {Event: "values", ID: "7"}, {Event: "messages"}, {Event: "error"}, {Event: "end"}, {Event: "lifecycle|tools:c11"}}, "tools:c9|tools:c10")
	var got []string
	for _, p := range parts {
		got = append(got, p.Event+"#"+p.ID)
	}
	if want := []string{"values|tools:c9|tools:c10#", "messages|tools:c9|tools:c10#", "lifecycle|tools:c9|tools:c10|tools:c11#"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("Subgraph %v, want %v", got, want)
	}
}

// The values after the run are read from its last checkpoint: a tool
// result the event clipped shows there whole.
func TestStreamFinalValuesExact(t *testing.T) {
	e, src := toolRun(t)
	whole := strings.Repeat("n", 3000)
	src.final.Apply(state.Update{Messages: []model.Message{{ID: "t1", Role: model.RoleTool, ToolCallID: "c1", Name: "clock", Content: whole, Status: "success"}}})
	values := byEvent(translate(t, []string{"values"}, src, e.out), "values")
	if len(values) != 5 {
		t.Fatalf("%d values, want the exact final one too", len(values))
	}
	msgs := decode(t, values[4].Data).(map[string]any)["messages"].([]any)
	if got := msgs[2].(map[string]any)["content"]; got != whole {
		t.Fatalf("final tool message %.40q, want the whole result", got)
	}
}

func TestStreamToolsAndLifecycle(t *testing.T) {
	e := &events{t: t}
	e.add(protocol.EventRunStarted, false, 1, map[string]any{"attempt": 1})
	e.add(protocol.EventToolStarted, false, 1, protocol.ToolEventData{ToolCallID: "c1", Name: "task", Arguments: `{"goal":"dig"}`})
	e.add("subagent.started", false, 1, map[string]any{"run_id": "k1", "thread_id": "kid", "tool_call_id": "c1", "status": "pending"})
	e.add("subagent.finished", false, 1, map[string]any{"run_id": "k1", "thread_id": "kid", "tool_call_id": "c1", "status": "timeout"})
	e.add(protocol.EventToolFinished, false, 1, protocol.ToolEventData{ToolCallID: "c1", Name: "task", Status: "error", Result: "it timed out"})
	e.add(protocol.EventRunFinished, false, 1, protocol.FinishedData{Status: protocol.StatusSuccess})
	src := &fixedSource{start: &state.State{}, final: &state.State{}}
	parts := translate(t, []string{"tools", "lifecycle"}, src, e.out)
	var got []any
	for _, p := range parts {
		if p.Event != "metadata" && p.Event != "end" {
			got = append(got, map[string]any{p.Event: decode(t, p.Data)})
		}
	}
	want := []any{
		map[string]any{"tools": map[string]any{"event": "on_tool_start", "toolCallId": "c1", "name": "task", "input": map[string]any{"goal": "dig"}}},
		map[string]any{"lifecycle|tools:c1": map[string]any{"event": "started", "namespace": []any{"tools:c1"}, "tool_call_id": "c1"}},
		map[string]any{"lifecycle|tools:c1": map[string]any{"event": "failed", "namespace": []any{"tools:c1"}, "tool_call_id": "c1",
			"error": map[string]any{"error": "TimeoutError", "message": "the subagent run ended timeout"}}},
		map[string]any{"tools": map[string]any{"event": "on_tool_error", "toolCallId": "c1", "name": "task", "error": "it timed out"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("parts\n%v\nwant\n%v", got, want)
	}
}
