package langgraph

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
)

// roundTrip encodes v and decodes it as generic JSON, as a client sees it.
func roundTrip(t *testing.T, v any) map[string]any {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestFromModelShapes(t *testing.T) {
	ai := model.Message{ID: "m2", Role: model.RoleAssistant, Content: "",
		ToolCalls: []model.ToolCall{{ID: "c1", Name: "search", Arguments: `{"q":"nats","n":3}`}, {ID: "c2", Name: "broken", Arguments: `{"q":`}},
		Meta:      map[string]any{"run_id": "r1", "finish_reason": "tool_calls", "usage": map[string]any{"input_tokens": 12.0, "output_tokens": 5.0, "model": "gpt-x"}}}
	got := roundTrip(t, FromModel(ai))
	if got["type"] != "ai" || got["id"] != "m2" || got["content"] != "" {
		t.Fatalf("ai message %v", got)
	}
	calls := got["tool_calls"].([]any)
	if len(calls) != 1 {
		t.Fatalf("tool_calls %v", calls)
	}
	want := map[string]any{"id": "c1", "name": "search", "args": map[string]any{"q": "nats", "n": 3.0}, "type": "tool_call"}
	if !reflect.DeepEqual(calls[0], want) {
		t.Fatalf("tool call %v, want %v", calls[0], want)
	}
	invalid := got["invalid_tool_calls"].([]any)[0].(map[string]any)
	if invalid["args"] != `{"q":` || invalid["type"] != "invalid_tool_call" || invalid["id"] != "c2" {
		t.Fatalf("invalid tool call %v", invalid)
	}
	if u := got["usage_metadata"].(map[string]any); u["input_tokens"] != 12.0 || u["output_tokens"] != 5.0 || u["total_tokens"] != 17.0 {
		t.Fatalf("usage_metadata %v", u)
	}
	if rm := got["response_metadata"].(map[string]any); rm["finish_reason"] != "tool_calls" || rm["model_name"] != "gpt-x" {
		t.Fatalf("response_metadata %v", rm)
	}
	if ak := got["additional_kwargs"].(map[string]any)["natsagent"].(map[string]any); ak["run_id"] != "r1" {
		t.Fatalf("additional_kwargs %v", got["additional_kwargs"])
	}

	// An AI message without calls still has empty lists, as LangChain
	// serializes it; other types have none.
	plain := roundTrip(t, FromModel(model.Message{ID: "m3", Role: model.RoleAssistant, Content: "hi"}))
	if l, ok := plain["tool_calls"].([]any); !ok || len(l) != 0 {
		t.Fatalf("tool_calls of a plain ai message: %v", plain["tool_calls"])
	}
	human := roundTrip(t, FromModel(model.Message{ID: "m1", Role: model.RoleUser, Content: "hello"}))
	if _, ok := human["tool_calls"]; ok || human["type"] != "human" || human["content"] != "hello" {
		t.Fatalf("human %v", human)
	}
	tool := roundTrip(t, FromModel(model.Message{ID: "m4", Role: model.RoleTool, Name: "search", ToolCallID: "c1", Content: "found", Status: "error"}))
	if tool["type"] != "tool" || tool["tool_call_id"] != "c1" || tool["status"] != "error" || tool["name"] != "search" {
		t.Fatalf("tool %v", tool)
	}
	if sys := roundTrip(t, FromModel(model.Message{Role: model.RoleSystem, Content: "be brief"})); sys["type"] != "system" {
		t.Fatalf("system %v", sys)
	}
	img := roundTrip(t, FromModel(model.Message{Role: model.RoleUser, Content: "look", Parts: []model.Part{{Type: "text", Text: "look"}, {Type: "image_url", ImageURL: "https://x/a.png"}}}))
	blocks := img["content"].([]any)
	if len(blocks) != 2 || blocks[1].(map[string]any)["image_url"].(map[string]any)["url"] != "https://x/a.png" {
		t.Fatalf("image content %v", img["content"])
	}
}

func TestToModelAcceptsBothShapes(t *testing.T) {
	cases := []struct {
		name string
		in   string
		want model.Message
	}{
		{"natsagent", `{"role":"user","content":"hi","id":"a"}`, model.Message{ID: "a", Role: "user", Content: "hi"}},
		{"langchain human blocks", `{"type":"human","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}`, model.Message{Role: "user", Content: "ab"}},
		{"langchain ai with args", `{"type":"ai","content":"","tool_calls":[{"id":"c","name":"f","args":{"x":1},"type":"tool_call"}]}`,
			model.Message{Role: "assistant", ToolCalls: []model.ToolCall{{ID: "c", Name: "f", Arguments: `{"x":1}`}}}},
		{"natsagent raw arguments", `{"role":"assistant","tool_calls":[{"id":"c","name":"f","arguments":"{\"x\":1}"}]}`,
			model.Message{Role: "assistant", ToolCalls: []model.ToolCall{{ID: "c", Name: "f", Arguments: `{"x":1}`}}}},
		{"tool", `{"type":"tool","content":"r","tool_call_id":"c"}`, model.Message{Role: "tool", Content: "r", ToolCallID: "c"}},
		{"system", `{"type":"system","content":"s"}`, model.Message{Role: "system", Content: "s"}},
		{"image block", `{"type":"human","content":[{"type":"text","text":"see"},{"type":"image_url","image_url":{"url":"https://x/a.png"}}]}`,
			model.Message{Role: "user", Content: "see", Parts: []model.Part{{Type: "text", Text: "see"}, {Type: "image_url", ImageURL: "https://x/a.png"}}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var in Input
			if err := json.Unmarshal([]byte(tc.in), &in); err != nil {
				t.Fatal(err)
			}
			got, err := ToModel(in)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
	for _, bad := range []struct{ in, field string }{
		{`{"type":"human","content":[{"type":"audio"}]}`, "content"},
		{`{"type":"human","content":7}`, "content"},
		{`{"type":"ai","tool_calls":[{"id":"c","name":"f","args":[1]}]}`, "tool_calls[0].args"},
		{`{"type":"human","content":[{"type":"image_url"}]}`, "content"},
	} {
		var in Input
		if err := json.Unmarshal([]byte(bad.in), &in); err != nil {
			t.Fatal(err)
		}
		_, err := ToModel(in)
		fe, ok := err.(*FieldError)
		if !ok || fe.Field != bad.field {
			t.Errorf("%s: error %v, want one on %s", bad.in, err, bad.field)
		}
	}
	var rm Input
	_ = json.Unmarshal([]byte(`{"type":"remove","id":"m9"}`), &rm)
	if id, ok := rm.Remove(); !ok || id != "m9" {
		t.Fatalf("remove: %q %v", id, ok)
	}
}

// A message converted to LangChain's shape and read back is the same
// message (what LangChain keeps of it).
func TestRoundTrip(t *testing.T) {
	orig := model.Message{ID: "m2", Role: model.RoleAssistant, Content: "calling", ToolCalls: []model.ToolCall{{ID: "c1", Name: "f", Arguments: `{"a":"b"}`}}}
	data, err := json.Marshal(FromModel(orig))
	if err != nil {
		t.Fatal(err)
	}
	var in Input
	if err := json.Unmarshal(data, &in); err != nil {
		t.Fatal(err)
	}
	back, err := ToModel(in)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, orig) {
		t.Fatalf("back %+v, want %+v", back, orig)
	}
}

func TestStateSnapshot(t *testing.T) {
	st := &state.State{}
	st.Apply(state.Update{Messages: []model.Message{{ID: "u1", Role: "user", Content: "write a file"},
		{ID: "a1", Role: "assistant", ToolCalls: []model.ToolCall{{ID: "c1", Name: "write_file", Arguments: `{"path":"/a"}`}}}},
		Values: map[string]json.RawMessage{"title": json.RawMessage(`"Files"`), "interrupt": json.RawMessage(`{}`)}})
	now := time.Now().UTC()
	in := &protocol.Interrupt{Kind: protocol.InterruptApproval, RunID: "r1", MessageID: "a1", AllowedDecisions: []string{"approve", "reject"},
		ActionRequests: []protocol.ActionRequest{{ToolCallID: "c1", Name: "write_file", Arguments: `{"path":"/a"}`}}}
	got := roundTrip(t, State(Snapshot{ThreadID: "h", CheckpointID: "e1-2", Parent: "e1-1", CreatedAt: now, State: st, Interrupt: in, Settled: true, Hidden: []string{"interrupt"}}))
	values := got["values"].(map[string]any)
	if _, ok := values["interrupt"]; ok || values["title"] != "Files" || len(values["messages"].([]any)) != 2 {
		t.Fatalf("values %v", values)
	}
	if !reflect.DeepEqual(got["next"], []any{NodeApproval}) {
		t.Fatalf("next %v", got["next"])
	}
	task := got["tasks"].([]any)[0].(map[string]any)
	intr := task["interrupts"].([]any)[0].(map[string]any)
	value := intr["value"].(map[string]any)
	action := value["action_requests"].([]any)[0].(map[string]any)
	if task["name"] != NodeApproval || intr["id"] == "" || action["name"] != "write_file" || action["args"].(map[string]any)["path"] != "/a" {
		t.Fatalf("task %v", task)
	}
	rc := value["review_configs"].([]any)[0].(map[string]any)
	if rc["action_name"] != "write_file" || len(rc["allowed_decisions"].([]any)) != 2 {
		t.Fatalf("review_configs %v", rc)
	}
	cp := got["checkpoint"].(map[string]any)
	if cp["thread_id"] != "h" || cp["checkpoint_id"] != "e1-2" || cp["checkpoint_ns"] != "" {
		t.Fatalf("checkpoint %v", cp)
	}
	if got["parent_checkpoint"].(map[string]any)["checkpoint_id"] != "e1-1" {
		t.Fatalf("parent %v", got["parent_checkpoint"])
	}

	// Mid-run, without an interrupt: the tools come next; settled, nothing.
	mid := State(Snapshot{ThreadID: "h", CheckpointID: "e1-2", State: st})
	if !reflect.DeepEqual(mid.Next, []string{NodeTools}) || len(mid.Tasks) != 1 {
		t.Fatalf("mid-run next %v tasks %v", mid.Next, mid.Tasks)
	}
	if done := State(Snapshot{ThreadID: "h", CheckpointID: "e1-2", State: st, Settled: true}); len(done.Next) != 0 || len(done.Tasks) != 0 {
		t.Fatalf("settled next %v", done.Next)
	}
	empty := roundTrip(t, State(Snapshot{ThreadID: "h", State: &state.State{}}))
	if empty["checkpoint"] != nil || empty["created_at"] != nil || len(empty["values"].(map[string]any)["messages"].([]any)) != 0 {
		t.Fatalf("empty state %v", empty)
	}

	values = roundTrip(t, WithInterrupt(Values(st, "interrupt"), in))
	if l := values[InterruptKey].([]any); len(l) != 1 || !strings.HasPrefix(l[0].(map[string]any)["id"].(string), "interrupt-r1") {
		t.Fatalf("__interrupt__ %v", values[InterruptKey])
	}
}
