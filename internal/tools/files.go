package tools

// The file tools work on the run's workdir (Env.Files), the files a thread
// keeps across runs and shares with its subagents: ls, read_file,
// write_file, edit_file, glob and grep, after LangChain deepagents'
// FilesystemMiddleware. Every result is capped, so no file tool floods the
// transcript; read_file caps itself by lines and characters, which is why
// the large-result offload never touches it (re-reading an offloaded
// result must not offload it again). Every refusal is a sentence the model
// can act on.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/model"
)

// Names of the file tools.
const (
	ToolLs        = "ls"
	ToolReadFile  = "read_file"
	ToolWriteFile = "write_file"
	ToolEditFile  = "edit_file"
	ToolGlob      = "glob"
	ToolGrep      = "grep"
	ToolExecute   = "execute"
)

// FileToolNames lists the file tools every registry holds (execute is not
// one: it exists only where a sandbox is configured).
var FileToolNames = []string{ToolLs, ToolReadFile, ToolWriteFile, ToolEditFile, ToolGlob, ToolGrep}

// Limits of the file tools' output.
const (
	// ReadFileDefaultLimit is how many lines read_file returns by default.
	ReadFileDefaultLimit = 2000
	// ReadFileMaxLineChars cuts longer lines of read_file.
	ReadFileMaxLineChars = 2000
	// MaxOutputBytes caps the whole output of a file tool.
	MaxOutputBytes = 100 << 10
	// MaxListEntries caps ls, glob and the file lists of grep.
	MaxListEntries = 1000
	// MaxGrepLines caps grep's content and count output.
	MaxGrepLines = 500
	// grepLineChars cuts a matching line in grep's content output.
	grepLineChars = 300
)

// FileTools returns the file tools.
func FileTools() []Tool {
	return []Tool{
		fileTool{spec: lsSpec, run: runLs},
		fileTool{spec: readFileSpec, run: runReadFile},
		fileTool{spec: writeFileSpec, run: runWriteFile},
		fileTool{spec: editFileSpec, run: runEditFile},
		fileTool{spec: globSpec, run: runGlob},
		fileTool{spec: grepSpec, run: runGrep},
	}
}

// fileTool is a tool over the run's workdir.
type fileTool struct {
	spec model.ToolSpec
	run  func(ctx context.Context, w files.Workdir, args json.RawMessage) (string, error)
}

func (t fileTool) Spec() model.ToolSpec { return t.spec }

func (t fileTool) Call(ctx context.Context, call *Call) (*Result, error) {
	if call.Env == nil || call.Env.Files == nil {
		return nil, ErrNoWorkdir
	}
	out, err := t.run(ctx, call.Env.Files, call.Args)
	if err != nil {
		return nil, err
	}
	return Text(out), nil
}

// ToolError is a refusal of a file tool: a sentence for the model, and
// the files error behind it for errors.Is.
type ToolError struct {
	Msg   string
	Cause error
}

func (e *ToolError) Error() string { return e.Msg }
func (e *ToolError) Unwrap() error { return e.Cause }

func refuse(cause error, format string, args ...any) error {
	return &ToolError{Msg: fmt.Sprintf(format, args...), Cause: cause}
}

// fileError explains a workdir error about p.
func fileError(p string, err error) error {
	switch {
	case errors.Is(err, files.ErrBadPath):
		return refuse(err, "%v. Paths name files inside the workdir, which starts at /; use a path such as /notes/todo.md.", err)
	case errors.Is(err, files.ErrNotFound):
		return refuse(err, "%s does not exist. Use ls or glob to find the file you mean.", p)
	case errors.Is(err, files.ErrIsDir):
		return refuse(err, "%s is a directory, not a file. Use ls with path %s to see what it holds.", p, p)
	case errors.Is(err, files.ErrNotDir):
		return refuse(err, "%v: a file is in the way, so %s cannot be created below it. Choose another path.", err, p)
	case errors.Is(err, files.ErrTooLarge):
		return refuse(err, "%v. Split the content into smaller files.", err)
	case errors.Is(err, files.ErrQuota):
		return refuse(err, "%v. Nothing was written; remove files the task no longer needs, or write less.", err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	}
	return refuse(err, "the workdir could not be used for %s: %v. Try again later.", p, err)
}

// decodeArgs decodes a tool's JSON arguments; a type mismatch is explained
// with the schema's words.
func decodeArgs(tool string, args json.RawMessage, v any) error {
	if len(bytes.TrimSpace(args)) == 0 {
		return nil
	}
	if err := json.Unmarshal(args, v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return refuse(err, "the argument %s of %s must be %s, not %s.", te.Field, tool, kindName(te.Type), te.Value)
		}
		return refuse(err, "the arguments of %s must be a JSON object matching its schema: %v.", tool, err)
	}
	return nil
}

func kindName(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int64, reflect.Int32:
		return "an integer"
	}
	return "a " + t.Kind().String()
}

// filePathAlias accepts file_path for path, the name other harnesses
// use; the schema does not show it.
type filePathAlias struct {
	FilePath string `json:"file_path,omitempty" schema:"-"`
}

// pathOr is the path argument: path, else file_path, else def.
func (a filePathAlias) pathOr(path, def string) string {
	switch {
	case path != "":
		return path
	case a.FilePath != "":
		return a.FilePath
	}
	return def
}

// cleanArg cleans a path argument, explaining a refusal.
func cleanArg(tool, p string) (string, error) {
	if p == "" {
		return "", refuse(files.ErrBadPath, "%s needs a path, such as /notes/todo.md.", tool)
	}
	c, err := files.Clean(p)
	if err != nil {
		return "", fileError(p, err)
	}
	return c, nil
}

// --- ls ---

var lsSpec = model.ToolSpec{
	Name: ToolLs,
	Description: "List the files and directories directly inside a directory of the workdir (the files this conversation keeps; " +
		"attachments are in /uploads). Directories end with '/'; files show their size. Use glob to find files by name " +
		"anywhere below a directory.",
	Parameters: SchemaJSON[lsArgs](),
}

type lsArgs struct {
	Path string `json:"path,omitempty" jsonschema:"Absolute directory path in the workdir, e.g. / or /uploads. Defaults to /."`
	filePathAlias
}

func runLs(ctx context.Context, w files.Workdir, args json.RawMessage) (string, error) {
	var in lsArgs
	if err := decodeArgs(ToolLs, args, &in); err != nil {
		return "", err
	}
	p, err := cleanArg(ToolLs, in.pathOr(in.Path, "/"))
	if err != nil {
		return "", err
	}
	list, err := w.List(ctx, p)
	if errors.Is(err, files.ErrNotDir) {
		info, err := w.Stat(ctx, p)
		if err != nil {
			return "", fileError(p, err)
		}
		return fmt.Sprintf("%s is a file (%s). Read it with read_file.", p, size(info.Size)), nil
	}
	if errors.Is(err, files.ErrNotFound) {
		return "", refuse(err, "the directory %s does not exist. Use ls with path / to see the top of the workdir.", p)
	}
	if err != nil {
		return "", fileError(p, err)
	}
	if len(list) == 0 {
		if p == "/" {
			return "The workdir is empty.", nil
		}
		return fmt.Sprintf("%s is empty.", p), nil
	}
	var b strings.Builder
	for i, info := range list {
		if i == MaxListEntries || b.Len() > MaxOutputBytes {
			fmt.Fprintf(&b, "[%d more entries not shown; use glob with a narrower pattern.]\n", len(list)-i)
			break
		}
		if info.IsDir {
			fmt.Fprintf(&b, "%s/\n", info.Path)
		} else {
			fmt.Fprintf(&b, "%s (%s)\n", info.Path, size(info.Size))
		}
	}
	return strings.TrimSuffix(b.String(), "\n"), nil
}

func size(n int64) string {
	switch {
	case n == 1:
		return "1 byte"
	case n < 10<<10:
		return fmt.Sprintf("%d bytes", n)
	case n < 10<<20:
		return fmt.Sprintf("%.1f KB", float64(n)/1024)
	}
	return fmt.Sprintf("%.1f MB", float64(n)/(1<<20))
}

// --- read_file ---

var readFileSpec = model.ToolSpec{
	Name: ToolReadFile,
	Description: fmt.Sprintf("Read a text file of the workdir. Lines come numbered like `cat -n` (line number, tab, text). "+
		"By default up to %d lines from the start; for long files read a part at a time with offset (first line, from 1) "+
		"and limit (number of lines). Lines over %d characters are cut, and the output stops at %d KB with a note saying "+
		"which offset to continue from. Attached files are in /uploads; large tool results saved to "+
		"/large_tool_results are read with this tool too.", ReadFileDefaultLimit, ReadFileMaxLineChars, MaxOutputBytes>>10),
	Parameters: SchemaJSON[readFileArgs](),
}

type readFileArgs struct {
	Path string `json:"path" jsonschema:"Absolute path of the file, e.g. /uploads/report.txt"`
	filePathAlias
	Offset *int `json:"offset,omitempty" schema:"minimum=1" jsonschema:"First line to read, counting from 1. Defaults to 1."`
	Limit  *int `json:"limit,omitempty" schema:"minimum=1" jsonschema:"How many lines to read. Defaults to 2000."`
}

func runReadFile(ctx context.Context, w files.Workdir, args json.RawMessage) (string, error) {
	var in readFileArgs
	if err := decodeArgs(ToolReadFile, args, &in); err != nil {
		return "", err
	}
	p, err := cleanArg(ToolReadFile, in.pathOr(in.Path, ""))
	if err != nil {
		return "", err
	}
	offset, limit := 1, ReadFileDefaultLimit
	if in.Offset != nil {
		if *in.Offset < 0 {
			return "", refuse(nil, "offset must be 1 or more (the first line to read), not %d.", *in.Offset)
		}
		offset = max(*in.Offset, 1) // 0, as other harnesses count, means the start
	}
	if in.Limit != nil {
		if *in.Limit < 1 {
			return "", refuse(nil, "limit must be 1 or more (the number of lines to read), not %d.", *in.Limit)
		}
		limit = *in.Limit
	}
	data, err := w.Read(ctx, p)
	if err != nil {
		return "", fileError(p, err)
	}
	if len(data) == 0 {
		return fmt.Sprintf("%s exists but is empty.", p), nil
	}
	if isBinary(data) {
		return "", refuse(nil, "%s is a binary file (%s); read_file shows text files only.", p, size(int64(len(data))))
	}
	lines := splitLines(string(data))
	total := len(lines)
	if offset > total {
		return "", refuse(nil, "offset %d is past the end of %s, which has %d lines.", offset, p, total)
	}
	var b strings.Builder
	last := offset - 1
	capped := false
	for i := offset - 1; i < total && i < offset-1+limit; i++ {
		line := numbered(i+1, cutLine(lines[i], ReadFileMaxLineChars))
		if b.Len()+len(line) > MaxOutputBytes && i > offset-1 {
			capped = true
			break
		}
		b.WriteString(line)
		last = i + 1
	}
	out := strings.TrimSuffix(b.String(), "\n")
	switch {
	case capped:
		out += fmt.Sprintf("\n[Output capped at %d KB: lines %d-%d of %d shown. Continue with offset=%d.]", MaxOutputBytes>>10, offset, last, total, last+1)
	case last < total:
		out += fmt.Sprintf("\n[Lines %d-%d of %d shown. Continue with offset=%d.]", offset, last, total, last+1)
	}
	return out, nil
}

// numbered formats one line like cat -n.
func numbered(n int, line string) string { return fmt.Sprintf("%6d\t%s\n", n, line) }

// splitLines splits text into lines without their line endings; a final
// newline does not start another line.
func splitLines(s string) []string {
	s = strings.TrimSuffix(s, "\n")
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimSuffix(l, "\r")
	}
	return lines
}

// cutLine cuts a line to n characters with a marker saying how much is
// left out.
func cutLine(line string, n int) string {
	if len(line) <= n || utf8.RuneCountInString(line) <= n {
		return line
	}
	cut := runePrefix(line, n)
	rest := utf8.RuneCountInString(line) - n
	return cut + fmt.Sprintf(" [... line cut: %d more characters; grep with output_mode content shows the text around a match]", rest)
}

// runePrefix returns the first n characters of s.
func runePrefix(s string, n int) string {
	i := 0
	for j := range s {
		if i == n {
			return s[:j]
		}
		i++
	}
	return s
}

func isBinary(data []byte) bool {
	head := data[:min(len(data), 8000)]
	return bytes.IndexByte(head, 0) >= 0 || !utf8.Valid(data)
}

// --- write_file ---

var writeFileSpec = model.ToolSpec{
	Name: ToolWriteFile,
	Description: "Create a file in the workdir, or replace its whole content. Directories are created as needed. " +
		"To change part of an existing file, use edit_file instead.",
	Parameters: SchemaJSON[writeFileArgs](),
}

type writeFileArgs struct {
	Path string `json:"path" jsonschema:"Absolute path of the file, e.g. /notes/plan.md"`
	filePathAlias
	Content *string `json:"content" jsonschema:"The complete new content of the file"`
}

func runWriteFile(ctx context.Context, w files.Workdir, args json.RawMessage) (string, error) {
	var in writeFileArgs
	if err := decodeArgs(ToolWriteFile, args, &in); err != nil {
		return "", err
	}
	p, err := cleanArg(ToolWriteFile, in.pathOr(in.Path, ""))
	if err != nil {
		return "", err
	}
	if in.Content == nil {
		return "", refuse(nil, "write_file needs content (use \"\" for an empty file).")
	}
	existed := false
	if info, err := w.Stat(ctx, p); err == nil {
		if info.IsDir {
			return "", fileError(p, fmt.Errorf("%s: %w", p, files.ErrIsDir))
		}
		existed = true
	}
	if err := w.Write(ctx, p, []byte(*in.Content)); err != nil {
		return "", fileError(p, err)
	}
	if existed {
		return fmt.Sprintf("Replaced the content of %s (%s).", p, size(int64(len(*in.Content)))), nil
	}
	return fmt.Sprintf("Created %s (%s).", p, size(int64(len(*in.Content)))), nil
}

// --- edit_file ---

var editFileSpec = model.ToolSpec{
	Name: ToolEditFile,
	Description: "Replace text in a file of the workdir: old_string is replaced by new_string. old_string must match the " +
		"file exactly, including whitespace and indentation, and occur exactly once, unless replace_all is true, " +
		"which replaces every occurrence. Read the file first so you copy the text exactly; include enough " +
		"surrounding lines to make old_string unique.",
	Parameters: SchemaJSON[editFileArgs](),
}

type editFileArgs struct {
	Path string `json:"path" jsonschema:"Absolute path of the file to edit"`
	filePathAlias
	Old        *string `json:"old_string" jsonschema:"The exact text to replace"`
	New        *string `json:"new_string" jsonschema:"The text to put in its place (must differ from old_string)"`
	ReplaceAll bool    `json:"replace_all,omitempty" jsonschema:"Replace every occurrence instead of exactly one. Defaults to false."`
}

func runEditFile(ctx context.Context, w files.Workdir, args json.RawMessage) (string, error) {
	var in editFileArgs
	if err := decodeArgs(ToolEditFile, args, &in); err != nil {
		return "", err
	}
	p, err := cleanArg(ToolEditFile, in.pathOr(in.Path, ""))
	if err != nil {
		return "", err
	}
	if in.Old == nil || in.New == nil {
		return "", refuse(nil, "edit_file needs old_string and new_string.")
	}
	old, repl := *in.Old, *in.New
	if old == "" {
		return "", refuse(nil, "old_string is empty; to create a file or replace all of it use write_file.")
	}
	if old == repl {
		return "", refuse(nil, "old_string and new_string are the same, so the edit would change nothing.")
	}
	data, err := w.Read(ctx, p)
	if err != nil {
		return "", fileError(p, err)
	}
	content := string(data)
	n := strings.Count(content, old)
	switch {
	case n == 0:
		return "", refuse(nil, "old_string was not found in %s. Read the file with read_file and copy the text exactly, including whitespace and indentation (without the line numbers).", p)
	case n > 1 && !in.ReplaceAll:
		return "", refuse(nil, "old_string occurs %d times in %s. Include more surrounding lines to make it unique, or set replace_all to true to replace all %d.", n, p, n)
	}
	if in.ReplaceAll {
		content = strings.ReplaceAll(content, old, repl)
	} else {
		content = strings.Replace(content, old, repl, 1)
	}
	if err := w.Write(ctx, p, []byte(content)); err != nil {
		return "", fileError(p, err)
	}
	if n == 1 {
		return fmt.Sprintf("Replaced 1 occurrence in %s.", p), nil
	}
	return fmt.Sprintf("Replaced %d occurrences in %s.", n, p), nil
}

// --- glob ---

var globSpec = model.ToolSpec{
	Name: ToolGlob,
	Description: "Find files of the workdir by name pattern. '*' matches within one path segment, '**' matches any " +
		"number of directories, '?' one character, '{a,b}' either alternative: '**/*.md' finds Markdown files " +
		"anywhere, '*.txt' only directly in the search directory. The pattern is relative to path (default /). " +
		fmt.Sprintf("Returns matching file paths, sorted, at most %d.", MaxListEntries),
	Parameters: SchemaJSON[globArgs](),
}

type globArgs struct {
	Pattern string `json:"pattern" jsonschema:"Glob pattern, e.g. **/*.go or reports/*.{csv,json}"`
	Path    string `json:"path,omitempty" jsonschema:"Directory to search from. Defaults to /."`
	filePathAlias
}

func runGlob(ctx context.Context, w files.Workdir, args json.RawMessage) (string, error) {
	var in globArgs
	if err := decodeArgs(ToolGlob, args, &in); err != nil {
		return "", err
	}
	base, err := cleanArg(ToolGlob, in.pathOr(in.Path, "/"))
	if err != nil {
		return "", err
	}
	pattern := in.Pattern
	if strings.HasPrefix(pattern, "/") {
		// An absolute pattern is taken from the root.
		base, pattern = "/", strings.TrimLeft(pattern, "/")
	}
	if slices.Contains(strings.Split(pattern, "/"), "..") {
		return "", refuse(files.ErrBadPath, "the pattern %q leaves the search directory; use path to choose where to search.", in.Pattern)
	}
	g, err := compileGlob(pattern)
	if err != nil {
		return "", refuse(nil, "%v.", err)
	}
	var matches []string
	more := 0
	err = w.Walk(ctx, base, func(info files.Info) error {
		if !g.match(relTo(base, info.Path)) {
			return nil
		}
		if len(matches) < MaxListEntries {
			matches = append(matches, info.Path)
		} else {
			more++
		}
		return nil
	})
	if err != nil {
		return "", fileError(base, err)
	}
	if len(matches) == 0 {
		if _, err := w.Stat(ctx, base); err != nil {
			return "", fileError(base, err)
		}
		return fmt.Sprintf("No files match %q under %s.", in.Pattern, base), nil
	}
	out := strings.Join(matches, "\n")
	if more > 0 {
		out += fmt.Sprintf("\n[%d more files match; narrow the pattern or the path.]", more)
	}
	return out, nil
}

// relTo returns p relative to dir, without a leading slash.
func relTo(dir, p string) string {
	if dir == "/" {
		return strings.TrimPrefix(p, "/")
	}
	return strings.TrimPrefix(strings.TrimPrefix(p, dir), "/")
}

// --- grep ---

var grepSpec = model.ToolSpec{
	Name: ToolGrep,
	Description: "Search the text files of the workdir for a regular expression (Go RE2 syntax: escape ( ) [ ] . * + ? " +
		"with a backslash to match them literally; (?i) at the start ignores case). output_mode files_with_matches " +
		"(default) lists the files that match, content shows each matching line as path:line_number:text, count shows " +
		"path:number_of_matching_lines. Narrow the search with path (a directory or one file) and glob (a file name " +
		fmt.Sprintf("pattern such as *.md). At most %d files or %d lines are returned.", MaxListEntries, MaxGrepLines),
	Parameters: SchemaJSON[grepArgs](),
}

type grepArgs struct {
	Pattern string `json:"pattern" jsonschema:"Regular expression to search for"`
	Path    string `json:"path,omitempty" jsonschema:"Directory or file to search. Defaults to /."`
	filePathAlias
	Glob            string `json:"glob,omitempty" jsonschema:"Only search files whose name matches this pattern, e.g. *.py or **/tests/*.go"`
	OutputMode      string `json:"output_mode,omitempty" schema:"enum=files_with_matches|content|count" jsonschema:"What to return. Defaults to files_with_matches."`
	CaseInsensitive bool   `json:"case_insensitive,omitempty" jsonschema:"Ignore case. Defaults to false."`
}

// Grep output modes.
const (
	grepFiles   = "files_with_matches"
	grepContent = "content"
	grepCount   = "count"
)

func runGrep(ctx context.Context, w files.Workdir, args json.RawMessage) (string, error) {
	var in grepArgs
	if err := decodeArgs(ToolGrep, args, &in); err != nil {
		return "", err
	}
	base, err := cleanArg(ToolGrep, in.pathOr(in.Path, "/"))
	if err != nil {
		return "", err
	}
	mode := in.OutputMode
	switch mode {
	case "":
		mode = grepFiles
	case grepFiles, grepContent, grepCount:
	default:
		return "", refuse(nil, "output_mode %q is not one of files_with_matches, content, count.", in.OutputMode)
	}
	if in.Pattern == "" {
		return "", refuse(nil, "grep needs a pattern.")
	}
	expr := in.Pattern
	if in.CaseInsensitive {
		expr = "(?i)" + expr
	}
	re, err := regexp.Compile(expr)
	if err != nil {
		return "", refuse(err, "the pattern is not a valid regular expression (Go RE2 syntax): %v. Escape characters such as ( [ . * with a backslash to match them literally.", err)
	}
	var filter *globPattern
	if in.Glob != "" {
		if filter, err = compileGlob(strings.TrimPrefix(in.Glob, "/")); err != nil {
			return "", refuse(nil, "glob: %v.", err)
		}
	}
	info, err := w.Stat(ctx, base)
	if err != nil {
		return "", fileError(base, err)
	}
	var candidates []files.Info
	if info.IsDir {
		err = w.Walk(ctx, base, func(i files.Info) error {
			if filter == nil || matchFilter(filter, in.Glob, relTo(base, i.Path)) {
				candidates = append(candidates, i)
			}
			return nil
		})
		if err != nil {
			return "", fileError(base, err)
		}
	} else {
		candidates = []files.Info{info}
	}

	var b strings.Builder
	found, lines, skipped := 0, 0, 0
	full := false
	for _, c := range candidates {
		if err := ctx.Err(); err != nil {
			return "", err
		}
		data, err := w.Read(ctx, c.Path)
		if err != nil {
			// Removed meanwhile, or unreadable: a search goes on.
			continue
		}
		if isBinary(data) {
			skipped++
			continue
		}
		if !re.Match(data) {
			continue
		}
		if full {
			found++
			continue
		}
		switch mode {
		case grepFiles:
			fmt.Fprintf(&b, "%s\n", c.Path)
			full = found+1 >= MaxListEntries
		case grepCount:
			n := 0
			for _, l := range splitLines(string(data)) {
				if re.MatchString(l) {
					n++
				}
			}
			fmt.Fprintf(&b, "%s:%d\n", c.Path, n)
			full = found+1 >= MaxGrepLines
		case grepContent:
			for i, l := range splitLines(string(data)) {
				loc := re.FindStringIndex(l)
				if loc == nil {
					continue
				}
				if lines == MaxGrepLines || b.Len() > MaxOutputBytes {
					full = true
					break
				}
				fmt.Fprintf(&b, "%s:%d:%s\n", c.Path, i+1, excerpt(l, loc, grepLineChars))
				lines++
			}
		}
		found++
	}
	if found == 0 {
		msg := fmt.Sprintf("No matches for %q in %s", in.Pattern, base)
		if in.Glob != "" {
			msg += fmt.Sprintf(" (files matching %q)", in.Glob)
		}
		if skipped > 0 {
			msg += fmt.Sprintf("; %d binary files were skipped", skipped)
		}
		return msg + ".", nil
	}
	out := strings.TrimSuffix(b.String(), "\n")
	if full {
		out += fmt.Sprintf("\n[Output capped: %d files match in all. Narrow the search with path, glob or a more specific pattern.]", found)
	}
	return out, nil
}

// matchFilter applies grep's glob: a pattern without '/' matches file
// names, one with '/' the path relative to the search directory.
func matchFilter(g *globPattern, raw, rel string) bool {
	if !strings.Contains(raw, "/") {
		return g.match(rel[strings.LastIndexByte(rel, '/')+1:])
	}
	return g.match(rel)
}

// excerpt cuts a matching line to about n characters around the match.
func excerpt(line string, loc []int, n int) string {
	if utf8.RuneCountInString(line) <= n {
		return line
	}
	start := max(loc[0]-n/3, 0)
	for start > 0 && !utf8.RuneStart(line[start]) {
		start--
	}
	end := min(start+n, len(line))
	for end < len(line) && !utf8.RuneStart(line[end]) {
		end++
	}
	out := line[start:end]
	if start > 0 {
		out = fmt.Sprintf("[%d characters]...", utf8.RuneCountInString(line[:start])) + out
	}
	if end < len(line) {
		out += fmt.Sprintf("...[%d characters]", utf8.RuneCountInString(line[end:]))
	}
	return out
}
