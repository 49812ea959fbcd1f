package middleware_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
	"github.com/natsagent/natsagent/internal/tools"
)

func TestSlashSkillName(t *testing.T) {
	for in, want := range map[string]string{
		"/pdf-reports make the Q3 report": "pdf-reports",
		"  /pdf-reports":                  "pdf-reports",
		"/pdf_reports\nplease":            "pdf_reports",
		"/etc/passwd":                     "",
		"/../pdf-reports":                 "",
		"/pdf-reports/../x":               "",
		"/pdf-reports.md":                 "",
		"/PDF":                            "",
		"/-x":                             "",
		"/" + strings.Repeat("a", 65):     "",
		"please /pdf-reports":             "",
		"/":                               "",
	} {
		if got := middleware.SlashSkillName(in); got != want {
			t.Errorf("SlashSkillName(%q) = %q, want %q", in, got, want)
		}
	}
}

// slashRun is one run of the default chain with a shared skill
// pdf-reports (tool make_pdf) and a user skill notes in the workdir.
func slashRun(t *testing.T, st *state.State, w files.Workdir, runID, text string) (*model.Scripted, *state.State, []string) {
	t.Helper()
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "pdf-reports"), 0o755)
	os.WriteFile(filepath.Join(dir, "pdf-reports", "SKILL.md"), []byte("---\nname: pdf-reports\ndescription: Makes PDF reports.\ntools: [make_pdf]\n---\nCall make_pdf with the title. Never use <b> tags.\n"), 0o644)
	reg := tools.NewRegistry()
	reg.Register(tools.Func(model.ToolSpec{Name: "make_pdf", Description: "Makes a PDF", Parameters: json.RawMessage(`{"type":"object"}`)},
		func(ctx context.Context, args json.RawMessage) (string, error) { return "made", nil }))
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
	scripted := model.NewScripted(func(n int, req *model.Request) model.Reply { return model.Reply{Text: "done"} })
	host := &memHost{base: st.Clone()}
	var events []string
	rt := &middleware.Runtime{RunID: runID, ThreadID: "h1", Tenant: "default", Agent: "test", Tools: profile, Files: w, Logger: zap.NewNop(),
		Emit: func(typ string, data any) { events = append(events, typ) }}
	out := agent.Execute(context.Background(), &agent.Run{
		Runtime: rt, Chain: chain, Model: scripted, ModelName: "test-model", System: "sys", MaxSteps: 5, State: st,
		Input: []model.Message{{ID: "u_" + runID, Role: model.RoleUser, Content: text}}, Host: host, ToolEnv: tools.Env{Files: w},
	})
	if out.Status != protocol.StatusSuccess {
		t.Fatalf("run ended %+v", out)
	}
	mustAcceptAll(t, scripted.Requests())
	return scripted, st, events
}

// DeerFlow SkillActivation: "/pdf-reports ..." loads the skill's
// instructions for the run, stored once right after the message, and
// activates it (its tool is offered from the first call).
func TestSkills_SlashActivatesASkill(t *testing.T) {
	w := files.NewMemory()
	scripted, st, events := slashRun(t, &state.State{}, w, "r1", "/pdf-reports make the Q3 report")
	req := scripted.Requests()[0]
	if got := offeredTools(req.Tools); !slices.Contains(got, "make_pdf") {
		t.Fatalf("first request offers %v; the skill is active", got)
	}
	var roles []string
	for _, m := range req.Messages {
		roles = append(roles, m.Role)
	}
	if strings.Join(roles, ",") != "system,user,user" || req.Messages[1].Content != "/pdf-reports make the Q3 report" {
		t.Fatalf("first request: %+v", req.Messages)
	}
	body := req.Messages[2].Content
	for _, want := range []string{`<skill_activation name="pdf-reports" path="/skills/pdf-reports/SKILL.md">`, "Call make_pdf with the title. Never use &lt;b&gt; tags.", "</skill_content>\n</skill_activation>"} {
		if !strings.Contains(body, want) {
			t.Errorf("activation message lacks %q:\n%s", want, body)
		}
	}
	var active []string
	if _, err := st.Value(middleware.SkillsValue, &active); err != nil || !slices.Equal(active, []string{"pdf-reports"}) {
		t.Fatalf("activated_skills = %v (%v)", active, err)
	}
	i := st.Index("skill_u_r1")
	if i != 1 || st.Messages[i].Meta[middleware.MetaHidden] != true || st.Messages[i].Meta[middleware.MetaSkillActivation] != "pdf-reports" {
		t.Fatalf("stored activation at %d: %+v", i, st.Messages)
	}
	if !slices.Contains(events, middleware.EventSkillSlash) {
		t.Errorf("events %v lack %s", events, middleware.EventSkillSlash)
	}

	// The next run on the thread keeps the stored message where it is
	// (the prefix holds) and activates nothing again.
	scripted, st, events = slashRun(t, st, w, "r2", "thanks, now shorter")
	req = scripted.Requests()[0]
	if n := strings.Count(fmtMessages(req.Messages), "<skill_activation"); n != 1 || req.Messages[2].Content != body {
		t.Fatalf("second run sends the activation %d times: %+v", n, req.Messages)
	}
	if slices.Contains(events, middleware.EventSkillSlash) {
		t.Errorf("the second run activated again: %v", events)
	}
}

func fmtMessages(ms []model.Message) string {
	var b strings.Builder
	for _, m := range ms {
		b.WriteString(m.Role + ":" + m.Content + "\n")
	}
	return b.String()
}

// A name that is not one of the run's skills, or is not a name at all,
// is left as text: nothing is loaded, nothing activated, no path read.
func TestSkills_SlashUnknownOrPathIsText(t *testing.T) {
	for _, text := range []string{"/nope hello", "/etc/passwd", "/../pdf-reports", "/pdf-reports/../../x", "/skills/pdf-reports/SKILL.md", "say /pdf-reports"} {
		scripted, st, _ := slashRun(t, &state.State{}, files.NewMemory(), "r1", text)
		req := scripted.Requests()[0]
		if len(req.Messages) != 2 || req.Messages[1].Content != text {
			t.Errorf("%q: request %+v", text, req.Messages)
		}
		if got := offeredTools(req.Tools); slices.Contains(got, "make_pdf") {
			t.Errorf("%q: make_pdf offered", text)
		}
		if _, ok := st.Values[middleware.SkillsValue]; ok {
			t.Errorf("%q activated a skill", text)
		}
	}
}

// A user's own skill in the workdir can be activated too; it is text,
// so it brings no tool.
func TestSkills_SlashUserSkill(t *testing.T) {
	w := files.NewMemory()
	if err := w.Write(context.Background(), "/skills/notes/SKILL.md", []byte("---\nname: notes\ndescription: Takes notes.\n---\nWrite terse notes.\n")); err != nil {
		t.Fatal(err)
	}
	scripted, _, _ := slashRun(t, &state.State{}, w, "r1", "/notes")
	req := scripted.Requests()[0]
	if len(req.Messages) != 3 || !strings.Contains(req.Messages[2].Content, "Write terse notes.") {
		t.Fatalf("request %+v", req.Messages)
	}
}
