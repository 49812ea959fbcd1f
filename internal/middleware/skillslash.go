package middleware

// Slash activation of a skill (DeerFlow's SkillActivation). A run whose
// own latest user message starts with /<name>, where <name> is a skill
// this run has (shared or the user's own), activates that skill before
// the first model call: the skill joins activated_skills (so its tools
// are offered, as after a read of its SKILL.md), and its instructions are
// stored right after the user's message as one hidden user message, the
// way a read_file of the SKILL.md would have put them in the transcript.
// Stored, not added per request: the prompt's prefix stays the same for
// the rest of the run and the thread (promptcontext.go), and a summary
// carries the active skill on. The name is matched against the run's
// skills only: a name that is not one (an unknown word, a path such as
// /etc/passwd, ../x) leaves the message as the text it is.

import (
	"regexp"
	"strings"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/skills"
	"github.com/natsagent/natsagent/internal/state"
)

// MetaSkillActivation marks the stored message holding the instructions
// of a skill activated with /name; its value is the skill's name.
const MetaSkillActivation = "skill_activation"

// slashCommand is /name at the start of a message, name spelled as a
// skill name is (skills.LoadDir): lower-case letters, digits, - and _, at
// most 64, then the end or a space. A slash, a dot or anything else in
// the word makes it no command.
var slashCommand = regexp.MustCompile(`^/([a-z0-9][a-z0-9_-]{0,63})(?:\s|$)`)

// SlashSkillName returns the skill name a message asks for with /name,
// or "" when it does not start with one.
func SlashSkillName(text string) string {
	m := slashCommand.FindStringSubmatch(strings.TrimLeft(text, " \t\r\n"))
	if m == nil {
		return ""
	}
	return m[1]
}

// slashActivation returns the stored message and the activation for the
// run's own latest user message when it names one of v's skills with
// /name; ok is false otherwise, or when the message is stored already
// (a redelivered run).
func slashActivation(rt *Runtime, st *state.State, v *runSkills) (msg model.Message, name string, ok bool) {
	for i := len(st.Messages) - 1; i >= 0; i-- {
		m := &st.Messages[i]
		if id, _ := m.Meta["run_id"].(string); id != rt.RunID {
			return model.Message{}, "", false
		}
		if m.Role != model.RoleUser || m.Meta[MetaHidden] == true {
			continue
		}
		sk := v.byName[SlashSkillName(m.Content)]
		if sk == nil {
			return model.Message{}, "", false
		}
		id := "skill_" + m.ID
		if st.Index(id) >= 0 {
			return model.Message{}, "", false
		}
		return model.Message{
			ID: id, Role: model.RoleUser, Content: slashText(sk),
			Meta: map[string]any{MetaHidden: true, MetaSkillActivation: sk.Name, "run_id": rt.RunID},
		}, sk.Name, true
	}
	return model.Message{}, "", false
}

var escapeSkill = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;")

// slashText is what the model reads of a skill activated with /name.
func slashText(sk *skills.Skill) string {
	var b strings.Builder
	b.WriteString("<skill_activation name=\"" + sk.Name + "\" path=\"" + sk.Path() + "\">\n")
	b.WriteString("The user activated the skill " + sk.Name + " with /" + sk.Name + ". Follow its instructions below for the request above; the skill is active from now on, and its SKILL.md need not be read again.\n")
	b.WriteString("<skill_content encoding=\"xml-escaped\">\n")
	b.WriteString(escapeSkill.Replace(strings.TrimSpace(sk.Body)))
	b.WriteString("\n</skill_content>\n</skill_activation>")
	return b.String()
}
