package middleware

// Todo completion reminder, after DeerFlow's TodoMiddleware. Boundary:
// model response (after-model) and model call (request-only note). When
// the model gives a final answer while items of its todo list are not
// completed, the run goes back to the model once (max_reminders) with a
// trailing note that lists the open items and asks it to finish them or
// update the list; the note never enters state (invariant 3). Reads the
// state value "todos" and the run's messages; writes only a mark on the
// answer that was sent back (meta todo_reminder: the how-many-th), so the
// count is the same on every worker and after a redelivery. It stays out
// of runs whose plan mode is off (config.plan_mode false).

import (
	"context"
	"fmt"
	"strings"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/state"
)

// MetaTodoReminder marks a final answer the todo reminder sent back to the
// model; its value is the reminder's number in the run.
const MetaTodoReminder = "todo_reminder"

const todoReminderName = "todo_completion_reminder"

// TodoReminder asks the model to finish open todo items before its final
// answer ends the run.
type TodoReminder struct {
	// MaxReminders bounds the reminders per run (default 1; 0 in the
	// settings means the default, enabled: false turns it off).
	MaxReminders int `json:"max_reminders"`
}

// NewTodoReminder fills the default and checks the bound.
func NewTodoReminder(t TodoReminder) (*TodoReminder, error) {
	if t.MaxReminders == 0 {
		t.MaxReminders = 1
	}
	if t.MaxReminders < 1 || t.MaxReminders > 5 {
		return nil, fmt.Errorf("max_reminders must be 1 to 5, not %d", t.MaxReminders)
	}
	return &t, nil
}

// Name implements Middleware.
func (*TodoReminder) Name() string { return "todo_reminder" }

// AfterModel sends a final answer back to the model while todo items are
// open, at most MaxReminders times per run.
func (t *TodoReminder) AfterModel(ctx context.Context, rt *Runtime, st *state.State) (Result, error) {
	if SwitchedOff(rt.Config.PlanMode) {
		return Result{}, nil
	}
	i := LastAssistant(st)
	if i < 0 || i != len(st.Messages)-1 {
		return Result{}, nil
	}
	answer := st.Messages[i]
	if len(answer.ToolCalls) > 0 || answer.Meta["run_id"] != rt.RunID {
		return Result{}, nil
	}
	var open []Todo
	for _, item := range todosOf(st) {
		if item.Status != TodoCompleted {
			open = append(open, item)
		}
	}
	if len(open) == 0 {
		return Result{}, nil
	}
	sent := 0
	for _, m := range st.Messages {
		if m.Role == model.RoleAssistant && m.Meta["run_id"] == rt.RunID && m.Meta[MetaTodoReminder] != nil {
			sent++
		}
	}
	if sent >= t.MaxReminders {
		return Result{}, nil
	}
	marked := answer.Clone()
	if marked.Meta == nil {
		marked.Meta = map[string]any{}
	}
	marked.Meta[MetaTodoReminder] = sent + 1
	queueGuidance(rt, todoReminderName, reminderText(open))
	return Result{Update: state.Update{Messages: []model.Message{marked}}, Jump: JumpModel}, nil
}

func reminderText(open []Todo) string {
	var b strings.Builder
	b.WriteString("<system_reminder>\nYour todo list still has items that are not completed:\n\n")
	for _, item := range open {
		fmt.Fprintf(&b, "- [%s] %s\n", item.Status, oneLine(item.Content))
	}
	b.WriteString("\nFinish them before your final answer, or call write_todos to mark what is done or drop what no longer applies. Then give your final answer.\n</system_reminder>")
	return b.String()
}

// WrapModelCall adds a pending reminder to the request, after the
// transcript; it is dropped once a call carried it.
func (t *TodoReminder) WrapModelCall(ctx context.Context, rt *Runtime, req *ModelRequest, next ModelHandler) (*ModelResponse, error) {
	resp, err := next(ctx, withGuidance(rt, todoReminderName, req))
	if err == nil {
		clearGuidance(rt, todoReminderName)
	}
	return resp, err
}
