package skills

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/natsagent/natsagent/internal/files"
)

func TestParse_Good(t *testing.T) {
	s, err := Parse("a/SKILL.md", []byte("\ufeff---\r\nname: pdf-reports\r\ndescription: >\r\n  Makes PDF reports\r\n  from tables.\r\ntools: [make_pdf, current_time]\r\nlicense: MIT\r\nallowed-tools: Bash\r\n---\r\n# PDF reports\r\nStep 1.\r\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s.Name != "pdf-reports" || s.Slug != "pdf-reports" || s.Description != "Makes PDF reports from tables." {
		t.Errorf("skill = %+v", s)
	}
	if strings.Join(s.Tools, ",") != "make_pdf,current_time" {
		t.Errorf("tools = %v", s.Tools)
	}
	if s.Body != "# PDF reports\nStep 1.\n" {
		t.Errorf("body = %q", s.Body)
	}
	if s.Path() != "/skills/pdf-reports/SKILL.md" {
		t.Errorf("path = %s", s.Path())
	}

	s, err = Parse("b/SKILL.md", []byte("---\nname: reports\nslug: report_v2\ndescription: d\n---\n"))
	if err != nil || s.Slug != "report_v2" || s.Body != "" {
		t.Fatalf("%+v, %v", s, err)
	}
}

func TestParse_Errors(t *testing.T) {
	for _, tc := range []struct {
		name, text, field, want string
	}{
		{"no front matter", "# Title\n", "", `must start with a front matter line`},
		{"unterminated", "---\nname: a\ndescription: b\n", "", "not terminated"},
		{"empty header", "---\n---\nbody", "", "empty"},
		{"bad yaml", "---\nname: [a\ndescription: b\n---\n", "", "not valid YAML"},
		{"not a mapping", "---\n- a\n- b\n---\n", "", "not valid YAML"},
		{"unknown field", "---\nname: a\ndescripton: b\n---\n", "", "descripton"},
		{"missing name", "---\ndescription: b\n---\n", "name", "missing"},
		{"blank name", "---\nname: \"  \"\ndescription: b\n---\n", "name", "missing"},
		{"name not an id", "---\nname: PDF Reports\ndescription: b\n---\n", "name", "not an id"},
		{"name with slash", "---\nname: ../x\ndescription: b\n---\n", "name", "not an id"},
		{"long name", "---\nname: " + strings.Repeat("a", MaxNameLen+1) + "\ndescription: b\n---\n", "name", "longer than"},
		{"missing description", "---\nname: a\n---\n", "description", "missing"},
		{"long description", "---\nname: a\ndescription: " + strings.Repeat("d", MaxDescriptionLen+1) + "\n---\n", "description", "longer than"},
		{"bad slug", "---\nname: a\nslug: A/B\ndescription: b\n---\n", "slug", "not an id"},
		{"tools not a list", "---\nname: a\ndescription: b\ntools: make_pdf\n---\n", "", "not valid YAML"},
		{"bad tool name", "---\nname: a\ndescription: b\ntools: [\"make pdf\"]\n---\n", "tools", "not a tool name"},
		{"tool twice", "---\nname: a\ndescription: b\ntools: [x, x]\n---\n", "tools", "listed twice"},
		{"oversized", "---\nname: a\ndescription: b\n---\n" + strings.Repeat("x", MaxFileSize), "", "larger than"},
		{"not utf-8", "---\nname: a\ndescription: \xff\n---\n", "", "UTF-8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("dir/x/SKILL.md", []byte(tc.text))
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("err = %v, want a *skills.Error", err)
			}
			if e.Field != tc.field || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "dir/x/SKILL.md") {
				t.Errorf("err = %v (field %q), want field %q and %q", err, e.Field, tc.field, tc.want)
			}
		})
	}
}

func writeSkill(t *testing.T, dir, slug, text string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, slug), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, slug, FileName), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

func skillText(name, desc string, extra ...string) string {
	return "---\nname: " + name + "\ndescription: " + desc + "\n" + strings.Join(extra, "\n") + "\n---\nInstructions of " + name + ".\n"
}

func TestLoadDir(t *testing.T) {
	dir := t.TempDir()
	writeSkill(t, dir, "beta", skillText("beta", "B"))
	writeSkill(t, dir, "alpha", skillText("alpha", "A", "tools: [x]"))
	os.WriteFile(filepath.Join(dir, "README.md"), []byte("not a skill"), 0o644)
	os.MkdirAll(filepath.Join(dir, ".git"), 0o755)
	got, err := LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Name != "alpha" || got[1].Name != "beta" || got[0].Source != SourceShared || !filepath.IsAbs(got[0].Dir) {
		t.Fatalf("skills = %+v", got)
	}
}

func TestLoadDir_Errors(t *testing.T) {
	t.Run("missing dir", func(t *testing.T) {
		if _, err := LoadDir(filepath.Join(t.TempDir(), "nope")); err == nil || !strings.Contains(err.Error(), "nope") {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("directory without SKILL.md", func(t *testing.T) {
		dir := t.TempDir()
		os.MkdirAll(filepath.Join(dir, "empty"), 0o755)
		_, err := LoadDir(dir)
		if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "empty", FileName)) {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("broken skill names its path", func(t *testing.T) {
		dir := t.TempDir()
		writeSkill(t, dir, "good", skillText("good", "G"))
		writeSkill(t, dir, "bad", "---\nname: bad\n---\n")
		_, err := LoadDir(dir)
		if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "bad", FileName)) || !strings.Contains(err.Error(), "description") {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("oversized file", func(t *testing.T) {
		dir := t.TempDir()
		writeSkill(t, dir, "big", skillText("big", "B")+strings.Repeat("x", MaxFileSize))
		_, err := LoadDir(dir)
		if err == nil || !strings.Contains(err.Error(), "larger than") {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("slug is not the directory", func(t *testing.T) {
		dir := t.TempDir()
		writeSkill(t, dir, "dir-name", skillText("other-name", "O"))
		_, err := LoadDir(dir)
		var e *Error
		if !errors.As(err, &e) || e.Field != "slug" {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("duplicate names", func(t *testing.T) {
		dir := t.TempDir()
		writeSkill(t, dir, "one", skillText("same", "1", "slug: one"))
		writeSkill(t, dir, "two", skillText("same", "2", "slug: two"))
		_, err := LoadDir(dir)
		if !errors.Is(err, ErrDuplicate) || !strings.Contains(err.Error(), "one") || !strings.Contains(err.Error(), "two") {
			t.Errorf("err = %v", err)
		}
	})
}

func TestLoadWorkdir(t *testing.T) {
	ctx := context.Background()
	wd := files.NewMemory()
	if got, err := LoadWorkdir(ctx, wd); err != nil || got != nil {
		t.Fatalf("empty workdir: %v, %v", got, err)
	}
	wd.Write(ctx, "/skills/mine/SKILL.md", []byte(skillText("mine", "M")))
	wd.Write(ctx, "/skills/draft/notes.md", []byte("no SKILL.md yet"))
	wd.Write(ctx, "/skills/loose.md", []byte("a file, not a skill"))
	got, err := LoadWorkdir(ctx, wd)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Name != "mine" || got[0].Source != SourceUser || got[0].File != "/skills/mine/SKILL.md" {
		t.Fatalf("skills = %+v", got)
	}

	wd.Write(ctx, "/skills/broken/SKILL.md", []byte("---\nname: broken\n"))
	if _, err := LoadWorkdir(ctx, wd); err == nil || !strings.Contains(err.Error(), "/skills/broken/SKILL.md") {
		t.Errorf("err = %v", err)
	}
	wd.Remove(ctx, "/skills/broken/SKILL.md")
	wd.Write(ctx, "/skills/big/SKILL.md", []byte(strings.Repeat("x", MaxFileSize+1)))
	if _, err := LoadWorkdir(ctx, wd); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("err = %v", err)
	}
}

func TestMerge_UserCannotShadowShared(t *testing.T) {
	shared := []*Skill{{Name: "a", Slug: "a", File: "/srv/skills/a/SKILL.md"}}
	user := []*Skill{{Name: "a", Slug: "a", File: "/skills/a/SKILL.md"}}
	if _, err := Merge(shared, user); !errors.Is(err, ErrDuplicate) {
		t.Errorf("err = %v", err)
	}
	user = []*Skill{{Name: "b", Slug: "a2", File: "/skills/a2/SKILL.md"}, {Name: "c", Slug: "a", File: "/skills/a/SKILL.md"}}
	if _, err := Merge(shared, user); !errors.Is(err, ErrDuplicate) {
		t.Errorf("slug clash: err = %v", err)
	}
}

func TestReadShared_Confined(t *testing.T) {
	dir := t.TempDir()
	writeSkill(t, dir, "s", skillText("s", "S"))
	os.WriteFile(filepath.Join(dir, "secret.txt"), []byte("secret"), 0o644)
	os.MkdirAll(filepath.Join(dir, "s", "ref"), 0o755)
	os.WriteFile(filepath.Join(dir, "s", "ref", "a.md"), []byte("ref a"), 0o644)
	if err := os.Symlink(filepath.Join(dir, "secret.txt"), filepath.Join(dir, "s", "link.txt")); err != nil {
		t.Fatal(err)
	}
	all, err := LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	s := all[0]
	if data, err := ReadShared(s, "ref/a.md", 100); err != nil || string(data) != "ref a" {
		t.Errorf("ref/a.md: %q, %v", data, err)
	}
	if _, err := ReadShared(s, "link.txt", 100); !errors.Is(err, files.ErrBadPath) {
		t.Errorf("symlink out of the skill: err = %v", err)
	}
	if _, err := ReadShared(s, "../secret.txt", 100); err == nil {
		t.Error("../ read outside the skill")
	}
	if _, err := ReadShared(s, "nope.md", 100); !errors.Is(err, files.ErrNotFound) {
		t.Errorf("missing: err = %v", err)
	}
	if _, err := ReadShared(s, "ref", 100); !errors.Is(err, files.ErrIsDir) {
		t.Errorf("dir: err = %v", err)
	}
	if _, err := ReadShared(s, "ref/a.md", 2); !errors.Is(err, files.ErrTooLarge) {
		t.Errorf("cap: err = %v", err)
	}
}

func TestSplitPath(t *testing.T) {
	for p, want := range map[string][2]string{
		"/skills/a/SKILL.md": {"a", "SKILL.md"},
		"/skills/a/ref/x.md": {"a", "ref/x.md"},
		"/skills/a":          {"a", ""},
	} {
		slug, rel, ok := SplitPath(p)
		if !ok || slug != want[0] || rel != want[1] {
			t.Errorf("%s: %q %q %v", p, slug, rel, ok)
		}
	}
	for _, p := range []string{"/skills", "/skillsx/a", "/notes/a"} {
		if _, _, ok := SplitPath(p); ok {
			t.Errorf("%s is not a skill path", p)
		}
	}
}
