package middleware_test

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
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
	"github.com/natsagent/natsagent/internal/tools"
)

// memHost is an in-memory agent.Host.
type memHost struct {
	base        *state.State
	mu          sync.Mutex
	checkpoints []state.Update
	events      []string
}

func (h *memHost) Checkpoint(ctx context.Context, u state.Update) error {
	data, err := json.Marshal(u) // a checkpoint must be storable
	if err != nil {
		return err
	}
	var c state.Update
	if err := json.Unmarshal(data, &c); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.checkpoints = append(h.checkpoints, c)
	return nil
}

func (h *memHost) Emit(eventType string, data any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.events = append(h.events, eventType)
}

// replay applies every checkpoint to the thread's state before the run,
// as a worker that picks the thread up does.
func (h *memHost) replay() *state.State {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := h.base.Clone()
	for _, u := range h.checkpoints {
		st.Apply(u)
	}
	return st
}

// recorder is a log of hook calls.
type recorder struct {
	mu  sync.Mutex
	log []string
}

func (r *recorder) add(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log = append(r.log, s)
}

func (r *recorder) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.log...)
}

type hookFunc func(ctx context.Context, rt *middleware.Runtime, st *state.State) (middleware.Result, error)

// mw implements every hook, logs each call and runs the optional
// function of the hook.
type mw struct {
	name           string
	rec            *recorder
	ba, bm, am, aa hookFunc
	wm             func(ctx context.Context, rt *middleware.Runtime, req *middleware.ModelRequest, next middleware.ModelHandler) (*middleware.ModelResponse, error)
	wt             func(ctx context.Context, rt *middleware.Runtime, call *middleware.ToolCall, next middleware.ToolHandler) (*middleware.ToolResult, error)
}

func (m *mw) Name() string { return m.name }

func (m *mw) hook(kind string, f hookFunc, ctx context.Context, rt *middleware.Runtime, st *state.State) (middleware.Result, error) {
	m.rec.add(kind + ":" + m.name)
	if f != nil {
		return f(ctx, rt, st)
	}
	return middleware.Result{}, nil
}

func (m *mw) BeforeAgent(ctx context.Context, rt *middleware.Runtime, st *state.State) (middleware.Result, error) {
	return m.hook("before_agent", m.ba, ctx, rt, st)
}

func (m *mw) BeforeModel(ctx context.Context, rt *middleware.Runtime, st *state.State) (middleware.Result, error) {
	return m.hook("before_model", m.bm, ctx, rt, st)
}

func (m *mw) AfterModel(ctx context.Context, rt *middleware.Runtime, st *state.State) (middleware.Result, error) {
	return m.hook("after_model", m.am, ctx, rt, st)
}

func (m *mw) AfterAgent(ctx context.Context, rt *middleware.Runtime, st *state.State) (middleware.Result, error) {
	return m.hook("after_agent", m.aa, ctx, rt, st)
}

func (m *mw) WrapModelCall(ctx context.Context, rt *middleware.Runtime, req *middleware.ModelRequest, next middleware.ModelHandler) (*middleware.ModelResponse, error) {
	m.rec.add("wrap_model>" + m.name)
	defer m.rec.add("wrap_model<" + m.name)
	if m.wm != nil {
		return m.wm(ctx, rt, req, next)
	}
	return next(ctx, req)
}

func (m *mw) WrapToolCall(ctx context.Context, rt *middleware.Runtime, call *middleware.ToolCall, next middleware.ToolHandler) (*middleware.ToolResult, error) {
	m.rec.add("wrap_tool>" + m.name)
	defer m.rec.add("wrap_tool<" + m.name)
	if m.wt != nil {
		return m.wt(ctx, rt, call, next)
	}
	return next(ctx, call)
}

func echoTool(t *testing.T) *tools.Set {
	t.Helper()
	set, err := tools.NewSet(tools.Func(model.ToolSpec{Name: "echo", Description: "echoes", Parameters: json.RawMessage(`{"type":"object"}`)},
		func(ctx context.Context, args json.RawMessage) (string, error) { return "echo " + string(args), nil }))
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// toolThenAnswer asks for one echo call, then answers.
func toolThenAnswer() *model.Scripted {
	return model.NewScripted(func(n int, req *model.Request) model.Reply {
		if n == 0 {
			return model.Reply{ToolCalls: []model.ToolCall{{ID: "call_1", Name: "echo", Arguments: `{"x":1}`}}}
		}
		return model.Reply{Text: "done"}
	})
}

type runResult struct {
	out  agent.Outcome
	st   *state.State
	host *memHost
}

func execute(t *testing.T, chain *middleware.Chain, m model.Model, set *tools.Set, input ...model.Message) runResult {
	t.Helper()
	return executeOn(t, &state.State{}, chain, m, set, input...)
}

// executeOn runs the loop on a thread whose state is st.
func executeOn(t *testing.T, st *state.State, chain *middleware.Chain, m model.Model, set *tools.Set, input ...model.Message) runResult {
	t.Helper()
	return executeSteps(t, st, chain, m, set, 20, input...)
}

// executeSteps runs the loop on a thread whose state is st with a
// max_steps of maxSteps.
func executeSteps(t *testing.T, st *state.State, chain *middleware.Chain, m model.Model, set *tools.Set, maxSteps int, input ...model.Message) runResult {
	t.Helper()
	host := &memHost{base: st.Clone()}
	rt := &middleware.Runtime{RunID: "r1", ThreadID: "h1", Tenant: "default", Agent: "test", Tools: set, Logger: zap.NewNop(), Emit: host.Emit}
	if len(input) == 0 {
		input = []model.Message{{ID: "u1", Role: model.RoleUser, Content: "hello"}}
	}
	out := agent.Execute(context.Background(), &agent.Run{
		Runtime: rt, Chain: chain, Model: m, ModelName: "test-model", System: "sys",
		MaxSteps: maxSteps, State: st, Input: input, Host: host,
	})
	if out.Stopped != nil || out.Status == protocol.StatusError {
		t.Fatalf("run failed: %+v", out)
	}
	// The worker persists the last step's changes with the run's end.
	if err := host.Checkpoint(context.Background(), out.Pending); err != nil {
		t.Fatal(err)
	}
	return runResult{out, st, host}
}

func newChain(t *testing.T, ms ...middleware.Middleware) *middleware.Chain {
	t.Helper()
	c, err := middleware.NewChain(ms)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestEngine_HookOrder(t *testing.T) {
	rec := &recorder{}
	chain := newChain(t, &mw{name: "a", rec: rec}, &mw{name: "b", rec: rec}, &mw{name: "c", rec: rec})
	scripted := toolThenAnswer()
	r := execute(t, chain, scripted, echoTool(t))
	if r.out.Status != protocol.StatusSuccess || scripted.Calls() != 2 {
		t.Fatalf("outcome %+v after %d model calls", r.out, scripted.Calls())
	}
	modelCall := []string{
		"before_model:a", "before_model:b", "before_model:c",
		"wrap_model>a", "wrap_model>b", "wrap_model>c", "wrap_model<c", "wrap_model<b", "wrap_model<a",
		"after_model:c", "after_model:b", "after_model:a",
	}
	var want []string
	want = append(want, "before_agent:a", "before_agent:b", "before_agent:c")
	want = append(want, modelCall...)
	want = append(want, "wrap_tool>a", "wrap_tool>b", "wrap_tool>c", "wrap_tool<c", "wrap_tool<b", "wrap_tool<a")
	// After the tool batch: back to the first before-model hook, never to
	// before-agent.
	want = append(want, modelCall...)
	want = append(want, "after_agent:c", "after_agent:b", "after_agent:a")
	if got := rec.all(); !reflect.DeepEqual(got, want) {
		t.Errorf("hook calls:\n got %v\nwant %v", got, want)
	}
}

func TestEngine_BeforeModelJumpEnd(t *testing.T) {
	rec := &recorder{}
	stop := func(ctx context.Context, rt *middleware.Runtime, st *state.State) (middleware.Result, error) {
		return middleware.Result{Jump: middleware.JumpEnd, StopReason: "test_guard"}, nil
	}
	chain := newChain(t, &mw{name: "a", rec: rec}, &mw{name: "b", rec: rec, bm: stop}, &mw{name: "c", rec: rec})
	scripted := toolThenAnswer()
	r := execute(t, chain, scripted, echoTool(t))
	if r.out.Status != protocol.StatusIncomplete || r.out.StopReason != "test_guard" {
		t.Errorf("outcome = %+v, want incomplete with the guard's stop reason", r.out)
	}
	if scripted.Calls() != 0 {
		t.Errorf("model called %d times after a jump to the end", scripted.Calls())
	}
	want := []string{
		"before_agent:a", "before_agent:b", "before_agent:c",
		"before_model:a", "before_model:b",
		"after_agent:c", "after_agent:b", "after_agent:a",
	}
	if got := rec.all(); !reflect.DeepEqual(got, want) {
		t.Errorf("hook calls:\n got %v\nwant %v", got, want)
	}
}

func TestEngine_AfterModelJumpEndSkipsTools(t *testing.T) {
	rec := &recorder{}
	guard := func(ctx context.Context, rt *middleware.Runtime, st *state.State) (middleware.Result, error) {
		i := middleware.LastAssistant(st)
		if len(st.Messages[i].ToolCalls) == 0 {
			return middleware.Result{}, nil
		}
		stripped := middleware.StripToolCalls(st.Messages[i], "test_guard", "[stopped]")
		return middleware.Result{Update: state.Update{Messages: []model.Message{stripped}}, Jump: middleware.JumpEnd, StopReason: "test_guard"}, nil
	}
	chain := newChain(t, &mw{name: "a", rec: rec}, &mw{name: "b", rec: rec, am: guard})
	r := execute(t, chain, toolThenAnswer(), echoTool(t))
	if r.out.Status != protocol.StatusIncomplete || r.out.StopReason != "test_guard" || r.out.Output == nil || r.out.Output.Content != "[stopped]" {
		t.Errorf("outcome = %+v", r.out)
	}
	for _, s := range rec.all() {
		if strings.HasPrefix(s, "wrap_tool") || s == "after_model:a" {
			t.Errorf("%s ran after a jump to the end", s)
		}
	}
	if got := rec.all(); got[len(got)-1] != "after_agent:a" {
		t.Errorf("after-agent hooks did not run: %v", got)
	}
	for _, m := range r.host.replay().Messages {
		if len(m.ToolCalls) > 0 {
			t.Errorf("persisted a tool call the guard stripped: %+v", m)
		}
	}
}

// An edit made inside WrapModelCall reaches the model but not the state.
func TestEngine_RequestEditIsRequestOnly(t *testing.T) {
	rec := &recorder{}
	inject := func(ctx context.Context, rt *middleware.Runtime, req *middleware.ModelRequest, next middleware.ModelHandler) (*middleware.ModelResponse, error) {
		c := req.Clone()
		c.System += "\n\nrequest-only note"
		c.Messages = append(c.Messages, model.Message{Role: model.RoleUser, Name: "note", Content: "injected"})
		c.Messages[0].Content += " (edited)" // Clone copies: the state must not see this
		return next(ctx, c)
	}
	chain := newChain(t, &mw{name: "a", rec: rec, wm: inject})
	scripted := toolThenAnswer()
	r := execute(t, chain, scripted, echoTool(t))
	reqs := scripted.Requests()
	if len(reqs) != 2 {
		t.Fatalf("%d model calls", len(reqs))
	}
	for i, req := range reqs {
		sys := req.Messages[0]
		last := req.Messages[len(req.Messages)-1]
		if sys.Role != model.RoleSystem || !strings.HasSuffix(sys.Content, "request-only note") {
			t.Errorf("request %d: system = %+v", i, sys)
		}
		if last.Content != "injected" {
			t.Errorf("request %d ends with %+v, want the injected note", i, last)
		}
		n := 0
		for _, m := range req.Messages {
			if m.Content == "injected" {
				n++
			}
		}
		if n != 1 {
			t.Errorf("request %d carries the note %d times", i, n)
		}
	}
	for name, st := range map[string]*state.State{"state": r.st, "checkpoints": r.host.replay()} {
		for _, m := range st.Messages {
			if m.Content == "injected" || strings.Contains(m.Content, "(edited)") {
				t.Errorf("%s holds a request-only edit: %+v", name, m)
			}
		}
	}
}

// A hook update with an existing id replaces that message in place;
// Remove deletes by id; both reach the model and the checkpoints.
func TestEngine_UpdatesReplaceAndRemoveByID(t *testing.T) {
	rec := &recorder{}
	remove := func(ctx context.Context, rt *middleware.Runtime, st *state.State) (middleware.Result, error) {
		return middleware.Result{Update: state.Update{Remove: []string{"old_note"}}}, nil
	}
	edited := false
	replace := func(ctx context.Context, rt *middleware.Runtime, st *state.State) (middleware.Result, error) {
		if edited {
			return middleware.Result{}, nil
		}
		edited = true
		i := st.Index("u0")
		m := st.Messages[i].Clone()
		m.Content = "edited earlier question"
		return middleware.Result{Update: state.Update{Messages: []model.Message{m}}}, nil
	}
	chain := newChain(t, &mw{name: "a", rec: rec, ba: remove}, &mw{name: "b", rec: rec, bm: replace})
	scripted := toolThenAnswer()
	thread := &state.State{Messages: []model.Message{
		{ID: "u0", Role: model.RoleUser, Content: "earlier question"},
		{ID: "old_note", Role: model.RoleUser, Content: "remove me"},
		{ID: "a0", Role: model.RoleAssistant, Content: "earlier answer"},
	}}
	r := executeOn(t, thread, chain, scripted, echoTool(t), model.Message{ID: "u1", Role: model.RoleUser, Content: "new question"})
	first := scripted.Requests()[0].Messages // system, u0, a0, u1
	if len(first) != 4 || first[1].Content != "edited earlier question" || first[2].Content != "earlier answer" {
		t.Errorf("first request = %+v", first)
	}
	for name, st := range map[string]*state.State{"state": r.st, "checkpoints": r.host.replay()} {
		if st.Index("old_note") >= 0 {
			t.Errorf("%s: removed message still there", name)
		}
		if i := st.Index("u0"); i != 0 || st.Messages[i].Content != "edited earlier question" {
			t.Errorf("%s: u0 at %d: %+v", name, i, st.Messages)
		}
		if len(st.Messages) != 6 {
			t.Errorf("%s: %d messages, want u0, a0, u1, call, result, answer", name, len(st.Messages))
		}
	}
}

// A message added and removed before the same checkpoint must stay removed
// when the checkpoint is replayed: the loop merges a step's updates with
// state.Update.Merge, which must drop an earlier upsert of an id a later
// update removes, because state.Apply removes before it upserts.
func TestEngine_RemoveOfMessageAddedInTheSameStep(t *testing.T) {
	rec := &recorder{}
	remove := func(ctx context.Context, rt *middleware.Runtime, st *state.State) (middleware.Result, error) {
		return middleware.Result{Update: state.Update{Remove: []string{"u_scratch"}}}, nil
	}
	chain := newChain(t, &mw{name: "a", rec: rec, ba: remove})
	r := execute(t, chain, toolThenAnswer(), echoTool(t),
		model.Message{ID: "u_scratch", Role: model.RoleUser, Content: "remove me"},
		model.Message{ID: "u1", Role: model.RoleUser, Content: "question"},
	)
	if r.st.Index("u_scratch") >= 0 {
		t.Error("state: removed message still there")
	}
	if r.host.replay().Index("u_scratch") >= 0 {
		t.Error("checkpoints: removed message comes back on replay")
	}
}

// A value set through ModelResponse.Update is persisted.
func TestEngine_ModelResponseUpdatePersisted(t *testing.T) {
	rec := &recorder{}
	calls := 0
	count := func(ctx context.Context, rt *middleware.Runtime, req *middleware.ModelRequest, next middleware.ModelHandler) (*middleware.ModelResponse, error) {
		resp, err := next(ctx, req)
		if err != nil {
			return nil, err
		}
		calls++
		u, err := state.SetValue("model_calls", calls)
		if err != nil {
			return nil, err
		}
		resp.Update = u
		return resp, nil
	}
	chain := newChain(t, &mw{name: "a", rec: rec, wm: count})
	r := execute(t, chain, toolThenAnswer(), echoTool(t))
	for name, st := range map[string]*state.State{"state": r.st, "checkpoints": r.host.replay()} {
		var n int
		if ok, err := st.Value("model_calls", &n); !ok || err != nil || n != 2 {
			t.Errorf("%s: model_calls = %d (%v, %v), want 2", name, n, ok, err)
		}
	}
}

// Every request the default lead chain sends is one a strict provider
// accepts, a loop warning arrives in the request after the one that
// tripped it, and the fifth identical call ends the run loop_capped.
func TestEngine_DefaultChainLoopCapped(t *testing.T) {
	chain, err := middleware.Assemble(middleware.ChainConfig{}, middleware.Env{KnownTool: func(n string) bool { return n == "echo" }})
	if err != nil {
		t.Fatal(err)
	}
	scripted := model.NewScripted(func(n int, req *model.Request) model.Reply {
		return model.Reply{ToolCalls: []model.ToolCall{{ID: fmt.Sprintf("call_%d", n), Name: "echo", Arguments: `{"query":"same"}`}}}
	})
	r := execute(t, chain, scripted, echoTool(t))
	if r.out.StopReason != protocol.StopLoopCapped || scripted.Calls() != 5 {
		t.Fatalf("outcome %+v after %d calls", r.out, scripted.Calls())
	}
	for i, req := range scripted.Requests() {
		w := &openaitest.Request{Model: req.Model}
		for _, m := range req.Messages {
			om := openaitest.Message{Role: m.Role, Content: m.Content, Name: m.Name, ToolCallID: m.ToolCallID}
			for _, c := range m.ToolCalls {
				om.ToolCalls = append(om.ToolCalls, openaitest.ToolCallMsg{ID: c.ID, Type: "function", Function: openaitest.FunctionCall{Name: c.Name, Arguments: c.Arguments}})
			}
			w.Messages = append(w.Messages, om)
		}
		for _, s := range req.Tools {
			w.Tools = append(w.Tools, openaitest.Tool{Type: "function", Function: openaitest.Function{Name: s.Name}})
		}
		if problems := openaitest.Validate(w); len(problems) > 0 {
			t.Errorf("request %d rejected: %v", i, problems)
		}
		last := req.Messages[len(req.Messages)-1]
		if warned := last.Name == "loop_warning"; warned != (i == 3) {
			t.Errorf("request %d ends with %+v; the warning belongs to request 3 only", i, last)
		}
	}
	final := r.st.Messages[len(r.st.Messages)-1]
	if final.Role != model.RoleAssistant || len(final.ToolCalls) != 0 || !strings.Contains(final.Content, "[FORCED STOP]") {
		t.Errorf("final message = %+v", final)
	}
	if r.out.Output == nil || r.out.Output.ID != final.ID {
		t.Errorf("output = %+v", r.out.Output)
	}
	for _, m := range r.host.replay().Messages {
		if m.Name == "loop_warning" {
			t.Error("the loop warning was persisted")
		}
	}
}

// Nothing a tool or a middleware does may take the worker down: a panic in
// a tool, or in a wrapper inside the tool error guard, becomes an error
// result the model reads, and the run goes on.
func TestEngine_PanicsBecomeToolErrors(t *testing.T) {
	rec := &recorder{}
	panicky := &mw{name: "panicky", rec: rec, wt: func(ctx context.Context, rt *middleware.Runtime, call *middleware.ToolCall, next middleware.ToolHandler) (*middleware.ToolResult, error) {
		if call.Call.Name == "echo" {
			panic("wrapper bug")
		}
		return next(ctx, call)
	}}
	set, err := tools.NewSet(
		tools.Func(model.ToolSpec{Name: "echo"}, func(context.Context, json.RawMessage) (string, error) { return "unreachable", nil }),
		tools.Func(model.ToolSpec{Name: "boom"}, func(context.Context, json.RawMessage) (string, error) { panic("tool bug") }),
	)
	if err != nil {
		t.Fatal(err)
	}
	m := model.NewScripted(func(n int, req *model.Request) model.Reply {
		if n == 0 {
			return model.Reply{ToolCalls: []model.ToolCall{{ID: "c1", Name: "echo", Arguments: "{}"}, {ID: "c2", Name: "boom", Arguments: "{}"}}}
		}
		return model.Reply{Text: "recovered"}
	})
	r := execute(t, newChain(t, middleware.ToolErrorGuard{}, panicky), m, set)
	if r.out.Status != protocol.StatusSuccess || r.out.Output.Content != "recovered" {
		t.Fatalf("outcome %+v", r.out)
	}
	var errs []string
	for _, msg := range r.st.Messages {
		if msg.Role == model.RoleTool {
			if msg.Status != model.ToolStatusError || strings.Contains(msg.Content, "goroutine") {
				t.Errorf("tool result %+v: want an error result without a stack", msg)
			}
			errs = append(errs, msg.Content)
		}
	}
	if len(errs) != 2 || !strings.Contains(errs[0], "wrapper bug") || !strings.Contains(errs[1], "tool bug") {
		t.Fatalf("tool results %q", errs)
	}
}

// checkAnswered fails when an assistant message of msgs has a tool call
// without its tool message, or when msgs end on tool calls.
func checkAnswered(t *testing.T, msgs []model.Message) {
	t.Helper()
	answered := map[string]bool{}
	for _, m := range msgs {
		if m.Role == model.RoleTool {
			answered[m.ToolCallID] = true
		}
	}
	for _, m := range msgs {
		for _, c := range m.ToolCalls {
			if !answered[c.ID] {
				t.Errorf("tool call %s of message %s is not answered", c.ID, m.ID)
			}
		}
	}
}

// A run cut by max_steps ends incomplete on an answer that says so: the
// tool calls of its last allowed step are not run and are stripped, so
// the transcript is valid and the output is never a bare tool call.
func TestEngine_MaxStepsEndsIncompleteWithValidTranscript(t *testing.T) {
	var ran int
	set, err := tools.NewSet(tools.Func(model.ToolSpec{Name: "echo", Parameters: json.RawMessage(`{"type":"object"}`)},
		func(ctx context.Context, args json.RawMessage) (string, error) { ran++; return "echo", nil }))
	if err != nil {
		t.Fatal(err)
	}
	scripted := model.NewScripted(func(n int, req *model.Request) model.Reply {
		return model.Reply{ToolCalls: []model.ToolCall{{ID: fmt.Sprintf("call_%d", n), Name: "echo", Arguments: fmt.Sprintf(`{"n":%d}`, n)}}}
	})
	r := executeSteps(t, &state.State{}, newChain(t), scripted, set, 3)
	if r.out.Status != protocol.StatusIncomplete || r.out.StopReason != protocol.StopMaxSteps {
		t.Fatalf("outcome %s (%s), want incomplete with max_steps", r.out.Status, r.out.StopReason)
	}
	if scripted.Calls() != 3 || ran != 2 {
		t.Fatalf("%d model calls and %d tool runs, want 3 and 2 (the last step's call is not run)", scripted.Calls(), ran)
	}
	out := r.out.Output
	if out == nil || len(out.ToolCalls) != 0 || !strings.Contains(out.Content, "max_steps") || out.Meta[middleware.MetaStopNote] != protocol.StopMaxSteps {
		t.Fatalf("output %+v, want the last answer stripped of its calls, saying it was cut", out)
	}
	msgs := r.host.replay().Messages
	checkAnswered(t, msgs)
	if last := msgs[len(msgs)-1]; last.ID != out.ID {
		t.Fatalf("thread ends on %+v, not on the output", last)
	}
}

// A run whose last allowed step went back to the model (a hook asked for
// another call) ends on a note that it was cut, not on the answer before.
func TestEngine_MaxStepsAfterJumpModelEndsOnNote(t *testing.T) {
	again := func(ctx context.Context, rt *middleware.Runtime, st *state.State) (middleware.Result, error) {
		return middleware.Result{Jump: middleware.JumpModel}, nil
	}
	chain := newChain(t, &mw{name: "again", rec: &recorder{}, am: again})
	scripted := model.NewScripted(func(n int, req *model.Request) model.Reply { return model.Reply{Text: "answer"} })
	r := executeSteps(t, &state.State{}, chain, scripted, nil, 2)
	if r.out.Status != protocol.StatusIncomplete || r.out.StopReason != protocol.StopMaxSteps || scripted.Calls() != 2 {
		t.Fatalf("outcome %s (%s) after %d calls", r.out.Status, r.out.StopReason, scripted.Calls())
	}
	if r.out.Output == nil || !strings.Contains(r.out.Output.Content, "[STOPPED: max_steps]") {
		t.Fatalf("output %+v", r.out.Output)
	}
	msgs := r.host.replay().Messages
	if last := msgs[len(msgs)-1]; last.Role != model.RoleAssistant || last.ID != r.out.Output.ID {
		t.Fatalf("thread ends on %+v", last)
	}
}

// todoChain is todos with reminders completion reminders (nil: default).
func todoChain(t *testing.T, reminders *int) *middleware.Chain {
	t.Helper()
	todos, err := middleware.NewTodos(middleware.Todos{CompletionReminders: reminders})
	if err != nil {
		t.Fatal(err)
	}
	return newChain(t, todos)
}

// planThenAnswer writes a todo list of two open items, then answers
// every later call without tools.
func planThenAnswer() *model.Scripted {
	return model.NewScripted(func(n int, req *model.Request) model.Reply {
		if n == 0 {
			return model.Reply{ToolCalls: []model.ToolCall{{ID: "call_todos", Name: middleware.WriteTodosTool,
				Arguments: `{"todos":[{"content":"read the file","status":"completed"},{"content":"write the summary","status":"in_progress"}]}`}}}
		}
		return model.Reply{Text: fmt.Sprintf("answer %d", n)}
	})
}

// A final answer given while todo items are open goes back to the model
// once, with a reminder listing them after the transcript; the next
// answer ends the run. The reminder is never stored.
func TestEngine_TodoReminderOnceThenEnds(t *testing.T) {
	scripted := planThenAnswer()
	r := executeSteps(t, &state.State{}, todoChain(t, nil), scripted, nil, 20)
	if r.out.Status != protocol.StatusSuccess || scripted.Calls() != 3 {
		t.Fatalf("outcome %s after %d model calls, want success after 3", r.out.Status, scripted.Calls())
	}
	reqs := scripted.Requests()
	for i, req := range reqs {
		// The reminder is the last message before the trailing context
		// (which lists every item, open or not).
		msgs := req.Messages
		if last := msgs[len(msgs)-1]; last.Name == model.ContextMessageName {
			msgs = msgs[:len(msgs)-1]
		}
		last := msgs[len(msgs)-1]
		reminded := strings.Contains(last.Content, "write the summary") && strings.Contains(last.Content, "<system_reminder>")
		if reminded != (i == 2) {
			t.Fatalf("request %d ends with %+v (reminder expected only in request 2)", i, last)
		}
		if i == 2 && (last.Role != model.RoleUser || strings.Contains(last.Content, "read the file")) {
			t.Fatalf("reminder %+v: a user message listing only the open item", last)
		}
	}
	if r.out.Output == nil || r.out.Output.Content != "answer 2" {
		t.Fatalf("output %+v", r.out.Output)
	}
	reminded := 0
	for _, m := range r.host.replay().Messages {
		if strings.Contains(m.Content, "<system_reminder>") {
			t.Fatalf("the reminder was stored: %+v", m)
		}
		if m.Meta[middleware.MetaTodoReminder] != nil {
			reminded++
		}
	}
	if reminded != 1 {
		t.Fatalf("%d answers marked as reminded, want 1", reminded)
	}
}

// completion_reminders 2 sends the answer back twice, 0 never; so does
// plan mode off for the run.
func TestEngine_TodoReminderCountAndPlanModeOff(t *testing.T) {
	for n, want := range map[int]int{0: 2, 2: 4} {
		scripted := planThenAnswer()
		executeSteps(t, &state.State{}, todoChain(t, &n), scripted, nil, 20)
		if scripted.Calls() != want {
			t.Fatalf("%d model calls with completion_reminders %d, want %d", scripted.Calls(), n, want)
		}
	}

	off := false
	st := &state.State{}
	scripted := planThenAnswer()
	host := &memHost{base: st.Clone()}
	rt := &middleware.Runtime{RunID: "r1", ThreadID: "h1", Tenant: "default", Agent: "test", Logger: zap.NewNop(), Emit: host.Emit,
		Config: protocol.RunConfig{PlanMode: &off}}
	out := agent.Execute(context.Background(), &agent.Run{Runtime: rt, Chain: todoChain(t, nil), Model: scripted,
		ModelName: "m", System: "sys", MaxSteps: 20, State: st, Input: []model.Message{{ID: "u1", Role: model.RoleUser, Content: "hi"}}, Host: host})
	if out.Status != protocol.StatusSuccess || scripted.Calls() != 2 {
		t.Fatalf("plan mode off: %s after %d calls, want success after 2", out.Status, scripted.Calls())
	}
}

// rejectThenRepeat runs a call that asks for approval, rejects it in a
// resume run, and returns that run's outcome: the scripted model re-issues
// the rejected call (arguments spaced and ordered differently) repeats
// times, then answers.
func rejectThenRepeat(t *testing.T, maxRepeats, repeats int) (agent.Outcome, *model.Scripted, []string) {
	t.Helper()
	approval, err := middleware.NewToolApproval(middleware.ToolApproval{Tools: []string{"echo"}, MaxRejectedRepeats: maxRepeats}, middleware.KindLead)
	if err != nil {
		t.Fatal(err)
	}
	chain := newChain(t, approval)
	first := model.NewScripted(func(n int, req *model.Request) model.Reply {
		return model.Reply{ToolCalls: []model.ToolCall{{ID: "call_0", Name: "echo", Arguments: `{"path":"a.txt","x":1}`}}}
	})
	r := executeSteps(t, &state.State{}, chain, first, echoTool(t), 20)
	if r.out.Status != protocol.StatusInterrupted {
		t.Fatalf("first run %s, want interrupted for approval", r.out.Status)
	}
	st := r.host.replay()
	again := model.NewScripted(func(n int, req *model.Request) model.Reply {
		if n < repeats {
			return model.Reply{ToolCalls: []model.ToolCall{{ID: fmt.Sprintf("call_r%d", n), Name: "echo", Arguments: `{ "x": 1, "path": "a.txt" }`}}}
		}
		return model.Reply{Text: "giving up on echo"}
	})
	host := &memHost{base: st.Clone()}
	rt := &middleware.Runtime{RunID: "r2", ThreadID: "h1", Tenant: "default", Agent: "test", Tools: echoTool(t), Logger: zap.NewNop(), Emit: host.Emit,
		Resume: []byte(`{"decisions":[{"type":"reject","message":"not that file"}]}`)}
	out := agent.Execute(context.Background(), &agent.Run{Runtime: rt, Chain: chain, Model: again, ModelName: "m", System: "sys", MaxSteps: 20, State: st, Host: host})
	if err := host.Checkpoint(context.Background(), out.Pending); err != nil {
		t.Fatal(err)
	}
	var results []string
	for _, m := range host.replay().Messages {
		if m.Role == model.RoleTool && m.Meta["run_id"] == "r2" {
			results = append(results, m.Content)
		}
	}
	checkAnswered(t, host.replay().Messages)
	return out, again, results
}

// A call a person rejected and the model asks for again is answered by
// the middleware, without a second approval round, up to the cap; past
// it the run stops incomplete (deepagents #2946).
func TestEngine_RejectedCallRepeatCap(t *testing.T) {
	out, m, results := rejectThenRepeat(t, 2, 2)
	if out.Status != protocol.StatusSuccess || m.Calls() != 3 || out.Output.Content != "giving up on echo" {
		t.Fatalf("two repeats under a cap of 2: %s (%s) after %d calls, output %+v", out.Status, out.StopReason, m.Calls(), out.Output)
	}
	if len(results) != 3 || !strings.Contains(results[0], "not that file") || !strings.Contains(results[1], "already rejected") || !strings.Contains(results[2], "already rejected") {
		t.Fatalf("tool results of the resume run: %q", results)
	}

	out, m, _ = rejectThenRepeat(t, 2, 5)
	if out.Status != protocol.StatusIncomplete || out.StopReason != protocol.StopRejectedCallRepeated || m.Calls() != 3 {
		t.Fatalf("five repeats under a cap of 2: %s (%s) after %d calls, want incomplete after 3", out.Status, out.StopReason, m.Calls())
	}
	if out.Interrupt != nil || out.Output == nil || len(out.Output.ToolCalls) != 0 || !strings.Contains(out.Output.Content, "rejected_call_repeated") {
		t.Fatalf("output %+v, interrupt %+v", out.Output, out.Interrupt)
	}
}
