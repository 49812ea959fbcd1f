package middleware

// Todo completion reminder (part of the todos middleware), after
// DeerFlow's TodoMiddleware. Boundary: model response (after-model) and
// model call (request-only note). When
// the model gives a final answer while items of its todo list are not
// completed, the run goes back to the model once (completion_reminders) with a
// trailing note that lists the open items and asks it to finish them or
// update the list; the note never enters state (invariant 3). Reads the
// state value "todos" and the run's messages; writes only a mark on the
// answer that was sent back (meta todo_reminder: the how-many-th), so the
// count is the same on every worker and after a redelivery, and a run
// redelivered between that answer and the next model call carries the
// reminder again (remindAgain; the loop's MetaSentBack makes the call).
// It stays out of runs whose plan mode is off (config.plan_mode false).

import (
	"fmt"
	"strings"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/state"
)

// MetaTodoReminder marks a final answer the todo reminder sent back to the
// model; its value is the reminder's number in the run.
const MetaTodoReminder = "todo_reminder"

const todoReminderName = "todo_completion_reminder"

// remind sends a final answer back to the model while todo items are
// open, at most CompletionReminders times per run. It is the last step of
// the todos middleware's after-model hook.
func (t *Todos) remind(rt *Runtime, st *state.State) Result {
	if t.reminders() == 0 || SwitchedOff(rt.Config.PlanMode) {
		return Result{}
	}
	i := LastAssistant(st)
	if i < 0 || i != len(st.Messages)-1 {
		return Result{}
	}
	answer := st.Messages[i]
	if len(answer.ToolCalls) > 0 || answer.Meta["run_id"] != rt.RunID {
		return Result{}
	}
	open := openTodos(st)
	if len(open) == 0 {
		return Result{}
	}
	sent := 0
	for _, m := range st.Messages {
		if m.Role == model.RoleAssistant && m.Meta["run_id"] == rt.RunID && m.Meta[MetaTodoReminder] != nil {
			sent++
		}
	}
	if sent >= t.reminders() {
		return Result{}
	}
	marked := answer.Clone()
	if marked.Meta == nil {
		marked.Meta = map[string]any{}
	}
	marked.Meta[MetaTodoReminder] = sent + 1
	queueGuidance(rt, todoReminderName, reminderText(open))
	return Result{Update: state.Update{Messages: []model.Message{marked}}, Jump: JumpModel}
}

// remindAgain queues the reminder again for a call that follows an
// answer remind sent back, when the process that sent it stopped before
// the call (the guidance queue lives in memory; the mark is in state).
func (t *Todos) remindAgain(rt *Runtime, st *state.State) {
	if st == nil || len(st.Messages) == 0 {
		return
	}
	last := st.Messages[len(st.Messages)-1]
	if last.Role != model.RoleAssistant || len(last.ToolCalls) > 0 || last.Meta["run_id"] != rt.RunID || last.Meta[MetaTodoReminder] == nil {
		return
	}
	if open := openTodos(st); len(open) > 0 {
		queueGuidance(rt, todoReminderName, reminderText(open))
	}
}

func openTodos(st *state.State) []Todo {
	var open []Todo
	for _, item := range todosOf(st) {
		if item.Status != TodoCompleted {
			open = append(open, item)
		}
	}
	return open
}

// reminders is the number of reminders a run gets (default 1).
func (t *Todos) reminders() int {
	if t.CompletionReminders == nil {
		return 1
	}
	return *t.CompletionReminders
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

// withReminder is req with a pending reminder after the transcript; the
// reminder is dropped once a call carried it (carried).
func withReminder(rt *Runtime, req *ModelRequest) *ModelRequest {
	return withGuidance(rt, todoReminderName, req)
}

func carried(rt *Runtime) { clearGuidance(rt, todoReminderName) }
