package middleware

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/state"
)

func newTodos(t *testing.T) *Todos {
	t.Helper()
	m, err := NewTodos(Todos{})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func todosIn(t *testing.T, st *state.State) []Todo {
	t.Helper()
	var list []Todo
	if _, err := st.Value(TodosValue, &list); err != nil {
		t.Fatal(err)
	}
	return list
}

func writeTodos(id, args string) model.ToolCall { return call(id, WriteTodosTool, args) }

func TestTodos_WriteReplacesListAndEmitsOnChange(t *testing.T) {
	m := newTodos(t)
	rt, ev := newRuntime("r1")
	st := &state.State{}
	next := &passTool{}
	args := `{"todos":[{"content":" Find sources ","status":"completed"},{"content":"Draft","status":"in_progress"},{"content":"Review","status":"in_progress"},{"content":"Send","status":"pending"}]}`
	res, err := m.WrapToolCall(context.Background(), rt, &ToolCall{Call: writeTodos("c1", args), State: st}, next.handle)
	if err != nil {
		t.Fatal(err)
	}
	if next.calls.Load() != 0 {
		t.Error("write_todos went on to the tool layer")
	}
	if res.Message.Status != model.ToolStatusSuccess || !strings.Contains(res.Message.Content, "4 items: 1 completed, 2 in progress, 1 pending") {
		t.Errorf("result = %+v", res.Message)
	}
	st.Apply(checkpointed(t, res.Update))
	want := []Todo{{Content: "Find sources", Status: TodoCompleted}, {Content: "Draft", Status: TodoInProgress}, {Content: "Review", Status: TodoInProgress}, {Content: "Send", Status: TodoPending}}
	if got := todosIn(t, st); !reflect.DeepEqual(got, want) {
		t.Errorf("todos = %+v", got)
	}
	if evs := ev.ofType(EventTodos); len(evs) != 1 || !reflect.DeepEqual(evs[0].Data, map[string]any{"todos": want}) {
		t.Errorf("events = %+v", evs)
	}

	// The same list again: no update, no event.
	res, _ = m.WrapToolCall(context.Background(), rt, &ToolCall{Call: writeTodos("c2", args), State: st}, next.handle)
	if !res.Update.Empty() || len(ev.ofType(EventTodos)) != 1 || !strings.Contains(res.Message.Content, "unchanged") {
		t.Errorf("unchanged write: %+v, %d events", res, len(ev.ofType(EventTodos)))
	}

	// A new list replaces the old one; [] clears it.
	res, _ = m.WrapToolCall(context.Background(), rt, &ToolCall{Call: writeTodos("c3", `{"todos":[{"content":"Send","status":"completed"}]}`), State: st}, next.handle)
	st.Apply(res.Update)
	if got := todosIn(t, st); !reflect.DeepEqual(got, []Todo{{Content: "Send", Status: TodoCompleted}}) {
		t.Errorf("todos = %+v", got)
	}
	res, _ = m.WrapToolCall(context.Background(), rt, &ToolCall{Call: writeTodos("c4", `{"todos":[]}`), State: st}, next.handle)
	st.Apply(res.Update)
	if got := todosIn(t, st); len(got) != 0 || len(ev.ofType(EventTodos)) != 3 {
		t.Errorf("todos = %+v after clearing, %d events", got, len(ev.ofType(EventTodos)))
	}

	// Other tools pass through.
	m.WrapToolCall(context.Background(), rt, &ToolCall{Call: call("c5", "echo", `{}`), State: st}, next.handle)
	if next.calls.Load() != 1 {
		t.Error("another tool did not reach the tool layer")
	}
}

func TestTodos_Validation(t *testing.T) {
	m, err := NewTodos(Todos{MaxItems: 3})
	if err != nil {
		t.Fatal(err)
	}
	rt, ev := newRuntime("r1")
	for _, tc := range []struct{ args, want string }{
		{`not json`, `write_todos takes {"todos"`},
		{`{}`, "todos is missing"},
		{`{"todos":null}`, "todos is missing"},
		{`{"todos":"a, b"}`, `write_todos takes`},
		{`{"todos":[{"content":"a","status":"done"}]}`, `todos[0].status "done" is not one of pending, in_progress, completed`},
		{`{"todos":[{"content":"a","status":"pending"},{"content":"  ","status":"pending"}]}`, "todos[1].content is empty"},
		{`{"todos":[{"status":"pending"}]}`, "todos[0].content is empty"},
		{`{"todos":[{"content":"a"}]}`, `todos[0].status "" is not one of`},
		{`{"todos":[{"content":"` + strings.Repeat("x", MaxTodoContent+1) + `","status":"pending"}]}`, "longer than 1000 characters"},
		{`{"todos":[` + strings.Repeat(`{"content":"a","status":"pending"},`, 3) + `{"content":"a","status":"pending"}]}`, "4 items is more than the 3 allowed"},
	} {
		res, err := m.WrapToolCall(context.Background(), rt, &ToolCall{Call: writeTodos("c1", tc.args), State: &state.State{}}, (&passTool{}).handle)
		if err != nil {
			t.Fatal(err)
		}
		if res.Message.Status != model.ToolStatusError || !strings.Contains(res.Message.Content, tc.want) || !res.Update.Empty() {
			t.Errorf("%s: %+v, want %q", tc.args, res, tc.want)
		}
	}
	if len(ev.all) != 0 {
		t.Errorf("events = %v", ev.all)
	}
	for _, n := range []int{-1, 201} {
		if _, err := NewTodos(Todos{MaxItems: n}); err == nil {
			t.Errorf("max_items %d accepted", n)
		}
	}
}

func TestTodos_ParallelCallsRefused(t *testing.T) {
	m := newTodos(t)
	rt, _ := newRuntime("r1")
	list := `{"todos":[{"content":"a","status":"pending"}]}`
	st := &state.State{Messages: []model.Message{
		user("u1", "plan"),
		asst("a1", "", writeTodos("c1", list), call("c2", "echo", `{}`), writeTodos("c3", list)),
	}}
	res, err := m.AfterModel(context.Background(), rt, st)
	if err != nil {
		t.Fatal(err)
	}
	var answered []string
	for _, msg := range res.Update.Messages {
		if msg.Role != model.RoleTool || msg.Status != model.ToolStatusError || !strings.Contains(msg.Content, "once per response") {
			t.Errorf("result = %+v", msg)
		}
		answered = append(answered, msg.ToolCallID)
	}
	if !reflect.DeepEqual(answered, []string{"c1", "c3"}) || res.Jump != JumpNone {
		t.Errorf("answered %v, jump %v", answered, res.Jump)
	}
	st.Apply(res.Update)
	mustValidate(t, "sys", append(st.Messages, result("t2", "c2", "echo", "ok")), "echo", WriteTodosTool)
	// Idempotent: run again (a replay), nothing more.
	if res, _ := m.AfterModel(context.Background(), rt, st); !res.Update.Empty() {
		t.Errorf("second after_model: %+v", res.Update)
	}

	// Parallel calls that reach the tool anyway (a resumed response whose
	// after-model hooks an approval cut short) are refused too.
	st = &state.State{Messages: []model.Message{user("u1", "plan"), asst("a1", "", writeTodos("c1", list), writeTodos("c3", list))}}
	res2, _ := m.WrapToolCall(context.Background(), rt, &ToolCall{Call: writeTodos("c3", list), State: st}, (&passTool{}).handle)
	if res2.Message.Status != model.ToolStatusError || !res2.Update.Empty() {
		t.Errorf("resumed parallel call: %+v", res2)
	}

	// One call per response is fine.
	st = &state.State{Messages: []model.Message{user("u1", "plan"), asst("a1", "", writeTodos("c1", list), call("c2", "echo", `{}`))}}
	if res, _ := m.AfterModel(context.Background(), rt, st); !res.Update.Empty() {
		t.Errorf("single call refused: %+v", res.Update)
	}
}

// The list is shown from state, not found in past write_todos calls, so
// compacting the transcript cannot lose it (deepagents #4161).
func TestTodos_DeepAgents4161_ListInEveryRequestFromState(t *testing.T) {
	m := newTodos(t)
	rt, _ := newRuntime("r1")
	capture := &captureNext{}
	st := &state.State{}
	req := &ModelRequest{System: "sys", Tools: specs("echo"), State: st}
	m.WrapModelCall(context.Background(), rt, req, capture.handle)
	sent := capture.reqs[0]
	if got := specNames(sent.Tools); !reflect.DeepEqual(got, []string{"echo", WriteTodosTool}) {
		t.Errorf("tools = %v", got)
	}
	if !strings.HasPrefix(sent.System, "sys\n\n## Todo list") || strings.Contains(sent.System, "current todo list") {
		t.Errorf("system:\n%s", sent.System)
	}
	if len(req.Tools) != 1 || req.System != "sys" {
		t.Error("the request edit leaked into the caller's request")
	}

	u, _ := state.SetValue(TodosValue, []Todo{{Content: "Find\nsources", Status: TodoCompleted}, {Content: "Draft", Status: TodoInProgress}})
	st.Apply(u)
	capture.reqs = nil
	m.WrapModelCall(context.Background(), rt, &ModelRequest{Tools: append(specs("echo"), writeTodosSpec), State: st}, capture.handle)
	sent = capture.reqs[0]
	if n := len(sent.Tools); n != 2 {
		t.Errorf("write_todos offered twice: %v", specNames(sent.Tools))
	}
	// The list goes into the trailing context, the system prompt keeps
	// only the guide: a change of the list leaves the prompt's prefix as
	// it was.
	if strings.Contains(sent.System, "current todo list") || !strings.Contains(sent.System, "## Todo list") {
		t.Errorf("system:\n%s", sent.System)
	}
	if ctx, ok := ContextMessage(sent); !ok || !strings.Contains(ctx.Content, "<todo_list>\nYour current todo list:\n1. [completed] Find sources\n2. [in_progress] Draft\n</todo_list>") {
		t.Errorf("trailing context: %+v", ctx)
	}
	// Nothing of it reaches state.
	if fmt.Sprint(st.Messages) != "[]" {
		t.Errorf("state messages = %v", st.Messages)
	}
}
