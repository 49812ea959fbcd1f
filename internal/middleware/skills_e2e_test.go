package middleware_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/model/openaitest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/tools"
)

// strictRequests fails the test for every request a strict provider would
// reject.
func mustAcceptAll(t *testing.T, reqs []*model.Request) {
	t.Helper()
	for i, req := range reqs {
		w := &openaitest.Request{Model: req.Model}
		for _, m := range req.Messages {
			om := openaitest.Message{Role: m.Role, Content: m.Content, Name: m.Name, ToolCallID: m.ToolCallID}
			for _, c := range m.ToolCalls {
				om.ToolCalls = append(om.ToolCalls, openaitest.ToolCallMsg{ID: c.ID, Type: "function", Function: openaitest.FunctionCall{Name: c.Name, Arguments: c.Arguments}})
			}
			w.Messages = append(w.Messages, om)
		}
		for _, s := range req.Tools {
			w.Tools = append(w.Tools, openaitest.Tool{Type: "function", Function: openaitest.Function{Name: s.Name, Parameters: s.Parameters}})
		}
		if problems := openaitest.Validate(w); len(problems) > 0 {
			t.Errorf("request %d rejected: %v", i, problems)
		}
	}
}

func offeredTools(specs []model.ToolSpec) []string {
	var out []string
	for _, s := range specs {
		out = append(out, s.Name)
	}
	return out
}

// A run of the default chain: the model reads a shared skill, which
// activates it and reveals its tool, plans with write_todos, calls the
// skill's tool, tries two parallel write_todos (refused), and answers.
func TestDefaultChain_SkillThenItsToolThenTodos(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "pdf-reports"), 0o755)
	os.WriteFile(filepath.Join(dir, "pdf-reports", "SKILL.md"), []byte("---\nname: pdf-reports\ndescription: Makes PDF reports.\ntools: [make_pdf]\n---\nCall make_pdf with the title.\n"), 0o644)
	reg := tools.NewRegistry()
	reg.Register(tools.Func(model.ToolSpec{Name: "make_pdf", Description: "Makes a PDF", Parameters: json.RawMessage(`{"type":"object","properties":{"title":{"type":"string"}}}`)},
		func(ctx context.Context, args json.RawMessage) (string, error) { return "made /out/report.pdf", nil }))
	profile, err := reg.Select([]string{"current_time"})
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(map[string]any{"dir": dir})
	chain, err := middleware.Assemble(middleware.ChainConfig{Settings: map[string]json.RawMessage{"skills": raw}},
		middleware.Env{KnownTool: func(n string) bool { return profile.Get(n) != nil }, Tools: reg})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"skills", "todos"} {
		if !slices.Contains(chain.Names(), n) {
			t.Fatalf("%s is not in the default chain %v", n, chain.Names())
		}
	}

	plan := `{"todos":[{"content":"Make the PDF","status":"in_progress"}]}`
	scripted := model.NewScripted(func(n int, req *model.Request) model.Reply {
		switch n {
		case 0:
			return model.Reply{ToolCalls: []model.ToolCall{
				{ID: "c_read", Name: "read_file", Arguments: `{"file_path":"/skills/pdf-reports/SKILL.md"}`},
				{ID: "c_plan", Name: "write_todos", Arguments: plan},
			}}
		case 1:
			return model.Reply{ToolCalls: []model.ToolCall{{ID: "c_pdf", Name: "make_pdf", Arguments: `{"title":"Q3"}`}}}
		case 2:
			return model.Reply{ToolCalls: []model.ToolCall{
				{ID: "c_t1", Name: "write_todos", Arguments: `{"todos":[{"content":"Make the PDF","status":"completed"}]}`},
				{ID: "c_t2", Name: "write_todos", Arguments: `{"todos":[]}`},
			}}
		}
		return model.Reply{Text: "The report is at /out/report.pdf."}
	})
	r := execute(t, chain, scripted, profile, model.Message{ID: "u1", Role: model.RoleUser, Content: "Make the Q3 report"})
	// The parallel writes were refused, so the item is still open at the
	// answer: the todos middleware sends it back once with a reminder.
	if r.out.Status != protocol.StatusSuccess || scripted.Calls() != 5 {
		t.Fatalf("outcome %+v after %d calls", r.out, scripted.Calls())
	}
	reqs := scripted.Requests()
	if last := reqs[4].Messages[len(reqs[4].Messages)-1]; !strings.Contains(last.Content, "[in_progress] Make the PDF") {
		t.Errorf("the fifth request ends with %+v, want the todo reminder", last)
	}
	mustAcceptAll(t, reqs)

	if got := offeredTools(reqs[0].Tools); slices.Contains(got, "make_pdf") || !slices.Contains(got, "read_file") || !slices.Contains(got, "write_todos") || !slices.Contains(got, "current_time") {
		t.Errorf("first request offers %v; make_pdf must be hidden until the skill is read", got)
	}
	sys0 := reqs[0].Messages[0].Content
	for _, want := range []string{"- pdf-reports: Makes PDF reports.\n  Read /skills/pdf-reports/SKILL.md (tools: make_pdf)", "## Todo list", "<current_date>"} {
		if !strings.Contains(sys0, want) {
			t.Errorf("first system prompt lacks %q:\n%s", want, sys0)
		}
	}
	if got := offeredTools(reqs[1].Tools); !slices.Contains(got, "make_pdf") {
		t.Errorf("second request offers %v; the skill is active", got)
	}
	sys1 := reqs[1].Messages[0].Content
	// The system prompt stays as the run's first call had it, so the
	// provider's cached prefix holds; the next run shows the skill active.
	if sys1 != sys0 {
		t.Errorf("the system prompt changed within the run:\n%s\n---\n%s", sys0, sys1)
	}
	if last := reqs[1].Messages[len(reqs[1].Messages)-1]; last.Role != model.RoleUser || !strings.Contains(last.Content, "1. [in_progress] Make the PDF") {
		t.Errorf("second request's trailing context: %+v", last)
	}

	byCall := map[string]model.Message{}
	for _, m := range r.st.Messages {
		if m.Role == model.RoleTool {
			byCall[m.ToolCallID] = m
		}
	}
	if m := byCall["c_read"]; m.Status != model.ToolStatusSuccess || !strings.Contains(m.Content, "     6\tCall make_pdf with the title.") {
		t.Errorf("read result = %+v", m)
	}
	if m := byCall["c_pdf"]; m.Status != model.ToolStatusSuccess || m.Content != "made /out/report.pdf" {
		t.Errorf("make_pdf result = %+v", m)
	}
	for _, id := range []string{"c_t1", "c_t2"} {
		if m := byCall[id]; m.Status != model.ToolStatusError || !strings.Contains(m.Content, "once per response") {
			t.Errorf("%s result = %+v", id, m)
		}
	}

	// State as a worker that picks the thread up sees it.
	st := r.host.replay()
	var activated []string
	var todos []middleware.Todo
	st.Value(middleware.SkillsValue, &activated)
	st.Value(middleware.TodosValue, &todos)
	if !reflect.DeepEqual(activated, []string{"pdf-reports"}) {
		t.Errorf("activated_skills = %v", activated)
	}
	if !reflect.DeepEqual(todos, []middleware.Todo{{Content: "Make the PDF", Status: middleware.TodoInProgress}}) {
		t.Errorf("todos = %+v (the refused parallel writes must change nothing)", todos)
	}
	count := map[string]int{}
	for _, e := range r.host.events {
		count[e]++
	}
	if count[middleware.EventSkillsActivated] != 1 || count[middleware.EventTodos] != 1 {
		t.Errorf("events = %v", r.host.events)
	}
	for _, e := range []string{middleware.EventSkillsActivated, middleware.EventTodos} {
		if protocol.KindOf(e) != protocol.KindUpdates {
			t.Errorf("%s is published under %s", e, protocol.KindOf(e))
		}
	}
}

// Two skills read in one batch both end up active, whatever order the
// parallel reads finish in.
func TestDefaultChain_ParallelSkillReads(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"alpha", "beta", "gamma"} {
		os.MkdirAll(filepath.Join(dir, name), 0o755)
		os.WriteFile(filepath.Join(dir, name, "SKILL.md"), []byte("---\nname: "+name+"\ndescription: "+name+"\n---\nbody\n"), 0o644)
	}
	raw, _ := json.Marshal(map[string]any{"dir": dir})
	chain, err := middleware.Assemble(middleware.ChainConfig{Settings: map[string]json.RawMessage{"skills": raw}}, middleware.Env{Tools: tools.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	scripted := model.NewScripted(func(n int, req *model.Request) model.Reply {
		if n == 0 {
			return model.Reply{ToolCalls: []model.ToolCall{
				{ID: "c1", Name: "read_file", Arguments: `{"file_path":"/skills/alpha/SKILL.md"}`},
				{ID: "c2", Name: "read_file", Arguments: `{"file_path":"/skills/beta/SKILL.md"}`},
				{ID: "c3", Name: "read_file", Arguments: `{"file_path":"/skills/gamma/SKILL.md"}`},
			}}
		}
		return model.Reply{Text: "ok"}
	})
	r := execute(t, chain, scripted, nil)
	var activated []string
	r.host.replay().Value(middleware.SkillsValue, &activated)
	if !reflect.DeepEqual(activated, []string{"alpha", "beta", "gamma"}) {
		t.Errorf("activated_skills = %v", activated)
	}
	// Within the run the system prompt keeps its first form (the cached
	// prefix holds); the next run lists all three active.
	if sys0, sys1 := scripted.Requests()[0].Messages[0].Content, scripted.Requests()[1].Messages[0].Content; sys0 != sys1 {
		t.Errorf("the system prompt changed within the run:\n%s\n---\n%s", sys0, sys1)
	}
	next := model.NewScripted(func(int, *model.Request) model.Reply { return model.Reply{Text: "ok"} })
	executeOn(t, r.host.replay(), chain, next, nil, model.Message{ID: "u2", Role: model.RoleUser, Content: "again"})
	sys := next.Requests()[0].Messages[0].Content
	for _, name := range []string{"alpha", "beta", "gamma"} {
		if !strings.Contains(sys, "- "+name+" (active)") {
			t.Errorf("%s not active in the next run:\n%s", name, sys)
		}
	}
}
