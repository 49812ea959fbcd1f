package protocol

import (
	"maps"
	"reflect"
	"time"
)

// EventUsageModel is published (kind usage) after every main model call:
// the call's token usage and a snapshot of the context it was sent.
const EventUsageModel = "usage.model"

// Usage purposes: a run's own model calls, and the calls that summarize
// its history (context compression), counted apart.
const (
	PurposeMain    = "main"
	PurposeSummary = "summary"
)

// TokenCounts sums the token usage of model calls.
type TokenCounts struct {
	Input  int `json:"input_tokens"`
	Output int `json:"output_tokens"`
	Total  int `json:"total_tokens"`
	// Cached sums the prompt tokens served from a provider's cache over
	// the calls that reported it (CachedCalls). It is absent when no call
	// reported it: not reported is not zero.
	Cached      *int `json:"cached_tokens,omitempty"`
	CachedCalls int  `json:"cached_reported_calls,omitempty"`
	Calls       int  `json:"calls"`
	// ApproximateCalls counts calls whose figures are estimates: the
	// provider reported nothing, or it is configured to be ignored.
	ApproximateCalls int `json:"approximate_calls,omitempty"`
}

// AddCall adds one call's figures; cached is nil when not reported.
func (t *TokenCounts) AddCall(input, output int, cached *int, approximate bool) {
	t.Add(TokenCounts{Input: input, Output: output, Total: input + output, Cached: cached, CachedCalls: boolInt(cached != nil), Calls: 1, ApproximateCalls: boolInt(approximate)})
}

// Add adds o to t.
func (t *TokenCounts) Add(o TokenCounts) {
	t.Input += o.Input
	t.Output += o.Output
	t.Total += o.Total
	t.Calls += o.Calls
	t.ApproximateCalls += o.ApproximateCalls
	t.CachedCalls += o.CachedCalls
	if o.Cached != nil {
		sum := *o.Cached
		if t.Cached != nil {
			sum += *t.Cached
		}
		t.Cached = &sum
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// ModelUsage is one model's bucket, main and summary calls apart.
type ModelUsage struct {
	Main    TokenCounts `json:"main,omitzero"`
	Summary TokenCounts `json:"summary,omitzero"`
}

// UsageTotals is the token usage of a set of model calls: all of them,
// by purpose, and by model.
type UsageTotals struct {
	TokenCounts
	Main    TokenCounts            `json:"main"`
	Summary TokenCounts            `json:"summary"`
	Models  map[string]*ModelUsage `json:"models,omitempty"`
}

// AddCall adds one model call. model names the bucket ("" when unknown).
func (u *UsageTotals) AddCall(model, purpose string, input, output int, cached *int, approximate bool) {
	var one TokenCounts
	one.AddCall(input, output, cached, approximate)
	u.TokenCounts.Add(one)
	if u.Models == nil {
		u.Models = make(map[string]*ModelUsage)
	}
	b := u.Models[model]
	if b == nil {
		b = &ModelUsage{}
		u.Models[model] = b
	}
	if purpose == PurposeSummary {
		u.Summary.Add(one)
		b.Summary.Add(one)
	} else {
		u.Main.Add(one)
		b.Main.Add(one)
	}
}

// Add adds o to u.
func (u *UsageTotals) Add(o UsageTotals) {
	u.TokenCounts.Add(o.TokenCounts)
	u.Main.Add(o.Main)
	u.Summary.Add(o.Summary)
	for name, ob := range o.Models {
		if u.Models == nil {
			u.Models = make(map[string]*ModelUsage)
		}
		b := u.Models[name]
		if b == nil {
			b = &ModelUsage{}
			u.Models[name] = b
		}
		b.Main.Add(ob.Main)
		b.Summary.Add(ob.Summary)
	}
}

// Clone deep-copies u.
func (u UsageTotals) Clone() UsageTotals {
	var c UsageTotals
	c.Add(u)
	return c
}

// RunUsage is a run's token usage: its own model calls, and the combined
// usage of the subagent runs it started, each counted once.
type RunUsage struct {
	RunID    string `json:"run_id"`
	ThreadID string `json:"thread_id"`
	Tenant   string `json:"tenant"`
	// Own counts the run's own model calls (main and summary).
	Own UsageTotals `json:"own"`
	// Children holds each subagent run's total by child run id; set
	// with SetChild, so reporting a child again replaces it.
	Children map[string]UsageTotals `json:"children,omitempty"`
	// Total is Own plus every child.
	Total UsageTotals `json:"total"`
	// Final is true once the run ended and these are its last figures.
	Final     bool      `json:"final"`
	UpdatedAt time.Time `json:"updated_at,omitzero"`
}

// SetChild records a subagent run's total (its own calls and its
// children's) under its run id, replacing what an earlier report of the
// same child said, and recomputes Total.
func (r *RunUsage) SetChild(childRunID string, child UsageTotals) {
	if r.Children == nil {
		r.Children = make(map[string]UsageTotals)
	}
	r.Children[childRunID] = child.Clone()
	r.Recompute()
}

// Recompute sets Total from Own and Children.
func (r *RunUsage) Recompute() {
	t := r.Own.Clone()
	for _, c := range r.Children {
		t.Add(c)
	}
	r.Total = t
}

// Clone deep-copies r.
func (r *RunUsage) Clone() *RunUsage {
	c := *r
	c.Own = r.Own.Clone()
	c.Total = r.Total.Clone()
	if r.Children != nil {
		c.Children = make(map[string]UsageTotals, len(r.Children))
		for id, u := range r.Children {
			c.Children[id] = u.Clone()
		}
	}
	return &c
}

// ThreadUsage is a thread's token usage: the sum of its runs' totals.
type ThreadUsage struct {
	ThreadID string `json:"thread_id"`
	Tenant   string `json:"tenant"`
	// Total is Folded plus every entry of Runs.
	Total UsageTotals `json:"total"`
	// Runs holds, per run id, the run total last applied, so applying a
	// run again replaces its entry instead of adding to it.
	Runs map[string]ThreadRunUsage `json:"runs,omitempty"`
	// Folded sums the runs whose entries were folded away to bound the
	// record (the oldest applied first); FoldedRuns counts them.
	Folded     UsageTotals `json:"folded,omitzero"`
	FoldedRuns int         `json:"folded_runs,omitempty"`
	// Applied numbers the applications; each entry keeps its number, the
	// order in which entries are folded.
	Applied   uint64    `json:"applied"`
	UpdatedAt time.Time `json:"updated_at,omitzero"`
}

// ThreadRunUsage is one run's entry in a thread's usage.
type ThreadRunUsage struct {
	Usage UsageTotals `json:"usage"`
	Seq   uint64      `json:"seq"`
}

// Clone deep-copies t.
func (t *ThreadUsage) Clone() *ThreadUsage {
	c := *t
	c.Total = t.Total.Clone()
	c.Folded = t.Folded.Clone()
	c.Runs = maps.Clone(t.Runs)
	for id, e := range c.Runs {
		e.Usage = e.Usage.Clone()
		c.Runs[id] = e
	}
	return &c
}

// DefaultThreadUsageRuns is how many run entries a thread's usage keeps
// before folding the oldest into Folded.
const DefaultThreadUsageRuns = 256

// ThreadRecordUsageRuns is how many run entries a thread record's usage
// keeps (Thread.Usage). A run is applied again only when its end is
// written again (its terminal record failed after the release), before
// any later run of the thread ends, so a few entries are enough; more
// would only make every write of the thread record bigger.
const ThreadRecordUsageRuns = 4

// Merge returns the sum of two thread usages of the same thread (the
// legacy usage bucket's and the thread record's): folded sums add, run
// entries are united (o's entry wins for a run in both), and Total is
// recomputed. Either may be nil.
func (t *ThreadUsage) Merge(o *ThreadUsage) *ThreadUsage {
	switch {
	case t == nil && o == nil:
		return nil
	case t == nil:
		return o.Clone()
	case o == nil:
		return t.Clone()
	}
	m := t.Clone()
	m.Folded.Add(o.Folded)
	m.FoldedRuns += o.FoldedRuns
	m.Applied += o.Applied
	for id, e := range o.Runs {
		if m.Runs == nil {
			m.Runs = make(map[string]ThreadRunUsage)
		}
		e.Usage = e.Usage.Clone()
		m.Runs[id] = e
	}
	if o.UpdatedAt.After(m.UpdatedAt) {
		m.UpdatedAt = o.UpdatedAt
	}
	sum := m.Folded.Clone()
	for _, e := range m.Runs {
		sum.Add(e.Usage)
	}
	m.Total = sum
	return m
}

// Apply sets a run's total in the thread's usage, replacing the entry the
// run had, and recomputes Total. Beyond keep entries (<= 0:
// DefaultThreadUsageRuns) the oldest applied are folded into Folded: a
// folded run applied again would count twice, which is why only runs that
// have ended are applied (once, at their end) and keep is far beyond the
// runs a replay can reach. It reports whether anything changed.
func (t *ThreadUsage) Apply(runID string, total UsageTotals, keep int) bool {
	if keep <= 0 {
		keep = DefaultThreadUsageRuns
	}
	if e, ok := t.Runs[runID]; ok && reflect.DeepEqual(e.Usage, total) {
		return false
	}
	if t.Runs == nil {
		t.Runs = make(map[string]ThreadRunUsage)
	}
	t.Applied++
	t.Runs[runID] = ThreadRunUsage{Usage: total.Clone(), Seq: t.Applied}
	for len(t.Runs) > keep {
		oldest, seq := "", uint64(0)
		for id, e := range t.Runs {
			if oldest == "" || e.Seq < seq {
				oldest, seq = id, e.Seq
			}
		}
		t.Folded.Add(t.Runs[oldest].Usage)
		t.FoldedRuns++
		delete(t.Runs, oldest)
	}
	sum := t.Folded.Clone()
	for _, e := range t.Runs {
		sum.Add(e.Usage)
	}
	t.Total = sum
	return true
}

// UsageModelData is the data of usage.model: one main model call's usage
// and the context it was sent.
type UsageModelData struct {
	// MessageID is the assistant message the call produced.
	MessageID    string `json:"message_id,omitempty"`
	Step         int    `json:"step"`
	Purpose      string `json:"purpose"`
	Model        string `json:"model,omitempty"`
	InputTokens  int    `json:"input_tokens"`
	OutputTokens int    `json:"output_tokens"`
	// CachedTokens is absent when the provider did not report it.
	CachedTokens *int `json:"cached_tokens,omitempty"`
	// Approximate is true when the figures are estimates.
	Approximate bool            `json:"approximate"`
	Context     ContextSnapshot `json:"context"`
}

// ContextSnapshot is the size of a model request as the model saw it,
// counted with the model's tiktoken encoding (an estimate for models with
// other tokenizers), against its context window and the summarization
// trigger.
type ContextSnapshot struct {
	Encoding       string `json:"encoding"`
	Tokens         int    `json:"context_tokens"`
	SystemTokens   int    `json:"system_tokens"`
	MessagesTokens int    `json:"messages_tokens"`
	ToolsTokens    int    `json:"tools_tokens"`
	MessageCount   int    `json:"message_count"`
	ToolCount      int    `json:"tool_count"`
	// NextTokens is where the next call starts: this request plus the
	// response.
	NextTokens int `json:"next_context_tokens"`
	Window     int `json:"context_window"`
	// UsageRatio is Tokens / Window; Remaining is Window - Tokens, at
	// least 0.
	UsageRatio float64 `json:"usage_ratio"`
	Remaining  int     `json:"remaining_tokens"`
	// TriggerTokens is Window × TriggerFraction, where context
	// compression summarizes; Pressure is NextTokens / TriggerTokens (1
	// or more: the next call summarizes).
	TriggerFraction float64 `json:"summarization_trigger_fraction"`
	TriggerTokens   int     `json:"summarization_trigger_tokens"`
	Pressure        float64 `json:"summarization_pressure"`
}
