// Package skills owns the skill format and where skills come from: a skill
// is a directory holding SKILL.md, a Markdown file that opens with YAML
// front matter (name, description, optional slug and dependency tools).
// Shared skills live in a directory on the worker's disk; a user's own
// skills live in the thread's workdir under /skills/<slug>/SKILL.md. The
// package parses and loads; it knows nothing of runs, tools or the chain
// (internal/middleware/skills.go decides what the model sees and may call).
package skills

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/natsagent/natsagent/internal/files"
)

// Root is the virtual directory every skill is read from: the model sees
// a skill at Root/<slug>/SKILL.md, shared or the user's own.
const Root = "/skills"

// FileName is the name of a skill's instructions file.
const FileName = "SKILL.md"

// Limits of a SKILL.md.
const (
	MaxFileSize       = 64 << 10
	MaxNameLen        = 64
	MaxDescriptionLen = 1024
	MaxTools          = 32
)

// Sources of a skill.
const (
	SourceShared = "shared"
	SourceUser   = "user"
)

// Skill is one parsed skill.
type Skill struct {
	Name        string
	Description string
	// Slug names the skill's directory; it defaults to Name.
	Slug string
	// Tools are the tools the skill needs; they are offered to the model
	// once the skill is active.
	Tools []string
	// Source is SourceShared or SourceUser.
	Source string
	// Dir is the skill's directory on disk (shared skills only).
	Dir string
	// File is where the skill was loaded from, for error messages: a disk
	// path for shared skills, a workdir path for the user's.
	File string
	// Body is the SKILL.md content after the front matter.
	Body string
}

// Path is the virtual path of the skill's SKILL.md.
func (s *Skill) Path() string { return VirtualPath(s.Slug) }

// VirtualPath is the path the model reads a skill's SKILL.md at.
func VirtualPath(slug string) string { return Root + "/" + slug + "/" + FileName }

// Error is a problem with one SKILL.md; Field names the front matter field
// at fault, "" when the problem is the file itself.
type Error struct {
	File  string
	Field string
	Msg   string
}

func (e *Error) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("skill %s: %s", e.File, e.Msg)
	}
	return fmt.Sprintf("skill %s: front matter field %q: %s", e.File, e.Field, e.Msg)
}

// ErrDuplicate is wrapped by the error of two skills with one name or slug.
var ErrDuplicate = errors.New("duplicate skill")

var (
	// idPattern is what a name or slug may be: a path segment the model can
	// type, lower case so two skills never differ by case only.
	idPattern   = regexp.MustCompile(`^[a-z0-9]+(?:[-_][a-z0-9]+)*$`)
	toolPattern = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)
)

// frontMatter is the YAML header. license, compatibility, metadata and
// allowed-tools are accepted so skills written for other harnesses load,
// and ignored: allowed-tools pre-approves tools there, which is not what
// tools (dependencies) means here.
type frontMatter struct {
	Name          *string   `yaml:"name"`
	Description   *string   `yaml:"description"`
	Slug          *string   `yaml:"slug"`
	Tools         []string  `yaml:"tools"`
	License       yaml.Node `yaml:"license"`
	Compatibility yaml.Node `yaml:"compatibility"`
	Metadata      yaml.Node `yaml:"metadata"`
	AllowedTools  yaml.Node `yaml:"allowed-tools"`
}

// Parse parses a SKILL.md; file names it in errors.
func Parse(file string, data []byte) (*Skill, error) {
	bad := func(field, format string, args ...any) error {
		return &Error{File: file, Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	if len(data) > MaxFileSize {
		return nil, bad("", "%d bytes is larger than the %d allowed", len(data), MaxFileSize)
	}
	if !utf8.Valid(data) {
		return nil, bad("", "not valid UTF-8 text")
	}
	text := strings.TrimPrefix(string(data), "\ufeff")
	text = strings.ReplaceAll(text, "\r\n", "\n")
	first, rest, _ := strings.Cut(text, "\n")
	if strings.TrimRight(first, " \t") != "---" {
		return nil, bad("", "must start with a front matter line \"---\", then YAML (name, description), then \"---\"")
	}
	var header string
	var body string
	found := false
	for off := 0; off <= len(rest); {
		line, after, more := strings.Cut(rest[off:], "\n")
		if strings.TrimRight(line, " \t") == "---" {
			header, body, found = rest[:off], after, true
			break
		}
		if !more {
			break
		}
		off += len(line) + 1
	}
	if !found {
		return nil, bad("", "the front matter is not terminated: add a line \"---\" after the YAML header")
	}

	var fm frontMatter
	dec := yaml.NewDecoder(strings.NewReader(header))
	dec.KnownFields(true)
	if err := dec.Decode(&fm); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, bad("", "the front matter is empty: it needs name and description")
		}
		return nil, bad("", "front matter is not valid YAML: %v", err)
	}

	s := &Skill{File: file, Body: body}
	switch {
	case fm.Name == nil || strings.TrimSpace(*fm.Name) == "":
		return nil, bad("name", "missing: every skill needs a name such as \"pdf-reports\"")
	case len(*fm.Name) > MaxNameLen:
		return nil, bad("name", "longer than %d characters", MaxNameLen)
	case !idPattern.MatchString(*fm.Name):
		return nil, bad("name", "%q is not an id: use lower-case letters, digits, '-' and '_' (like \"pdf-reports\")", *fm.Name)
	}
	s.Name = *fm.Name
	switch {
	case fm.Description == nil || strings.TrimSpace(*fm.Description) == "":
		return nil, bad("description", "missing: say in a sentence what the skill is for and when to use it")
	case utf8.RuneCountInString(*fm.Description) > MaxDescriptionLen:
		return nil, bad("description", "longer than %d characters: keep it short, the instructions go in the body", MaxDescriptionLen)
	}
	s.Description = strings.TrimSpace(*fm.Description)
	s.Slug = s.Name
	if fm.Slug != nil {
		switch slug := *fm.Slug; {
		case len(slug) > MaxNameLen:
			return nil, bad("slug", "longer than %d characters", MaxNameLen)
		case !idPattern.MatchString(slug):
			return nil, bad("slug", "%q is not an id: use lower-case letters, digits, '-' and '_'", slug)
		}
		s.Slug = *fm.Slug
	}
	if len(fm.Tools) > MaxTools {
		return nil, bad("tools", "%d tools is more than the %d allowed", len(fm.Tools), MaxTools)
	}
	for i, t := range fm.Tools {
		if !toolPattern.MatchString(t) {
			return nil, bad("tools", "entry %d (%q) is not a tool name", i, t)
		}
		if slices.Contains(fm.Tools[:i], t) {
			return nil, bad("tools", "%q is listed twice", t)
		}
	}
	s.Tools = slices.Clone(fm.Tools)
	return s, nil
}

// LoadDir loads the shared skills of dir: every subdirectory (except
// hidden ones) must hold a valid SKILL.md whose slug is the directory's
// name, and no two skills may share a name. Errors name the file at fault.
func LoadDir(dir string) ([]*Skill, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("skills directory %s: %w", dir, err)
	}
	var out []*Skill
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") {
			continue
		}
		sub := filepath.Join(dir, name)
		info, err := os.Stat(sub) // follows a symlinked skill directory
		if err != nil {
			return nil, fmt.Errorf("skills directory %s: %w", dir, err)
		}
		if !info.IsDir() {
			continue // a README next to the skills
		}
		file := filepath.Join(sub, FileName)
		data, err := readCapped(file)
		if err != nil {
			return nil, err
		}
		s, err := Parse(file, data)
		if err != nil {
			return nil, err
		}
		if s.Slug != name {
			return nil, &Error{File: file, Field: "slug", Msg: fmt.Sprintf("the skill's slug is %q but its directory is %q; they must be equal (the model reads it at %s)", s.Slug, name, VirtualPath(name))}
		}
		abs, err := filepath.Abs(sub)
		if err != nil {
			return nil, err
		}
		s.Source, s.Dir = SourceShared, abs
		out = append(out, s)
	}
	if err := checkDuplicates(out); err != nil {
		return nil, err
	}
	return out, nil
}

func readCapped(file string) ([]byte, error) {
	f, err := os.Open(file)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, &Error{File: file, Msg: "missing: a skill directory needs a SKILL.md"}
		}
		return nil, &Error{File: file, Msg: err.Error()}
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, &Error{File: file, Msg: err.Error()}
	}
	if len(data) > MaxFileSize {
		return nil, &Error{File: file, Msg: fmt.Sprintf("larger than the %d bytes allowed", MaxFileSize)}
	}
	return data, nil
}

// LoadWorkdir loads the user's skills of a thread's workdir: every
// Root/<slug>/SKILL.md. A directory without SKILL.md is not a skill (the
// workdir is a scratch space); a SKILL.md that does not parse, or whose
// slug is not its directory's name, is an error.
func LoadWorkdir(ctx context.Context, wd files.Workdir) ([]*Skill, error) {
	if wd == nil {
		return nil, nil
	}
	entries, err := wd.List(ctx, Root)
	if err != nil {
		if errors.Is(err, files.ErrNotFound) {
			return nil, nil
		}
		return nil, fmt.Errorf("listing %s in the workdir: %w", Root, err)
	}
	var out []*Skill
	for _, e := range entries {
		if !e.IsDir {
			continue
		}
		slug := strings.TrimPrefix(e.Path, Root+"/")
		file := VirtualPath(slug)
		info, err := wd.Stat(ctx, file)
		if err != nil {
			if errors.Is(err, files.ErrNotFound) {
				continue
			}
			return nil, fmt.Errorf("skill %s: %w", file, err)
		}
		if info.IsDir {
			continue
		}
		if info.Size > MaxFileSize {
			return nil, &Error{File: file, Msg: fmt.Sprintf("%d bytes is larger than the %d allowed", info.Size, MaxFileSize)}
		}
		data, err := wd.Read(ctx, file)
		if err != nil {
			return nil, fmt.Errorf("skill %s: %w", file, err)
		}
		s, err := Parse(file, data)
		if err != nil {
			return nil, err
		}
		if s.Slug != slug {
			return nil, &Error{File: file, Field: "slug", Msg: fmt.Sprintf("the skill's slug is %q but its directory is %q; they must be equal", s.Slug, slug)}
		}
		s.Source = SourceUser
		out = append(out, s)
	}
	if err := checkDuplicates(out); err != nil {
		return nil, err
	}
	return out, nil
}

// checkDuplicates refuses two skills with one name or one slug: the model
// names a skill by both, so either would be ambiguous.
func checkDuplicates(all []*Skill) error {
	names := make(map[string]*Skill)
	slugs := make(map[string]*Skill)
	for _, s := range all {
		if o, ok := names[s.Name]; ok {
			return fmt.Errorf("%w: %s and %s are both named %q", ErrDuplicate, o.File, s.File, s.Name)
		}
		if o, ok := slugs[s.Slug]; ok {
			return fmt.Errorf("%w: %s and %s both have the slug %q", ErrDuplicate, o.File, s.File, s.Slug)
		}
		names[s.Name], slugs[s.Slug] = s, s
	}
	return nil
}

// Merge returns shared then user skills, sorted by name, refusing a user
// skill with the name or slug of a shared one.
func Merge(shared, user []*Skill) ([]*Skill, error) {
	all := append(slices.Clone(shared), user...)
	if err := checkDuplicates(all); err != nil {
		return nil, err
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].Name < all[j].Name })
	return all, nil
}

// SplitPath reports whether p (already cleaned) is inside a skill
// directory, and returns the slug and the path relative to the skill's
// directory ("SKILL.md", "ref/a.md").
func SplitPath(p string) (slug, rel string, ok bool) {
	rest, ok := strings.CutPrefix(p, Root+"/")
	if !ok {
		return "", "", false
	}
	slug, rel, _ = strings.Cut(rest, "/")
	if slug == "" {
		return "", "", false
	}
	return slug, rel, true
}

// ReadShared reads a file of a shared skill's directory, confined to it
// (no "..", no symlink leaving it). rel is relative to the directory.
func ReadShared(s *Skill, rel string, maxBytes int64) ([]byte, error) {
	if s.Dir == "" {
		return nil, fmt.Errorf("skill %s is not a shared skill", s.Name)
	}
	if rel == "" {
		return nil, fmt.Errorf("%s/%s: %w", Root, s.Slug, files.ErrIsDir)
	}
	root, err := os.OpenRoot(s.Dir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	f, err := root.Open(rel)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%s/%s/%s: %w", Root, s.Slug, rel, files.ErrNotFound)
		}
		return nil, fmt.Errorf("%s/%s/%s: %w: %v", Root, s.Slug, rel, files.ErrBadPath, err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if info.IsDir() {
		return nil, fmt.Errorf("%s/%s/%s: %w", Root, s.Slug, rel, files.ErrIsDir)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxBytes+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > maxBytes {
		return nil, fmt.Errorf("%s/%s/%s: %w (more than %d bytes)", Root, s.Slug, rel, files.ErrTooLarge, maxBytes)
	}
	return data, nil
}
