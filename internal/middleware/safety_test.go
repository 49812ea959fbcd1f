package middleware

import (
	"context"
	"strings"
	"testing"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
)

func withFinish(m model.Message, reason string) model.Message {
	m = m.Clone()
	if m.Meta == nil {
		m.Meta = map[string]any{}
	}
	m.Meta["finish_reason"] = reason
	return m
}

// deer-flow §2.17 (#3028, #4393).
func TestSafetyFinishReason(t *testing.T) {
	s, err := NewSafetyFinishReason(SafetyFinishReason{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	t.Run("content_filter with tool calls: stripped, run ends with safety", func(t *testing.T) {
		rt, ev := newRuntime("r1")
		resp := withFinish(asst("a1", "Let me run", call("c1", "shell", `{"command":"rm -rf`), call("c2", "search", `{}`)), model.FinishContentFilter)
		st := stateOf(user("u1", "q"), resp)
		res, err := s.AfterModel(ctx, rt, st)
		if err != nil {
			t.Fatal(err)
		}
		if res.Jump != JumpEnd || res.StopReason != protocol.StopSafety || len(res.Update.Messages) != 1 {
			t.Fatalf("result = %+v", res)
		}
		m := res.Update.Messages[0]
		if m.ID != "a1" || len(m.ToolCalls) != 0 || !strings.HasPrefix(m.Content, "Let me run\n\n") || !strings.Contains(m.Content, "finish_reason=content_filter") {
			t.Errorf("message = %+v", m)
		}
		if m.Meta[MetaStopNote] != protocol.StopSafety {
			t.Errorf("meta = %v", m.Meta)
		}
		st.Apply(res.Update)
		mustValidate(t, "", st.Messages)
		evs := ev.ofType(EventSafetyStopped)
		if len(evs) != 1 || evs[0].Data.(map[string]any)["suppressed_tool_calls"] != 2 {
			t.Errorf("events = %+v", evs)
		}
		if len(resp.ToolCalls) != 2 {
			t.Error("the state's message was edited in place")
		}
	})
	t.Run("text and no tool calls: untouched", func(t *testing.T) {
		rt, ev := newRuntime("r1")
		st := stateOf(user("u1", "q"), withFinish(asst("a1", "Partial answer."), model.FinishContentFilter))
		res, err := s.AfterModel(ctx, rt, st)
		if err != nil || res.Jump != JumpNone || !res.Update.Empty() || len(ev.all) != 0 {
			t.Errorf("result = %+v, err %v, events %v", res, err, ev.all)
		}
	})
	t.Run("empty: backfilled", func(t *testing.T) {
		rt, _ := newRuntime("r1")
		st := stateOf(user("u1", "q"), withFinish(asst("a1", " "), "refusal"))
		res, err := s.AfterModel(ctx, rt, st)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Update.Messages) != 1 || strings.TrimSpace(res.Update.Messages[0].Content) == "" || res.StopReason != protocol.StopSafety {
			t.Fatalf("result = %+v", res)
		}
		st.Apply(res.Update)
		mustValidate(t, "", st.Messages)
	})
	t.Run("case-insensitive provider reasons", func(t *testing.T) {
		rt, _ := newRuntime("r1")
		st := stateOf(user("u1", "q"), withFinish(asst("a1", "", call("c1", "search", `{}`)), "SAFETY"))
		if res, _ := s.AfterModel(ctx, rt, st); res.Jump != JumpEnd {
			t.Errorf("Gemini SAFETY not matched: %+v", res)
		}
	})
	t.Run("ordinary finish reasons pass", func(t *testing.T) {
		rt, _ := newRuntime("r1")
		for _, reason := range []string{model.FinishToolCalls, model.FinishStop, model.FinishLength, ""} {
			st := stateOf(user("u1", "q"), withFinish(asst("a1", "", call("c1", "search", `{}`)), reason))
			if res, _ := s.AfterModel(ctx, rt, st); res.Jump != JumpNone || !res.Update.Empty() {
				t.Errorf("%q: result %+v", reason, res)
			}
		}
	})
	t.Run("configured reasons replace the defaults", func(t *testing.T) {
		custom, _ := NewSafetyFinishReason(SafetyFinishReason{Reasons: []string{"policy_block"}})
		rt, _ := newRuntime("r1")
		st := stateOf(user("u1", "q"), withFinish(asst("a1", "", call("c1", "search", `{}`)), "policy_block"))
		if res, _ := custom.AfterModel(ctx, rt, st); res.Jump != JumpEnd {
			t.Errorf("custom reason not matched: %+v", res)
		}
		st = stateOf(user("u1", "q"), withFinish(asst("a1", "", call("c1", "search", `{}`)), model.FinishContentFilter))
		if res, _ := custom.AfterModel(ctx, rt, st); res.Jump != JumpNone {
			t.Errorf("default reason matched although replaced: %+v", res)
		}
	})
}
