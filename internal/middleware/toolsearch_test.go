package middleware_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/state"
	"github.com/natsagent/natsagent/internal/tools"
)

// tsTools is a run's tools: two MCP-style (deferred by default) and one
// ordinary tool. runs counts the calls of github__create_issue.
func tsTools(t *testing.T, runs *atomic.Int32) *tools.Set {
	t.Helper()
	obj := json.RawMessage(`{"type":"object","properties":{"title":{"type":"string"}}}`)
	set, err := tools.NewSet(
		tools.Func(model.ToolSpec{Name: "github__create_issue", Description: "Create a GitHub issue.", Parameters: obj},
			func(context.Context, json.RawMessage) (string, error) { runs.Add(1); return "issue #1 created", nil }),
		tools.Func(model.ToolSpec{Name: "jira__search", Description: "Search Jira.", Parameters: obj},
			func(context.Context, json.RawMessage) (string, error) { return "no tickets", nil }),
		tools.Func(model.ToolSpec{Name: "current_time", Description: "Time.", Parameters: obj},
			func(context.Context, json.RawMessage) (string, error) { return "noon", nil }),
	)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

func tsChain(t *testing.T, settings string) *middleware.Chain {
	t.Helper()
	chain, err := middleware.Assemble(middleware.ChainConfig{Settings: map[string]json.RawMessage{
		"tool_search": json.RawMessage(settings),
	}}, middleware.Env{KnownTool: func(string) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(chain.Names(), "tool_search") {
		t.Fatalf("tool_search not in the chain: %v", chain.Names())
	}
	return chain
}

func tsOffered(req *model.Request) []string {
	var out []string
	for _, s := range req.Tools {
		out = append(out, s.Name)
	}
	return out
}

func tsResult(st *state.State, callID string) *model.Message {
	for i := range st.Messages {
		if m := &st.Messages[i]; m.Role == model.RoleTool && m.ToolCallID == callID {
			return m
		}
	}
	return nil
}

// A deferred tool is hidden from the request and refused when called by
// name before tool_search (deer-flow #2513); tool_search returns its
// schema and promotes it; then it is offered and runs. The promotion is
// thread state: the thread's next run is offered the tool at once.
func TestToolSearchPromotesAcrossRuns(t *testing.T) {
	var runs atomic.Int32
	set := tsTools(t, &runs)
	chain := tsChain(t, `{"enabled": true}`)
	var reqs []*model.Request
	m := model.NewScripted(func(n int, req *model.Request) model.Reply {
		reqs = append(reqs, req)
		switch n {
		case 0:
			return model.Reply{ToolCalls: []model.ToolCall{{ID: "c1", Name: "github__create_issue", Arguments: `{"title":"x"}`}}}
		case 1:
			return model.Reply{ToolCalls: []model.ToolCall{{ID: "c2", Name: middleware.ToolSearchTool, Arguments: `{"query":"select:github__create_issue"}`}}}
		case 2:
			return model.Reply{ToolCalls: []model.ToolCall{{ID: "c3", Name: "github__create_issue", Arguments: `{"title":"x"}`}}}
		default:
			return model.Reply{Text: "done"}
		}
	})
	res := execute(t, chain, m, set)

	first := reqs[0]
	if names := tsOffered(first); slices.Contains(names, "github__create_issue") || slices.Contains(names, "jira__search") ||
		!slices.Contains(names, "current_time") || !slices.Contains(names, middleware.ToolSearchTool) {
		t.Fatalf("first request offers %v", names)
	}
	sys := first.Messages[0].Content
	if !strings.Contains(sys, "<available-deferred-tools>\ngithub__create_issue\njira__search\n</available-deferred-tools>") {
		t.Fatalf("system prompt does not list the deferred names:\n%s", sys)
	}
	if strings.Contains(sys, "Create a GitHub issue.") {
		t.Fatal("the system prompt holds a deferred tool's description")
	}
	refused := tsResult(res.st, "c1")
	if refused == nil || refused.Status != model.ToolStatusError || !strings.Contains(refused.Content, "tool_search") {
		t.Fatalf("call before the search: %+v", refused)
	}
	found := tsResult(res.st, "c2")
	var schemas []model.ToolSpec
	if found == nil || json.Unmarshal([]byte(found.Content), &schemas) != nil || len(schemas) != 1 ||
		schemas[0].Name != "github__create_issue" || !strings.Contains(string(schemas[0].Parameters), "title") {
		t.Fatalf("tool_search result %+v", found)
	}
	if names := tsOffered(reqs[2]); !slices.Contains(names, "github__create_issue") || slices.Contains(names, "jira__search") {
		t.Fatalf("request after the search offers %v", names)
	}
	if r := tsResult(res.st, "c3"); r == nil || r.Content != "issue #1 created" || runs.Load() != 1 {
		t.Fatalf("promoted call: %+v, ran %d times", r, runs.Load())
	}
	var p middleware.Promoted
	if ok, _ := res.host.replay().Value(middleware.PromotedToolsValue, &p); !ok || !slices.Equal(p.Names, []string{"github__create_issue"}) || p.CatalogHash == "" {
		t.Fatalf("checkpointed promotion %+v", p)
	}

	// The thread's next run, from what was checkpointed.
	var next []*model.Request
	m2 := model.NewScripted(func(n int, req *model.Request) model.Reply {
		next = append(next, req)
		if n == 0 {
			return model.Reply{ToolCalls: []model.ToolCall{{ID: "c4", Name: "github__create_issue", Arguments: `{"title":"y"}`}}}
		}
		return model.Reply{Text: "again"}
	})
	res2 := executeOn(t, res.host.replay(), chain, m2, set, model.Message{ID: "u2", Role: model.RoleUser, Content: "one more"})
	if names := tsOffered(next[0]); !slices.Contains(names, "github__create_issue") {
		t.Fatalf("second run's first request offers %v", names)
	}
	if r := tsResult(res2.st, "c4"); r == nil || r.Status != model.ToolStatusSuccess || runs.Load() != 2 {
		t.Fatalf("second run's call: %+v", r)
	}
}

// A promotion stored under another catalog hash (the tools were renamed
// or changed since) exposes nothing: the tool stays hidden and refused.
func TestToolSearchStaleCatalogExposesNothing(t *testing.T) {
	var runs atomic.Int32
	set := tsTools(t, &runs)
	chain := tsChain(t, `{"enabled": true}`)
	st := &state.State{}
	u, _ := state.SetValue(middleware.PromotedToolsValue, middleware.Promoted{CatalogHash: "0123456789abcdef", Names: []string{"github__create_issue"}})
	st.Apply(u)
	var reqs []*model.Request
	m := model.NewScripted(func(n int, req *model.Request) model.Reply {
		reqs = append(reqs, req)
		if n == 0 {
			return model.Reply{ToolCalls: []model.ToolCall{{ID: "c1", Name: "github__create_issue", Arguments: `{}`}}}
		}
		return model.Reply{Text: "ok"}
	})
	res := executeOn(t, st, chain, m, set)
	if names := tsOffered(reqs[0]); slices.Contains(names, "github__create_issue") {
		t.Fatalf("a stale promotion exposed the tool: %v", names)
	}
	if r := tsResult(res.st, "c1"); r == nil || r.Status != model.ToolStatusError || runs.Load() != 0 {
		t.Fatalf("call under a stale promotion: %+v, ran %d", r, runs.Load())
	}
}

// Two tool_search calls in one batch both promote (each result carries its
// promotion; the next before-model hook completes the union).
func TestToolSearchParallelSearchesUnion(t *testing.T) {
	var runs atomic.Int32
	set := tsTools(t, &runs)
	chain := tsChain(t, `{"enabled": true}`)
	var reqs []*model.Request
	m := model.NewScripted(func(n int, req *model.Request) model.Reply {
		reqs = append(reqs, req)
		if n == 0 {
			return model.Reply{ToolCalls: []model.ToolCall{
				{ID: "s1", Name: middleware.ToolSearchTool, Arguments: `{"query":"select:github__create_issue"}`},
				{ID: "s2", Name: middleware.ToolSearchTool, Arguments: `{"query":"+jira"}`},
			}}
		}
		return model.Reply{Text: "ok"}
	})
	res := execute(t, chain, m, set)
	names := tsOffered(reqs[1])
	if !slices.Contains(names, "github__create_issue") || !slices.Contains(names, "jira__search") {
		t.Fatalf("after two searches the request offers %v", names)
	}
	var p middleware.Promoted
	if _, _ = res.host.replay().Value(middleware.PromotedToolsValue, &p); !slices.Equal(p.Names, []string{"github__create_issue", "jira__search"}) {
		t.Fatalf("stored promotion %+v", p)
	}
}

// auto_promote_top_k promotes the deferred tools the user's message
// speaks of before the first model call.
func TestToolSearchAutoPromote(t *testing.T) {
	var runs atomic.Int32
	set := tsTools(t, &runs)
	chain := tsChain(t, `{"enabled": true, "auto_promote_top_k": 1}`)
	var reqs []*model.Request
	m := model.NewScripted(func(n int, req *model.Request) model.Reply {
		reqs = append(reqs, req)
		return model.Reply{Text: "ok"}
	})
	execute(t, chain, m, set, model.Message{ID: "u1", Role: model.RoleUser, Content: "File a GitHub issue about the login bug"})
	if names := tsOffered(reqs[0]); !slices.Contains(names, "github__create_issue") || slices.Contains(names, "jira__search") {
		t.Fatalf("first request offers %v", names)
	}
}

// Without deferred tools the middleware changes nothing: no tool_search,
// no prompt section.
func TestToolSearchNothingDeferred(t *testing.T) {
	chain := tsChain(t, `{"enabled": true, "deferred": ["nothing__*"]}`)
	var reqs []*model.Request
	m := model.NewScripted(func(n int, req *model.Request) model.Reply {
		reqs = append(reqs, req)
		return model.Reply{Text: "ok"}
	})
	execute(t, chain, m, echoTool(t))
	if names := tsOffered(reqs[0]); !slices.Contains(names, "echo") || slices.Contains(names, middleware.ToolSearchTool) || strings.Contains(reqs[0].Messages[0].Content, "deferred") {
		t.Fatalf("request offers %v, system %q", names, reqs[0].Messages[0].Content)
	}
}

func TestToolSearchSettings(t *testing.T) {
	for _, bad := range []string{`{"enabled": true, "max_results": 0.5}`, `{"enabled": true, "deferred": ["[x"]}`, `{"enabled": true, "limit": 3}`} {
		_, err := middleware.Assemble(middleware.ChainConfig{Settings: map[string]json.RawMessage{"tool_search": json.RawMessage(bad)}},
			middleware.Env{KnownTool: func(string) bool { return true }})
		if err == nil || !strings.Contains(err.Error(), "settings.tool_search") {
			t.Errorf("%s: %v", bad, err)
		}
	}
	chain, err := middleware.Assemble(middleware.ChainConfig{}, middleware.Env{KnownTool: func(string) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(chain.Names(), "tool_search") || slices.Contains(chain.Names(), "view_image") {
		t.Fatalf("off-by-default middlewares in the default chain: %v", chain.Names())
	}
}
