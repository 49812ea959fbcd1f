package middleware

// Token budget. Boundary: model response (after-model) and model call
// (request-only warning). Reads the usage recorded on this run's assistant
// messages (meta "usage"); writes only the stripped assistant message of a
// hard stop; emits budget.warning and budget.exceeded (custom). Off by
// default. Only this run's model calls count, with the usage of the
// subagents it started once a result reports them ended (each once, by
// run id), and the count is derived from checkpointed messages, so a
// redelivered or replayed step is never counted twice. Input tokens are summed per call: context sent again is
// paid again.

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
)

// TokenBudget stops a run that spends too many tokens.
type TokenBudget struct {
	MaxTokens       int     `json:"max_tokens"`
	MaxInputTokens  int     `json:"max_input_tokens"`
	MaxOutputTokens int     `json:"max_output_tokens"`
	Warn            float64 `json:"warn_threshold"`
	Hard            float64 `json:"hard_stop_threshold"`
}

// NewTokenBudget fills defaults (200,000 tokens, warn at 0.8, stop at 1.0)
// and checks the thresholds.
func NewTokenBudget(b TokenBudget) (*TokenBudget, error) {
	if b.MaxTokens == 0 {
		b.MaxTokens = 200000
	}
	if b.Warn == 0 {
		b.Warn = 0.8
	}
	if b.Hard == 0 {
		b.Hard = 1.0
	}
	switch {
	case b.MaxTokens < 1000:
		return nil, fmt.Errorf("max_tokens must be at least 1000, not %d", b.MaxTokens)
	case b.MaxInputTokens < 0 || b.MaxOutputTokens < 0:
		return nil, fmt.Errorf("max_input_tokens and max_output_tokens must not be negative")
	case b.Warn <= 0 || b.Hard < b.Warn:
		return nil, fmt.Errorf("need 0 < warn_threshold <= hard_stop_threshold, got %g and %g", b.Warn, b.Hard)
	}
	return &b, nil
}

// Name implements Middleware.
func (*TokenBudget) Name() string { return "token_budget" }

const budgetWarningName = "budget_warning"

// Token budget events.
const (
	EventBudgetWarning  = protocol.EventBudgetWarning
	EventBudgetExceeded = protocol.EventBudgetExceeded
)

// AfterModel implements AfterModel.
func (b *TokenBudget) AfterModel(ctx context.Context, rt *Runtime, st *state.State) (Result, error) {
	in, out := RunUsage(st, rt.RunID)
	// The children's tokens are the run's spending too (research case
	// 39), counted once each when a result reports a child ended.
	cin, cout := ChildUsage(st, rt.RunID)
	frac, used, budget, which := b.fraction(in+cin, out+cout)
	i := LastAssistant(st)
	if frac >= b.Hard && i >= 0 {
		if len(st.Messages[i].ToolCalls) == 0 {
			// A final answer that crossed the budget finished on its own:
			// nothing was cut short.
			return Result{}, nil
		}
		if rt.Emit != nil {
			rt.Emit(EventBudgetExceeded, map[string]any{"used": used, "budget": budget, "kind": which})
		}
		note := fmt.Sprintf("[TOKEN BUDGET EXCEEDED] This run used %d %s tokens, over its budget of %d. Here is the answer with the results collected so far.", used, which, budget)
		return stopWith(st, i, protocol.StopTokenCapped, note), nil
	}
	warned := Scratch(rt, "token_budget:warned", func() *bool { return new(bool) })
	if frac >= b.Warn && !*warned {
		*warned = true
		queueGuidance(rt, budgetWarningName, fmt.Sprintf("[TOKEN BUDGET WARNING] This run has used %d of its %d %s token budget (%.0f%%). Wrap up and give your final answer; avoid new tool calls unless they are necessary.", used, budget, which, frac*100))
		if rt.Emit != nil {
			rt.Emit(EventBudgetWarning, map[string]any{"used": used, "budget": budget, "kind": which})
		}
	}
	return Result{}, nil
}

// fraction returns the highest share of any configured budget.
func (b *TokenBudget) fraction(in, out int) (frac float64, used, budget int, which string) {
	frac, used, budget, which = float64(in+out)/float64(b.MaxTokens), in+out, b.MaxTokens, "total"
	if b.MaxInputTokens > 0 {
		if f := float64(in) / float64(b.MaxInputTokens); f > frac {
			frac, used, budget, which = f, in, b.MaxInputTokens, "input"
		}
	}
	if b.MaxOutputTokens > 0 {
		if f := float64(out) / float64(b.MaxOutputTokens); f > frac {
			frac, used, budget, which = f, out, b.MaxOutputTokens, "output"
		}
	}
	return frac, used, budget, which
}

// WrapModelCall implements WrapModelCall: it delivers the warning.
func (b *TokenBudget) WrapModelCall(ctx context.Context, rt *Runtime, req *ModelRequest, next ModelHandler) (*ModelResponse, error) {
	resp, err := next(ctx, withGuidance(rt, budgetWarningName, req))
	if err == nil {
		clearGuidance(rt, budgetWarningName)
	}
	return resp, err
}

// MetaUsage is the assistant-message meta key holding the token usage of
// the model call that produced it.
const MetaUsage = "usage"

// Usage of one model call as stored in message meta. Checkpoints written
// before Cached, Model and Purpose existed read back with them empty.
type Usage struct {
	Input  int `json:"input_tokens"`
	Output int `json:"output_tokens"`
	// Cached is the prompt tokens the provider served from its cache; nil
	// when it did not say (not reported is not zero).
	Cached *int `json:"cached_tokens,omitempty"`
	// Approximate is true when the provider reported nothing (or is
	// configured to be ignored) and the numbers are estimates.
	Approximate bool `json:"approximate,omitempty"`
	// Model is the model that answered, as the provider named it (the
	// requested name when it named none).
	Model string `json:"model,omitempty"`
	// Purpose is protocol.PurposeMain ("" reads as main) or
	// protocol.PurposeSummary.
	Purpose string `json:"purpose,omitempty"`
	// Context is the size of the request the call sent, measured by the
	// token_usage middleware (nil without it). It goes on the call's
	// message.completed event (CompletedMessage), not into checkpoints.
	Context *protocol.ContextSnapshot `json:"context,omitempty"`
}

// CompletedMessage is m as its message.completed event carries it
// (protocol v2, which folded usage.model into it): a copy whose
// meta.usage adds, to what the checkpointed message keeps, the call's
// step and, when measured, the context it was sent. m is not changed.
func CompletedMessage(m *model.Message, u Usage, step int) model.Message {
	c := m.Clone()
	raw, ok := c.Meta[MetaUsage].(map[string]any)
	if !ok {
		return c
	}
	usage := make(map[string]any, len(raw)+2)
	for k, v := range raw {
		usage[k] = v
	}
	usage["step"] = step
	if u.Context != nil {
		usage["context"] = u.Context
	}
	c.Meta[MetaUsage] = usage
	return c
}

// SetUsage records a call's usage on its message.
func SetUsage(m *model.Message, u Usage) {
	if m.Meta == nil {
		m.Meta = map[string]any{}
	}
	m.Meta[MetaUsage] = u.meta()
}

// meta is the usage as a meta value, the form it has after a JSON round
// trip too.
func (u Usage) meta() map[string]any {
	v := map[string]any{"input_tokens": u.Input, "output_tokens": u.Output, "approximate": u.Approximate}
	if u.Cached != nil {
		v["cached_tokens"] = *u.Cached
	}
	if u.Model != "" {
		v["model"] = u.Model
	}
	if u.Purpose != "" {
		v["purpose"] = u.Purpose
	}
	return v
}

// UsageOf reads the usage recorded on a message, in memory or after a
// JSON round trip.
func UsageOf(m *model.Message) (Usage, bool) {
	raw, ok := m.Meta[MetaUsage].(map[string]any)
	if !ok {
		return Usage{}, false
	}
	return usageFromMeta(raw), true
}

func usageFromMeta(raw map[string]any) Usage {
	num := func(k string) (int, bool) {
		switch v := raw[k].(type) {
		case int:
			return v, true
		case float64:
			return int(v), true
		case json.Number:
			n, err := v.Int64()
			return int(n), err == nil
		}
		return 0, false
	}
	in, _ := num("input_tokens")
	out, _ := num("output_tokens")
	u := Usage{Input: in, Output: out}
	if c, ok := num("cached_tokens"); ok {
		u.Cached = &c
	}
	u.Approximate, _ = raw["approximate"].(bool)
	u.Model, _ = raw["model"].(string)
	u.Purpose, _ = raw["purpose"].(string)
	return u
}

// RunUsage sums the usage of one run's assistant messages. A run's
// messages are the tail of the transcript, so reading stops at the first
// message of another run; messages a middleware added without a run id
// are passed over.
func RunUsage(st *state.State, runID string) (in, out int) {
	for i := len(st.Messages) - 1; i >= 0; i-- {
		m := &st.Messages[i]
		if id, _ := m.Meta["run_id"].(string); id != runID {
			if id != "" {
				break
			}
			continue
		}
		if m.Role != model.RoleAssistant {
			continue
		}
		if u, ok := UsageOf(m); ok {
			in += u.Input
			out += u.Output
		}
	}
	return in, out
}
