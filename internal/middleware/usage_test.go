package middleware_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/model/openaitest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
	"github.com/natsagent/natsagent/internal/tokens"
)

// eventHost keeps events with their data, and checkpoints as a worker
// stores them (a JSON round trip).
type eventHost struct {
	mu     sync.Mutex
	events []hostEvent
	cps    []state.Update
}

type hostEvent struct {
	typ  string
	data json.RawMessage
}

func (h *eventHost) Checkpoint(ctx context.Context, u state.Update) error {
	data, err := json.Marshal(u)
	if err != nil {
		return err
	}
	var c state.Update
	if err := json.Unmarshal(data, &c); err != nil {
		return err
	}
	h.mu.Lock()
	h.cps = append(h.cps, c)
	h.mu.Unlock()
	return nil
}

func (h *eventHost) Emit(eventType string, data any) {
	raw, _ := json.Marshal(data)
	h.mu.Lock()
	h.events = append(h.events, hostEvent{eventType, raw})
	h.mu.Unlock()
}

func (h *eventHost) usageEvents(t *testing.T) []protocol.UsageModelData {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []protocol.UsageModelData
	for _, e := range h.events {
		if e.typ == protocol.EventUsageModel {
			t.Fatalf("protocol v2 publishes no %s", e.typ)
		}
		if e.typ != protocol.EventMessageCompleted {
			continue
		}
		if d := completedUsage(t, e.data); d != nil {
			out = append(out, *d)
		}
	}
	return out
}

// completedUsage decodes the call usage a message.completed carries in
// meta.usage (protocol v2: what usage.model carried), or nil.
func completedUsage(t *testing.T, data []byte) *protocol.UsageModelData {
	t.Helper()
	var m struct {
		ID   string `json:"id"`
		Meta struct {
			Usage *protocol.UsageModelData `json:"usage"`
		} `json:"meta"`
	}
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	if m.Meta.Usage != nil {
		m.Meta.Usage.MessageID = m.ID
	}
	return m.Meta.Usage
}

// stored is the thread's state as the checkpoints (and the run's pending
// end) store it.
func (h *eventHost) stored(base *state.State) *state.State {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := base.Clone()
	for _, u := range h.cps {
		st.Apply(u)
	}
	return st
}

// recordingModel keeps the last request the provider got.
type recordingModel struct {
	model.Model
	mu   sync.Mutex
	last *model.Request
}

func (m *recordingModel) Generate(ctx context.Context, req *model.Request, onDelta func(model.Delta)) (*model.Response, error) {
	m.mu.Lock()
	m.last = req.Clone()
	m.mu.Unlock()
	return m.Model.Generate(ctx, req, onDelta)
}

// addTool is an inner wrapper that offers one more tool, as clarification
// does inside token_usage.
type addTool struct{}

func (addTool) Name() string { return "add_tool" }
func (addTool) WrapModelCall(ctx context.Context, rt *middleware.Runtime, req *middleware.ModelRequest, next middleware.ModelHandler) (*middleware.ModelResponse, error) {
	r := req.Clone()
	r.Tools = append(r.Tools, model.ToolSpec{Name: "ask_clarification", Description: "Ask the person a question when the request is unclear.", Parameters: json.RawMessage(`{"type":"object","properties":{"question":{"type":"string"}}}`)})
	return next(ctx, r)
}

func newTokenUsage(t *testing.T, s middleware.TokenUsage) *middleware.TokenUsage {
	t.Helper()
	u, err := middleware.NewTokenUsage(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

type usageRun struct {
	out  agent.Outcome
	host *eventHost
	st   *state.State // as stored
	m    *recordingModel
}

// runUsage runs one question through chain on m, on a thread holding
// history.
func runUsage(t *testing.T, chain *middleware.Chain, m model.Model, modelName string, history ...model.Message) usageRun {
	t.Helper()
	base := &state.State{}
	base.Apply(state.Update{Messages: history})
	st := base.Clone()
	host := &eventHost{}
	rm := &recordingModel{Model: m}
	rt := &middleware.Runtime{RunID: "r1", ThreadID: "h1", Tenant: "default", Agent: "test", Tools: echoTool(t), Logger: zap.NewNop(), Emit: host.Emit}
	out := agent.Execute(context.Background(), &agent.Run{
		Runtime: rt, Chain: chain, Model: rm, ModelName: modelName, System: "You are terse.",
		MaxSteps: 10, State: st, Host: host,
		Input: []model.Message{{ID: "u1", Role: model.RoleUser, Content: "What is the weather in Paris today?"}},
	})
	if out.Stopped != nil || out.Status != protocol.StatusSuccess {
		t.Fatalf("run failed: %+v", out)
	}
	if err := host.Checkpoint(context.Background(), out.Pending); err != nil {
		t.Fatal(err)
	}
	return usageRun{out: out, host: host, st: host.stored(base), m: rm}
}

func usageOpenAI(t *testing.T, srv *openaitest.Server, name string, noStreamUsage bool) model.Model {
	t.Helper()
	m, err := model.NewOpenAI(model.OpenAIConfig{BaseURL: srv.URL(), Model: name, DisableStreamUsage: noStreamUsage})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func lastUsageOf(t *testing.T, st *state.State) middleware.Usage {
	t.Helper()
	i := middleware.LastAssistant(st)
	if i < 0 {
		t.Fatal("no assistant message")
	}
	u, ok := middleware.UsageOf(&st.Messages[i])
	if !ok {
		t.Fatalf("no usage on %+v", st.Messages[i])
	}
	return u
}

func usageIntp(n int) *int { return &n }

// Usage reported at the end of a stream, cached tokens included, is what
// the assistant message and the usage event carry, with the model the
// provider names. The snapshot measures the request as the provider got
// it, the tool an inner wrapper added included.
func TestTokenUsage_StreamedUsageWithCachedTokens(t *testing.T) {
	srv := openaitest.NewServer(t, func(req *openaitest.Request) openaitest.Reply {
		if !req.IncludeUsage() {
			t.Errorf("the client did not ask for stream usage")
		}
		return openaitest.Reply{Text: "Sunny, 21 degrees.", Model: "gpt-4o-2024-08-06",
			Usage: &openaitest.Usage{PromptTokens: 1200, CompletionTokens: 7, CachedTokens: usageIntp(1024)}}
	})
	chain := newChain(t, newTokenUsage(t, middleware.TokenUsage{}), addTool{})
	r := runUsage(t, chain, usageOpenAI(t, srv, "gpt-4o", false), "gpt-4o")
	if v := srv.Violations(); len(v) > 0 {
		t.Fatalf("violations: %q", v)
	}

	u := lastUsageOf(t, r.st)
	if u.Input != 1200 || u.Output != 7 || u.Cached == nil || *u.Cached != 1024 || u.Approximate || u.Model != "gpt-4o-2024-08-06" || u.Purpose != protocol.PurposeMain {
		t.Fatalf("stored usage %+v", u)
	}
	evs := r.host.usageEvents(t)
	if len(evs) != 1 {
		t.Fatalf("%d usage events", len(evs))
	}
	ev := evs[0]
	if ev.InputTokens != 1200 || ev.OutputTokens != 7 || ev.CachedTokens == nil || *ev.CachedTokens != 1024 || ev.Approximate || ev.Model != "gpt-4o-2024-08-06" || ev.Step != 1 || ev.MessageID != r.out.Output.ID {
		t.Fatalf("event %+v (output message %s)", ev, r.out.Output.ID)
	}
	counter := tokens.ForModel("gpt-4o", "")
	sent := r.m.last
	want := tokens.Request(counter, sent.System, sent.Messages, sent.Tools)
	c := ev.Context
	if c.Encoding != tokens.O200K || c.Tokens != want.Total || c.SystemTokens != want.System || c.MessagesTokens != want.Messages || c.ToolsTokens != want.Tools {
		t.Fatalf("snapshot %+v, want counts %+v", c, want)
	}
	if c.ToolCount != 2 || c.MessageCount != 1 {
		t.Fatalf("snapshot saw %d tools and %d messages, want the sent 2 and 1", c.ToolCount, c.MessageCount)
	}
	// The step and the snapshot ride on the event only: the stored
	// message keeps the v1 meta.usage.
	stored := r.st.Messages[middleware.LastAssistant(r.st)].Meta[middleware.MetaUsage].(map[string]any)
	if _, there := stored["context"]; there {
		t.Fatalf("the checkpointed message keeps the context snapshot: %v", stored)
	}
	if _, there := stored["step"]; there {
		t.Fatalf("the checkpointed message keeps the step: %v", stored)
	}

	totals := middleware.RunTotals(r.st, "r1")
	if totals.Input != 1200 || totals.Cached == nil || *totals.Cached != 1024 || totals.CachedCalls != 1 || totals.Calls != 1 || totals.Models["gpt-4o-2024-08-06"].Main.Input != 1200 {
		t.Fatalf("run totals %+v", totals)
	}
}

// A provider without prompt caching says nothing of cached tokens:
// nothing is recorded, which is not zero.
func TestTokenUsage_CachedTokensAbsentIsNotZero(t *testing.T) {
	srv := openaitest.NewServer(t, func(req *openaitest.Request) openaitest.Reply {
		return openaitest.Reply{Text: "ok", Usage: &openaitest.Usage{PromptTokens: 90, CompletionTokens: 1}}
	})
	chain := newChain(t, newTokenUsage(t, middleware.TokenUsage{}))
	r := runUsage(t, chain, usageOpenAI(t, srv, "qwen2.5:7b", false), "qwen2.5:7b")
	u := lastUsageOf(t, r.st)
	if u.Input != 90 || u.Cached != nil || u.Approximate || u.Model != "qwen2.5:7b" {
		t.Fatalf("stored usage %+v", u)
	}
	ev := r.host.usageEvents(t)[0]
	if ev.CachedTokens != nil {
		t.Fatalf("event reports cached tokens %d", *ev.CachedTokens)
	}
	if ev.Context.Encoding != tokens.DefaultEncoding {
		t.Fatalf("unknown model counted in %s", ev.Context.Encoding)
	}
	totals := middleware.RunTotals(r.st, "r1")
	if totals.Cached != nil || totals.CachedCalls != 0 {
		t.Fatalf("totals report cached tokens: %+v", totals)
	}
	data, _ := json.Marshal(totals)
	var m map[string]any
	_ = json.Unmarshal(data, &m)
	if _, ok := m["cached_tokens"]; ok {
		t.Fatalf("cached_tokens in %s", data)
	}

	// A cache that reported 0 tokens did report.
	srv0 := openaitest.NewServer(t, func(req *openaitest.Request) openaitest.Reply {
		return openaitest.Reply{Text: "ok", Usage: &openaitest.Usage{PromptTokens: 90, CompletionTokens: 1, CachedTokens: usageIntp(0)}}
	})
	r0 := runUsage(t, newChain(t, newTokenUsage(t, middleware.TokenUsage{})), usageOpenAI(t, srv0, "gpt-4o", false), "gpt-4o")
	if u := lastUsageOf(t, r0.st); u.Cached == nil || *u.Cached != 0 {
		t.Fatalf("a reported 0 was lost: %+v", u)
	}
	if tot := middleware.RunTotals(r0.st, "r1"); tot.Cached == nil || *tot.Cached != 0 || tot.CachedCalls != 1 {
		t.Fatalf("totals %+v", tot)
	}
}

// deer-flow §2.7 (langgraph #4848, DeerFlow #2217): a streaming provider
// sends no usage unless asked; when it still sends none, the call gets
// estimates from the model's tokenizer, marked approximate, never zeros.
func TestTokenUsage_MissingUsageWithStreamingProvider(t *testing.T) {
	srv := openaitest.NewServer(t, func(req *openaitest.Request) openaitest.Reply {
		if req.IncludeUsage() {
			t.Errorf("stream usage asked for although disabled")
		}
		return openaitest.Reply{Text: "Sunny and warm in Paris today.", Usage: &openaitest.Usage{PromptTokens: 500, CompletionTokens: 9}}
	})
	chain := newChain(t, newTokenUsage(t, middleware.TokenUsage{}))
	r := runUsage(t, chain, usageOpenAI(t, srv, "gpt-4o", true), "gpt-4o")
	u := lastUsageOf(t, r.st)
	ev := r.host.usageEvents(t)[0]
	counter := tokens.ForModel("gpt-4o", "")
	if !u.Approximate || u.Input != ev.Context.Tokens || u.Output != counter.Count("Sunny and warm in Paris today.") || u.Input == 0 {
		t.Fatalf("usage %+v, snapshot %+v", u, ev.Context)
	}
	if !ev.Approximate {
		t.Fatal("event not marked approximate")
	}
	if tot := middleware.RunTotals(r.st, "r1"); tot.ApproximateCalls != 1 || tot.Calls != 1 {
		t.Fatalf("totals %+v", tot)
	}
}

// deer-flow §2.7: some gateways put a zero usage object on every chunk
// and the real one on the last (here on the finish chunk itself, as
// providers that answer in one piece do): the last non-zero report wins.
func TestTokenUsage_ZeroUsageChunksThenRealOne(t *testing.T) {
	chunk := func(delta, finish, usage string) string {
		return `{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[{"index":0,"delta":` + delta + `,"finish_reason":` + finish + `}],"usage":` + usage + `}`
	}
	zero := `{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0}`
	srv := openaitest.NewServer(t, func(req *openaitest.Request) openaitest.Reply {
		return openaitest.Reply{Raw: []string{
			chunk(`{"role":"assistant","content":""}`, "null", zero),
			chunk(`{"content":"Sunny."}`, "null", zero),
			chunk(`{}`, `"stop"`, `{"prompt_tokens":321,"completion_tokens":3,"total_tokens":324,"prompt_tokens_details":{"cached_tokens":256}}`),
			"[DONE]",
		}}
	})
	r := runUsage(t, newChain(t, newTokenUsage(t, middleware.TokenUsage{})), usageOpenAI(t, srv, "gpt-4o", false), "gpt-4o")
	if u := lastUsageOf(t, r.st); u.Input != 321 || u.Output != 3 || u.Cached == nil || *u.Cached != 256 || u.Approximate {
		t.Fatalf("usage %+v", u)
	}
}

// A model listed in approximate_models gets estimates only, whatever its
// provider reports.
func TestTokenUsage_ApproximateModelsIgnoreReportedUsage(t *testing.T) {
	srv := openaitest.NewServer(t, func(req *openaitest.Request) openaitest.Reply {
		return openaitest.Reply{Text: "fine", Model: "siliconflow/deepseek-v3", Usage: &openaitest.Usage{PromptTokens: 999999, CompletionTokens: 999999, CachedTokens: usageIntp(5)}}
	})
	chain := newChain(t, newTokenUsage(t, middleware.TokenUsage{ApproximateModels: []string{"siliconflow/*"}}))
	r := runUsage(t, chain, usageOpenAI(t, srv, "deepseek-v3", false), "deepseek-v3")
	u := lastUsageOf(t, r.st)
	ev := r.host.usageEvents(t)[0]
	if !u.Approximate || u.Input != ev.Context.Tokens || u.Input > 1000 || u.Output > 10 || u.Cached != nil || u.Model != "siliconflow/deepseek-v3" {
		t.Fatalf("usage %+v", u)
	}
	// The same model without the listing keeps the provider's figures.
	r2 := runUsage(t, newChain(t, newTokenUsage(t, middleware.TokenUsage{})), usageOpenAI(t, srv, "deepseek-v3", false), "deepseek-v3")
	if u := lastUsageOf(t, r2.st); u.Approximate || u.Input != 999999 {
		t.Fatalf("unlisted model: %+v", u)
	}
}

// The snapshot's figures: window and trigger from the settings, ratio,
// remaining tokens, and pressure of the next call toward the trigger.
func TestTokenUsage_SnapshotNumbers(t *testing.T) {
	history := []model.Message{
		{ID: "h1", Role: model.RoleUser, Content: "Tell me about the history of Paris."},
		{ID: "h2", Role: model.RoleAssistant, Content: "Paris grew from a Gallic settlement on the Seine into the capital of France over two thousand years."},
	}
	scripted := model.NewScripted(func(n int, req *model.Request) model.Reply {
		if n == 0 {
			return model.Reply{ToolCalls: []model.ToolCall{{ID: "call_1", Name: "echo", Arguments: `{"x":1}`}}, Usage: &model.Usage{PromptTokens: 100, CompletionTokens: 10}}
		}
		return model.Reply{Text: "It is sunny.", Usage: &model.Usage{PromptTokens: 150, CompletionTokens: 5}}
	})
	chain := newChain(t, newTokenUsage(t, middleware.TokenUsage{ContextLimits: middleware.ContextLimits{Window: 2000, TriggerFraction: 0.5}}))
	r := runUsage(t, chain, scripted, "gpt-4", history...)
	evs := r.host.usageEvents(t)
	if len(evs) != 2 {
		t.Fatalf("%d usage events, want one per call", len(evs))
	}
	counter := tokens.ForModel("gpt-4", "")
	for i, ev := range evs {
		req := scripted.Requests()[i]
		want := tokens.Request(counter, req.System, req.Messages, req.Tools)
		c := ev.Context
		resp := "It is sunny."
		out := counter.Count(resp)
		if i == 0 {
			out = tokens.PerToolCall + counter.Count("echo") + counter.Count(`{"x":1}`)
		}
		next := want.Total + tokens.PerMessage + tokens.PerRole + out
		ratio := float64(int(float64(want.Total)/2000*10000+0.5)) / 10000
		pressure := float64(int(float64(next)/1000*10000+0.5)) / 10000
		if c.Encoding != tokens.CL100K || c.Tokens != want.Total || c.Window != 2000 || c.Remaining != 2000-want.Total ||
			c.TriggerTokens != 1000 || c.TriggerFraction != 0.5 || c.NextTokens != next || c.UsageRatio != ratio || c.Pressure != pressure {
			t.Errorf("call %d: snapshot %+v; want tokens %d, next %d, ratio %v, pressure %v", i+1, c, want.Total, next, ratio, pressure)
		}
		// Scripted shows the system prompt as the leading message; the
		// snapshot counts it apart.
		if c.MessageCount != len(req.Messages)-1 || c.ToolCount != 1 {
			t.Errorf("call %d: %d messages and %d tools, want %d and 1", i+1, c.MessageCount, c.ToolCount, len(req.Messages)-1)
		}
	}
	if evs[1].Context.Tokens <= evs[0].Context.Tokens || evs[1].Step != 2 {
		t.Errorf("second call: %+v", evs[1])
	}
	totals := middleware.RunTotals(r.st, "r1")
	if totals.Input != 250 || totals.Output != 15 || totals.Calls != 2 || totals.Main.Calls != 2 || totals.Summary.Calls != 0 || totals.Models["scripted"].Main.Output != 15 {
		t.Fatalf("totals %+v", totals)
	}
}

// Without token_usage a call the provider did not count is estimated by
// the model's tokenizer, not by characters.
func TestLoopEstimatesUnreportedUsageWithTheTokenizer(t *testing.T) {
	scripted := model.NewScripted(func(n int, req *model.Request) model.Reply {
		return model.Reply{Text: "自然语言处理是人工智能的一个重要分支。"}
	})
	r := runUsage(t, newChain(t), scripted, "gpt-4o")
	u := lastUsageOf(t, r.st)
	counter := tokens.ForModel("gpt-4o", "")
	req := scripted.Requests()[0]
	if want := tokens.Request(counter, req.System, req.Messages, req.Tools).Total; !u.Approximate || u.Input != want || u.Output != counter.Count("自然语言处理是人工智能的一个重要分支。") {
		t.Fatalf("usage %+v, want input %d", u, want)
	}
}

func TestTokenUsage_Settings(t *testing.T) {
	bad := []middleware.TokenUsage{
		{ContextLimits: middleware.ContextLimits{Window: -1}},
		{ContextLimits: middleware.ContextLimits{Window: 100}},
		{ContextLimits: middleware.ContextLimits{TriggerFraction: 1.5}},
		{Encoding: "p99k"},
		{DefaultEncoding: "nope"},
		{ApproximateModels: []string{"["}},
	}
	for _, s := range bad {
		if _, err := middleware.NewTokenUsage(s); err == nil {
			t.Errorf("settings %+v accepted", s)
		}
	}
	limits := middleware.ContextLimits{}
	if limits.WindowFor("gpt-4o-mini") != 128000 || limits.WindowFor("openai/gpt-4.1-mini") != 1047576 || limits.WindowFor("gpt-4") != 8192 ||
		limits.WindowFor("gpt-4-turbo") != 128000 || limits.WindowFor("qwen2.5:7b") != middleware.DefaultContextWindow {
		t.Error("context window table")
	}
	if limits.TriggerTokens("qwen2.5:7b") != int(middleware.DefaultContextWindow*middleware.DefaultSummarizationTriggerFraction) {
		t.Errorf("trigger %d", limits.TriggerTokens("qwen2.5:7b"))
	}
	set := middleware.ContextLimits{Window: 32000, TriggerFraction: 0.5}
	if set.WindowFor("gpt-4.1") != 32000 || set.TriggerTokens("gpt-4.1") != 16000 {
		t.Error("configured window ignored")
	}

	// In a profile: on by default in the tail, its context settings
	// checked with the path of the setting.
	chain, err := middleware.Assemble(middleware.ChainConfig{Settings: map[string]json.RawMessage{
		"token_usage": json.RawMessage(`{"context_window": 32000, "summarization_trigger_fraction": 0.6, "approximate_models": ["local-*"]}`),
	}}, middleware.Env{})
	if err != nil {
		t.Fatal(err)
	}
	var tu *middleware.TokenUsage
	for _, m := range chain.Middlewares() {
		if u, ok := m.(*middleware.TokenUsage); ok {
			tu = u
		}
	}
	if tu == nil || tu.Window != 32000 || tu.TriggerFraction != 0.6 || len(tu.ApproximateModels) != 1 {
		t.Fatalf("token_usage in the chain: %+v", tu)
	}
	for raw, want := range map[string]string{
		`{"summarization_trigger_fraction": 2}`:    "settings.token_usage: summarization_trigger_fraction",
		`{"context_windw": 1}`:                     "settings.token_usage: invalid settings",
		`{"enabled": false, "context_window": -5}`: "settings.token_usage: context_window",
	} {
		_, err := middleware.Assemble(middleware.ChainConfig{Settings: map[string]json.RawMessage{"token_usage": json.RawMessage(raw)}}, middleware.Env{})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want %q", raw, err, want)
		}
	}
}
