package middleware

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/state"
)

func known(names ...string) func(string) bool {
	return func(n string) bool {
		for _, k := range names {
			if k == n {
				return true
			}
		}
		return false
	}
}

func specs(names ...string) []model.ToolSpec {
	out := make([]model.ToolSpec, len(names))
	for i, n := range names {
		out[i] = model.ToolSpec{Name: n, Description: n}
	}
	return out
}

func specNames(ss []model.ToolSpec) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = s.Name
	}
	return out
}

func TestToolExclusion(t *testing.T) {
	ex, err := NewToolExclusion(ToolExclusion{Exclude: []string{"shell", "write_file"}}, known("search", "shell", "write_file", "read_file"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rt, _ := newRuntime("r1")

	t.Run("excluded tools are not offered", func(t *testing.T) {
		req := &ModelRequest{Tools: specs("search", "shell", "read_file", "write_file")}
		var next captureNext
		if _, err := (toolExclusionTrim{ex}).WrapModelCall(ctx, rt, req, next.handle); err != nil {
			t.Fatal(err)
		}
		if got := specNames(next.last(t).Tools); !reflect.DeepEqual(got, []string{"search", "read_file"}) {
			t.Errorf("offered %v", got)
		}
		if len(req.Tools) != 4 {
			t.Error("the caller's request was changed")
		}
	})
	t.Run("a hidden tool called by name is refused without running", func(t *testing.T) {
		ran := false
		next := func(ctx context.Context, c *ToolCall) (*ToolResult, error) {
			ran = true
			return &ToolResult{Message: model.Message{Content: "done", Status: model.ToolStatusSuccess}}, nil
		}
		res, err := ex.WrapToolCall(ctx, rt, &ToolCall{Call: call("c1", "shell", `{"command":"ls"}`)}, next)
		if err != nil {
			t.Fatal(err)
		}
		if ran {
			t.Error("the excluded tool ran")
		}
		if res.Message.Status != model.ToolStatusError || !strings.Contains(res.Message.Content, "shell") {
			t.Errorf("result = %+v", res.Message)
		}
		res, err = ex.WrapToolCall(ctx, rt, &ToolCall{Call: call("c2", "search", `{}`)}, next)
		if err != nil || !ran || res.Message.Content != "done" {
			t.Errorf("an allowed tool did not run: %+v, %v", res, err)
		}
	})
	t.Run("unknown names are rejected", func(t *testing.T) {
		_, err := NewToolExclusion(ToolExclusion{Exclude: []string{"search", "shel"}}, known("search", "shell"))
		if err == nil || !strings.Contains(err.Error(), `"shel"`) {
			t.Errorf("err = %v, want one naming shel", err)
		}
	})
	t.Run("nothing excluded passes the request through", func(t *testing.T) {
		none, err := NewToolExclusion(ToolExclusion{}, known())
		if err != nil {
			t.Fatal(err)
		}
		req := &ModelRequest{Tools: specs("search")}
		var seen *ModelRequest
		_, _ = (toolExclusionTrim{none}).WrapModelCall(ctx, rt, req, func(ctx context.Context, r *ModelRequest) (*ModelResponse, error) {
			seen = r
			return &ModelResponse{}, nil
		})
		if seen != req {
			t.Error("request was copied for nothing")
		}
	})
}

func newLimit(t *testing.T, l ToolCallLimit) *ToolCallLimit {
	t.Helper()
	m, err := NewToolCallLimit(l)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func limitAfterModel(t *testing.T, l *ToolCallLimit, rt *Runtime, st *state.State) (Result, error) {
	t.Helper()
	return l.AfterModel(context.Background(), rt, st)
}

// blockedIDs returns the call ids answered by results the limit wrote.
func blockedIDs(u state.Update, name string) []string {
	var ids []string
	for _, m := range u.Messages {
		if m.Role == model.RoleTool && m.Meta[MetaBlockedBy] == name {
			ids = append(ids, m.ToolCallID)
		}
	}
	return ids
}

// answerRest appends results for the calls of the last assistant message
// that are still unanswered, as the loop does after a continue.
func answerRest(st *state.State, runID string, assistantID string) {
	i := st.Index(assistantID)
	answered := map[string]bool{}
	for _, m := range st.Messages[i+1:] {
		if m.Role == model.RoleTool {
			answered[m.ToolCallID] = true
		}
	}
	for _, c := range st.Messages[i].ToolCalls {
		if !answered[c.ID] {
			st.Messages = append(st.Messages, inRun(runID, result("t_"+c.ID, c.ID, c.Name, "ok"))...)
		}
	}
}

func TestToolCallLimit_Continue(t *testing.T) {
	t.Run("run limit on all tools", func(t *testing.T) {
		l := newLimit(t, ToolCallLimit{RunLimit: 2})
		rt, _ := newRuntime("r1")
		st := stateOf(append(inRun("r1", user("u1", "q")), inRun("r1", asst("a1", "", call("c1", "search", `{}`), call("c2", "fetch", `{}`), call("c3", "search", `{}`)))...)...)
		res, err := limitAfterModel(t, l, rt, st)
		if err != nil || res.Jump != JumpNone {
			t.Fatalf("result %+v, err %v", res, err)
		}
		if got := blockedIDs(res.Update, "tool_call_limit"); !reflect.DeepEqual(got, []string{"c3"}) {
			t.Fatalf("blocked %v, want [c3]", got)
		}
		b := res.Update.Messages[0]
		if b.Status != model.ToolStatusError || b.Name != "search" || b.Meta["run_id"] != "r1" || !strings.Contains(b.Content, "limit") {
			t.Errorf("blocked result = %+v", b)
		}
		st.Apply(res.Update)
		answerRest(st, "r1", "a1")
		mustValidate(t, "", st.Messages, "search", "fetch")

		// The run's next call is over the limit too: blocked calls count
		// for the run.
		st.Messages = append(st.Messages, inRun("r1", asst("a2", "", call("c4", "fetch", `{}`)))...)
		res, _ = limitAfterModel(t, l, rt, st)
		if got := blockedIDs(res.Update, "tool_call_limit"); !reflect.DeepEqual(got, []string{"c4"}) {
			t.Errorf("blocked %v, want [c4]", got)
		}
	})
	t.Run("limit on one tool leaves others alone", func(t *testing.T) {
		l := newLimit(t, ToolCallLimit{Tool: "search", RunLimit: 1})
		if l.Name() != "tool_call_limit_search" {
			t.Errorf("name = %q", l.Name())
		}
		rt, _ := newRuntime("r1")
		st := stateOf(append(inRun("r1", user("u1", "q")), inRun("r1", asst("a1", "", call("c1", "search", `{}`), call("c2", "fetch", `{}`), call("c3", "search", `{}`), call("c4", "fetch", `{}`)))...)...)
		res, _ := limitAfterModel(t, l, rt, st)
		if got := blockedIDs(res.Update, l.Name()); !reflect.DeepEqual(got, []string{"c3"}) {
			t.Errorf("blocked %v, want [c3]", got)
		}
		if !strings.Contains(res.Update.Messages[0].Content, "search") {
			t.Errorf("text = %q", res.Update.Messages[0].Content)
		}
	})
	t.Run("under the limit: nothing", func(t *testing.T) {
		l := newLimit(t, ToolCallLimit{RunLimit: 5})
		rt, _ := newRuntime("r1")
		st := stateOf(append(inRun("r1", user("u1", "q")), inRun("r1", asst("a1", "", call("c1", "search", `{}`)))...)...)
		if res, err := limitAfterModel(t, l, rt, st); err != nil || !res.Update.Empty() || res.Jump != JumpNone {
			t.Errorf("result %+v, err %v", res, err)
		}
	})
}

func TestToolCallLimit_End(t *testing.T) {
	l := newLimit(t, ToolCallLimit{RunLimit: 1, ExitBehavior: LimitEnd})
	rt, _ := newRuntime("r1")
	st := stateOf(append(inRun("r1", user("u1", "q")), inRun("r1", asst("a1", "", call("c1", "search", `{}`), call("c2", "fetch", `{}`), call("c3", "search", `{}`)))...)...)
	res, err := limitAfterModel(t, l, rt, st)
	if err != nil {
		t.Fatal(err)
	}
	if res.Jump != JumpEnd || res.StopReason != StopToolLimitCapped {
		t.Fatalf("result %+v", res)
	}
	st.Apply(res.Update)
	// Every call answered, then a final assistant note.
	answered := map[string]bool{}
	for _, m := range st.Messages {
		if m.Role == model.RoleTool {
			answered[m.ToolCallID] = true
			if m.Status != model.ToolStatusError {
				t.Errorf("call %s answered with %s: it never ran", m.ToolCallID, m.Status)
			}
		}
	}
	if len(answered) != 3 {
		t.Errorf("answered %v, want all 3 calls", answered)
	}
	last := st.Messages[len(st.Messages)-1]
	if last.Role != model.RoleAssistant || len(last.ToolCalls) != 0 || strings.TrimSpace(last.Content) == "" || last.Meta[MetaStopNote] != StopToolLimitCapped {
		t.Errorf("last message = %+v, want the final note", last)
	}
	mustValidate(t, "", st.Messages, "search", "fetch")
}

func TestToolCallLimit_Error(t *testing.T) {
	l := newLimit(t, ToolCallLimit{Tool: "search", RunLimit: 1, ExitBehavior: LimitError})
	rt, _ := newRuntime("r1")
	st := stateOf(append(inRun("r1", user("u1", "q")), inRun("r1", asst("a1", "", call("c1", "search", `{}`), call("c2", "search", `{}`)))...)...)
	res, err := limitAfterModel(t, l, rt, st)
	if err == nil || !strings.Contains(err.Error(), "search") {
		t.Errorf("err = %v, want an error naming search", err)
	}
	if !res.Update.Empty() {
		t.Errorf("update %+v on error", res.Update)
	}
}

// The thread limit counts calls earlier runs made but not the ones this
// limit blocked (they never ran).
func TestToolCallLimit_ThreadLimit(t *testing.T) {
	l := newLimit(t, ToolCallLimit{Tool: "search", ThreadLimit: 2})
	earlier := func(secondBlocked bool) []model.Message {
		second := inRun("r0", result("ot2", "oc2", "search", "ok"))[0]
		if secondBlocked {
			second = model.Message{ID: "limit_oc2", Role: model.RoleTool, ToolCallID: "oc2", Name: "search", Content: "limit", Status: model.ToolStatusError,
				Meta: map[string]any{MetaBlockedBy: l.Name(), "run_id": "r0"}}
		}
		return append(inRun("r0",
			user("u0", "old"),
			asst("oa1", "", call("oc1", "search", `{}`), call("oc2", "search", `{}`)),
			result("ot1", "oc1", "search", "ok"),
		), second, inRun("r0", asst("oa2", "old answer"))[0])
	}
	current := inRun("r1", user("u1", "new"), asst("a1", "", call("c1", "search", `{}`), call("c2", "search", `{}`)))

	t.Run("blocked calls of earlier runs do not count", func(t *testing.T) {
		rt, _ := newRuntime("r1")
		st := stateOf(append(earlier(true), current...)...)
		res, _ := limitAfterModel(t, l, rt, st)
		if got := blockedIDs(res.Update, l.Name()); !reflect.DeepEqual(got, []string{"c2"}) {
			t.Errorf("blocked %v, want [c2] (1 earlier call ran)", got)
		}
	})
	t.Run("allowed calls of earlier runs count", func(t *testing.T) {
		rt, _ := newRuntime("r1")
		st := stateOf(append(earlier(false), current...)...)
		res, _ := limitAfterModel(t, l, rt, st)
		if got := blockedIDs(res.Update, l.Name()); !reflect.DeepEqual(got, []string{"c1", "c2"}) {
			t.Errorf("blocked %v, want [c1 c2] (2 earlier calls ran)", got)
		}
	})
	t.Run("a run limit ignores earlier runs", func(t *testing.T) {
		rl := newLimit(t, ToolCallLimit{Tool: "search", RunLimit: 2})
		rt, _ := newRuntime("r1")
		st := stateOf(append(earlier(false), current...)...)
		if res, _ := limitAfterModel(t, rl, rt, st); !res.Update.Empty() {
			t.Errorf("blocked %v", blockedIDs(res.Update, rl.Name()))
		}
	})
	t.Run("replay gives the same decision", func(t *testing.T) {
		rt, _ := newRuntime("r1")
		st := stateOf(append(earlier(true), current...)...)
		res, _ := limitAfterModel(t, l, rt, jsonRoundTrip(t, st))
		if got := blockedIDs(res.Update, l.Name()); !reflect.DeepEqual(got, []string{"c2"}) {
			t.Errorf("after a round trip blocked %v, want [c2]", got)
		}
	})
}

func TestNewToolCallLimit_Validation(t *testing.T) {
	for name, bad := range map[string]ToolCallLimit{
		"no limit":               {},
		"negative":               {RunLimit: -1, ThreadLimit: 3},
		"run over thread":        {RunLimit: 5, ThreadLimit: 3},
		"unknown exit behaviour": {RunLimit: 1, ExitBehavior: "explode"},
	} {
		if _, err := NewToolCallLimit(bad); err == nil {
			t.Errorf("%s: accepted %+v", name, bad)
		}
	}
	l := newLimit(t, ToolCallLimit{RunLimit: 1})
	if l.ExitBehavior != LimitContinue || l.Name() != "tool_call_limit" {
		t.Errorf("defaults = %+v", l)
	}
}

// Two limits over the same call: the first to see the response (the later
// one in the chain) answers it; the other must not answer it a second
// time, and both count it as blocked, not run.
func TestToolCallLimit_TwoLimitsOneCall(t *testing.T) {
	all := newLimit(t, ToolCallLimit{MiddlewareName: "all", RunLimit: 1})
	search := newLimit(t, ToolCallLimit{MiddlewareName: "search_only", Tool: "search", RunLimit: 1})
	rt, _ := newRuntime("r1")
	st := stateOf(inRun("r1", user("u1", "q"),
		asst("a1", "", call("c1", "search", "{}")), result("t1", "c1", "search", "ok"),
		asst("a2", "", call("c2", "search", "{}")))...)
	res, err := limitAfterModel(t, search, rt, st)
	if err != nil {
		t.Fatal(err)
	}
	st.Apply(res.Update)
	res2, err := limitAfterModel(t, all, rt, st)
	if err != nil {
		t.Fatal(err)
	}
	if !res2.Update.Empty() {
		t.Fatalf("the second limit answered an answered call again: %+v", res2.Update)
	}
	mustValidate(t, "", st.Messages, "search")
}
