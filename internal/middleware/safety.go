package middleware

// Safety finish reason. Boundary: model response (after-model). Reads the
// last assistant message and its finish reason; writes that message when
// it acts; emits safety.stopped (custom). When the provider ended a
// response for a safety reason (content_filter, refusal, ...), the tool
// calls in it may be truncated: they are suppressed with a visible note and
// the run ends with stop_reason safety. An empty response gets a visible
// text so no empty assistant message is stored. It sits last among the
// after-model middlewares of the chain, so it sees a response first and
// later guards never count calls it suppressed.

import (
	"context"
	"fmt"
	"strings"

	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
)

// SafetyFinishReason suppresses tool calls of safety-stopped responses.
type SafetyFinishReason struct {
	// Reasons are the finish reasons treated as safety stops.
	Reasons []string `json:"finish_reasons"`
}

// DefaultSafetyReasons covers OpenAI-compatible, Anthropic and Gemini
// providers.
var DefaultSafetyReasons = []string{"content_filter", "refusal", "safety", "blocklist", "prohibited_content", "spii", "recitation"}

// NewSafetyFinishReason fills the default reasons.
func NewSafetyFinishReason(s SafetyFinishReason) (*SafetyFinishReason, error) {
	if len(s.Reasons) == 0 {
		s.Reasons = DefaultSafetyReasons
	}
	return &s, nil
}

// Name implements Middleware.
func (*SafetyFinishReason) Name() string { return "safety_finish_reason" }

// EventSafetyStopped is emitted when a response was stopped for safety.
const EventSafetyStopped = protocol.EventSafetyStopped

// AfterModel implements AfterModel.
func (s *SafetyFinishReason) AfterModel(ctx context.Context, rt *Runtime, st *state.State) (Result, error) {
	i := LastAssistant(st)
	if i < 0 || i != len(st.Messages)-1 {
		return Result{}, nil
	}
	m := st.Messages[i]
	reason, _ := m.Meta["finish_reason"].(string)
	if !s.matches(reason) {
		return Result{}, nil
	}
	switch {
	case len(m.ToolCalls) > 0:
		if rt.Emit != nil {
			rt.Emit(EventSafetyStopped, map[string]any{"finish_reason": reason, "suppressed_tool_calls": len(m.ToolCalls)})
		}
		return stopWith(st, i, protocol.StopSafety, fmt.Sprintf("[The model provider stopped this response with a safety signal (finish_reason=%s). Its tool calls were not run because their arguments may be cut off. Rephrase the request or try another approach.]", reason)), nil
	case strings.TrimSpace(m.Content) == "":
		if rt.Emit != nil {
			rt.Emit(EventSafetyStopped, map[string]any{"finish_reason": reason})
		}
		return stopWith(st, i, protocol.StopSafety, fmt.Sprintf("[The model provider returned no content (finish_reason=%s).]", reason)), nil
	}
	return Result{}, nil
}

func (s *SafetyFinishReason) matches(reason string) bool {
	reason = strings.ToLower(reason)
	for _, r := range s.Reasons {
		if reason == strings.ToLower(r) {
			return true
		}
	}
	return false
}
