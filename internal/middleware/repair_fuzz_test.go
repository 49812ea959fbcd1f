package middleware

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/model/openaitest"
)

// FuzzToolArguments: whatever arguments a model sends with a tool call
// (truncated JSON, arrays, scalars, 10,000 levels of nesting, invalid
// UTF-8, whitespace), tool-call repair never panics and the request it
// sends carries, for every call, arguments that are a JSON object (empty
// arguments go out as {}); a call whose arguments it replaced is answered
// by an error result that says so, in valid UTF-8 when the arguments
// were. Arguments that were a JSON object are sent untouched. The
// repaired transcript passes the strict provider's validation and needs
// no second repair.
func FuzzToolArguments(f *testing.F) {
	seeds := []string{
		`{}`, `{"path":"a.txt","content":"x"}`, ``, `  `, "\n", `{"path":"a.txt","content":"truncat`,
		`[1,2]`, `"text"`, `null`, `42`, `{"a":1} trailing`, `{"a":1}{"b":2}`, ` {"a":1} `,
		strings.Repeat("[", 10000) + strings.Repeat("]", 10000),
		`{"a":` + strings.Repeat("[", 9998) + strings.Repeat("]", 9998) + `}`,
		"{\"a\":\"\xff\"}", "\xff", `{"ab":"` + strings.Repeat("é", 100) + `"`,
		`{"a":"\u0000"}`, `{"a":"\ud800"}`, `{"__proto__":{}}`,
	}
	for _, s := range seeds {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, args string, answered bool) {
		in := []model.Message{
			{ID: "u1", Role: model.RoleUser, Content: "go"},
			{ID: "a1", Role: model.RoleAssistant, ToolCalls: []model.ToolCall{
				{ID: "c1", Name: "write_file", Arguments: args},
				{ID: "c2", Name: "current_time", Arguments: `{}`},
			}},
		}
		if answered {
			in = append(in,
				model.Message{ID: "t1", Role: model.RoleTool, ToolCallID: "c1", Name: "write_file", Content: "done", Status: model.ToolStatusSuccess},
				model.Message{ID: "t2", Role: model.RoleTool, ToolCallID: "c2", Name: "current_time", Content: "noon", Status: model.ToolStatusSuccess})
		}
		before := model.CloneMessages(in)
		sys, out, _ := RepairTranscript("", in)
		if !reflect.DeepEqual(in, before) {
			t.Fatal("RepairTranscript modified its input")
		}
		if problems := openaitest.Validate(wire(sys, out, "write_file", "current_time")); len(problems) > 0 {
			t.Fatalf("strict provider would reject the repaired transcript: %v\n%s", problems, dump(out))
		}
		if _, out2, changed := RepairTranscript(sys, out); changed || !reflect.DeepEqual(out2, out) {
			t.Fatalf("a second repair changed the transcript:\n%s", dump(out2))
		}
		var call model.ToolCall
		var result *model.Message
		for i, m := range out {
			for _, c := range m.ToolCalls {
				if c.ID == "c1" {
					call = c
				}
			}
			if m.Role == model.RoleTool && m.ToolCallID == "c1" {
				result = &out[i]
			}
		}
		if call.ID == "" || result == nil {
			t.Fatalf("call c1 or its result is missing:\n%s", dump(out))
		}
		sent := call.Arguments
		if sent == "" {
			sent = "{}" // what the OpenAI adapter sends for no arguments
		}
		var obj map[string]any
		if err := json.Unmarshal([]byte(sent), &obj); err != nil || obj == nil {
			t.Fatalf("arguments %q are sent as %q, not a JSON object (%v)", args, sent, err)
		}
		switch {
		case call.Arguments == args:
			if answered && result.Content != "done" {
				t.Fatalf("the real result was replaced: %+v", result)
			}
		case call.Arguments == "{}":
			if !answered {
				if result.Status != model.ToolStatusError || !strings.Contains(result.Content, "not a valid JSON object") {
					t.Fatalf("replaced arguments %q answered with %+v", args, result)
				}
				if utf8.ValidString(args) && !utf8.ValidString(result.Content) {
					t.Fatalf("the error result is not valid UTF-8: %q", result.Content)
				}
			}
		default:
			t.Fatalf("arguments %q became %q", args, call.Arguments)
		}
	})
}
