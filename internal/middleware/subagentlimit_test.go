package middleware

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
)

func delegate(id string) model.ToolCall {
	return model.ToolCall{ID: id, Name: TaskTool, Arguments: `{"description":"x","subagent_type":"researcher"}`}
}

// ownMsg is a message of run r1.
func ownMsg(m model.Message) model.Message {
	m.Meta = map[string]any{"run_id": "r1"}
	return m
}

func limitState(msgs ...model.Message) *state.State {
	st := &state.State{}
	st.Apply(state.Update{Messages: msgs})
	return st
}

// The limits are clamped into their ranges, not refused (deer-flow #3099).
func TestSubagentLimitClamp_DeerFlow3099(t *testing.T) {
	for _, tc := range []struct{ in, want SubagentLimit }{
		{SubagentLimit{}, SubagentLimit{MaxPerResponse: 3, MaxPerRun: 6}},
		{SubagentLimit{MaxPerResponse: 9, MaxPerRun: 100}, SubagentLimit{MaxPerResponse: 4, MaxPerRun: 50}},
		{SubagentLimit{MaxPerResponse: -2, MaxPerRun: -1}, SubagentLimit{MaxPerResponse: 1, MaxPerRun: 1}},
		{SubagentLimit{MaxPerResponse: 2, MaxPerRun: 10}, SubagentLimit{MaxPerResponse: 2, MaxPerRun: 10}},
	} {
		got, err := NewSubagentLimit(tc.in)
		if err != nil || *got != tc.want {
			t.Errorf("NewSubagentLimit(%+v) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

// More delegations in one response than allowed: the first ones start,
// the rest are answered with an error before anything runs, and the
// response's other calls are left alone.
func TestSubagentLimitPerResponse(t *testing.T) {
	l, _ := NewSubagentLimit(SubagentLimit{})
	rt, ev := newRuntime("r1")
	calls := []model.ToolCall{delegate("d1"), {ID: "c1", Name: "current_time", Arguments: "{}"}, delegate("d2"), delegate("d3"), delegate("d4"),
		{ID: "s5", Name: SubagentStartTool, Arguments: `{"description":"x","subagent_type":"researcher"}`}}
	st := limitState(ownMsg(model.Message{ID: "u", Role: model.RoleUser, Content: "go"}), ownMsg(model.Message{ID: "a1", Role: model.RoleAssistant, ToolCalls: calls}))
	res, err := l.AfterModel(context.Background(), rt, st)
	if err != nil || res.Jump != JumpNone {
		t.Fatalf("AfterModel: %+v, %v", res, err)
	}
	var blocked []string
	for _, m := range res.Update.Messages {
		if m.Role != model.RoleTool || m.Status != model.ToolStatusError || m.Meta[MetaBlockedBy] != "subagent_limit" || !strings.Contains(m.Content, "at most 3 subagents start per response") {
			t.Errorf("result %+v", m)
		}
		blocked = append(blocked, m.ToolCallID)
	}
	if fmt.Sprint(blocked) != "[d4 s5]" {
		t.Errorf("blocked %v, want the delegations after the first three", blocked)
	}
	if evs := ev.ofType(protocol.EventSubagentLimited); len(evs) != 1 || evs[0].Data.(SubagentLimitData).Reason != "per_response" {
		t.Errorf("events %+v", evs)
	}
	// A fresh response under the limit is left alone.
	st = limitState(ownMsg(model.Message{ID: "a1", Role: model.RoleAssistant, ToolCalls: calls[:3]}))
	if res, _ := l.AfterModel(context.Background(), rt, st); !res.Update.Empty() {
		t.Errorf("under the limit: %+v", res)
	}
}

// The total counts over the run's responses; when it is spent, a response
// that only delegates is stripped with a visible note and the run ends
// subagent_limit_capped (deer-flow #3857). A new run gets a fresh budget.
func TestSubagentLimitPerRun_DeerFlow3857(t *testing.T) {
	l, _ := NewSubagentLimit(SubagentLimit{MaxPerRun: 4})
	rt, _ := newRuntime("r1")
	history := []model.Message{
		ownMsg(model.Message{ID: "u", Role: model.RoleUser, Content: "go"}),
		ownMsg(model.Message{ID: "a1", Role: model.RoleAssistant, ToolCalls: []model.ToolCall{delegate("d1"), delegate("d2"), delegate("d3")}}),
		ownMsg(model.Message{ID: "t1", Role: model.RoleTool, ToolCallID: "d1"}),
		ownMsg(model.Message{ID: "t2", Role: model.RoleTool, ToolCallID: "d2"}),
		ownMsg(model.Message{ID: "t3", Role: model.RoleTool, ToolCallID: "d3"}),
	}
	// One left: of two, the first starts and the second is refused for
	// the run's total.
	st := limitState(append(history, ownMsg(model.Message{ID: "a2", Role: model.RoleAssistant, ToolCalls: []model.ToolCall{delegate("d4"), delegate("d5")}}))...)
	res, _ := l.AfterModel(context.Background(), rt, st)
	if len(res.Update.Messages) != 1 || res.Update.Messages[0].ToolCallID != "d5" || !strings.Contains(res.Update.Messages[0].Content, "SUBAGENT LIMIT REACHED") || res.Jump != JumpNone {
		t.Fatalf("second response: %+v", res)
	}
	st.Apply(res.Update)
	st.Apply(state.Update{Messages: []model.Message{ownMsg(model.Message{ID: "t4", Role: model.RoleTool, ToolCallID: "d4"})}})

	// Spent: a response that only delegates ends the run.
	st.Apply(state.Update{Messages: []model.Message{ownMsg(model.Message{ID: "a3", Role: model.RoleAssistant, Content: "more help", ToolCalls: []model.ToolCall{delegate("d6")}})}})
	res, _ = l.AfterModel(context.Background(), rt, st)
	if res.Jump != JumpEnd || res.StopReason != protocol.StopSubagentLimitCapped {
		t.Fatalf("spent budget: %+v", res)
	}
	stripped := res.Update.Messages[0]
	if stripped.ID != "a3" || len(stripped.ToolCalls) != 0 || !strings.Contains(stripped.Content, "more help") || !strings.Contains(stripped.Content, "[SUBAGENT LIMIT REACHED]") {
		t.Errorf("stripped message %+v", stripped)
	}

	// Spent, but the response does other things too: only the
	// delegation is refused, the run goes on.
	st2 := limitState(append(append([]model.Message(nil), st.Messages[:len(st.Messages)-1]...),
		ownMsg(model.Message{ID: "a3", Role: model.RoleAssistant, ToolCalls: []model.ToolCall{delegate("d6"), {ID: "c", Name: "current_time"}}}))...)
	res, _ = l.AfterModel(context.Background(), rt, st2)
	if res.Jump != JumpNone || len(res.Update.Messages) != 1 || res.Update.Messages[0].ToolCallID != "d6" {
		t.Errorf("mixed response with a spent budget: %+v", res)
	}

	// The next run on the thread starts with a fresh budget.
	rt2, _ := newRuntime("r2")
	next := model.Message{ID: "b1", Role: model.RoleAssistant, ToolCalls: []model.ToolCall{delegate("e1"), delegate("e2")}, Meta: map[string]any{"run_id": "r2"}}
	st.Apply(state.Update{Messages: []model.Message{{ID: "u2", Role: model.RoleUser, Content: "again", Meta: map[string]any{"run_id": "r2"}}, next}})
	if res, _ := l.AfterModel(context.Background(), rt2, st); !res.Update.Empty() || res.Jump != JumpNone {
		t.Errorf("a new run was limited by the last one: %+v", res)
	}
}

// A response an approval interrupted before the hook ran is limited when
// the resume run starts, before its calls run.
func TestSubagentLimitOnResume(t *testing.T) {
	l, _ := NewSubagentLimit(SubagentLimit{MaxPerResponse: 1})
	rt, _ := newRuntime("r2")
	rt.Resume = []byte(`{"decisions":[{"type":"approve"}]}`)
	st := limitState(
		ownMsg(model.Message{ID: "u", Role: model.RoleUser, Content: "go"}),
		ownMsg(model.Message{ID: "a1", Role: model.RoleAssistant, ToolCalls: []model.ToolCall{delegate("d1"), delegate("d2"), {ID: "w", Name: "write_file"}}}),
	)
	res, err := l.BeforeAgent(context.Background(), rt, st)
	if err != nil || len(res.Update.Messages) != 1 || res.Update.Messages[0].ToolCallID != "d2" {
		t.Fatalf("BeforeAgent on resume: %+v, %v", res, err)
	}
	rt.Resume = nil
	if res, _ := l.BeforeAgent(context.Background(), rt, st); !res.Update.Empty() {
		t.Errorf("BeforeAgent without a resume: %+v", res)
	}
}

// Children are derived from the run's own delegation calls: a call a
// guard answered is not one; another run's calls are not this run's.
func TestDelegatedRuns(t *testing.T) {
	st := limitState(
		model.Message{ID: "old", Role: model.RoleAssistant, ToolCalls: []model.ToolCall{delegate("old1")}, Meta: map[string]any{"run_id": "r0"}},
		ownMsg(model.Message{ID: "u", Role: model.RoleUser, Content: "go"}),
		ownMsg(model.Message{ID: "a1", Role: model.RoleAssistant, ToolCalls: []model.ToolCall{delegate("d1"), delegate("d2"), {ID: "c", Name: "current_time"},
			{ID: "s1", Name: SubagentStartTool, Arguments: `{"description":"y","subagent_type":"coder","thread_id":"sub_existing"}`}}}),
		model.Message{ID: "t2", Role: model.RoleTool, ToolCallID: "d2", Meta: map[string]any{"run_id": "r1", MetaBlockedBy: "subagent_limit"}},
	)
	got := DelegatedRuns(st, "h1", "r1")
	want := map[string]ChildRun{}
	for _, c := range []struct{ call, sub, thread string }{{"d1", "researcher", ""}, {"s1", "coder", "sub_existing"}} {
		thread := c.thread
		if thread == "" {
			thread = protocol.SubagentThreadID("h1", "r1", c.sub, c.call)
		}
		want[c.call] = ChildRun{RunID: protocol.SubagentRunID(thread, "r1", c.call), ThreadID: thread, Subagent: c.sub, ToolCallID: c.call}
	}
	if len(got) != len(want) {
		t.Fatalf("children %+v", got)
	}
	for _, c := range got {
		if want[c.ToolCallID] != c {
			t.Errorf("child %+v, want %+v", c, want[c.ToolCallID])
		}
	}
}
