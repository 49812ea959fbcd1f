package middleware

// Todos. Boundary: prompt and tools offered (request only), model response
// (after-model), tool call (write_todos), state. Reads and writes the
// state value "todos" (a list of {content, status}); emits state.todos
// (updates kind) when the list changes, never when a write leaves it as
// it was. The middleware provides the write_todos tool itself: it offers
// it in every request and answers its calls; a call replaces the whole
// list, after LangChain's TodoListMiddleware. Several write_todos calls in
// one response are refused, each with an error result, since their order
// is undefined; the response's other calls run normally. Each request
// shows the current list in its trailing context message (after the
// history, so a change leaves the cached prefix alone: promptcontext.go),
// so the model keeps it in view however the transcript is later compacted
// (the list lives in state, not only in past tool calls). The system
// prompt holds only the fixed guide.
//
// A final answer given while items are open is sent back to the model
// with a request-only reminder, completion_reminders times per run
// (todoreminder.go).
//
// Statuses are pending, in_progress and completed. Like LangChain's,
// several items may be in_progress at once (independent work done in
// parallel); nothing else about the order of work is enforced.

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
	"github.com/natsagent/natsagent/internal/tools"
)

// TodosValue is the state value holding the todo list.
const TodosValue = protocol.TodosValue

// EventTodos is emitted with {"todos": [...]} when the list changes.
const EventTodos = protocol.EventTodos

// WriteTodosTool is the name of the tool the todos middleware provides.
const WriteTodosTool = "write_todos"

// Todo statuses.
const (
	TodoPending    = "pending"
	TodoInProgress = "in_progress"
	TodoCompleted  = "completed"
)

// MaxTodoContent bounds one item's text, in characters.
const MaxTodoContent = 1000

// Todo is one item of the list.
type Todo = protocol.Todo

// Todos keeps the model's todo list.
type Todos struct {
	// MaxItems bounds the list (default 50).
	MaxItems int `json:"max_items"`
	// CompletionReminders is how many times a run's final answer is sent
	// back while items are open (default 1, 0 none; todoreminder.go).
	CompletionReminders *int `json:"completion_reminders"`
}

// NewTodos fills the default and checks the bound.
func NewTodos(t Todos) (*Todos, error) {
	if t.MaxItems == 0 {
		t.MaxItems = 50
	}
	if t.MaxItems < 1 || t.MaxItems > 200 {
		return nil, fmt.Errorf("max_items must be 1 to 200, not %d", t.MaxItems)
	}
	if n := t.CompletionReminders; n != nil && (*n < 0 || *n > 5) {
		return nil, fmt.Errorf("completion_reminders must be 0 to 5, not %d", *n)
	}
	return &t, nil
}

// Name implements Middleware.
func (*Todos) Name() string { return "todos" }

var writeTodosSpec = model.ToolSpec{
	Name: WriteTodosTool,
	Description: "Replaces your todo list for the current task. Send the whole list every time, " +
		"each item with its content and status (pending, in_progress or completed).",
	Parameters: tools.SchemaJSON[writeTodosArgs](),
}

type writeTodosArgs struct {
	// A pointer: a missing list is an error, [] clears the list.
	Todos *[]todoArg `json:"todos" jsonschema:"The whole todo list; it replaces the previous one. [] clears it."`
}

// todoArg is one item as the model writes it (a Todo).
type todoArg struct {
	Content string `json:"content" jsonschema:"What to do"`
	Status  string `json:"status" schema:"enum=pending|in_progress|completed" jsonschema:"pending, in_progress or completed"`
}

const todosGuide = "## Todo list\n\nFor a task of three steps or more, plan and track it with write_todos. " +
	"Each call replaces the whole list: send every item with its status (pending, in_progress, completed). " +
	"Mark an item in_progress when you start it and completed as soon as it is done; several items may be in_progress when you work on them in parallel. " +
	"Skip the list for simple requests, and call write_todos at most once per response."

// todosOf returns the state's list.
func todosOf(st *state.State) []Todo {
	var list []Todo
	if st != nil {
		_, _ = st.Value(TodosValue, &list)
	}
	return list
}

// WrapModelCall offers write_todos and shows the current list.
func (t *Todos) WrapModelCall(ctx context.Context, rt *Runtime, req *ModelRequest, next ModelHandler) (*ModelResponse, error) {
	if SwitchedOff(rt.Config.PlanMode) {
		return next(ctx, req) // plan mode off for this run: no tool, no guide
	}
	if len(pendingGuidance(rt, todoReminderName)) == 0 {
		t.remindAgain(rt, req.State)
	}
	resp, err := next(ctx, withReminder(rt, todosRequest(req)))
	if err == nil {
		carried(rt)
	}
	return resp, err
}

// todosRequest is the model call's request with the todo tool and list
// (built apart: chain.go, "Frames").
func todosRequest(req *ModelRequest) *ModelRequest {
	c := *req
	if !slices.ContainsFunc(req.Tools, func(s model.ToolSpec) bool { return s.Name == WriteTodosTool }) {
		c.Tools = withTools(req.Tools, writeTodosSpec)
	}
	c.appendShared(todosGuide)
	if list := todosOf(req.State); len(list) > 0 {
		var b strings.Builder
		b.WriteString("<todo_list>\nYour current todo list:\n")
		for i, item := range list {
			fmt.Fprintf(&b, "%d. [%s] %s\n", i+1, item.Status, escapeMemory.Replace(oneLine(item.Content)))
		}
		b.WriteString("</todo_list>")
		return withContextSection(&c, b.String())
	}
	return &c
}

// AfterModel refuses every write_todos call of a response that has more
// than one; on a final answer it may send the run back with a reminder
// of the open items (remind).
func (t *Todos) AfterModel(ctx context.Context, rt *Runtime, st *state.State) (Result, error) {
	i := LastAssistant(st)
	if i < 0 {
		return Result{}, nil
	}
	calls := st.Messages[i].ToolCalls
	n := countWrites(calls)
	if n < 2 {
		return t.remind(rt, st), nil
	}
	answered := make(map[string]bool)
	for _, m := range st.Messages[i+1:] {
		if m.Role != model.RoleTool {
			return Result{}, nil // not a fresh response
		}
		answered[m.ToolCallID] = true
	}
	var results []model.Message
	for _, c := range calls {
		if c.Name != WriteTodosTool || answered[c.ID] {
			continue
		}
		results = append(results, model.Message{
			ID: "todos_" + c.ID, Role: model.RoleTool, ToolCallID: c.ID, Name: c.Name, Status: model.ToolStatusError,
			Content: parallelWrites(n),
			Meta:    map[string]any{MetaBlockedBy: t.Name(), "run_id": rt.RunID},
		})
	}
	if len(results) == 0 {
		return Result{}, nil
	}
	return Result{Update: state.Update{Messages: results}}, nil
}

func countWrites(calls []model.ToolCall) int {
	n := 0
	for _, c := range calls {
		if c.Name == WriteTodosTool {
			n++
		}
	}
	return n
}

func parallelWrites(n int) string {
	return fmt.Sprintf("Error: write_todos was called %d times in one response, so none of them was applied. Call write_todos once per response with the whole list.", n)
}

// WrapToolCall runs write_todos.
func (t *Todos) WrapToolCall(ctx context.Context, rt *Runtime, call *ToolCall, next ToolHandler) (*ToolResult, error) {
	if call.Call.Name != WriteTodosTool {
		return next(ctx, call)
	}
	// After-model answers parallel writes; calls that reach here anyway
	// (a response resumed after an approval interrupted it before that
	// hook ran) are refused the same way.
	if i := LastAssistant(call.State); i >= 0 && slices.ContainsFunc(call.State.Messages[i].ToolCalls, func(c model.ToolCall) bool { return c.ID == call.Call.ID }) {
		if n := countWrites(call.State.Messages[i].ToolCalls); n > 1 {
			return errorResult(parallelWrites(n)), nil
		}
	}
	list, err := t.parse(call.Call.Arguments)
	if err != nil {
		return errorResult("Error: " + err.Error()), nil
	}
	old := todosOf(call.State)
	if slices.Equal(old, list) {
		return &ToolResult{Message: model.Message{Content: "The todo list is unchanged. " + summary(list), Status: model.ToolStatusSuccess}}, nil
	}
	u, err := state.SetValue(TodosValue, list)
	if err != nil {
		return nil, err
	}
	if rt.Emit != nil {
		rt.Emit(EventTodos, map[string]any{"todos": list})
	}
	return &ToolResult{
		Message: model.Message{Content: "Updated the todo list. " + summary(list), Status: model.ToolStatusSuccess},
		Update:  u,
	}, nil
}

func summary(list []Todo) string {
	if len(list) == 0 {
		return "It is empty."
	}
	count := map[string]int{}
	for _, item := range list {
		count[item.Status]++
	}
	return fmt.Sprintf("%d items: %d completed, %d in progress, %d pending.",
		len(list), count[TodoCompleted], count[TodoInProgress], count[TodoPending])
}

// parse checks write_todos' arguments; its errors are meant for the model.
func (t *Todos) parse(args string) ([]Todo, error) {
	const shape = `write_todos takes {"todos": [{"content": "...", "status": "pending"}, ...]}`
	var in writeTodosArgs
	if err := json.Unmarshal([]byte(args), &in); err != nil {
		return nil, fmt.Errorf("%s: %v", shape, err)
	}
	if in.Todos == nil {
		return nil, fmt.Errorf("todos is missing; %s ([] clears the list)", shape)
	}
	list := *in.Todos
	if len(list) > t.MaxItems {
		return nil, fmt.Errorf("%d items is more than the %d allowed; merge or drop some", len(list), t.MaxItems)
	}
	out := make([]Todo, len(list))
	for i, arg := range list {
		item := Todo(arg)
		item.Content = strings.TrimSpace(item.Content)
		switch {
		case item.Content == "":
			return nil, fmt.Errorf("todos[%d].content is empty; say what the item is", i)
		case utf8.RuneCountInString(item.Content) > MaxTodoContent:
			return nil, fmt.Errorf("todos[%d].content is longer than %d characters; keep items short", i, MaxTodoContent)
		}
		switch item.Status {
		case TodoPending, TodoInProgress, TodoCompleted:
		default:
			return nil, fmt.Errorf("todos[%d].status %q is not one of pending, in_progress, completed", i, item.Status)
		}
		out[i] = item
	}
	return out, nil
}

// ProvidedTools implements ToolProvider.
func (*Todos) ProvidedTools() []string { return []string{WriteTodosTool} }
