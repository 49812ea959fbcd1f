package middleware

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
)

// used returns an assistant message of run with recorded usage.
func used(runID, id string, in, out int, calls ...model.ToolCall) model.Message {
	m := inRun(runID, asst(id, "", calls...))[0]
	if len(calls) == 0 {
		m.Content = "answer " + id
	}
	SetUsage(&m, Usage{Input: in, Output: out})
	return m
}

func newBudget(t *testing.T, b TokenBudget) *TokenBudget {
	t.Helper()
	tb, err := NewTokenBudget(b)
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

func budgetAfterModel(t *testing.T, b *TokenBudget, rt *Runtime, st *state.State) Result {
	t.Helper()
	res, err := b.AfterModel(context.Background(), rt, st)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// earlierRun is a previous run on the thread that spent far more than
// any budget of the tests.
func earlierRun() []model.Message {
	return append(inRun("r0", user("u0", "old question")),
		used("r0", "old1", 900000, 50000, call("oc1", "search", `{}`)),
		inRun("r0", result("ot1", "oc1", "search", "r"))[0],
		used("r0", "old2", 950000, 60000),
	)
}

// deer-flow §5.5 #39: only this run's model calls count.
func TestTokenBudget_DeerFlow39_OnlyThisRunCounts(t *testing.T) {
	b := newBudget(t, TokenBudget{MaxTokens: 10000})
	rt, ev := newRuntime("r1")
	st := stateOf(append(earlierRun(),
		inRun("r1", user("u1", "new question"))[0],
		used("r1", "a1", 1000, 200, call("c1", "search", `{}`)),
	)...)
	if in, out := RunUsage(st, "r1"); in != 1000 || out != 200 {
		t.Errorf("RunUsage = %d, %d; want 1000, 200", in, out)
	}
	res := budgetAfterModel(t, b, rt, st)
	if res.Jump != JumpNone || !res.Update.Empty() || len(pendingGuidance(rt, budgetWarningName)) != 0 || len(ev.all) != 0 {
		t.Errorf("earlier runs' usage counted: result %+v, events %+v", res, ev.all)
	}
	if in, out := RunUsage(st, "r0"); in != 0 || out != 0 {
		t.Errorf("RunUsage of a run that is not the tail = %d, %d", in, out)
	}
}

// deer-flow §5.5 #40: one warning at 80%, request-only; a hard stop at
// 100% strips the tool calls.
func TestTokenBudget_DeerFlow40_WarnOnceThenStop(t *testing.T) {
	b := newBudget(t, TokenBudget{MaxTokens: 10000})
	rt, ev := newRuntime("r1")
	st := stateOf(append(earlierRun(), inRun("r1", user("u1", "q"))...)...)
	step := func(id string, in, out int) Result {
		st.Messages = append(st.Messages, used("r1", id, in, out, call("c_"+id, "search", `{}`)))
		res := budgetAfterModel(t, b, rt, st)
		if res.Jump == JumpNone {
			st.Messages = append(st.Messages, inRun("r1", result("t_"+id, "c_"+id, "search", "r"))...)
		}
		return res
	}

	if res := step("a1", 5000, 500); res.Jump != JumpNone || len(pendingGuidance(rt, budgetWarningName)) != 0 {
		t.Fatalf("55%%: result %+v, warnings %q", res, pendingGuidance(rt, budgetWarningName))
	}
	if res := step("a2", 2400, 100); res.Jump != JumpNone || !res.Update.Empty() {
		t.Fatalf("80%%: result %+v, want a warning only", res)
	}
	w := pendingGuidance(rt, budgetWarningName)
	if len(w) != 1 || !strings.Contains(w[0], "[TOKEN BUDGET WARNING]") || !strings.Contains(w[0], "8000") {
		t.Fatalf("warnings = %q", w)
	}
	if len(ev.ofType(EventBudgetWarning)) != 1 {
		t.Errorf("budget.warning events = %d", len(ev.ofType(EventBudgetWarning)))
	}

	// The warning goes into the next request only, after the results.
	before := st.Clone()
	var next captureNext
	if _, err := b.WrapModelCall(context.Background(), rt, &ModelRequest{Messages: append([]model.Message(nil), st.Messages...), State: st}, next.handle); err != nil {
		t.Fatal(err)
	}
	got := next.last(t).Messages
	if last := got[len(got)-1]; last.Role != model.RoleUser || last.Name != budgetWarningName || got[len(got)-2].Role != model.RoleTool {
		t.Errorf("request ends %+v, want the budget warning after the tool result", last)
	}
	mustValidate(t, "", got, "search")
	if !reflect.DeepEqual(st, before) {
		t.Error("the warning entered state")
	}
	if len(pendingGuidance(rt, budgetWarningName)) != 0 {
		t.Error("the warning was not cleared after a successful call")
	}

	// Still over 80%, below 100%: no second warning.
	if res := step("a3", 1000, 100); res.Jump != JumpNone || len(pendingGuidance(rt, budgetWarningName)) != 0 {
		t.Errorf("91%%: result %+v, warnings %q; want no second warning", res, pendingGuidance(rt, budgetWarningName))
	}

	// 100%: hard stop.
	last := st.Messages
	res := step("a4", 800, 100)
	if res.Jump != JumpEnd || res.StopReason != protocol.StopTokenCapped || len(res.Update.Messages) != 1 {
		t.Fatalf("100%%: result %+v", res)
	}
	m := res.Update.Messages[0]
	if m.ID != "a4" || len(m.ToolCalls) != 0 || !strings.Contains(m.Content, "[TOKEN BUDGET EXCEEDED]") || m.Meta[MetaStopNote] != protocol.StopTokenCapped {
		t.Errorf("stripped message = %+v", m)
	}
	if _, ok := UsageOf(&m); !ok {
		t.Error("the stripped message lost its usage")
	}
	st.Apply(res.Update)
	if len(st.Messages) != len(last)+1 {
		t.Error("the stop did not replace the message in place")
	}
	mustValidate(t, "", st.Messages, "search")
	if len(ev.ofType(EventBudgetExceeded)) != 1 {
		t.Errorf("budget.exceeded events = %d", len(ev.ofType(EventBudgetExceeded)))
	}
}

// A final answer that crosses the budget finished on its own: it is kept
// as it is and the run is not reported as capped.
func TestTokenBudget_OverBudgetFinalAnswerIsKept(t *testing.T) {
	b := newBudget(t, TokenBudget{MaxTokens: 1000})
	rt, ev := newRuntime("r1")
	st := stateOf(append(inRun("r1", user("u1", "q")), used("r1", "a1", 2000, 10))...)
	res := budgetAfterModel(t, b, rt, st)
	if res.Jump != JumpNone || res.StopReason != "" || !res.Update.Empty() {
		t.Errorf("result = %+v, want nothing: the answer is final and untouched", res)
	}
	if n := len(ev.ofType(EventBudgetExceeded)); n != 0 {
		t.Errorf("%d budget.exceeded events for a natural finish", n)
	}
}

// Invariant 5: the count is derived from checkpointed messages, so a
// replayed state gives the same count and the same decision.
func TestTokenBudget_ReplayAfterJSONRoundTrip(t *testing.T) {
	st := stateOf(append(earlierRun(),
		inRun("r1", user("u1", "q"))[0],
		used("r1", "a1", 3000, 400, call("c1", "search", `{}`)),
		inRun("r1", result("t1", "c1", "search", "r"))[0],
		used("r1", "a2", 4200, 600, call("c2", "search", `{}`)),
	)...)
	replayed := jsonRoundTrip(t, st)
	in1, out1 := RunUsage(st, "r1")
	in2, out2 := RunUsage(replayed, "r1")
	if in1 != 7200 || out1 != 1000 || in2 != in1 || out2 != out1 {
		t.Errorf("usage in memory %d/%d, after a round trip %d/%d; want 7200/1000 both", in1, out1, in2, out2)
	}
	if u, ok := UsageOf(&replayed.Messages[len(replayed.Messages)-1]); !ok || u.Input != 4200 || u.Output != 600 {
		t.Errorf("UsageOf after a round trip = %+v, %v", u, ok)
	}
	b := newBudget(t, TokenBudget{MaxTokens: 8000})
	for name, s := range map[string]*state.State{"in memory": st, "replayed": replayed} {
		rt, _ := newRuntime("r1")
		res := budgetAfterModel(t, b, rt, s)
		if res.Jump != JumpEnd || res.StopReason != protocol.StopTokenCapped {
			t.Errorf("%s: result %+v, want a stop at 8200/8000", name, res)
		}
	}
}

func TestTokenBudget_MaxInputTokensWins(t *testing.T) {
	b := newBudget(t, TokenBudget{MaxTokens: 100000, MaxInputTokens: 10000, MaxOutputTokens: 50000})
	if frac, used, budget, which := b.fraction(8500, 100); which != "input" || used != 8500 || budget != 10000 || frac != 0.85 {
		t.Errorf("fraction = %v %d %d %s, want input 8500/10000", frac, used, budget, which)
	}
	if _, _, _, which := b.fraction(100, 45000); which != "output" {
		t.Errorf("which = %s, want output", which)
	}
	loose := newBudget(t, TokenBudget{MaxTokens: 10000, MaxInputTokens: 100000})
	if _, _, _, which := loose.fraction(1000, 1000); which != "total" {
		t.Errorf("which = %s, want total", which)
	}
	rt, _ := newRuntime("r1")
	st := stateOf(append(inRun("r1", user("u1", "q")), used("r1", "a1", 8500, 100, call("c1", "search", `{}`)))...)
	budgetAfterModel(t, b, rt, st)
	if w := pendingGuidance(rt, budgetWarningName); len(w) != 1 || !strings.Contains(w[0], "input") || !strings.Contains(w[0], "10000") {
		t.Errorf("warnings = %q, want one about the input budget", w)
	}
	st.Messages = append(st.Messages, inRun("r1", result("t1", "c1", "search", "r"))[0], used("r1", "a2", 1500, 100, call("c2", "search", `{}`)))
	res := budgetAfterModel(t, b, rt, st)
	if res.Jump != JumpEnd || !strings.Contains(res.Update.Messages[0].Content, "input") {
		t.Errorf("result = %+v, want a stop on the input budget", res)
	}
}

func TestTokenBudget_FailedCallKeepsWarning(t *testing.T) {
	b := newBudget(t, TokenBudget{MaxTokens: 1000})
	rt, _ := newRuntime("r1")
	st := stateOf(append(inRun("r1", user("u1", "q")), used("r1", "a1", 850, 0, call("c1", "search", `{}`)))...)
	budgetAfterModel(t, b, rt, st)
	failed := captureNext{err: errors.New("boom")}
	if _, err := b.WrapModelCall(context.Background(), rt, &ModelRequest{Messages: st.Messages}, failed.handle); err == nil {
		t.Fatal("want the error")
	}
	if len(pendingGuidance(rt, budgetWarningName)) != 1 {
		t.Error("a failed call dropped the warning")
	}
}

func TestNewTokenBudget_Validation(t *testing.T) {
	b, err := NewTokenBudget(TokenBudget{})
	if err != nil || b.MaxTokens != 200000 || b.Warn != 0.8 || b.Hard != 1.0 {
		t.Fatalf("defaults = %+v, %v", b, err)
	}
	for name, bad := range map[string]TokenBudget{
		"max_tokens below 1000": {MaxTokens: 999},
		"hard below warn":       {Warn: 0.9, Hard: 0.5},
		"negative input":        {MaxInputTokens: -1},
		"negative warn":         {Warn: -0.1},
	} {
		if _, err := NewTokenBudget(bad); err == nil {
			t.Errorf("%s: accepted %+v", name, bad)
		}
	}
}

// deer-flow §5.5 #39, second half: the usage of the subagents a run
// started counts in its budget, each child once however many results
// report it ended, and only this run's children.
func TestTokenBudget_DeerFlow39_SubagentUsageCounts(t *testing.T) {
	childDone := func(id, callID, tool, child string, in, out int) model.Message {
		m := inRun("r1", result(id, callID, tool, "done"))[0]
		m.Meta[MetaSubagentUsage] = map[string]any{"run_id": child, "input_tokens": in, "output_tokens": out}
		return m
	}
	base := append(earlierRun(),
		childDone("old_t", "oc1", TaskTool, "child_old", 500000, 1000), // another run's (r0 tag below)
		inRun("r1", user("u1", "delegate"))[0],
		used("r1", "a1", 1000, 100, call("c1", TaskTool, `{"subagent_type":"researcher","description":"x"}`)),
		childDone("t1", "c1", TaskTool, "child_1", 6000, 1000),
		used("r1", "a2", 1000, 100, call("c2", SubagentStatusTool, `{"run_id":"child_1"}`)),
		childDone("t2", "c2", SubagentStatusTool, "child_1", 6000, 1000), // the same child again
		used("r1", "a3", 500, 50, call("c3", "search", `{}`)),
	)
	base[len(earlierRun())].Meta["run_id"] = "r0"
	// This run: 2,500 + 250 of its own calls and 7,000 of its child,
	// once: 9,750 of 10,000 warns; counted twice it would stop.
	b := newBudget(t, TokenBudget{MaxTokens: 10000})
	rt, ev := newRuntime("r1")
	if in, out := ChildUsage(stateOf(base...), "r1"); in != 6000 || out != 1000 {
		t.Fatalf("child usage %d/%d, want 6000/1000", in, out)
	}
	res := budgetAfterModel(t, b, rt, stateOf(base...))
	if res.Jump != JumpNone || len(ev.ofType(EventBudgetWarning)) != 1 {
		t.Fatalf("result %+v, warnings %d: want one warning and no stop", res, len(ev.ofType(EventBudgetWarning)))
	}
	// Without the child it is far below the warning.
	b2 := newBudget(t, TokenBudget{MaxTokens: 10000})
	rt2, ev2 := newRuntime("r1")
	plain := stateOf(append(model.CloneMessages(base), used("r1", "a4", 0, 0))...)
	for i := range plain.Messages {
		delete(plain.Messages[i].Meta, MetaSubagentUsage)
	}
	if res := budgetAfterModel(t, b2, rt2, plain); res.Jump != JumpNone || len(ev2.ofType(EventBudgetWarning)) != 0 {
		t.Fatalf("without the child: %+v", res)
	}
	// A bigger child stops the run.
	big := append(base[:len(base):len(base)], childDone("t3", "c3", "search", "child_2", 0, 0))
	big = append(big, used("r1", "a5", 100, 10, call("c5", TaskTool, `{"subagent_type":"researcher","description":"y"}`)))
	big[len(big)-2].Meta[MetaSubagentUsage] = map[string]any{"run_id": "child_2", "input_tokens": 3000, "output_tokens": 0}
	rt3, _ := newRuntime("r1")
	res = budgetAfterModel(t, newBudget(t, TokenBudget{MaxTokens: 10000}), rt3, stateOf(big...))
	if res.Jump != JumpEnd || res.StopReason != protocol.StopTokenCapped {
		t.Fatalf("a second child over the budget: %+v", res)
	}
}
