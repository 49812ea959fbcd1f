package skills

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/natsagent/natsagent/internal/files"
)

// FuzzSkillFrontMatter: whatever a SKILL.md holds (YAML of any shape,
// anchors and aliases, deep nesting, tabs, BOMs, CRLF, unterminated
// headers), Parse never panics; a refusal is an *Error naming the file and
// at most one known field; an accepted skill has an id name and slug whose
// virtual path stays under /skills, a non-empty description within the
// limit and distinct valid tool names, and it renders back to a SKILL.md
// that parses to the same skill.
func FuzzSkillFrontMatter(f *testing.F) {
	seeds := []string{
		"---\nname: pdf-reports\ndescription: Makes PDF reports.\n---\n# Body\n",
		"\ufeff---\r\nname: pdf-reports\r\ndescription: >\r\n  Makes PDF reports\r\n  from tables.\r\ntools: [make_pdf, current_time]\r\nlicense: MIT\r\nallowed-tools: Bash\r\n---\r\nStep 1.\r\n",
		"---\nname: a\ndescription: d\nslug: other-slug\ntools:\n  - x.y\n  - z\nmetadata: {k: [1, {v: 2}]}\ncompatibility: any\n---\n",
		"---\nname: ../../etc\ndescription: d\n---\n",
		"---\nname: a\nslug: ../x\ndescription: d\n---\n",
		"---\nname: A\ndescription: d\n---\n",
		"---\nname: a\ndescription: d\ntools: [x, x]\n---\n",
		"---\nname: a\ndescription: d\nunknown: 1\n---\n",
		"---\nname: [a]\ndescription: d\n---\n",
		"---\nname: a\ndescription: d\n",
		"---\n---\n",
		"no front matter",
		"---\nname: &n a\ndescription: *n\n---\n",
		"---\nname: a\ndescription: d\nmetadata: &a [*a]\n---\n",
		"---\nname: a\ndescription: d\nmetadata: " + strings.Repeat("[", 500) + strings.Repeat("]", 500) + "\n---\n",
		"---\nname: a\ndescription: |\n  line one\n  ---\n  line three\n---\nbody\n---\nmore\n",
		"---\nname: a\ndescription: \"\\u0000\\t\"\n---\n",
		"---\nname: a\ndescription: d\n---\n\r\r\nbody\r\r\n",
		"---\n\tname: a\n---\n",
		"---\nname: a\ndescription: \xff\n---\n",
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Parse("x/SKILL.md", data)
		if err != nil {
			var se *Error
			if !errors.As(err, &se) || se.File != "x/SKILL.md" {
				t.Fatalf("error %T %v does not name the file", err, err)
			}
			switch se.Field {
			case "", "name", "description", "slug", "tools":
			default:
				t.Fatalf("error names field %q", se.Field)
			}
			return
		}
		check(t, s)
		again, err := Parse("x/SKILL.md", render(t, s))
		if err != nil {
			t.Fatalf("the rendering of an accepted skill is refused: %v\n%s", err, render(t, s))
		}
		if again.Name != s.Name || again.Slug != s.Slug || again.Description != s.Description || !slices.Equal(again.Tools, s.Tools) {
			t.Fatalf("round trip changed the skill:\n%+v\n%+v", s, again)
		}
		if again.Body != strings.ReplaceAll(s.Body, "\r\n", "\n") {
			t.Fatalf("round trip changed the body: %q -> %q", s.Body, again.Body)
		}
	})
}

func check(t *testing.T, s *Skill) {
	t.Helper()
	if !idPattern.MatchString(s.Name) || len(s.Name) > MaxNameLen || !idPattern.MatchString(s.Slug) || len(s.Slug) > MaxNameLen {
		t.Fatalf("accepted name %q slug %q", s.Name, s.Slug)
	}
	p := s.Path()
	if c, err := files.Clean(p); err != nil || c != p || !strings.HasPrefix(p, Root+"/"+s.Slug+"/") {
		t.Fatalf("skill path %q is not confined under %s (%q, %v)", p, Root, c, err)
	}
	if slug, rel, ok := SplitPath(p); !ok || slug != s.Slug || rel != FileName {
		t.Fatalf("SplitPath(%q) = %q %q %v", p, slug, rel, ok)
	}
	if s.Description == "" || s.Description != strings.TrimSpace(s.Description) || utf8.RuneCountInString(s.Description) > MaxDescriptionLen {
		t.Fatalf("accepted description %q", s.Description)
	}
	if len(s.Tools) > MaxTools {
		t.Fatalf("accepted %d tools", len(s.Tools))
	}
	for i, tool := range s.Tools {
		if !toolPattern.MatchString(tool) || slices.Contains(s.Tools[:i], tool) {
			t.Fatalf("accepted tools %q", s.Tools)
		}
	}
}

// render writes a skill back as a SKILL.md.
func render(t *testing.T, s *Skill) []byte {
	t.Helper()
	header, err := yaml.Marshal(struct {
		Name        string   `yaml:"name"`
		Description string   `yaml:"description"`
		Slug        string   `yaml:"slug"`
		Tools       []string `yaml:"tools,omitempty"`
	}{s.Name, s.Description, s.Slug, s.Tools})
	if err != nil {
		t.Fatal(err)
	}
	return []byte("---\n" + string(header) + "---\n" + s.Body)
}
