package middleware

import (
	"context"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
)

// named is a middleware built in code, with only a name and a before-model
// hook that records it ran.
type named struct {
	name string
	ran  *[]string
}

func (n named) Name() string { return n.name }

func (n named) BeforeModel(ctx context.Context, rt *Runtime, st *state.State) (Result, error) {
	if n.ran != nil {
		*n.ran = append(*n.ran, n.name)
	}
	return Result{}, nil
}

func TestAssemble_CodeMiddlewareInUserSegment(t *testing.T) {
	got := assembleNames(t, ChainConfig{User: []UserMiddleware{
		{Instance: named{name: "redact"}},
		{Use: "tool_call_limit", Name: "limit_all", Settings: json.RawMessage(`{"run_limit":20}`)},
	}})
	if want := withUser("redact", "limit_all"); !reflect.DeepEqual(got, want) {
		t.Errorf("names = %v\nwant    %v", got, want)
	}
}

func TestAssemble_RegisteredMiddlewareByName(t *testing.T) {
	var gotSettings string
	err := Register("test_audit", func(raw json.RawMessage, env Env) (Middleware, error) {
		gotSettings = string(raw)
		return named{name: "test_audit"}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := Register("test_audit", func(json.RawMessage, Env) (Middleware, error) { return nil, nil }); err == nil {
		t.Error("a second registration under one name was accepted")
	}
	if err := Register("title", func(json.RawMessage, Env) (Middleware, error) { return nil, nil }); err == nil {
		t.Error("a registration under a built-in's name was accepted")
	}
	got := assembleNames(t, ChainConfig{User: []UserMiddleware{{Use: "test_audit", Settings: json.RawMessage(`{"level":2}`)}}})
	if want := withUser("test_audit"); !reflect.DeepEqual(got, want) {
		t.Errorf("names = %v\nwant    %v", got, want)
	}
	if gotSettings != `{"level":2}` {
		t.Errorf("the build got settings %s", gotSettings)
	}
	// An unknown name lists what exists, registered ones included.
	wantAssembleError(t, ChainConfig{User: []UserMiddleware{{Use: "test_audti"}}}, "user[0].use", "test_audti", "test_audit")
}

// A user entry named like an optional built-in replaces it in its place
// instead of failing "already in the chain".
func TestAssemble_UserEntryReplacesBuiltin(t *testing.T) {
	c, err := Assemble(ChainConfig{User: []UserMiddleware{
		{Use: "loop_detection", Settings: json.RawMessage(`{"warn_threshold":4,"hard_limit":9}`)},
	}}, Env{KnownTool: known("search")})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Names(); !reflect.DeepEqual(got, defaultLead) {
		t.Errorf("names = %v\nwant    %v", got, defaultLead)
	}
	found := 0
	for _, m := range c.Middlewares() {
		if l, ok := m.(*LoopDetection); ok {
			found++
			if l.WarnThreshold != 4 || l.HardLimit != 9 {
				t.Errorf("loop detection kept its defaults: %+v", l)
			}
		}
	}
	if found != 1 {
		t.Errorf("%d loop detections in the chain", found)
	}

	// A code middleware named "title" takes the built-in title's place.
	var ran []string
	c, err = Assemble(ChainConfig{User: []UserMiddleware{{Instance: named{name: "title", ran: &ran}}}}, Env{})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Names(); !reflect.DeepEqual(got, defaultLead) {
		t.Errorf("names = %v\nwant    %v", got, defaultLead)
	}
	for _, m := range c.Middlewares() {
		if _, ok := m.(*Title); ok {
			t.Error("the built-in title is still in the chain")
		}
	}
	rt, _ := newRuntime("r1")
	if _, err := c.RunHooks(context.Background(), HookBeforeModel, rt, &state.State{}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ran, []string{"title"}) {
		t.Errorf("the replacement ran %v", ran)
	}

	// A built-in that is off by default comes in at its own place.
	got := assembleNames(t, ChainConfig{User: []UserMiddleware{{Use: "token_budget", Settings: json.RawMessage(`{"max_tokens":5000}`)}}})
	i := slices.Index(got, "token_budget")
	if i < 0 || got[i-1] != "loop_detection" {
		t.Errorf("token_budget not at its place: %v", got)
	}

	wantAssembleError(t, ChainConfig{User: []UserMiddleware{{Instance: named{name: "tool_call_repair"}}}}, "user[0].name", "cannot be replaced")
	_, err = Assemble(ChainConfig{User: []UserMiddleware{{Instance: named{name: "clarification"}}}}, Env{Kind: KindSubagent})
	if err == nil || !strings.Contains(err.Error(), "subagent") {
		t.Errorf("a subagent accepted a clarification replacement: %v", err)
	}
}

func TestAssemble_OrderWithinUserSegment(t *testing.T) {
	got := assembleNames(t, ChainConfig{
		User: []UserMiddleware{
			{Instance: named{name: "a"}}, {Instance: named{name: "b"}}, {Instance: named{name: "c"}},
		},
		Order: []string{"c", "a"},
	})
	if want := withUser("c", "b", "a"); !reflect.DeepEqual(got, want) {
		t.Errorf("names = %v\nwant    %v", got, want)
	}
	wantAssembleError(t, ChainConfig{User: []UserMiddleware{{Instance: named{name: "a"}}}, Order: []string{"a", "title"}},
		"order[1]", "segment")
	wantAssembleError(t, ChainConfig{Settings: settings("tool_exclusion", `{"exclude":["search"]}`), Order: []string{"tool_exclusion", "token_usage"}},
		"order[0]", "tool_exclusion")
}

// delegator is a Delegator the chain only needs to exist: the model-call
// wrappers offer the subagent tools when a run has one.
type delegator struct{}

func (delegator) StartSubagent(context.Context, string, *protocol.SubagentStart) (*protocol.SubagentStarted, error) {
	panic("not called")
}
func (delegator) SubagentStatus(context.Context, string, protocol.SubagentQuery) (*protocol.SubagentStatus, error) {
	panic("not called")
}
func (delegator) CancelSubagent(context.Context, string, protocol.SubagentQuery) (*protocol.SubagentStatus, error) {
	panic("not called")
}
func (delegator) AwaitSubagent(context.Context, string, protocol.SubagentQuery, time.Duration, func(string)) (*protocol.SubagentStatus, error) {
	panic("not called")
}

// Tool exclusion is the last step on the tools: it removes tools the
// middlewares added (write_todos, task, ask_clarification), which used to
// stop start-up with "unknown tool", and refuses them called by name before
// the middleware that owns them answers.
func TestAssemble_ToolExclusionRemovesMiddlewareTools(t *testing.T) {
	cfg := ChainConfig{Settings: settings("tool_exclusion", `{"exclude":["write_todos","task","ask_clarification","shell"]}`)}
	c, err := Assemble(cfg, Env{KnownTool: known("search", "shell"), Subagents: []SubagentInfo{{Name: "researcher", Description: "finds things"}}})
	if err != nil {
		t.Fatalf("Assemble: %v", err)
	}
	names := c.Names()
	if names[0] != "tool_exclusion" || names[len(names)-1] != ToolExclusionTrim {
		t.Errorf("tool exclusion does not hold the chain: %v", names)
	}

	rt, _ := newRuntime("r1")
	rt.Subagents = delegator{}
	var base captureNext
	req := &ModelRequest{Tools: specs("search", "shell"), State: &state.State{}}
	if _, err := c.ModelCall(rt, base.handle)(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	offered := specNames(base.last(t).Tools)
	for _, n := range []string{"write_todos", "task", "ask_clarification", "shell"} {
		if slices.Contains(offered, n) {
			t.Errorf("%s still offered: %v", n, offered)
		}
	}
	if !slices.Contains(offered, "search") || !slices.Contains(offered, SubagentStartTool) {
		t.Errorf("tools not excluded were dropped: %v", offered)
	}

	// Without the exclusion the same chain offers them: the test above can fail.
	plain, err := Assemble(ChainConfig{}, Env{KnownTool: known("search"), Subagents: []SubagentInfo{{Name: "researcher", Description: "finds things"}}})
	if err != nil {
		t.Fatal(err)
	}
	var base2 captureNext
	if _, err := plain.ModelCall(rt, base2.handle)(context.Background(), &ModelRequest{Tools: specs("search"), State: &state.State{}}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"write_todos", "task", "ask_clarification"} {
		if !slices.Contains(specNames(base2.last(t).Tools), n) {
			t.Errorf("the plain chain does not offer %s", n)
		}
	}

	// write_todos called anyway is refused before the todos middleware
	// answers it.
	ran := false
	res, err := c.ToolCall(rt, func(ctx context.Context, call *ToolCall) (*ToolResult, error) {
		ran = true
		return &ToolResult{Message: model.Message{Content: "done"}}, nil
	})(context.Background(), &ToolCall{Call: call("c1", WriteTodosTool, `{"todos":[]}`), State: &state.State{}})
	if err != nil {
		t.Fatal(err)
	}
	if ran || res.Message.Status != model.ToolStatusError || !strings.Contains(res.Message.Content, WriteTodosTool) {
		t.Errorf("write_todos was not refused: ran %v, %+v", ran, res.Message)
	}

	// A typo is still caught at start-up.
	wantAssembleError(t, ChainConfig{Settings: settings("tool_exclusion", `{"exclude":["write_todo"]}`)}, "settings.tool_exclusion", "write_todo")
	// Disabled, it excludes nothing and holds nothing.
	got := assembleNames(t, ChainConfig{Settings: settings("tool_exclusion", `{"enabled":false,"exclude":["shell"]}`)})
	if !reflect.DeepEqual(got, defaultLead) {
		t.Errorf("names = %v", got)
	}
}
