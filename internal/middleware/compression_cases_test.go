package middleware_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model/openaitest"
)

// deer-flow §5.2 #15 (#4361): a summary model that answers blank has
// failed; the run's own model is tried next, and its summary is the one
// recorded.
func TestCompression_Case15_BlankSummaryFallsBackToTheRunModel(t *testing.T) {
	var models []string
	e := newCCEnv(t, text("ok"), func(n int, req *openaitest.Request) openaitest.Reply {
		models = append(models, req.Model)
		if req.Model == "cheap-summarizer" {
			return openaitest.Text(" \n\t ")
		}
		return openaitest.Text("SUMMARY by the run model.")
	})
	chain, _ := ccChain(t, `{"trigger_messages": 6, "keep": {"messages": 2}, "model": "cheap-summarizer"}`, middleware.ContextLimits{Window: 100000}, middleware.Retry{})
	base := history(user("u0", "a"), answer("f0", "b"), user("u1", "c"), answer("f1", "d"), user("u2", "e"), answer("f2", "f"))
	r := e.run(chain, base, files.NewMemory(), nil, user("u3", "go"))
	e.checkStrict()
	if strings.Join(models, ",") != "cheap-summarizer,test-model" {
		t.Fatalf("summary calls went to %v", models)
	}
	rec := r.summary(t)
	if rec == nil || rec.Summary != "SUMMARY by the run model." || rec.Model != "test-model" {
		t.Fatalf("summary record %+v", rec)
	}
}

// deer-flow §5.2 #15: when every summary model answers blank, nothing is
// recorded, the history is left as it was (never replaced by an error
// text), a failed event says why, and the call goes on.
func TestCompression_Case15_BlankEverywhereChangesNothing(t *testing.T) {
	e := newCCEnv(t, text("ok"), func(int, *openaitest.Request) openaitest.Reply { return openaitest.Text("") })
	chain, _ := ccChain(t, `{"trigger_messages": 6, "keep": {"messages": 2}}`, middleware.ContextLimits{Window: 100000}, middleware.Retry{})
	base := history(user("u0", "a"), answer("f0", "b"), user("u1", "c"), answer("f1", "d"), user("u2", "e"), answer("f2", "f"))
	r := e.run(chain, base, files.NewMemory(), nil, user("u3", "go"))
	e.checkStrict()
	if rec := r.summary(t); rec != nil {
		t.Fatalf("a blank summary was recorded: %+v", rec)
	}
	req := e.mains()[0].Messages
	if len(req) != 8 || req[1].Content != "a" || req[7].Content != "go" {
		t.Fatalf("the request is not the whole history: %+v", req)
	}
	for _, m := range req {
		if strings.Contains(strings.ToLower(m.Content), "error generating summary") || strings.Contains(m.Content, "<context_summary>") {
			t.Fatalf("the history was replaced: %+v", m)
		}
	}
	failed := false
	for _, d := range r.compression(t) {
		failed = failed || (d.Phase == middleware.CompressionFailed && strings.Contains(d.Error, "empty summary"))
	}
	if !failed {
		t.Fatalf("no failed event naming the empty summary: %+v", r.compression(t))
	}
}

// LangChain #38352 (research §5.2 #11): a contiguous run of tool results
// answers two assistant messages ([a1(c1), a2(c2), t1, t2]). Repair
// regroups each result after its call before compression sees the
// request ([a1, t1, a2, t2]), and the cut never starts the kept part with
// a result: no kept result is an orphan, whatever keep asks for.
func TestCompression_Case11_MixedOrphanRunAtTheCut(t *testing.T) {
	for keep := 2; keep <= 5; keep++ {
		e := newCCEnv(t, text("ok"), nil)
		chain, _ := ccChain(t, fmt.Sprintf(`{"trigger_messages": 8, "keep": {"messages": %d}}`, keep), middleware.ContextLimits{Window: 100000}, middleware.Retry{})
		base := history(
			user("u0", "look"), answer("f0", "looking"), user("u1", "twice"),
			calls("a1", call("c1", "echo", `{"n":1}`)),
			calls("a2", call("c2", "echo", `{"n":2}`)),
			result("t1", "c1", "echo", "one"), result("t2", "c2", "echo", "two"),
			answer("f2", "both done"),
		)
		r := e.run(chain, base, files.NewMemory(), nil, user("u2", "and then?"))
		e.checkStrict() // every kept result follows its call
		rec := r.summary(t)
		if rec == nil || strings.HasPrefix(rec.CutBeforeMessageID, "t") {
			t.Fatalf("keep %d: summary = %+v; a cut before a tool result orphans it", keep, rec)
		}
		req := e.mains()[0].Messages
		for i, m := range req {
			if m.Role == "tool" && (req[i-1].Role != "assistant" && req[i-1].Role != "tool") {
				t.Fatalf("keep %d: result %s does not follow its call: %+v", keep, m.ToolCallID, req)
			}
		}
	}
}
