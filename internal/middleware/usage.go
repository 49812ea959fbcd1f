package middleware

// Token usage. Boundary: observation of the model call (wrap_model_call,
// innermost but for approval and clarification, whose request edits it
// still sees: the loop's innermost handler hands it the request as sent).
// After every main model call it measures the request the model saw
// (system prompt, messages, tool schemas) with the model's tiktoken
// encoding, relates it to the model's context window and to the
// summarization trigger, settles the call's usage (the provider's figures,
// or estimates when it reported none or is listed in approximate_models),
// returns that usage for the loop to record on the assistant message
// (meta "usage": input, output, cached when reported, approximate, model,
// purpose) with the request's context snapshot, which the loop adds to the
// call's message.completed event (protocol v2; v1 emitted it as
// usage.model). It writes no state of its
// own: a run's totals are derived from the usage on its messages
// (RunTotals), so a redelivered or replayed step never counts twice.
// Summary-model calls of context compression are recorded apart
// (RecordSummaryUsage).

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"path"
	"strings"
	"sync"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
	"github.com/natsagent/natsagent/internal/tokens"
)

// Context window defaults.
const (
	// DefaultContextWindow is the window of a model the table below does
	// not know.
	DefaultContextWindow = 128000
	// DefaultSummarizationTriggerFraction is the share of the window at
	// which context compression summarizes.
	DefaultSummarizationTriggerFraction = 0.8
)

// contextWindows are input windows by model-name prefix (the longest
// matching prefix wins), from the providers' model pages. A profile sets
// context_window for anything else, or for a provider that serves a model
// with a smaller window (Ollama's default context is far below the
// model's).
var contextWindows = []struct {
	prefix string
	window int
}{
	{"gpt-5", 272000},
	{"gpt-4.1", 1047576},
	{"gpt-4o", 128000},
	{"gpt-4-turbo", 128000},
	{"gpt-4-1106", 128000},
	{"gpt-4-0125", 128000},
	{"gpt-4-32k", 32768},
	{"gpt-4", 8192},
	{"gpt-3.5-turbo", 16385},
	{"o1", 200000},
	{"o3", 200000},
	{"o4", 200000},
	{"claude", 200000},
	{"gemini", 1048576},
	{"deepseek", 128000},
}

// ContextWindowOf is the context window the table gives a model name
// (provider prefixes like "openai/" ignored), or DefaultContextWindow.
func ContextWindowOf(modelName string) int {
	name := strings.ToLower(modelName)
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		name = name[i+1:]
	}
	best, window := 0, DefaultContextWindow
	for _, w := range contextWindows {
		if len(w.prefix) > best && strings.HasPrefix(name, w.prefix) {
			best, window = len(w.prefix), w.window
		}
	}
	return window
}

// ContextLimits is an agent's context profile: its model's window and the
// share of it at which context compression summarizes. The token_usage
// settings hold it (context_window, summarization_trigger_fraction) and
// Assemble passes it to every middleware in Env.Context, so the usage
// snapshot's pressure and the compression trigger use one figure.
type ContextLimits struct {
	// Window is the model's context window in tokens; 0 takes it from the
	// model name (ContextWindowOf).
	Window int `json:"context_window"`
	// TriggerFraction is the share of the window at which compression
	// summarizes; 0 means DefaultSummarizationTriggerFraction.
	TriggerFraction float64 `json:"summarization_trigger_fraction"`
	// Models are the deployment's configured windows by model name (the
	// configuration's models section, Env.ContextWindows); they go
	// before the built-in table.
	Models map[string]int `json:"-"`
}

// WindowFor is the context window of a run's model: the profile's
// context_window, else the configured window of that model name (as
// written, then without a provider/ prefix), else the built-in table.
func (c ContextLimits) WindowFor(modelName string) int {
	if c.Window > 0 {
		return c.Window
	}
	if w, ok := c.Models[modelName]; ok {
		return w
	}
	if i := strings.LastIndexByte(modelName, '/'); i >= 0 {
		if w, ok := c.Models[modelName[i+1:]]; ok {
			return w
		}
	}
	return ContextWindowOf(modelName)
}

// Fraction is the trigger fraction with its default.
func (c ContextLimits) Fraction() float64 {
	if c.TriggerFraction > 0 {
		return c.TriggerFraction
	}
	return DefaultSummarizationTriggerFraction
}

// TriggerTokens is the context size at which compression summarizes.
func (c ContextLimits) TriggerTokens(modelName string) int {
	return max(int(float64(c.WindowFor(modelName))*c.Fraction()), 1)
}

func (c ContextLimits) check() error {
	switch {
	case c.Window < 0:
		return fmt.Errorf("context_window must not be negative (0 takes it from the model name)")
	case c.Window > 0 && c.Window < 1024:
		return fmt.Errorf("context_window %d is too small to hold a conversation: give the model's window in tokens", c.Window)
	case c.TriggerFraction < 0 || c.TriggerFraction > 1:
		return fmt.Errorf("summarization_trigger_fraction must be within (0, 1], got %g", c.TriggerFraction)
	}
	return nil
}

// contextLimitsOf reads the context profile from token_usage's settings
// (other keys are that middleware's business).
func contextLimitsOf(raw json.RawMessage) (ContextLimits, error) {
	var c ContextLimits
	if len(raw) == 0 || string(raw) == "null" {
		return c, nil
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return c, fmt.Errorf("invalid settings: %w", err)
	}
	return c, c.check()
}

// TokenUsage measures every main model call and settles its usage.
type TokenUsage struct {
	ContextLimits
	// Encoding, when set, counts every model's requests in this tiktoken
	// encoding, or "approximate" for the encoder-free estimate. Empty:
	// by model name (tiktoken's table), DefaultEncoding for others.
	Encoding string `json:"encoding"`
	// DefaultEncoding counts models tiktoken does not know (default
	// o200k_base).
	DefaultEncoding string `json:"default_encoding"`
	// ApproximateModels are model-name patterns (path.Match globs, e.g.
	// "siliconflow/*") whose provider-reported usage is ignored: their
	// calls get estimates only, marked approximate. For providers known
	// to report wrong or partial figures.
	ApproximateModels []string `json:"approximate_models"`
}

// NewTokenUsage checks the settings and starts building the default
// encoder, so the first call does not wait for it.
func NewTokenUsage(t TokenUsage) (*TokenUsage, error) {
	if err := t.ContextLimits.check(); err != nil {
		return nil, err
	}
	if t.DefaultEncoding == "" {
		t.DefaultEncoding = tokens.DefaultEncoding
	}
	for _, enc := range []string{t.Encoding, t.DefaultEncoding} {
		if enc == "" {
			continue
		}
		if err := tokens.CheckEncoding(enc); err != nil {
			return nil, err
		}
	}
	if t.Encoding != "" {
		tokens.Preload(t.Encoding)
	} else {
		tokens.Preload(t.DefaultEncoding)
	}
	for i, p := range t.ApproximateModels {
		if _, err := path.Match(p, ""); err != nil || p == "" {
			return nil, fmt.Errorf("approximate_models[%d]: %q is not a valid pattern", i, p)
		}
	}
	return &t, nil
}

// Name implements Middleware.
func (*TokenUsage) Name() string { return "token_usage" }

func (t *TokenUsage) counter(modelName string) tokens.Counter {
	if t.Encoding != "" {
		if c, err := tokens.ForEncoding(t.Encoding); err == nil {
			return c
		}
	}
	return tokens.ForModel(modelName, t.DefaultEncoding)
}

// ignored reports whether a model's reported usage must be ignored.
func (t *TokenUsage) ignored(names ...string) bool {
	for _, p := range t.ApproximateModels {
		for _, n := range names {
			if n == "" {
				continue
			}
			if ok, _ := path.Match(p, n); ok {
				return true
			}
		}
	}
	return false
}

// WrapModelCall implements WrapModelCall.
func (t *TokenUsage) WrapModelCall(ctx context.Context, rt *Runtime, req *ModelRequest, next ModelHandler) (*ModelResponse, error) {
	// Counting the transcript before the call makes a run's first call
	// pay for the loaded history (once per run, hashed rather than encoded
	// when this worker counted the thread before) and every later call for
	// its new messages only; the count after the call is then free.
	runCounterOf(rt, t.counter(req.ModelName)).messages(req.State, req.Messages)
	slot := &sentSlot{}
	resp, err := next(context.WithValue(ctx, sentKey{}, slot), req)
	if err != nil || resp == nil || resp.Response == nil {
		return resp, err
	}
	return t.settle(ctx, rt, req, slot, resp), nil
}

// settle is the response with the call's usage, counted on what was sent
// (apart from WrapModelCall, whose frame stays on the run's stack while
// the model answers: chain.go, "Frames").
func (t *TokenUsage) settle(ctx context.Context, rt *Runtime, req *ModelRequest, slot *sentSlot, resp *ModelResponse) *ModelResponse {
	sent := req
	if slot.req != nil {
		sent = slot.req
	}
	counter := t.counter(sent.ModelName)
	rc := runCounterOf(rt, counter)
	count := rc.request(sent)
	output := responseTokens(rc, MessageID(ctx), &resp.Response.Message)

	u, reported := reportedUsage(resp.Response, sent.ModelName)
	if !reported || t.ignored(sent.ModelName, resp.Response.Model) {
		u = Usage{Input: count.Total, Output: output, Approximate: true, Model: u.Model}
	}
	u.Purpose = protocol.PurposeMain

	// The context snapshot goes out on the call's message.completed
	// (meta.usage.context); protocol v1 published it as usage.model.
	snap := t.snapshot(sent, counter, count, output)
	u.Context = &snap
	out := *resp
	out.Usage = &u
	return &out
}

// responseTokens counts a response's completion. It counts the message
// as the transcript will hold it, under the id the loop gives it, so the
// next request finds it in the cache.
func responseTokens(rc *runCounter, id string, msg *model.Message) int {
	if id == "" || msg.Name != "" || msg.ToolCallID != "" {
		return tokens.Output(rc.cache.Counter(), msg)
	}
	stored := model.Message{ID: id, Role: model.RoleAssistant, Content: msg.Content, ToolCalls: msg.ToolCalls}
	return rc.cache.Message(&stored) - tokens.PerMessage - tokens.PerRole
}

// snapshot relates a request's size to the model's window and to the
// summarization trigger.
func (t *TokenUsage) snapshot(req *ModelRequest, counter tokens.Counter, c tokens.RequestCount, output int) protocol.ContextSnapshot {
	window := t.WindowFor(req.ModelName)
	trigger := t.TriggerTokens(req.ModelName)
	// The next call starts from this request plus the response.
	next := c.Total + tokens.PerMessage + tokens.PerRole + output
	return protocol.ContextSnapshot{
		Encoding:        counter.Encoding(),
		Tokens:          c.Total,
		SystemTokens:    c.System,
		MessagesTokens:  c.Messages,
		ToolsTokens:     c.Tools,
		MessageCount:    len(req.Messages),
		ToolCount:       len(req.Tools),
		NextTokens:      next,
		Window:          window,
		UsageRatio:      round4(float64(c.Total) / float64(window)),
		Remaining:       max(window-c.Total, 0),
		TriggerFraction: t.Fraction(),
		TriggerTokens:   trigger,
		Pressure:        round4(float64(next) / float64(trigger)),
	}
}

func round4(f float64) float64 { return math.Round(f*10000) / 10000 }

// sentKey carries the slot where the innermost model handler leaves the
// request it sends.
type sentKey struct{}

type sentSlot struct{ req *ModelRequest }

// RecordSent is called by the innermost model handler (the agent loop)
// with the request it sends to the provider, so token_usage measures what
// the model saw, the edits of wrappers inside it included.
func RecordSent(ctx context.Context, req *ModelRequest) {
	if s, ok := ctx.Value(sentKey{}).(*sentSlot); ok {
		s.req = req
	}
}

// reportedUsage is the provider's usage of a call, if it reported any.
// The returned Model is set either way.
func reportedUsage(resp *model.Response, requested string) (Usage, bool) {
	u := Usage{Model: resp.Model}
	if u.Model == "" {
		u.Model = requested
	}
	r := resp.Usage
	// A usage object of zeros is what some gateways send when they count
	// nothing: not a report.
	if r == nil || (r.PromptTokens <= 0 && r.CompletionTokens <= 0) {
		return u, false
	}
	u.Input, u.Output = r.PromptTokens, r.CompletionTokens
	if r.CachedTokens != nil {
		c := *r.CachedTokens
		u.Cached = &c
	}
	return u, true
}

// CallUsage is the usage of a main model call when no token_usage
// middleware settled it: the provider's figures, or estimates in the
// model's tiktoken encoding (counting only what the run's counter has not
// seen).
func CallUsage(rt *Runtime, req *ModelRequest, resp *model.Response) Usage {
	u, ok := reportedUsage(resp, req.ModelName)
	u.Purpose = protocol.PurposeMain
	if ok {
		return u
	}
	counter := tokens.ForModel(req.ModelName, "")
	u.Input = runCounterOf(rt, counter).request(req).Total
	u.Output = tokens.Output(counter, &resp.Message)
	u.Approximate = true
	return u
}

// runCounter counts a run's requests: a message cache, and the count of
// the state's transcript prefix last seen, which stays valid while the
// state only grows (state.Rewrites unchanged), so a request on the state's
// own transcript costs its new messages and nothing per old one.
type runCounter struct {
	cache *tokens.Cache

	mu       sync.Mutex
	st       *state.State
	rewrites uint64
	n, sum   int
	// tally follows the edited copies of the transcript that wrappers
	// send (one position compare per message instead of a lookup).
	tally tokens.Tally
}

// counterKeys names a run's token counter of each encoding in its scratch.
var counterKeys = keyCache{prefix: "tokens:"}

func runCounterOf(rt *Runtime, counter tokens.Counter) *runCounter {
	return Scratch(rt, counterKeys.key(counter.Encoding()), func() *runCounter {
		return &runCounter{cache: tokens.NewCache(counter, 0)}
	})
}

func (r *runCounter) request(req *ModelRequest) tokens.RequestCount {
	c := tokens.RequestCount{
		System:   r.cache.System(req.System),
		Messages: r.messages(req.State, req.Messages),
		Tools:    r.cache.Tools(req.Tools),
	}
	c.Total = c.System + c.Messages + c.Tools + tokens.ReplyPriming
	return c
}

// messages counts msgs, which may be st's own transcript or an edited
// copy.
func (r *runCounter) messages(st *state.State, msgs []model.Message) int {
	own := st != nil && len(msgs) > 0 && len(msgs) <= len(st.Messages) && &msgs[0] == &st.Messages[0]
	if !own {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.cache.Transcript(&r.tally, msgs)
	}
	r.mu.Lock()
	prefix, sum := 0, 0
	if r.st == st && r.rewrites == st.Rewrites() && r.n <= len(msgs) {
		prefix, sum = r.n, r.sum
	}
	r.mu.Unlock()
	sum += r.cache.Messages(msgs[prefix:])
	r.mu.Lock()
	r.st, r.rewrites, r.n, r.sum = st, st.Rewrites(), len(msgs), sum
	r.mu.Unlock()
	return sum
}

// SummaryUsageValue is the state value recording the summary-model calls
// of the run that last made one, by call id: RunTotals counts them apart
// from the main calls. Earlier runs' calls are already in their totals.
const SummaryUsageValue = "summary_usage"

type summaryUsage struct {
	RunID string           `json:"run_id"`
	Calls map[string]Usage `json:"calls"`
}

// SummaryCallUsage is the usage of a summary-model call (context
// compression): the provider's figures, or estimates counted with the
// run's counter for that model.
func SummaryCallUsage(rt *Runtime, req *model.Request, resp *model.Response) Usage {
	u := summaryCallUsage(rt, req, resp)
	if rt.Metrics != nil {
		rt.Metrics.Tokens(rt.Tenant, cmp.Or(u.Model, req.Model), u.Purpose, u.Input, u.Output)
	}
	return u
}

func summaryCallUsage(rt *Runtime, req *model.Request, resp *model.Response) Usage {
	u, ok := reportedUsage(resp, req.Model)
	u.Purpose = protocol.PurposeSummary
	if ok {
		return u
	}
	counter := tokens.ForModel(req.Model, "")
	rc := runCounterOf(rt, counter)
	u.Input = rc.cache.System(req.System) + rc.cache.Messages(req.Messages) + rc.cache.Tools(req.Tools) + tokens.ReplyPriming
	u.Output = tokens.Output(counter, &resp.Message)
	u.Approximate = true
	return u
}

// RecordSummaryUsage returns the update recording a summary-model call's
// usage for the run, under an id unique to the call (recording the same
// id again replaces it). Persist it with the step that used the summary:
// a step lost to a crash is redone, and its summary call with it.
func RecordSummaryUsage(st *state.State, rt *Runtime, callID string, u Usage) (state.Update, error) {
	var rec summaryUsage
	if _, err := st.Value(SummaryUsageValue, &rec); err != nil || rec.RunID != rt.RunID {
		rec = summaryUsage{RunID: rt.RunID}
	}
	if rec.Calls == nil {
		rec.Calls = make(map[string]Usage)
	}
	u.Purpose = protocol.PurposeSummary
	rec.Calls[callID] = u
	return state.SetValue(SummaryUsageValue, rec)
}

// RunTotals is a run's own token usage, derived from its state alone: the
// usage recorded on its assistant messages and the summary calls recorded
// for it. Being derived, not accumulated, it counts a redelivered or
// replayed step once. A run's messages are the tail of the transcript,
// so reading stops at the first message of another run.
func RunTotals(st *state.State, runID string) protocol.UsageTotals {
	var t protocol.UsageTotals
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
			addUsage(&t, u)
		}
	}
	var rec summaryUsage
	if ok, err := st.Value(SummaryUsageValue, &rec); ok && err == nil && rec.RunID == runID {
		for _, u := range rec.Calls {
			u.Purpose = protocol.PurposeSummary
			addUsage(&t, u)
		}
	}
	return t
}

func addUsage(t *protocol.UsageTotals, u Usage) {
	purpose := u.Purpose
	if purpose == "" {
		purpose = protocol.PurposeMain
	}
	t.AddCall(u.Model, purpose, u.Input, u.Output, u.Cached, u.Approximate)
}
