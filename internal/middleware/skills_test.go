package middleware

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/state"
	"github.com/natsagent/natsagent/internal/tools"
)

const pdfSkill = "---\nname: pdf-reports\ndescription: Makes PDF reports from tables.\ntools: [make_pdf]\n---\n# PDF reports\nCall make_pdf with the table.\n"

// skillsDir writes a shared skills directory: slug → SKILL.md text.
func skillsDir(t *testing.T, skillFiles map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for slug, text := range skillFiles {
		if err := os.MkdirAll(filepath.Join(dir, slug), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, slug, "SKILL.md"), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// skillRegistry is a deployment registry with make_pdf and chart tools.
func skillRegistry() *tools.Registry {
	reg := tools.NewRegistry()
	for _, name := range []string{"make_pdf", "chart"} {
		reg.Register(tools.Func(model.ToolSpec{Name: name, Description: name, Parameters: json.RawMessage(`{"type":"object"}`)},
			func(ctx context.Context, args json.RawMessage) (string, error) { return name + " done", nil }))
	}
	return reg
}

func newSkills(t *testing.T, s Skills, reg *tools.Registry) *Skills {
	t.Helper()
	m, err := NewSkills(s, reg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// skillRuntime is a runtime whose profile grants only current_time.
func skillRuntime(t *testing.T, wd files.Workdir) (*Runtime, *events) {
	t.Helper()
	rt, ev := newRuntime("r1")
	set, err := tools.NewSet(tools.CurrentTime())
	if err != nil {
		t.Fatal(err)
	}
	rt.Tools, rt.Files, rt.Agent = set, wd, "chatbot"
	return rt, ev
}

// passTool is the rest of a tool call: it records the calls that reach it
// and runs the bound tool, if any.
type passTool struct{ calls atomic.Int32 }

func (n *passTool) handle(ctx context.Context, call *ToolCall) (*ToolResult, error) {
	n.calls.Add(1)
	if call.Tool == nil {
		return errorResult("reached the tool layer without a tool"), nil
	}
	out, err := call.Tool.Call(ctx, &tools.Call{ID: call.Call.ID, Name: call.Call.Name, Args: json.RawMessage(call.Call.Arguments), Env: call.Env})
	if err != nil {
		return nil, err
	}
	status := model.ToolStatusSuccess
	if out.Error {
		status = model.ToolStatusError
	}
	return &ToolResult{Message: model.Message{Content: out.Content, Status: status}, Update: out.Update}, nil
}

// readFileTool is a read_file tool over the run's workdir.
type readFileTool struct{ reads atomic.Int32 }

func (r *readFileTool) Spec() model.ToolSpec { return model.ToolSpec{Name: "read_file"} }
func (r *readFileTool) Call(ctx context.Context, c *tools.Call) (*tools.Result, error) {
	r.reads.Add(1)
	var a struct {
		FilePath string `json:"file_path"`
	}
	json.Unmarshal(c.Args, &a)
	data, err := c.Env.Files.Read(ctx, a.FilePath)
	if err != nil {
		return nil, err
	}
	return tools.Text("workdir: " + string(data)), nil
}

func readCall(id, path string) model.ToolCall {
	return call(id, "read_file", `{"file_path":"`+path+`"}`)
}

func activatedOf(t *testing.T, st *state.State) []string {
	t.Helper()
	var names []string
	if _, err := st.Value(SkillsValue, &names); err != nil {
		t.Fatal(err)
	}
	return names
}

func TestSkills_SharedSkillServedFromDiskAndActivated(t *testing.T) {
	dir := skillsDir(t, map[string]string{"pdf-reports": pdfSkill})
	os.MkdirAll(filepath.Join(dir, "pdf-reports", "ref"), 0o755)
	os.WriteFile(filepath.Join(dir, "pdf-reports", "ref", "layout.md"), []byte("margins\nfonts\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "outside.txt"), []byte("not of the skill"), 0o644)
	os.Symlink(filepath.Join(dir, "outside.txt"), filepath.Join(dir, "pdf-reports", "escape.txt"))
	s := newSkills(t, Skills{Dir: dir}, skillRegistry())
	wd := files.NewMemory()
	rt, ev := skillRuntime(t, wd)
	rf := &readFileTool{}
	next := &passTool{}
	st := &state.State{}

	res, err := s.WrapToolCall(context.Background(), rt, &ToolCall{Call: readCall("c1", "skills/pdf-reports/SKILL.md"), Tool: rf, State: st, Env: &tools.Env{Files: wd}}, next.handle)
	if err != nil {
		t.Fatal(err)
	}
	if next.calls.Load() != 0 || rf.reads.Load() != 0 {
		t.Fatal("a shared skill read reached the workdir's read_file")
	}
	lines := strings.Split(res.Message.Content, "\n")
	if res.Message.Status != model.ToolStatusSuccess || lines[0] != "     1\t---" || lines[1] != "     2\tname: pdf-reports" || len(lines) != 7 {
		t.Fatalf("result = %+v", res.Message)
	}
	if res.Message.Meta[MetaActivatedSkill] != "pdf-reports" {
		t.Errorf("meta = %v", res.Message.Meta)
	}
	st.Apply(res.Update)
	if got := activatedOf(t, st); !reflect.DeepEqual(got, []string{"pdf-reports"}) {
		t.Errorf("activated = %v", got)
	}
	if evs := ev.ofType(EventSkillsActivated); len(evs) != 1 || !reflect.DeepEqual(evs[0].Data, map[string]any{"activated": []string{"pdf-reports"}}) {
		t.Errorf("events = %+v", evs)
	}

	// Reading it again changes nothing and says nothing.
	res, _ = s.WrapToolCall(context.Background(), rt, &ToolCall{Call: readCall("c2", "/skills/pdf-reports/SKILL.md"), Tool: rf, State: st}, next.handle)
	if !res.Update.Empty() || len(ev.ofType(EventSkillsActivated)) != 1 {
		t.Errorf("a second read updated %+v", res.Update)
	}

	// A file next to SKILL.md is served, with offset and limit, and
	// activates nothing.
	res, _ = s.WrapToolCall(context.Background(), rt, &ToolCall{Call: call("c3", "read_file", `{"path":"/skills/pdf-reports/ref/layout.md","offset":2,"limit":1}`), Tool: rf, State: &state.State{}}, next.handle)
	if res.Message.Content != "     2\tfonts" || !res.Update.Empty() {
		t.Errorf("ref file: %+v", res)
	}

	// Confinement: no way out of the skill's directory.
	for _, p := range []string{"/skills/pdf-reports/escape.txt", "/skills/pdf-reports/../pdf-reports/nope.md", "/skills/pdf-reports/ref"} {
		res, _ = s.WrapToolCall(context.Background(), rt, &ToolCall{Call: readCall("c4", p), Tool: rf, State: &state.State{}}, next.handle)
		if res.Message.Status != model.ToolStatusError || strings.Contains(res.Message.Content, "not of the skill") {
			t.Errorf("%s: %+v", p, res.Message)
		}
	}
	res, _ = s.WrapToolCall(context.Background(), rt, &ToolCall{Call: readCall("c5", "/skills/../../etc/passwd"), Tool: rf, State: &state.State{}}, next.handle)
	if res.Message.Status != model.ToolStatusError || rf.reads.Load() != 0 {
		t.Errorf("escape: %+v", res.Message)
	}

	// Shared skills are read-only.
	res, _ = s.WrapToolCall(context.Background(), rt, &ToolCall{Call: call("c6", "write_file", `{"file_path":"/skills/pdf-reports/SKILL.md","content":"x"}`), State: st}, next.handle)
	if res.Message.Status != model.ToolStatusError || !strings.Contains(res.Message.Content, "read-only") || next.calls.Load() != 0 {
		t.Errorf("write: %+v", res.Message)
	}

	// Other paths go to the run's own read_file.
	wd.Write(context.Background(), "/notes.md", []byte("mine"))
	res, _ = s.WrapToolCall(context.Background(), rt, &ToolCall{Call: readCall("c7", "/notes.md"), Tool: rf, State: st, Env: &tools.Env{Files: wd}}, next.handle)
	if res.Message.Content != "workdir: mine" || !res.Update.Empty() {
		t.Errorf("workdir read: %+v", res)
	}
}

func TestSkills_PromptAndGating(t *testing.T) {
	dir := skillsDir(t, map[string]string{
		"pdf-reports": pdfSkill,
		"charts":      "---\nname: charts\ndescription: Draws charts.\ntools: [chart, make_pdf]\n---\nbody\n",
	})
	s := newSkills(t, Skills{Dir: dir}, skillRegistry())
	rt, _ := skillRuntime(t, nil)
	capture := &captureNext{}
	st := &state.State{}
	req := &ModelRequest{System: "sys", Tools: rt.Tools.Specs(), State: st}
	if _, err := s.WrapModelCall(context.Background(), rt, req, capture.handle); err != nil {
		t.Fatal(err)
	}
	sent := capture.reqs[0]
	for _, want := range []string{"sys\n\n## Skills", "read its SKILL.md with read_file",
		"- charts: Draws charts.\n  Read /skills/charts/SKILL.md (tools: chart, make_pdf)",
		"- pdf-reports: Makes PDF reports from tables.\n  Read /skills/pdf-reports/SKILL.md (tools: make_pdf)"} {
		if !strings.Contains(sent.System, want) {
			t.Errorf("system prompt lacks %q:\n%s", want, sent.System)
		}
	}
	// Hidden until active; read_file offered for the skills since the run
	// has none.
	if got := specNames(sent.Tools); !reflect.DeepEqual(got, []string{"current_time", "read_file"}) {
		t.Errorf("tools = %v", got)
	}
	if req.System != "sys" || len(req.Tools) != 1 {
		t.Error("the request edit leaked into the caller's request")
	}

	// Hiding is not the enforcement: an explicit call is refused.
	next := &passTool{}
	res, err := s.WrapToolCall(context.Background(), rt, &ToolCall{Call: call("c1", "make_pdf", `{}`), State: st}, next.handle)
	if err != nil {
		t.Fatal(err)
	}
	if res.Message.Status != model.ToolStatusError || next.calls.Load() != 0 ||
		!strings.Contains(res.Message.Content, "charts or pdf-reports") || !strings.Contains(res.Message.Content, "/skills/pdf-reports/SKILL.md") {
		t.Errorf("refusal = %+v", res.Message)
	}

	// After activation of one of the two skills that bring it, make_pdf is
	// offered and runs from the registry; chart stays hidden.
	u, _ := state.SetValue(SkillsValue, []string{"pdf-reports"})
	st.Apply(u)
	capture.reqs = nil
	s.WrapModelCall(context.Background(), rt, &ModelRequest{Tools: rt.Tools.Specs(), State: st}, capture.handle)
	if got := specNames(capture.reqs[0].Tools); !reflect.DeepEqual(got, []string{"current_time", "make_pdf", "read_file"}) {
		t.Errorf("tools = %v", got)
	}
	// The list keeps the marks of the run's first call (the prompt's
	// prefix holds); a later run marks the skill active.
	if strings.Contains(capture.reqs[0].System, "(active)") {
		t.Errorf("the system prompt changed within the run:\n%s", capture.reqs[0].System)
	}
	nextRun := &Runtime{RunID: "r2", ThreadID: rt.ThreadID, Tenant: rt.Tenant, Tools: rt.Tools}
	capture.reqs = nil
	s.WrapModelCall(context.Background(), nextRun, &ModelRequest{Tools: nextRun.Tools.Specs(), State: st}, capture.handle)
	if !strings.Contains(capture.reqs[0].System, "- pdf-reports (active):") {
		t.Errorf("active skill not marked in the next run:\n%s", capture.reqs[0].System)
	}
	res, _ = s.WrapToolCall(context.Background(), rt, &ToolCall{Call: call("c2", "make_pdf", `{}`), State: st}, next.handle)
	if res.Message.Status != model.ToolStatusSuccess || res.Message.Content != "make_pdf done" {
		t.Errorf("after activation: %+v", res.Message)
	}
	res, _ = s.WrapToolCall(context.Background(), rt, &ToolCall{Call: call("c3", "chart", `{}`), State: st}, next.handle)
	if res.Message.Status != model.ToolStatusError || !strings.Contains(res.Message.Content, "/skills/charts/SKILL.md") {
		t.Errorf("chart: %+v", res.Message)
	}

	// A tool the profile grants is never gated.
	set, _ := tools.NewSet(tools.CurrentTime(), skillRegistry().Get("chart"))
	rt2 := &Runtime{RunID: "r2", Tools: set}
	res, _ = s.WrapToolCall(context.Background(), rt2, &ToolCall{Call: call("c4", "chart", `{}`), Tool: set.Get("chart"), State: &state.State{}}, next.handle)
	if res.Message.Status != model.ToolStatusSuccess {
		t.Errorf("granted tool gated: %+v", res.Message)
	}
}

func TestSkills_OwnReadFileServesOnlySkills(t *testing.T) {
	s := newSkills(t, Skills{Dir: skillsDir(t, map[string]string{"pdf-reports": pdfSkill})}, skillRegistry())
	rt, _ := skillRuntime(t, nil)
	next := &passTool{}
	res, _ := s.WrapToolCall(context.Background(), rt, &ToolCall{Call: readCall("c1", "/notes.md"), State: &state.State{}}, next.handle)
	if res.Message.Status != model.ToolStatusError || !strings.Contains(res.Message.Content, "only skill files") || next.calls.Load() != 0 {
		t.Errorf("result = %+v", res.Message)
	}
	res, _ = s.WrapToolCall(context.Background(), rt, &ToolCall{Call: call("c2", "read_file", `{"file_path":"/skills/pdf-reports/SKILL.md","limit":0}`), State: &state.State{}}, next.handle)
	if res.Message.Status != model.ToolStatusError || !res.Update.Empty() {
		t.Errorf("limit 0 read: %+v", res)
	}
}

func TestSkills_Preload(t *testing.T) {
	dir := skillsDir(t, map[string]string{"pdf-reports": pdfSkill})
	if _, err := NewSkills(Skills{Dir: dir, Preload: []string{"nope"}}, skillRegistry()); err == nil || !strings.Contains(err.Error(), `preload[0]: unknown skill "nope"`) {
		t.Errorf("unknown preload: %v", err)
	}
	if _, err := NewSkills(Skills{Preload: []string{"pdf-reports"}}, skillRegistry()); err == nil || !strings.Contains(err.Error(), "set dir") {
		t.Errorf("preload without dir: %v", err)
	}
	s := newSkills(t, Skills{Dir: dir, Preload: []string{"pdf-reports"}}, skillRegistry())
	rt, ev := skillRuntime(t, nil)
	st := &state.State{}
	r, err := s.BeforeAgent(context.Background(), rt, st)
	if err != nil {
		t.Fatal(err)
	}
	st.Apply(r.Update)
	if got := activatedOf(t, st); !reflect.DeepEqual(got, []string{"pdf-reports"}) || len(ev.ofType(EventSkillsActivated)) != 1 {
		t.Errorf("activated = %v, events %v", got, ev.all)
	}
	// Once in state, the next run changes nothing.
	if r, _ := s.BeforeAgent(context.Background(), rt, st); !r.Update.Empty() {
		t.Errorf("second before_agent: %+v", r.Update)
	}
	capture := &captureNext{}
	s.WrapModelCall(context.Background(), rt, &ModelRequest{Tools: rt.Tools.Specs(), State: &state.State{}}, capture.handle)
	sent := capture.reqs[0]
	if got := specNames(sent.Tools); !reflect.DeepEqual(got, []string{"current_time", "make_pdf", "read_file"}) {
		t.Errorf("tools = %v", got)
	}
	if !strings.Contains(sent.System, "<preloaded_skill name=\"pdf-reports\"") || !strings.Contains(sent.System, "Call make_pdf with the table.") {
		t.Errorf("system:\n%s", sent.System)
	}
}

func TestSkills_UserSkillsFromWorkdir(t *testing.T) {
	ctx := context.Background()
	dir := skillsDir(t, map[string]string{"pdf-reports": pdfSkill})
	s := newSkills(t, Skills{Dir: dir}, skillRegistry())
	wd := files.NewMemory()
	wd.Write(ctx, "/skills/my-notes/SKILL.md", []byte("---\nname: my-notes\ndescription: How I take notes.\ntools: [make_pdf, chart, teleport]\n---\nUse bullet points.\n"))
	rt, ev := skillRuntime(t, wd)
	st := &state.State{}
	if _, err := s.BeforeAgent(ctx, rt, st); err != nil {
		t.Fatal(err)
	}
	capture := &captureNext{}
	s.WrapModelCall(ctx, rt, &ModelRequest{Tools: rt.Tools.Specs(), State: st}, capture.handle)
	if !strings.Contains(capture.reqs[0].System, "- my-notes: How I take notes.\n  Read /skills/my-notes/SKILL.md") {
		t.Errorf("system:\n%s", capture.reqs[0].System)
	}

	// With a read_file tool, the workdir's tool reads it and the skill
	// activates; it names make_pdf (a shared skill's gated tool) and chart
	// (a tool no skill of the agent brings), and neither comes with it: a
	// workdir file never changes which tools a run has.
	rf := &readFileTool{}
	next := &passTool{}
	env := &tools.Env{Files: wd}
	res, _ := s.WrapToolCall(ctx, rt, &ToolCall{Call: readCall("c1", "/skills/my-notes/SKILL.md"), Tool: rf, State: st, Env: env}, next.handle)
	if rf.reads.Load() != 1 || !strings.HasPrefix(res.Message.Content, "workdir: ---") {
		t.Fatalf("result = %+v", res.Message)
	}
	st.Apply(res.Update)
	if got := activatedOf(t, st); !reflect.DeepEqual(got, []string{"my-notes"}) || len(ev.ofType(EventSkillsActivated)) != 1 {
		t.Errorf("activated = %v", got)
	}
	for _, name := range []string{"make_pdf", "chart"} {
		res, _ = s.WrapToolCall(ctx, rt, &ToolCall{Call: call("c2", name, `{}`), State: st}, next.handle)
		if res.Message.Status != model.ToolStatusError || strings.Contains(res.Message.Content, "done") {
			t.Errorf("%s after activating the workdir skill: %+v", name, res.Message)
		}
	}
	capture.reqs = nil
	s.WrapModelCall(ctx, rt, &ModelRequest{Tools: rt.Tools.Specs(), State: st}, capture.handle)
	if got := specNames(capture.reqs[0].Tools); !reflect.DeepEqual(got, []string{"current_time", "read_file"}) {
		t.Errorf("tools offered with the workdir skill active = %v", got)
	}
	if strings.Contains(capture.reqs[0].System, "my-notes (active):\n  Read /skills/my-notes/SKILL.md (tools:") {
		t.Errorf("the workdir skill's tools are listed:\n%s", capture.reqs[0].System)
	}

	// A failed read activates nothing.
	rt2, _ := skillRuntime(t, wd)
	wd.Write(ctx, "/skills/other/SKILL.md", []byte("---\nname: other\ndescription: O\n---\n"))
	failing := tools.Func(model.ToolSpec{Name: "read_file"}, func(ctx context.Context, args json.RawMessage) (string, error) {
		return "", files.ErrNotFound
	})
	res, err := s.WrapToolCall(ctx, rt2, &ToolCall{Call: readCall("c3", "/skills/other/SKILL.md"), Tool: failing, State: &state.State{}, Env: env}, (&passTool{}).handle)
	if res != nil || err == nil { // the tool error guard makes it an error result
		t.Errorf("failed read: %+v, %v", res, err)
	}

	// Without a read_file tool, the middleware reads the workdir itself.
	rt3, _ := skillRuntime(t, wd)
	res, _ = s.WrapToolCall(ctx, rt3, &ToolCall{Call: readCall("c4", "/skills/other/SKILL.md"), State: &state.State{}}, (&passTool{}).handle)
	if !strings.HasPrefix(res.Message.Content, "     1\t---") || res.Message.Meta[MetaActivatedSkill] != "other" {
		t.Errorf("own read: %+v", res.Message)
	}
}

func TestSkills_UserSkillRunErrors(t *testing.T) {
	ctx := context.Background()
	dir := skillsDir(t, map[string]string{"pdf-reports": pdfSkill})
	for _, tc := range []struct {
		name, file, text, want string
	}{
		{"shadows a shared skill", "/skills/pdf-reports/SKILL.md", "---\nname: pdf-reports\ndescription: M\n---\n", "duplicate skill"},
		{"same name as a shared skill", "/skills/mine/SKILL.md", "---\nname: pdf-reports\nslug: mine\ndescription: M\n---\n", "duplicate skill"},
		{"broken front matter", "/skills/mine/SKILL.md", "---\nname: mine\n", "not terminated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSkills(t, Skills{Dir: dir}, skillRegistry())
			wd := files.NewMemory()
			wd.Write(ctx, tc.file, []byte(tc.text))
			rt, _ := skillRuntime(t, wd)
			_, err := s.BeforeAgent(ctx, rt, &state.State{})
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), tc.file) {
				t.Errorf("err = %v, want %q naming %s", err, tc.want, tc.file)
			}
			// Every hook of the run reports it, not only before_agent.
			if _, err := s.WrapModelCall(ctx, rt, &ModelRequest{State: &state.State{}}, (&captureNext{}).handle); err == nil {
				t.Error("the model call went on")
			}
		})
	}
}

// Parallel reads in one batch: each result writes the union it knows and
// the loop merges them in call order, so the last writer may miss a skill
// that finished later; the next before-model hook completes the union from
// the batch's markers (deepagents #923: parallel writes need a reducer).
func TestSkills_DeepAgents923_ParallelReadsUnion(t *testing.T) {
	dir := skillsDir(t, map[string]string{
		"alpha": "---\nname: alpha\ndescription: A\n---\n",
		"beta":  "---\nname: beta\ndescription: B\n---\n",
	})
	s := newSkills(t, Skills{Dir: dir}, skillRegistry())
	rt, _ := skillRuntime(t, nil)
	st := &state.State{Messages: []model.Message{user("u1", "go"), asst("a1", "", readCall("ca", "/skills/alpha/SKILL.md"), readCall("cb", "/skills/beta/SKILL.md"))}}
	next := &passTool{}
	// beta finishes first, alpha second; results merge in call order.
	rb, _ := s.WrapToolCall(context.Background(), rt, &ToolCall{Call: readCall("cb", "/skills/beta/SKILL.md"), State: st}, next.handle)
	ra, _ := s.WrapToolCall(context.Background(), rt, &ToolCall{Call: readCall("ca", "/skills/alpha/SKILL.md"), State: st}, next.handle)
	var merged state.Update
	merged.Merge(ra.Update)
	merged.Merge(rb.Update)
	for _, r := range []struct {
		id, call string
		res      *ToolResult
	}{{"t1", "ca", ra}, {"t2", "cb", rb}} {
		m := r.res.Message
		m.ID, m.Role, m.ToolCallID, m.Name = r.id, model.RoleTool, r.call, "read_file"
		merged.Messages = append(merged.Messages, m)
	}
	st.Apply(checkpointed(t, merged)) // as a checkpoint stores it
	if got := activatedOf(t, st); !reflect.DeepEqual(got, []string{"beta"}) {
		t.Fatalf("the merge alone gives %v; this test no longer shows the race", got)
	}
	res, err := s.BeforeModel(context.Background(), rt, st)
	if err != nil {
		t.Fatal(err)
	}
	st.Apply(res.Update)
	if got := activatedOf(t, st); !reflect.DeepEqual(got, []string{"alpha", "beta"}) {
		t.Errorf("activated = %v", got)
	}
	// A fresh runtime (another worker after a redelivery) completes it too.
	st2 := &state.State{Messages: st.Messages}
	u, _ := state.SetValue(SkillsValue, []string{"beta"})
	st2.Apply(u)
	rt2, _ := skillRuntime(t, nil)
	res, _ = s.BeforeModel(context.Background(), rt2, st2)
	st2.Apply(res.Update)
	if got := activatedOf(t, st2); !reflect.DeepEqual(got, []string{"alpha", "beta"}) {
		t.Errorf("after redelivery: activated = %v", got)
	}
}

func checkpointed(t *testing.T, u state.Update) state.Update {
	t.Helper()
	data, err := json.Marshal(u)
	if err != nil {
		t.Fatal(err)
	}
	var out state.Update
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestSkills_AssemblyErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  string
	}{
		{"duplicate names", map[string]string{
			"one": "---\nname: same\nslug: one\ndescription: 1\n---\n",
			"two": "---\nname: same\nslug: two\ndescription: 2\n---\n",
		}, "duplicate skill"},
		{"tool not in the registry", map[string]string{
			"one": "---\nname: one\ndescription: 1\ntools: [teleport]\n---\n",
		}, `"teleport" is not a tool of this deployment`},
		{"depends on read_file", map[string]string{
			"one": "---\nname: one\ndescription: 1\ntools: [read_file]\n---\n",
		}, "cannot depend on it"},
		{"broken file", map[string]string{
			"one": "---\nname: one\n---\n",
		}, "one/SKILL.md: front matter field \"description\""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := skillsDir(t, tc.files)
			raw, _ := json.Marshal(map[string]any{"dir": dir})
			_, err := Assemble(ChainConfig{Settings: map[string]json.RawMessage{"skills": raw}}, Env{Tools: skillRegistry()})
			if err == nil || !strings.Contains(err.Error(), "settings.skills: dir:") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want %q", err, tc.want)
			}
		})
	}
	if _, err := Assemble(ChainConfig{Settings: settings("skills", `{"dirr":"x"}`)}, Env{}); err == nil || !strings.Contains(err.Error(), "dirr") {
		t.Errorf("unknown setting: %v", err)
	}
	// Two skills may share a dependency tool.
	dir := skillsDir(t, map[string]string{
		"one": "---\nname: one\ndescription: 1\ntools: [make_pdf]\n---\n",
		"two": "---\nname: two\ndescription: 2\ntools: [make_pdf]\n---\n",
	})
	raw, _ := json.Marshal(map[string]any{"dir": dir, "preload": []string{"two"}})
	if _, err := Assemble(ChainConfig{Settings: map[string]json.RawMessage{"skills": raw}}, Env{Tools: skillRegistry()}); err != nil {
		t.Errorf("shared dependency: %v", err)
	}
}
