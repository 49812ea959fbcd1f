package tools_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/tools"
)

// fileCall calls a registered tool on w with the arguments given as JSON.
func fileCall(t *testing.T, w files.Workdir, name, args string) (string, error) {
	t.Helper()
	tool := tools.NewRegistry().Get(name)
	if tool == nil {
		t.Fatalf("tool %s is not registered", name)
	}
	res, err := tool.Call(context.Background(), &tools.Call{ID: "c1", Name: name, Args: json.RawMessage(args), Env: &tools.Env{Files: w}})
	if err != nil {
		return "", err
	}
	if res.Error {
		return res.Content, errors.New(res.Content)
	}
	return res.Content, nil
}

func mustCall(t *testing.T, w files.Workdir, name, args string) string {
	t.Helper()
	out, err := fileCall(t, w, name, args)
	if err != nil {
		t.Fatalf("%s %s: %v", name, args, err)
	}
	return out
}

func wantRefusal(t *testing.T, w files.Workdir, name, args string, contains ...string) error {
	t.Helper()
	out, err := fileCall(t, w, name, args)
	if err == nil {
		t.Fatalf("%s %s succeeded: %s", name, args, out)
	}
	for _, s := range contains {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("%s %s: error %q does not mention %q", name, args, err, s)
		}
	}
	return err
}

func args(kv ...any) string {
	m := map[string]any{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	data, _ := json.Marshal(m)
	return string(data)
}

func write(t *testing.T, w files.Workdir, p, content string) {
	t.Helper()
	if err := w.Write(context.Background(), p, []byte(content)); err != nil {
		t.Fatal(err)
	}
}

func TestFileTools_Specs(t *testing.T) {
	reg := tools.NewRegistry()
	for _, name := range tools.FileToolNames {
		tool := reg.Get(name)
		if tool == nil {
			t.Fatalf("%s is not registered", name)
		}
		spec := tool.Spec()
		var schema struct {
			Type       string                     `json:"type"`
			Properties map[string]json.RawMessage `json:"properties"`
			Required   []string                   `json:"required"`
		}
		if err := json.Unmarshal(spec.Parameters, &schema); err != nil || schema.Type != "object" {
			t.Errorf("%s: schema %s: %v", name, spec.Parameters, err)
		}
		for _, r := range schema.Required {
			if _, ok := schema.Properties[r]; !ok {
				t.Errorf("%s: required %s is not a property", name, r)
			}
		}
		for p, raw := range schema.Properties {
			if !strings.Contains(string(raw), `"description"`) {
				t.Errorf("%s.%s has no description", name, p)
			}
		}
		if len(spec.Description) < 80 {
			t.Errorf("%s: description too thin for a model: %q", name, spec.Description)
		}
	}
	if reg.Get(tools.ToolExecute) != nil {
		t.Error("execute is registered without a sandbox")
	}
}

func TestFileTools_NoWorkdir(t *testing.T) {
	reg := tools.NewRegistry()
	for _, name := range append(tools.FileToolNames, tools.ToolExecute) {
		tool := reg.Get(name)
		if name == tools.ToolExecute {
			tool = tools.Execute(tools.ExecuteConfig{})
		}
		_, err := tool.Call(context.Background(), &tools.Call{Name: name, Args: json.RawMessage(`{"path":"/a","pattern":"x","command":"true"}`), Env: &tools.Env{}})
		if !errors.Is(err, tools.ErrNoWorkdir) {
			t.Errorf("%s without a workdir: %v", name, err)
		}
		_, err = tool.Call(context.Background(), &tools.Call{Name: name, Args: json.RawMessage(`{}`)})
		if !errors.Is(err, tools.ErrNoWorkdir) {
			t.Errorf("%s without an env: %v", name, err)
		}
	}
}

// Every file tool refuses a path that leaves the workdir, and says so.
func TestFileTools_Confinement(t *testing.T) {
	w := files.NewMemory()
	write(t, w, "/inside.txt", "x")
	leaving := []string{"..", "../../etc/passwd", "/abs/../../x", "/uploads/../../../x"}
	invalid := []string{"a\x00b", `..\..\x`, "/" + strings.Repeat("x/", files.MaxPathLen)}
	for _, name := range tools.FileToolNames {
		for _, p := range append(leaving, invalid...) {
			a := args("path", p, "content", "pwned", "old_string", "x", "new_string", "y", "pattern", "x")
			_, err := fileCall(t, w, name, a)
			if !errors.Is(err, files.ErrBadPath) {
				t.Errorf("%s(%q) = %v, want a refusal wrapping ErrBadPath", name, p, err)
			}
		}
		for _, p := range leaving {
			a := args("path", p, "content", "pwned", "old_string", "x", "new_string", "y", "pattern", "x")
			wantRefusal(t, w, name, a, "leaves the workdir")
		}
	}
	wantRefusal(t, w, tools.ToolGlob, args("pattern", "../../*"), "leaves")
	if list, _ := w.List(context.Background(), "/"); len(list) != 1 {
		t.Errorf("refused writes left files: %v", list)
	}
}

func TestLs(t *testing.T) {
	w := files.NewMemory()
	if out := mustCall(t, w, tools.ToolLs, `{}`); out != "The workdir is empty." {
		t.Errorf("empty: %q", out)
	}
	write(t, w, "/uploads/report.csv", strings.Repeat("x", 2048))
	write(t, w, "/notes.md", "n")
	write(t, w, "/deep/a/b.txt", "b")
	if out, want := mustCall(t, w, tools.ToolLs, `{}`), "/deep/\n/notes.md (1 byte)\n/uploads/"; out != want {
		t.Errorf("ls / = %q, want %q", out, want)
	}
	if out, want := mustCall(t, w, tools.ToolLs, `{"path":"/uploads"}`), "/uploads/report.csv (2048 bytes)"; out != want {
		t.Errorf("ls /uploads = %q, want %q", out, want)
	}
	if out := mustCall(t, w, tools.ToolLs, `{"path":"uploads/report.csv"}`); !strings.Contains(out, "is a file") {
		t.Errorf("ls of a file = %q", out)
	}
	wantRefusal(t, w, tools.ToolLs, `{"path":"/nope"}`, "/nope", "does not exist")
	wantRefusal(t, w, tools.ToolLs, `{"path":3}`, "path", "a string")
}

func TestLs_Capped(t *testing.T) {
	w := files.NewMemory()
	for i := range tools.MaxListEntries + 5 {
		write(t, w, fmt.Sprintf("/many/f%04d", i), "x")
	}
	out := mustCall(t, w, tools.ToolLs, `{"path":"/many"}`)
	if n := strings.Count(out, "\n"); n != tools.MaxListEntries {
		t.Errorf("%d lines", n)
	}
	if !strings.HasSuffix(out, "[5 more entries not shown; use glob with a narrower pattern.]") {
		t.Errorf("no cap note: %q", out[len(out)-100:])
	}
}

func TestReadFile(t *testing.T) {
	w := files.NewMemory()
	var lines []string
	for i := 1; i <= 2500; i++ {
		lines = append(lines, "line "+strconv.Itoa(i))
	}
	write(t, w, "/long.txt", strings.Join(lines, "\n")+"\n")
	write(t, w, "/small.txt", "alpha\r\nbeta\n")

	if out, want := mustCall(t, w, tools.ToolReadFile, `{"path":"/small.txt"}`), "     1\talpha\n     2\tbeta"; out != want {
		t.Errorf("read = %q, want %q", out, want)
	}
	// The name other harnesses use works too.
	if out := mustCall(t, w, tools.ToolReadFile, `{"file_path":"small.txt"}`); !strings.HasPrefix(out, "     1\talpha") {
		t.Errorf("file_path: %q", out)
	}
	out := mustCall(t, w, tools.ToolReadFile, `{"path":"/long.txt"}`)
	if n := strings.Count(out, "\n"); n != 2000 {
		t.Errorf("default limit: %d lines", n)
	}
	if !strings.HasSuffix(out, "[Lines 1-2000 of 2500 shown. Continue with offset=2001.]") {
		t.Errorf("no continuation note: %q", out[len(out)-80:])
	}
	out = mustCall(t, w, tools.ToolReadFile, `{"path":"/long.txt","offset":2001,"limit":3}`)
	if want := "  2001\tline 2001\n  2002\tline 2002\n  2003\tline 2003\n[Lines 2001-2003 of 2500 shown. Continue with offset=2004.]"; out != want {
		t.Errorf("offset/limit = %q, want %q", out, want)
	}
	out = mustCall(t, w, tools.ToolReadFile, `{"path":"/long.txt","offset":2499}`)
	if want := "  2499\tline 2499\n  2500\tline 2500"; out != want {
		t.Errorf("tail = %q, want %q", out, want)
	}
	// offset 0, as 0-based harnesses send it, is the start.
	if out := mustCall(t, w, tools.ToolReadFile, `{"path":"/small.txt","offset":0}`); !strings.HasPrefix(out, "     1\t") {
		t.Errorf("offset 0: %q", out)
	}
	wantRefusal(t, w, tools.ToolReadFile, `{"path":"/long.txt","offset":3000}`, "past the end", "2500 lines")
	wantRefusal(t, w, tools.ToolReadFile, `{"path":"/long.txt","limit":0}`, "limit")
	wantRefusal(t, w, tools.ToolReadFile, `{"path":"/long.txt","offset":-1}`, "offset")
	wantRefusal(t, w, tools.ToolReadFile, `{"path":"/long.txt","offset":"ten"}`, "offset", "an integer")
	wantRefusal(t, w, tools.ToolReadFile, `{}`, "needs a path")
	err := wantRefusal(t, w, tools.ToolReadFile, `{"path":"/missing.md"}`, "/missing.md does not exist", "ls or glob")
	if !errors.Is(err, files.ErrNotFound) {
		t.Errorf("missing file error does not wrap ErrNotFound: %v", err)
	}
	write(t, w, "/dir/x", "x")
	wantRefusal(t, w, tools.ToolReadFile, `{"path":"/dir"}`, "/dir is a directory", "ls")
	write(t, w, "/empty.txt", "")
	if out := mustCall(t, w, tools.ToolReadFile, `{"path":"/empty.txt"}`); out != "/empty.txt exists but is empty." {
		t.Errorf("empty = %q", out)
	}
	write(t, w, "/bin", "PK\x03\x04\x00\x00binary")
	wantRefusal(t, w, tools.ToolReadFile, `{"path":"/bin"}`, "binary")
}

// deepagentsjs #82 / #172: read_file caps itself by line and by output, so
// a file with very long lines never produces a result large enough to be
// offloaded again.
func TestReadFile_CapsLongLinesAndOutput_82_172(t *testing.T) {
	w := files.NewMemory()
	write(t, w, "/one-line.json", strings.Repeat("é", 50_000))
	out := mustCall(t, w, tools.ToolReadFile, `{"path":"/one-line.json"}`)
	if !strings.Contains(out, "[... line cut: 48000 more characters;") {
		t.Errorf("no cut marker: %q", out[len(out)-150:])
	}
	if n := len([]rune(out)); n > tools.ReadFileMaxLineChars+200 {
		t.Errorf("one long line gave %d characters", n)
	}
	var lines []string
	for range 300 {
		lines = append(lines, strings.Repeat("x", 1500))
	}
	write(t, w, "/wide.txt", strings.Join(lines, "\n"))
	out = mustCall(t, w, tools.ToolReadFile, `{"path":"/wide.txt"}`)
	if len(out) > tools.MaxOutputBytes+200 {
		t.Errorf("output of %d bytes", len(out))
	}
	shown := strings.Count(out, "\n")
	want := fmt.Sprintf("[Output capped at 100 KB: lines 1-%d of 300 shown. Continue with offset=%d.]", shown, shown+1)
	if !strings.HasSuffix(out, want) {
		t.Errorf("cap note: %q, want %q", out[len(out)-120:], want)
	}
}

func TestWriteFile(t *testing.T) {
	w := files.NewMemory()
	if out := mustCall(t, w, tools.ToolWriteFile, args("path", "/a/b/c.md", "content", "hello")); out != "Created /a/b/c.md (5 bytes)." {
		t.Errorf("create = %q", out)
	}
	if out := mustCall(t, w, tools.ToolWriteFile, args("path", "a/b/c.md", "content", "bye")); out != "Replaced the content of /a/b/c.md (3 bytes)." {
		t.Errorf("replace = %q", out)
	}
	if got, _ := w.Read(context.Background(), "/a/b/c.md"); string(got) != "bye" {
		t.Errorf("content %q", got)
	}
	mustCall(t, w, tools.ToolWriteFile, args("path", "/empty", "content", ""))
	wantRefusal(t, w, tools.ToolWriteFile, args("path", "/x"), "needs content")
	wantRefusal(t, w, tools.ToolWriteFile, args("path", "/a/b", "content", "x"), "/a/b is a directory")
	wantRefusal(t, w, tools.ToolWriteFile, args("path", "/a/b/c.md/d", "content", "x"), "a file is in the way")
}

func TestWriteFile_TooLarge(t *testing.T) {
	w, err := files.NewLocal(t.TempDir(), "default", "h1", files.WithMaxFileBytes(10))
	if err != nil {
		t.Fatal(err)
	}
	err = wantRefusal(t, w, tools.ToolWriteFile, args("path", "/big", "content", "12345678901"), "limit of 10 bytes", "smaller files")
	if !errors.Is(err, files.ErrTooLarge) {
		t.Errorf("not ErrTooLarge: %v", err)
	}
}

func TestEditFile(t *testing.T) {
	w := files.NewMemory()
	write(t, w, "/f.go", "a := 1\nb := 1\nc := 2\n")
	if out := mustCall(t, w, tools.ToolEditFile, args("path", "/f.go", "old_string", "c := 2", "new_string", "c := 3")); out != "Replaced 1 occurrence in /f.go." {
		t.Errorf("edit = %q", out)
	}
	wantRefusal(t, w, tools.ToolEditFile, args("path", "/f.go", "old_string", ":= 1", "new_string", ":= 9"),
		"occurs 2 times", "replace_all", "more surrounding lines")
	if got, _ := w.Read(context.Background(), "/f.go"); string(got) != "a := 1\nb := 1\nc := 3\n" {
		t.Errorf("a refused edit changed the file: %q", got)
	}
	if out := mustCall(t, w, tools.ToolEditFile, args("path", "/f.go", "old_string", ":= 1", "new_string", ":= 9", "replace_all", true)); out != "Replaced 2 occurrences in /f.go." {
		t.Errorf("replace_all = %q", out)
	}
	if got, _ := w.Read(context.Background(), "/f.go"); string(got) != "a := 9\nb := 9\nc := 3\n" {
		t.Errorf("after replace_all: %q", got)
	}
	wantRefusal(t, w, tools.ToolEditFile, args("path", "/f.go", "old_string", "zzz", "new_string", "y"), "not found in /f.go", "read_file")
	wantRefusal(t, w, tools.ToolEditFile, args("path", "/f.go", "old_string", "a", "new_string", "a"), "the same")
	wantRefusal(t, w, tools.ToolEditFile, args("path", "/f.go", "old_string", "", "new_string", "a"), "empty", "write_file")
	wantRefusal(t, w, tools.ToolEditFile, args("path", "/f.go", "old_string", "a"), "needs old_string and new_string")
	wantRefusal(t, w, tools.ToolEditFile, args("path", "/nope.go", "old_string", "a", "new_string", "b"), "/nope.go does not exist")
}

func TestGlob(t *testing.T) {
	w := files.NewMemory()
	for _, p := range []string{"/a.go", "/src/b.go", "/src/pkg/c.go", "/src/pkg/c_test.go", "/docs/x.md", "/docs/y.txt"} {
		write(t, w, p, "x")
	}
	cases := []struct{ args, want string }{
		{args("pattern", "**/*.go"), "/a.go\n/src/b.go\n/src/pkg/c.go\n/src/pkg/c_test.go"},
		{args("pattern", "*.go"), "/a.go"},
		{args("pattern", "*.go", "path", "/src"), "/src/b.go"},
		{args("pattern", "**/*_test.go", "path", "/src"), "/src/pkg/c_test.go"},
		{args("pattern", "docs/*.{md,txt}"), "/docs/x.md\n/docs/y.txt"},
		{args("pattern", "/src/**"), "/src/b.go\n/src/pkg/c.go\n/src/pkg/c_test.go"},
		{args("pattern", "src/**/c?go"), "/src/pkg/c.go"},
	}
	for _, c := range cases {
		if out := mustCall(t, w, tools.ToolGlob, c.args); out != c.want {
			t.Errorf("glob %s = %q, want %q", c.args, out, c.want)
		}
	}
	if out := mustCall(t, w, tools.ToolGlob, args("pattern", "**/*.py")); !strings.HasPrefix(out, "No files match") {
		t.Errorf("no match = %q", out)
	}
	wantRefusal(t, w, tools.ToolGlob, args("pattern", "*", "path", "/nowhere"), "/nowhere does not exist")
	wantRefusal(t, w, tools.ToolGlob, args("pattern", "[a-"), "malformed")
	wantRefusal(t, w, tools.ToolGlob, args("pattern", "{a,b"), "without its }")
	for i := range tools.MaxListEntries + 3 {
		write(t, w, fmt.Sprintf("/many/%04d.log", i), "x")
	}
	out := mustCall(t, w, tools.ToolGlob, args("pattern", "many/*.log"))
	if n := strings.Count(out, "\n"); n != tools.MaxListEntries {
		t.Errorf("%d lines", n)
	}
	if !strings.HasSuffix(out, "[3 more files match; narrow the pattern or the path.]") {
		t.Errorf("no cap note: %q", out[len(out)-80:])
	}
}

func TestGrep(t *testing.T) {
	w := files.NewMemory()
	write(t, w, "/src/a.go", "package a\nfunc Hello() {}\n// hello again\n")
	write(t, w, "/src/b.go", "package b\n")
	write(t, w, "/docs/readme.md", "Say Hello(\n")
	write(t, w, "/bin.dat", "Hello\x00\x01")

	if out, want := mustCall(t, w, tools.ToolGrep, args("pattern", "Hello")), "/docs/readme.md\n/src/a.go"; out != want {
		t.Errorf("files = %q, want %q", out, want)
	}
	if out, want := mustCall(t, w, tools.ToolGrep, args("pattern", "hello", "case_insensitive", true, "output_mode", "content", "path", "/src")),
		"/src/a.go:2:func Hello() {}\n/src/a.go:3:// hello again"; out != want {
		t.Errorf("content = %q, want %q", out, want)
	}
	if out, want := mustCall(t, w, tools.ToolGrep, args("pattern", "(?i)hello", "output_mode", "count")), "/docs/readme.md:1\n/src/a.go:2"; out != want {
		t.Errorf("count = %q, want %q", out, want)
	}
	if out, want := mustCall(t, w, tools.ToolGrep, args("pattern", "Hello", "glob", "*.md")), "/docs/readme.md"; out != want {
		t.Errorf("glob = %q, want %q", out, want)
	}
	if out, want := mustCall(t, w, tools.ToolGrep, args("pattern", "package", "path", "/src/b.go")), "/src/b.go"; out != want {
		t.Errorf("one file = %q, want %q", out, want)
	}
	if out := mustCall(t, w, tools.ToolGrep, args("pattern", "nothing here")); !strings.HasPrefix(out, "No matches") {
		t.Errorf("no match = %q", out)
	}
	wantRefusal(t, w, tools.ToolGrep, args("pattern", "Hello("), "not a valid regular expression", "backslash")
	wantRefusal(t, w, tools.ToolGrep, args("pattern", "x", "output_mode", "lines"), "output_mode")
	wantRefusal(t, w, tools.ToolGrep, args("pattern", "x", "path", "/missing"), "/missing does not exist")
}

func TestGrep_Caps(t *testing.T) {
	w := files.NewMemory()
	for i := range tools.MaxListEntries + 2 {
		write(t, w, fmt.Sprintf("/f/%04d.txt", i), "needle\nneedle\n")
	}
	out := mustCall(t, w, tools.ToolGrep, args("pattern", "needle"))
	if n := strings.Count(out, "\n"); n != tools.MaxListEntries {
		t.Errorf("files: %d lines", n)
	}
	if !strings.HasSuffix(out, fmt.Sprintf("[Output capped: %d files match in all. Narrow the search with path, glob or a more specific pattern.]", tools.MaxListEntries+2)) {
		t.Errorf("files cap note: %q", out[len(out)-120:])
	}
	out = mustCall(t, w, tools.ToolGrep, args("pattern", "needle", "output_mode", "content"))
	if n := strings.Count(out, "\n"); n != tools.MaxGrepLines {
		t.Errorf("content: %d lines", n)
	}
	if !strings.Contains(out, "[Output capped:") {
		t.Error("content: no cap note")
	}
	out = mustCall(t, w, tools.ToolGrep, args("pattern", "needle", "output_mode", "count"))
	if n := strings.Count(out, "\n"); n != tools.MaxGrepLines {
		t.Errorf("count: %d lines", n)
	}
	// A match deep in a very long line shows the text around it.
	write(t, w, "/long.json", strings.Repeat("a", 100_000)+"TARGET"+strings.Repeat("b", 100_000))
	out = mustCall(t, w, tools.ToolGrep, args("pattern", "TARGET", "output_mode", "content", "path", "/long.json"))
	if !strings.Contains(out, "TARGET") || len(out) > 600 || !strings.Contains(out, "[99900 characters]...") {
		t.Errorf("long line excerpt (%d bytes): %q", len(out), out)
	}
}
