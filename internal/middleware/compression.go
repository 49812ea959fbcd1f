package middleware

// Context compression. Boundary: the model call (the request only) and
// state (the summary record). Before each model call it measures the
// request (system prompt, messages, tool schemas) with the model's tiktoken
// encoding. Below the trigger it changes nothing. At or over it (any of: a
// share of the context window, shared with token_usage; an absolute token
// count; a message count) it first compacts the request, deterministically
// and only for this call: tool results over a token limit are saved to the
// workdir under a content hash and replaced by a preview (a structured one
// for JSON search results), and long write_file/edit_file arguments of
// older steps are cut, keeping valid JSON. Only if the compacted request is
// still over the trigger are the older messages summarized with the
// summary model: the cut messages go to a history file in the workdir, and
// the state value "context_summary" records the summary and where the cut
// is, so every later request, on any worker, is projected as the summary
// plus the messages from the cut on without summarizing again. Stored
// messages are never changed or deleted. The cut never separates a tool
// call from its results and never drops the latest user request; todos,
// active skills and subagent results survive it (the summary message
// carries them). A provider's "context too long" error forces compression
// and one retry. Reads state values context_summary, todos,
// activated_skills and summary_usage; writes context_summary and
// summary_usage; writes the workdir's /.context; emits
// context_compression (custom kind).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
	"github.com/natsagent/natsagent/internal/tokens"
)

// ContextSummaryValue is the state value holding the summary record.
const ContextSummaryValue = "context_summary"

// EventContextCompression is emitted (custom kind) when compression
// starts, completes or fails.
const EventContextCompression = protocol.EventContextCompression

// Phases of a context_compression event.
const (
	CompressionStarted   = protocol.CompressionStarted
	CompressionCompleted = protocol.CompressionCompleted
	CompressionFailed    = protocol.CompressionFailed
)

// Codes of a failed context_compression event.
const (
	CodeSummaryFailed = protocol.CodeSummaryFailed
	CodeBusy          = protocol.CodeBusy
	CodeNotFound      = protocol.CodeNotFound
	CodeDisabled      = protocol.CodeDisabled
	CodeUnknownAgent  = protocol.CodeUnknownAgent
)

// Why compression ran.
const (
	CompressionReasonTrigger        = "trigger"
	CompressionReasonContextTooLong = "context_too_long"
	CompressionReasonRequest        = "request"
)

// Workdir locations of compression.
const (
	ContextDir        = "/.context"
	ToolResultsDir    = ContextDir + "/tool_results"
	HistoryDir        = ContextDir + "/history"
	summaryMessageTag = "context_summary"
)

// Compression defaults.
const (
	DefaultToolResultTokenLimit   = 300
	DefaultToolArgMaxChars        = 2000
	DefaultKeepFraction           = 0.1
	DefaultMaxSummaryFailures     = 3
	DefaultSummaryTimeout         = 120 * time.Second
	maxSummaryChars               = 24000
	maxCarriedSubagents           = 20
	maxCarriedSubagentResultChars = 600
)

// ContextCompression keeps requests within the model's context window.
type ContextCompression struct {
	// ToolResultTokenLimit is the size in tokens over which a tool result
	// is compacted (default 300).
	ToolResultTokenLimit int `json:"tool_result_token_limit"`
	// ToolArgMaxChars is the length over which a write_file or edit_file
	// argument of an older step is cut (default 2,000).
	ToolArgMaxChars int `json:"tool_arg_max_chars"`
	// TriggerTokens and TriggerMessages are triggers besides the share of
	// the window (token_usage's summarization_trigger_fraction); 0 means
	// none. Any one met triggers.
	TriggerTokens   int `json:"trigger_tokens"`
	TriggerMessages int `json:"trigger_messages"`
	// Keep is the recent tail a summary leaves as it is (default: a tenth
	// of the window in tokens).
	Keep KeepPolicy `json:"keep"`
	// Model is the summary model's name on the agent's provider; empty
	// means the agent's model. When it fails, the agent's model is tried.
	Model string `json:"model"`
	// SummaryInputTokens bounds the summarizer's input (default: what fits
	// the summary model's window with room for the answer).
	SummaryInputTokens int `json:"summary_input_tokens"`
	// MaxConsecutiveFailures is how many summaries may fail in a row
	// before the run fails (default 3).
	MaxConsecutiveFailures int `json:"max_consecutive_failures"`
	// TimeoutSeconds bounds one summary call (default 120).
	TimeoutSeconds int `json:"timeout_seconds"`
	// SummaryPrompt replaces the summarizer's instructions.
	SummaryPrompt string `json:"summary_prompt"`

	limits ContextLimits
	now    func() time.Time
}

// KeepPolicy says how much of the recent transcript a summary keeps: a
// number of messages, of tokens, or a share of the context window. One
// of them is set.
type KeepPolicy struct {
	Messages int     `json:"messages,omitempty"`
	Tokens   int     `json:"tokens,omitempty"`
	Fraction float64 `json:"fraction,omitempty"`
}

// NewContextCompression fills defaults and checks the settings against the
// agent's context limits (token_usage's).
func NewContextCompression(c ContextCompression, limits ContextLimits) (*ContextCompression, error) {
	if c.ToolResultTokenLimit == 0 {
		c.ToolResultTokenLimit = DefaultToolResultTokenLimit
	}
	if c.ToolArgMaxChars == 0 {
		c.ToolArgMaxChars = DefaultToolArgMaxChars
	}
	if c.MaxConsecutiveFailures == 0 {
		c.MaxConsecutiveFailures = DefaultMaxSummaryFailures
	}
	if c.TimeoutSeconds == 0 {
		c.TimeoutSeconds = int(DefaultSummaryTimeout / time.Second)
	}
	k := c.Keep
	set := 0
	for _, on := range []bool{k.Messages != 0, k.Tokens != 0, k.Fraction != 0} {
		if on {
			set++
		}
	}
	if set == 0 {
		c.Keep.Fraction = DefaultKeepFraction
	}
	frac := limits.Fraction()
	switch {
	case c.ToolResultTokenLimit < 50 || c.ToolResultTokenLimit > 100000:
		return nil, fmt.Errorf("tool_result_token_limit must be 50 to 100000, not %d", c.ToolResultTokenLimit)
	case c.ToolArgMaxChars < 200:
		return nil, fmt.Errorf("tool_arg_max_chars must be at least 200, not %d", c.ToolArgMaxChars)
	case c.TriggerTokens < 0 || (c.TriggerTokens > 0 && c.TriggerTokens < 1000):
		return nil, fmt.Errorf("trigger_tokens must be 0 (none) or at least 1000, not %d", c.TriggerTokens)
	case c.TriggerMessages < 0 || (c.TriggerMessages > 0 && c.TriggerMessages < 4):
		return nil, fmt.Errorf("trigger_messages must be 0 (none) or at least 4, not %d", c.TriggerMessages)
	case set > 1:
		return nil, fmt.Errorf("keep: set one of messages, tokens or fraction")
	case k.Messages < 0 || k.Tokens < 0:
		return nil, fmt.Errorf("keep must not be negative")
	case k.Fraction < 0 || k.Fraction >= 1:
		return nil, fmt.Errorf("keep.fraction must be within (0, 1), got %g", k.Fraction)
	case k.Fraction > 0 && k.Fraction >= frac:
		return nil, fmt.Errorf("keep.fraction %g must be below the summarization trigger fraction %g (token_usage.summarization_trigger_fraction), or every summary would trigger the next", k.Fraction, frac)
	case k.Tokens > 0 && c.TriggerTokens > 0 && k.Tokens >= c.TriggerTokens:
		return nil, fmt.Errorf("keep.tokens %d must be below trigger_tokens %d", k.Tokens, c.TriggerTokens)
	case k.Messages > 0 && c.TriggerMessages > 0 && k.Messages >= c.TriggerMessages:
		return nil, fmt.Errorf("keep.messages %d must be below trigger_messages %d", k.Messages, c.TriggerMessages)
	case c.SummaryInputTokens < 0 || (c.SummaryInputTokens > 0 && c.SummaryInputTokens < 1000):
		return nil, fmt.Errorf("summary_input_tokens must be 0 (fit the summary model) or at least 1000, not %d", c.SummaryInputTokens)
	case c.MaxConsecutiveFailures < 1:
		return nil, fmt.Errorf("max_consecutive_failures must be at least 1, not %d", c.MaxConsecutiveFailures)
	case c.TimeoutSeconds < 1 || c.TimeoutSeconds > 3600:
		return nil, fmt.Errorf("timeout_seconds must be 1 to 3600, not %d", c.TimeoutSeconds)
	}
	c.Model = strings.TrimSpace(c.Model)
	c.limits = limits
	if c.now == nil {
		c.now = time.Now
	}
	tokens.Preload(tokens.DefaultEncoding)
	return &c, nil
}

// Name implements Middleware.
func (*ContextCompression) Name() string { return "context_compression" }

// ContextSummary is the state value recording the last summarization:
// later requests show Summary in place of the messages before
// CutBeforeMessageID. The stored transcript keeps every message.
type ContextSummary struct {
	// Summary is the summarizer's text, earlier summaries folded in.
	Summary string `json:"summary"`
	// CutBeforeMessageID is the first message requests show after the
	// summary; empty when the summary covers the whole transcript so far
	// (then every message after LastSummarizedMessageID is shown).
	CutBeforeMessageID      string `json:"cut_before_message_id,omitempty"`
	LastSummarizedMessageID string `json:"last_summarized_message_id"`
	// PinnedMessageID is the person's latest request when it lay before the
	// cut: it is shown right after the summary until a newer one arrives.
	PinnedMessageID string `json:"pinned_message_id,omitempty"`
	// Count is how many messages all summaries so far replaced; Summarized
	// how many this one added.
	Count      int `json:"count"`
	Summarized int `json:"summarized"`
	// Seq counts summarizations of the thread.
	Seq          int    `json:"seq"`
	TokensBefore int    `json:"tokens_before"`
	TokensAfter  int    `json:"tokens_after"`
	HistoryPath  string `json:"history_path,omitempty"`
	// At is when it was made, RunID the run (or compaction job) that made
	// it, Reason why (trigger, context_too_long, request), Model the model
	// that wrote it.
	At     time.Time `json:"at"`
	RunID  string    `json:"run_id,omitempty"`
	Reason string    `json:"reason"`
	Model  string    `json:"model,omitempty"`
	// SkillFiles are the SKILL.md files read in the summarized messages;
	// Subagents the subagent results they held, newest last.
	SkillFiles []string       `json:"skill_files,omitempty"`
	Subagents  []SubagentNote `json:"subagents,omitempty"`
}

// SubagentNote is a subagent result carried over a summary.
type SubagentNote struct {
	ToolCallID string `json:"tool_call_id"`
	Tool       string `json:"tool"`
	Task       string `json:"task,omitempty"`
	Result     string `json:"result"`
}

// CompressionData is the data of a context_compression event.
type CompressionData = protocol.CompressionData

// ccRun is a run's compression memory (Scratch): compaction results by
// message, the view of the last request, the failure streak.
type ccRun struct {
	mu       sync.Mutex
	failures int
	byID     map[compKey]*compEntry
	known    map[string]bool // workdir paths known to hold their content
	listed   bool
	v        viewCache
	// rec is the decoded summary record of the state value recRaw.
	recRaw json.RawMessage
	rec    *ContextSummary
}

func ccRunOf(rt *Runtime) *ccRun {
	return Scratch(rt, "context_compression", func() *ccRun {
		return &ccRun{} // its maps are made when a compaction first fills them
	})
}

// callWork is what one prepared call did.
type callWork struct {
	req     *ModelRequest
	tokens  int
	before  int
	rec     *ContextSummary // the record in effect
	newRec  bool            // rec was made in this call
	usages  []summaryCall
	started bool
	data    CompressionData
	// summaryErr is set when a summary was needed and failed.
	summaryErr error
}

type summaryCall struct {
	id    string
	usage Usage
}

// WrapModelCall implements WrapModelCall.
func (c *ContextCompression) WrapModelCall(ctx context.Context, rt *Runtime, req *ModelRequest, next ModelHandler) (*ModelResponse, error) {
	w, err := c.prepare(ctx, rt, req, CompressionReasonTrigger, false, nil, "")
	if err != nil {
		return nil, err
	}
	resp, err := next(ctx, w.req)
	return c.settle(ctx, rt, req, next, w, resp, err)
}

// settle takes a call's answer: a context-too-long error has the request
// compressed harder and sent once more; an answer gets the compression's
// state update. It is apart from WrapModelCall, whose frame stays on the
// run's stack while the model answers (chain.go, "Frames").
func (c *ContextCompression) settle(ctx context.Context, rt *Runtime, req *ModelRequest, next ModelHandler, w *callWork, resp *ModelResponse, err error) (*ModelResponse, error) {
	if err != nil && ctx.Err() == nil && IsContextTooLong(err) {
		var pending *ContextSummary
		if w.newRec {
			pending = w.rec
		}
		w2, perr := c.prepare(ctx, rt, req, CompressionReasonContextTooLong, true, pending, "")
		if perr != nil {
			return nil, perr
		}
		w2.usages = append(w.usages, w2.usages...)
		if !w2.newRec && w.newRec {
			w2.rec, w2.newRec = w.rec, true
		}
		if w2.tokens >= w.tokens {
			return nil, fmt.Errorf("%w (context compression could not make the request smaller than %d tokens: the system prompt, tools and latest messages alone are too large for %s)", err, w.tokens, modelLabel(req.ModelName))
		}
		w = w2
		resp, err = next(ctx, w.req)
	}
	if err != nil || resp == nil {
		return resp, err
	}
	u, uerr := c.update(rt, req.State, w)
	if uerr != nil {
		return nil, uerr
	}
	if u.Empty() {
		return resp, nil
	}
	out := *resp
	out.Update = u
	out.Update.Merge(resp.Update)
	return &out, nil
}

// update is the state update persisting what a call's compression did: a
// new summary record and the summary calls' usage.
func (c *ContextCompression) update(rt *Runtime, st *state.State, w *callWork) (state.Update, error) {
	var u state.Update
	if w.newRec {
		rec, err := state.SetValue(ContextSummaryValue, w.rec)
		if err != nil {
			return u, err
		}
		u.Merge(rec)
	}
	if len(w.usages) > 0 {
		tmp := &state.State{}
		if st != nil {
			tmp.Values = maps.Clone(st.Values)
		}
		for _, s := range w.usages {
			su, err := RecordSummaryUsage(tmp, rt, s.id, s.usage)
			if err != nil {
				return u, err
			}
			tmp.Apply(su)
			u.Merge(su)
		}
	}
	return u, nil
}

// prepare builds the request of one call: the projection of the summary
// record in effect, compaction when over the trigger, a summary when still
// over it. force compresses whatever the size (a provider said the context
// was too long, or a person asked).
func (c *ContextCompression) prepare(ctx context.Context, rt *Runtime, req *ModelRequest, reason string, force bool, pending *ContextSummary, jobID string) (*callWork, error) {
	run := ccRunOf(rt)
	run.mu.Lock()
	defer run.mu.Unlock()
	counter := tokens.ForModel(req.ModelName, "")
	rc := runCounterOf(rt, counter)
	rec := pending
	if rec == nil {
		rec = run.record(req.State)
	}
	w := &callWork{rec: rec, data: CompressionData{Reason: reason, MessageID: MessageID(ctx), JobID: jobID}}
	fixed := rc.cache.System(req.System) + rc.cache.Tools(req.Tools) + tokens.ReplyPriming + contextTokens(counter, req)
	v := c.view(run, rc, req, rec)
	w.before = fixed + v.sum
	w.data.TokensBefore = w.before
	trigger := c.triggerTokens(req.ModelName)
	over := func(sum, n int) bool {
		return fixed+sum >= trigger || (c.TriggerMessages > 0 && n >= c.TriggerMessages)
	}
	if !force && !over(v.sum, len(v.view)) {
		w.tokens = w.before
		w.req = withMessages(req, v.view)
		return w, nil
	}
	newly := c.compact(ctx, rt, run, rc, v, force)
	if newly > 0 {
		w.start(rt)
	}
	w.data.Compacted = newly
	if force || over(v.csum, len(v.comp)) {
		c.summarize(ctx, rt, run, rc, req, v, w, force, trigger)
		if w.newRec {
			v = c.view(run, rc, req, w.rec)
			c.compact(ctx, rt, run, rc, v, force)
		}
	}
	chosen, sum := v.comp, v.csum
	if v.changed == 0 || (!force && !over(v.sum, len(v.view))) {
		// The summary alone brought the request under the trigger:
		// nothing needs compacting.
		chosen, sum = v.view, v.sum
	}
	w.tokens = fixed + sum
	w.req = withMessages(req, chosen)
	if w.summaryErr != nil {
		run.failures++
		w.data.Phase, w.data.TokensAfter, w.data.Code, w.data.Error = CompressionFailed, w.tokens, CodeSummaryFailed, clipText(w.summaryErr.Error(), 500)
		if jobID == "" {
			w.emit(rt)
		}
		if rt.Logger != nil {
			rt.Logger.Warn("context summary failed; the call goes on with compaction only",
				zap.Int("failures", run.failures), zap.Int("tokens", w.tokens), zap.Error(w.summaryErr))
		}
		if jobID == "" && run.failures >= c.MaxConsecutiveFailures {
			return nil, fmt.Errorf("context compression: the summary model failed %d times in a row (last: %v); the conversation (%d tokens) is over the summarization trigger (%d tokens) of %s and cannot be shortened. Check context_compression.model and the provider, or continue in a new thread",
				run.failures, w.summaryErr, w.before, trigger, modelLabel(req.ModelName))
		}
		return w, nil
	}
	if w.newRec {
		run.failures = 0
		w.rec.TokensAfter = w.tokens
		w.data.Summarized, w.data.Count, w.data.SummarySeq = w.rec.Summarized, w.rec.Count, w.rec.Seq
		w.data.CutBeforeMessageID, w.data.HistoryPath = w.rec.CutBeforeMessageID, w.rec.HistoryPath
	}
	if w.started {
		w.data.Phase, w.data.TokensAfter = CompressionCompleted, w.tokens
		if jobID == "" {
			// A job reports its end itself, with the checkpoint.
			w.emit(rt)
		}
	}
	return w, nil
}

func (w *callWork) start(rt *Runtime) {
	if w.started {
		return
	}
	w.started = true
	d := w.data
	d.Phase = CompressionStarted
	emitIfSet(rt, EventContextCompression, d)
}

func (w *callWork) emit(rt *Runtime) { emitIfSet(rt, EventContextCompression, w.data) }

func withMessages(req *ModelRequest, msgs []model.Message) *ModelRequest {
	if len(msgs) == len(req.Messages) && (len(msgs) == 0 || &msgs[0] == &req.Messages[0]) {
		return req
	}
	out := *req
	out.Messages = msgs[:len(msgs):len(msgs)]
	return &out
}

// triggerTokens is the smallest token trigger of a model.
func (c *ContextCompression) triggerTokens(modelName string) int {
	t := c.limits.TriggerTokens(modelName)
	if c.TriggerTokens > 0 {
		t = min(t, c.TriggerTokens)
	}
	return t
}

// record reads the summary record of a state, nil when there is none. The
// decoded record is kept while the state holds the same value, so a call
// does not decode it again.
func (r *ccRun) record(st *state.State) *ContextSummary {
	if st == nil {
		return nil
	}
	raw := st.Values[ContextSummaryValue]
	if len(raw) == 0 {
		return nil
	}
	if r.recRaw != nil && len(r.recRaw) == len(raw) && &r.recRaw[0] == &raw[0] {
		return r.rec
	}
	var rec ContextSummary
	r.recRaw, r.rec = raw, nil
	if err := json.Unmarshal(raw, &rec); err == nil && rec.Seq > 0 {
		r.rec = &rec
	}
	return r.rec
}

func modelLabel(name string) string {
	if name == "" {
		return "the model"
	}
	return "model " + name
}

// CompactOutcome is what a compaction on request did.
type CompactOutcome struct {
	// Summarized is false when there was nothing to summarize (the
	// transcript after the last summary fits what a summary keeps).
	Summarized bool
	// Update persists the new summary record and the summary call's usage.
	Update state.Update
	Record *ContextSummary
	// Data is the completed event's data.
	Data CompressionData
}

// Compact summarizes a thread's transcript on request, outside a run (the
// compaction job): as before a model call, with force. req describes the
// next call (the agent's system prompt, tools, model) over the thread's
// state; rt names the thread and the job (RunID) and gives the workdir.
// The caller persists Update in a checkpoint.
func (c *ContextCompression) Compact(ctx context.Context, rt *Runtime, req *ModelRequest, jobID string) (*CompactOutcome, error) {
	w, err := c.prepare(ctx, rt, req, CompressionReasonRequest, true, nil, jobID)
	if err != nil {
		return nil, err
	}
	if w.summaryErr != nil {
		return nil, w.summaryErr
	}
	u, err := c.update(rt, req.State, w)
	if err != nil {
		return nil, err
	}
	out := &CompactOutcome{Summarized: w.newRec, Update: u, Record: w.rec, Data: w.data}
	out.Data.Phase = CompressionCompleted
	if w.newRec {
		// What the next call starts from: the new projection, compacted
		// only if it is still over the trigger.
		after := *req
		st := req.State.Clone()
		st.Apply(u)
		after.State, after.Messages = st, st.Messages
		rt2 := &Runtime{RunID: rt.RunID, ThreadID: rt.ThreadID, Tenant: rt.Tenant, Files: rt.Files, Logger: rt.Logger}
		if n, err := c.prepare(ctx, rt2, &after, CompressionReasonRequest, false, nil, jobID); err == nil {
			out.Data.TokensAfter = n.tokens
			out.Record.TokensAfter = n.tokens
			if u2, err := state.SetValue(ContextSummaryValue, out.Record); err == nil {
				out.Update.Merge(u2)
			}
		}
	} else {
		// Nothing to summarize, and compaction alone is never stored.
		out.Data.TokensAfter = w.before
	}
	return out, nil
}

// IsContextTooLong reports whether a model call failed because the request
// is over the model's context window: HTTP 413, the OpenAI code
// context_length_exceeded, or the messages providers use for it.
func IsContextTooLong(err error) bool {
	if err == nil {
		return false
	}
	text := err.Error()
	var apiErr *model.APIError
	if errors.As(err, &apiErr) {
		switch {
		case apiErr.StatusCode >= 500:
			return false
		case apiErr.StatusCode == 413:
			return true
		}
		switch strings.ToLower(apiErr.Code) {
		case "context_length_exceeded", "string_above_max_length", "request_too_large":
			return true
		}
		text = apiErr.Type + " " + apiErr.Message
	}
	text = strings.ToLower(text)
	for _, p := range contextTooLongMarkers {
		if strings.Contains(text, p) {
			return true
		}
	}
	return false
}

var contextTooLongMarkers = []string{
	"context_length_exceeded", "maximum context length", "context length exceeded", "exceeds the context window",
	"exceed the context window", "context window is", "too many tokens", "prompt is too long", "prompt too long",
	"input is too long", "reduce the length of the messages", "input tokens exceed", "exceeds the maximum number of tokens",
	"maximum number of tokens allowed",
}
