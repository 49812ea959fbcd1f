package middleware

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/natsagent/natsagent/internal/model"
)

// repairCase is one transcript for RepairTranscript. Every case is also
// checked with the strict validator of openaitest, offering tools.
type repairCase struct {
	name   string
	system string
	in     []model.Message
	tools  []string
	// wantChanged is the changed flag RepairTranscript must report.
	wantChanged bool
	check       func(t *testing.T, sys string, out []model.Message)
}

func runRepairCases(t *testing.T, cases []repairCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := model.CloneMessages(tc.in)
			sys, out, changed := RepairTranscript(tc.system, tc.in)
			if changed != tc.wantChanged {
				t.Errorf("changed = %v, want %v", changed, tc.wantChanged)
			}
			if !reflect.DeepEqual(tc.in, before) {
				t.Errorf("RepairTranscript modified its input:\nbefore:\n%s\nafter:\n%s", dump(before), dump(tc.in))
			}
			mustValidate(t, sys, out, tc.tools...)
			if tc.check != nil {
				tc.check(t, sys, out)
			}
			// Repair is idempotent: a repaired transcript needs nothing more.
			sys2, out2, changed2 := RepairTranscript(sys, out)
			if changed2 || sys2 != sys || !reflect.DeepEqual(out2, out) {
				t.Errorf("a second repair changed the transcript again:\n%s", dump(out2))
			}
		})
	}
}

// order lists "role:id" (tool messages by call id) for a compact check.
func order(msgs []model.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		switch m.Role {
		case model.RoleTool:
			out[i] = "tool:" + m.ToolCallID
		default:
			out[i] = m.Role + ":" + m.ID
		}
	}
	return out
}

func wantOrder(t *testing.T, out []model.Message, want ...string) {
	t.Helper()
	if got := order(out); !reflect.DeepEqual(got, want) {
		t.Fatalf("order = %v\nwant    %v", got, want)
	}
}

// toolAt returns the tool message at i, failing when there is none.
func toolAt(t *testing.T, out []model.Message, i int) model.Message {
	t.Helper()
	if i >= len(out) || out[i].Role != model.RoleTool {
		t.Fatalf("message %d is not a tool message:\n%s", i, dump(out))
	}
	return out[i]
}

func TestRepairTranscript(t *testing.T) {
	runRepairCases(t, []repairCase{
		{
			name:   "valid transcript is a no-op",
			system: "sys",
			in: []model.Message{
				user("u1", "weather?"),
				asst("a1", "", call("c1", "search", `{"query":"weather"}`), call("c2", "fetch", `{}`)),
				result("t1", "c1", "search", "sunny"),
				result("t2", "c2", "fetch", "page"),
				asst("a2", "It is sunny."),
				user("u2", "thanks"),
			},
			tools:       []string{"search", "fetch"},
			wantChanged: false,
			check: func(t *testing.T, sys string, out []model.Message) {
				if sys != "sys" {
					t.Errorf("system = %q", sys)
				}
			},
		},
		{
			name: "unanswered call gets an error result right after its message",
			in: []model.Message{
				user("u1", "search"),
				asst("a1", "looking", call("c1", "search", `{"query":"x"}`)),
				user("u2", "never mind, something else"),
			},
			tools:       []string{"search"},
			wantChanged: true,
			check: func(t *testing.T, _ string, out []model.Message) {
				wantOrder(t, out, "user:u1", "assistant:a1", "tool:c1", "user:u2")
				r := toolAt(t, out, 2)
				if r.Status != model.ToolStatusError || r.Name != "search" || r.Content != repairInterrupted {
					t.Errorf("synthetic result = %+v", r)
				}
			},
		},
		{
			name: "orphan results are dropped",
			in: []model.Message{
				result("t0", "ghost0", "search", "before any call"),
				user("u1", "q"),
				asst("a1", "", call("c1", "search", `{}`)),
				result("t1", "c1", "search", "r1"),
				result("tx", "ghost", "search", "answers nothing"),
				asst("a2", "done"),
			},
			tools:       []string{"search"},
			wantChanged: true,
			check: func(t *testing.T, _ string, out []model.Message) {
				wantOrder(t, out, "user:u1", "assistant:a1", "tool:c1", "assistant:a2")
				if out[2].Content != "r1" {
					t.Errorf("the real result was replaced: %+v", out[2])
				}
			},
		},
		{
			name: "empty assistant message dropped, one with tool calls kept",
			in: []model.Message{
				user("u1", "q"),
				asst("a0", "  \n"),
				asst("a1", "", call("c1", "search", `{}`)),
				result("t1", "c1", "search", "r"),
				asst("a2", ""),
				user("u2", "again"),
			},
			tools:       []string{"search"},
			wantChanged: true,
			check: func(t *testing.T, _ string, out []model.Message) {
				wantOrder(t, out, "user:u1", "assistant:a1", "tool:c1", "user:u2")
			},
		},
		{
			name: "duplicate results keep the first",
			in: []model.Message{
				user("u1", "q"),
				asst("a1", "", call("c1", "search", `{}`)),
				result("t1", "c1", "search", "first"),
				result("t2", "c1", "search", "second"),
				asst("a2", "done"),
			},
			tools:       []string{"search"},
			wantChanged: true,
			check: func(t *testing.T, _ string, out []model.Message) {
				wantOrder(t, out, "user:u1", "assistant:a1", "tool:c1", "assistant:a2")
				if out[2].Content != "first" || out[2].ID != "t1" {
					t.Errorf("kept %+v, want the first result", out[2])
				}
			},
		},
		{
			name: "results out of call order are put in call order",
			in: []model.Message{
				user("u1", "q"),
				asst("a1", "", call("c1", "search", `{}`), call("c2", "fetch", `{}`)),
				result("t2", "c2", "fetch", "r2"),
				result("t1", "c1", "search", "r1"),
			},
			tools:       []string{"search", "fetch"},
			wantChanged: true,
			check: func(t *testing.T, _ string, out []model.Message) {
				wantOrder(t, out, "user:u1", "assistant:a1", "tool:c1", "tool:c2")
			},
		},
		{
			name: "result without a name gets the call's name",
			in: []model.Message{
				user("u1", "q"),
				asst("a1", "", call("c1", "search", `{}`)),
				{ID: "t1", Role: model.RoleTool, ToolCallID: "c1", Content: "r1"},
			},
			tools:       []string{"search"},
			wantChanged: true,
			check: func(t *testing.T, _ string, out []model.Message) {
				if r := toolAt(t, out, 2); r.Name != "search" || r.Content != "r1" {
					t.Errorf("result = %+v", r)
				}
			},
		},
	})
}

// deepagentsjs #150/#173: parallel calls where one was answered (the other
// rejected or interrupted) must leave a valid transcript.
func TestRepair_DeepagentsJS150_ParallelCallsOneAnswered(t *testing.T) {
	runRepairCases(t, []repairCase{{
		name: "second call unanswered",
		in: []model.Message{
			user("u1", "do both"),
			asst("a1", "", call("c1", "search", `{"query":"a"}`), call("c2", "shell", `{"command":"rm -rf /"}`)),
			result("t1", "c1", "search", "found"),
			user("u2", "I rejected the shell call"),
		},
		tools:       []string{"search", "shell"},
		wantChanged: true,
		check: func(t *testing.T, _ string, out []model.Message) {
			wantOrder(t, out, "user:u1", "assistant:a1", "tool:c1", "tool:c2", "user:u2")
			if out[2].Content != "found" || out[2].Status != model.ToolStatusSuccess {
				t.Errorf("answered call's result changed: %+v", out[2])
			}
			if r := toolAt(t, out, 3); r.Status != model.ToolStatusError || r.Name != "shell" {
				t.Errorf("synthetic result = %+v", r)
			}
		},
	}, {
		name: "first call unanswered",
		in: []model.Message{
			user("u1", "do both"),
			asst("a1", "", call("c1", "shell", `{}`), call("c2", "search", `{}`)),
			result("t2", "c2", "search", "found"),
		},
		tools:       []string{"search", "shell"},
		wantChanged: true,
		check: func(t *testing.T, _ string, out []model.Message) {
			wantOrder(t, out, "user:u1", "assistant:a1", "tool:c1", "tool:c2")
			if out[2].Status != model.ToolStatusError || out[3].Content != "found" {
				t.Errorf("out:\n%s", dump(out))
			}
		},
	}})
}

// deer-flow #1936: tool results separated from their call by later human
// messages (an upload, a new question) are regrouped after the call.
func TestRepair_DeerFlow1936_ResultsAfterLaterHumanMessage(t *testing.T) {
	runRepairCases(t, []repairCase{{
		name: "results after two human messages",
		in: []model.Message{
			user("u1", "analyse"),
			asst("a1", "", call("c1", "read_file", `{"path":"a"}`), call("c2", "search", `{"query":"b"}`)),
			user("u2", "[uploaded data.csv]"),
			result("t2", "c2", "search", "r2"),
			user("u3", "and also this"),
			result("t1", "c1", "read_file", "r1"),
		},
		tools:       []string{"read_file", "search"},
		wantChanged: true,
		check: func(t *testing.T, _ string, out []model.Message) {
			wantOrder(t, out, "user:u1", "assistant:a1", "tool:c1", "tool:c2", "user:u2", "user:u3")
			if out[2].Content != "r1" || out[3].Content != "r2" {
				t.Errorf("real results not kept:\n%s", dump(out))
			}
		},
	}})
}

// deer-flow #4008/#4172/#4246: a provider sends a call without a name or
// without an id; the call is answered and id-less results are paired by
// position.
func TestRepair_DeerFlow4008_EmptyToolNameAndID(t *testing.T) {
	runRepairCases(t, []repairCase{{
		name: "empty name answered with the missing-name text",
		in: []model.Message{
			user("u1", "q"),
			asst("a1", "", call("c1", "", `{}`)),
		},
		tools:       []string{"search", UnknownToolName},
		wantChanged: true,
		check: func(t *testing.T, _ string, out []model.Message) {
			if c := out[1].ToolCalls[0]; c.Name != UnknownToolName || c.ID != "c1" {
				t.Errorf("call = %+v", c)
			}
			r := toolAt(t, out, 2)
			if r.Name != UnknownToolName || r.Content != repairMissingName || r.Status != model.ToolStatusError {
				t.Errorf("result = %+v", r)
			}
		},
	}, {
		name: "empty id gets a synthetic id and an interrupted result",
		in: []model.Message{
			user("u1", "q"),
			asst("a1", "", call("", "search", `{}`)),
			user("u2", "next"),
		},
		tools:       []string{"search"},
		wantChanged: true,
		check: func(t *testing.T, _ string, out []model.Message) {
			id := out[1].ToolCalls[0].ID
			if id == "" {
				t.Fatal("call id still empty")
			}
			if r := toolAt(t, out, 2); r.ToolCallID != id || r.Content != repairInterrupted {
				t.Errorf("result = %+v, want an interrupted result for %q", r, id)
			}
		},
	}, {
		name: "id-less results re-paired by position",
		in: []model.Message{
			user("u1", "q"),
			asst("a1", "", call("", "search", `{"query":"a"}`), call("c2", "fetch", `{}`), call("", "search", `{"query":"b"}`)),
			{ID: "t1", Role: model.RoleTool, Name: "search", Content: "ra"},
			result("t2", "c2", "fetch", "rf"),
			{ID: "t3", Role: model.RoleTool, Name: "search", Content: "rb"},
		},
		tools:       []string{"search", "fetch"},
		wantChanged: true,
		check: func(t *testing.T, _ string, out []model.Message) {
			calls := out[1].ToolCalls
			if calls[0].ID == "" || calls[2].ID == "" || calls[0].ID == calls[2].ID || calls[1].ID != "c2" {
				t.Fatalf("calls = %+v", calls)
			}
			for k, want := range []string{"ra", "rf", "rb"} {
				r := toolAt(t, out, 2+k)
				if r.ToolCallID != calls[k].ID || r.Content != want {
					t.Errorf("result %d = %+v, want %q for %q", k, r, want, calls[k].ID)
				}
			}
		},
	}, {
		name: "a name-less call that has a result keeps it",
		in: []model.Message{
			user("u1", "q"),
			asst("a1", "", call("c1", " ", `{}`)),
			{ID: "t1", Role: model.RoleTool, ToolCallID: "c1", Content: "Error: tool not found", Status: model.ToolStatusError},
		},
		tools:       []string{UnknownToolName},
		wantChanged: true,
		check: func(t *testing.T, _ string, out []model.Message) {
			if r := toolAt(t, out, 2); r.Name != UnknownToolName || r.Content != "Error: tool not found" {
				t.Errorf("result = %+v", r)
			}
		},
	}})
}

// deer-flow #3711: strict providers reject system messages after the
// first; they are merged into the system prompt.
func TestRepair_DeerFlow3711_SystemMessagesMerged(t *testing.T) {
	runRepairCases(t, []repairCase{{
		name:   "system messages anywhere join the prompt in order",
		system: "base prompt",
		in: []model.Message{
			system("early note"),
			user("u1", "q"),
			system("late note"),
			system("   "),
			asst("a1", "answer"),
		},
		wantChanged: true,
		check: func(t *testing.T, sys string, out []model.Message) {
			if sys != "base prompt\n\nearly note\n\nlate note" {
				t.Errorf("system = %q", sys)
			}
			wantOrder(t, out, "user:u1", "assistant:a1")
		},
	}, {
		name: "no prompt: a system message becomes the prompt",
		in: []model.Message{
			system("only"),
			user("u1", "q"),
		},
		wantChanged: true,
		check: func(t *testing.T, sys string, out []model.Message) {
			if sys != "only" || len(out) != 1 {
				t.Errorf("system = %q, out:\n%s", sys, dump(out))
			}
		},
	}})
}

// deepagents #2703, deer-flow #2890: arguments that are not a JSON object
// (truncated, an array, a string, null) are sent as {} and, when the call
// has no result, it is answered with the invalid-arguments text.
func TestRepair_Deepagents2703_InvalidArguments(t *testing.T) {
	var cases []repairCase
	for _, args := range []string{`{"path":"a.txt","content":"truncat`, `[1,2]`, `"text"`, `null`, `{"a":1} trailing`, `42`} {
		cases = append(cases, repairCase{
			name: "unanswered " + args,
			in: []model.Message{
				user("u1", "write"),
				asst("a1", "", call("c1", "write_file", args)),
			},
			tools:       []string{"write_file"},
			wantChanged: true,
			check: func(t *testing.T, _ string, out []model.Message) {
				if got := out[1].ToolCalls[0].Arguments; got != "{}" {
					t.Errorf("arguments sent as %q, want {}", got)
				}
				r := toolAt(t, out, 2)
				if r.Status != model.ToolStatusError || !strings.Contains(r.Content, "not a valid JSON object") || !strings.Contains(r.Content, args[:min(len(args), 10)]) {
					t.Errorf("result = %+v", r)
				}
			},
		})
	}
	cases = append(cases, repairCase{
		name: "answered: arguments sent as {} and the real result kept",
		in: []model.Message{
			user("u1", "write"),
			asst("a1", "", call("c1", "write_file", `{"path":`)),
			{ID: "t1", Role: model.RoleTool, ToolCallID: "c1", Name: "write_file", Content: "Error: arguments are not valid JSON", Status: model.ToolStatusError},
		},
		tools:       []string{"write_file"},
		wantChanged: true,
		check: func(t *testing.T, _ string, out []model.Message) {
			if out[1].ToolCalls[0].Arguments != "{}" || out[2].ID != "t1" {
				t.Errorf("out:\n%s", dump(out))
			}
		},
	}, repairCase{
		name: "huge truncated payload is clipped in the result",
		in: []model.Message{
			user("u1", "write"),
			asst("a1", "", call("c1", "write_file", `{"content":"`+strings.Repeat("x", 5000))),
		},
		tools:       []string{"write_file"},
		wantChanged: true,
		check: func(t *testing.T, _ string, out []model.Message) {
			if r := toolAt(t, out, 2); len(r.Content) > 600 {
				t.Errorf("result holds %d bytes of the bad payload", len(r.Content))
			}
		},
	}, repairCase{
		name: "empty arguments are not invalid",
		in: []model.Message{
			user("u1", "time?"),
			asst("a1", "", call("c1", "current_time", ``)),
			result("t1", "c1", "current_time", "noon"),
		},
		tools:       []string{"current_time"},
		wantChanged: false,
	})
	runRepairCases(t, cases)
}

// A provider that numbers tool calls per response ("call_0" every turn)
// reuses ids across turns. Each result belongs to the call right before
// it: the later call is renamed, and its real result must follow it
// instead of being replaced by an "interrupted" error.
func TestRepair_ToolCallIDReusedAcrossTurns(t *testing.T) {
	runRepairCases(t, []repairCase{{
		name: "same id in two turns",
		in: []model.Message{
			user("u1", "q"),
			asst("a1", "", call("call_0", "search", `{"query":"a"}`)),
			result("t1", "call_0", "search", "ra"),
			asst("a2", "", call("call_0", "search", `{"query":"b"}`)),
			result("t2", "call_0", "search", "rb"),
			asst("a3", "done"),
		},
		tools:       []string{"search"},
		wantChanged: true,
		check: func(t *testing.T, _ string, out []model.Message) {
			if len(out) != 6 {
				t.Fatalf("out:\n%s", dump(out))
			}
			first, second := out[1].ToolCalls[0].ID, out[3].ToolCalls[0].ID
			if first == second {
				t.Fatalf("ids still collide: %q", first)
			}
			if out[2].ToolCallID != first || out[2].Content != "ra" {
				t.Errorf("first result = %+v", out[2])
			}
			if out[4].ToolCallID != second || out[4].Content != "rb" || out[4].Status == model.ToolStatusError {
				t.Errorf("second result = %+v, want the real result rb", out[4])
			}
		},
	}, {
		name: "same id twice in one message",
		in: []model.Message{
			user("u1", "q"),
			asst("a1", "", call("x", "search", `{"query":"a"}`), call("x", "search", `{"query":"b"}`)),
			result("t1", "x", "search", "ra"),
			result("t2", "x", "search", "rb"),
		},
		tools:       []string{"search"},
		wantChanged: true,
		check: func(t *testing.T, _ string, out []model.Message) {
			calls := out[1].ToolCalls
			if calls[0].ID == calls[1].ID {
				t.Fatalf("ids still collide: %+v", calls)
			}
			if out[2].ToolCallID != calls[0].ID || out[2].Content != "ra" || out[3].ToolCallID != calls[1].ID || out[3].Content != "rb" {
				t.Errorf("out:\n%s", dump(out))
			}
		},
	}, {
		name: "reused id with the later call unanswered",
		in: []model.Message{
			user("u1", "q"),
			asst("a1", "", call("call_0", "search", `{}`)),
			result("t1", "call_0", "search", "ra"),
			asst("a2", "", call("call_0", "search", `{}`)),
		},
		tools:       []string{"search"},
		wantChanged: true,
		check: func(t *testing.T, _ string, out []model.Message) {
			if out[2].Content != "ra" || out[4].Status != model.ToolStatusError {
				t.Errorf("out:\n%s", dump(out))
			}
		},
	}, {
		name: "reused id: earlier call unanswered, later one answered twice",
		in: []model.Message{
			user("u1", "q"),
			asst("a1", "", call("call_0", "search", `{}`)),
			user("u2", "again"),
			asst("a2", "", call("call_0", "search", `{}`)),
			result("t1", "call_0", "search", "r2"),
			result("t2", "call_0", "search", "duplicate"),
		},
		tools:       []string{"search"},
		wantChanged: true,
		check: func(t *testing.T, _ string, out []model.Message) {
			if len(out) != 6 || out[2].Status != model.ToolStatusError || out[5].Content != "r2" {
				t.Errorf("out:\n%s", dump(out))
			}
		},
	}})
}

func TestRepairTranscript_NoOpReturnsSameSlice(t *testing.T) {
	in := []model.Message{
		user("u1", "q"),
		asst("a1", "", call("c1", "search", `{}`)),
		result("t1", "c1", "search", "r"),
		asst("a2", "answer"),
	}
	sys, out, changed := RepairTranscript("sys", in)
	if changed || sys != "sys" {
		t.Fatalf("changed = %v, sys = %q", changed, sys)
	}
	if len(out) != len(in) || &out[0] != &in[0] {
		t.Error("a transcript that needs no repair must come back as the same slice")
	}
}

func TestToolCallRepair_WrapModelCall(t *testing.T) {
	ctx := context.Background()
	rt, _ := newRuntime("r1")
	t.Run("repairs the request only", func(t *testing.T) {
		st := stateOf(user("u1", "q"), asst("a1", "", call("c1", "search", `{}`)), system("late"))
		before := st.Clone()
		req := &ModelRequest{System: "sys", Messages: append([]model.Message(nil), st.Messages...), State: st}
		var next captureNext
		if _, err := (ToolCallRepair{}).WrapModelCall(ctx, rt, req, next.handle); err != nil {
			t.Fatal(err)
		}
		got := next.last(t)
		if got.System != "sys\n\nlate" {
			t.Errorf("system = %q", got.System)
		}
		mustValidate(t, got.System, got.Messages, "search")
		if !reflect.DeepEqual(st, before) {
			t.Error("repair changed the state")
		}
		if len(req.Messages) != 3 || req.System != "sys" {
			t.Error("repair changed the caller's request")
		}
	})
	t.Run("passes a valid request through as is", func(t *testing.T) {
		req := &ModelRequest{System: "sys", Messages: []model.Message{user("u1", "q")}}
		var seen *ModelRequest
		_, err := (ToolCallRepair{}).WrapModelCall(ctx, rt, req, func(ctx context.Context, r *ModelRequest) (*ModelResponse, error) {
			seen = r
			return &ModelResponse{}, nil
		})
		if err != nil || seen != req {
			t.Errorf("err = %v, same request = %v", err, seen == req)
		}
	})
}
