package middleware

// Large tool-result offload. Boundary: tool call (the result message) and
// files. Reads and writes no state; writes the workdir; emits
// tool_result.offloaded (custom) and, without a workdir,
// tool_result.truncated. After deepagents' FilesystemMiddleware eviction: a
// tool result over max_chars characters is saved to the run's workdir
// under /large_tool_results/<hash>.txt, and the transcript gets a head and
// tail preview and the path, with a sentence telling the model to read the
// rest with read_file a part at a time. The file name hashes the tool call
// id with the content, so a long provider id never makes a path too long
// (deepagents #5559) and a redelivered call writes the same file again.
// read_file is never offloaded: it caps its own output, and offloading it
// would make re-reading an offloaded result loop (deepagentsjs #82/#172).
// Without a workdir, or when the write fails, the result is cut to
// max_chars with a note instead, so the transcript never floods.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"unicode/utf8"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/tools"
)

// Events of the large-result offload (custom kind).
const (
	EventToolResultOffloaded = "tool_result.offloaded"
	EventToolResultTruncated = "tool_result.truncated"
)

// LargeResultsDir is the workdir directory of offloaded tool results.
const LargeResultsDir = "/large_tool_results"

// MetaOffloadedTo marks a tool message whose full content was saved to a
// workdir file; its value is the path.
const MetaOffloadedTo = "offloaded_to"

// Offload preview shape: the first and last lines of the result.
const (
	offloadHeadLines = 20
	offloadTailLines = 10
)

// DefaultOffloadMaxChars is the size over which a tool result is
// offloaded.
const DefaultOffloadMaxChars = 20000

// LargeResultOffload moves large tool results out of the transcript.
type LargeResultOffload struct {
	// MaxChars is the size in characters over which a result is offloaded
	// (default 20,000).
	MaxChars int `json:"max_chars"`
	// lineChars cuts each preview line.
	lineChars int
}

// OffloadedData is the data of tool_result.offloaded.
type OffloadedData struct {
	ToolCallID string `json:"tool_call_id"`
	Path       string `json:"path"`
	Chars      int    `json:"chars"`
}

// TruncatedData is the data of tool_result.truncated.
type TruncatedData struct {
	ToolCallID string `json:"tool_call_id"`
	Chars      int    `json:"chars"`
	Kept       int    `json:"kept"`
}

// NewLargeResultOffload fills defaults and checks the threshold.
func NewLargeResultOffload(o LargeResultOffload) (*LargeResultOffload, error) {
	if o.MaxChars == 0 {
		o.MaxChars = DefaultOffloadMaxChars
	}
	if o.MaxChars < 2000 {
		return nil, fmt.Errorf("max_chars must be at least 2000, not %d (the preview and the note need room)", o.MaxChars)
	}
	// Thirty preview lines take at most about a third of the threshold.
	o.lineChars = min(max(o.MaxChars/80, 40), 300)
	return &o, nil
}

// Name implements Middleware.
func (*LargeResultOffload) Name() string { return "large_result_offload" }

// WrapToolCall implements WrapToolCall.
func (o *LargeResultOffload) WrapToolCall(ctx context.Context, rt *Runtime, call *ToolCall, next ToolHandler) (*ToolResult, error) {
	res, err := next(ctx, call)
	if err != nil || res == nil || call.Call.Name == tools.ToolReadFile {
		return res, err
	}
	content := res.Message.Content
	// Bytes bound characters from above: most results skip the count.
	if len(content) <= o.MaxChars {
		return res, nil
	}
	chars := utf8.RuneCountInString(content)
	if chars <= o.MaxChars {
		return res, nil
	}
	w := rt.Files
	if w == nil && call.Env != nil {
		w = call.Env.Files
	}
	out := *res
	out.Message = res.Message.Clone()
	if w != nil {
		p := OffloadPath(call.Call.ID, content)
		werr := w.Write(ctx, p, []byte(content))
		if werr == nil {
			out.Message.Content = o.notice(p, content, chars)
			if out.Message.Meta == nil {
				out.Message.Meta = map[string]any{}
			}
			out.Message.Meta[MetaOffloadedTo] = p
			emitIfSet(rt, EventToolResultOffloaded, OffloadedData{ToolCallID: call.Call.ID, Path: p, Chars: chars})
			return &out, nil
		}
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		if rt.Logger != nil {
			rt.Logger.Warn("large tool result could not be offloaded; truncating it",
				zap.String("tool", call.Call.Name), zap.String("path", p), zap.Error(werr))
		}
	}
	out.Message.Content = o.truncate(content, chars)
	emitIfSet(rt, EventToolResultTruncated, TruncatedData{ToolCallID: call.Call.ID, Chars: chars, Kept: o.MaxChars})
	return &out, nil
}

// OffloadPath is the workdir path a tool result is offloaded to: a hash of
// the tool call id and the content, never the raw id (deepagents #5559).
func OffloadPath(toolCallID, content string) string {
	h := sha256.New()
	h.Write([]byte(toolCallID))
	h.Write([]byte(content))
	return LargeResultsDir + "/" + hex.EncodeToString(h.Sum(nil))[:32] + ".txt"
}

// notice is what replaces an offloaded result in the transcript.
func (o *LargeResultOffload) notice(p, content string, chars int) string {
	lines := strings.Split(strings.TrimSuffix(content, "\n"), "\n")
	var b strings.Builder
	fmt.Fprintf(&b, "This tool result was too large for the conversation (%d characters, %d lines), so it was saved to the file %s.\n", chars, len(lines), p)
	fmt.Fprintf(&b, "Read it with read_file, a part at a time: pass offset (the first line, from 1) and limit (how many lines), for example offset=1 and limit=200; grep with path %s finds text in it.\n", p)
	if len(lines) <= offloadHeadLines+offloadTailLines {
		b.WriteString("Preview (each line cut), numbered like read_file:\n")
		for i, l := range lines {
			b.WriteString(previewLine(i+1, l, o.lineChars))
		}
	} else {
		fmt.Fprintf(&b, "Preview of the first %d and last %d lines (each line cut), numbered like read_file:\n", offloadHeadLines, offloadTailLines)
		for i := range offloadHeadLines {
			b.WriteString(previewLine(i+1, lines[i], o.lineChars))
		}
		fmt.Fprintf(&b, "... [%d lines omitted] ...\n", len(lines)-offloadHeadLines-offloadTailLines)
		for i := len(lines) - offloadTailLines; i < len(lines); i++ {
			b.WriteString(previewLine(i+1, lines[i], o.lineChars))
		}
	}
	return strings.TrimSuffix(b.String(), "\n")
}

func previewLine(n int, line string, width int) string {
	line = strings.TrimSuffix(line, "\r")
	if utf8.RuneCountInString(line) > width {
		line = prefixRunes(line, width) + " [...]"
	}
	return fmt.Sprintf("%6d\t%s\n", n, line)
}

// truncate cuts a result to about MaxChars characters, keeping its start
// and its end.
func (o *LargeResultOffload) truncate(content string, chars int) string {
	keep := o.MaxChars - 300
	head := prefixRunes(content, keep*3/4)
	tail := suffixRunes(content, keep/4)
	omitted := chars - utf8.RuneCountInString(head) - utf8.RuneCountInString(tail)
	return fmt.Sprintf("%s\n\n[... %d characters omitted: this tool result had %d characters, more than the conversation can hold, and this run has no workdir to save it to. Ask for less at a time ...]\n\n%s", head, omitted, chars, tail)
}

func prefixRunes(s string, n int) string {
	i := 0
	for j := range s {
		if i == n {
			return s[:j]
		}
		i++
	}
	return s
}

func suffixRunes(s string, n int) string {
	j := len(s)
	for i := 0; i < n && j > 0; i++ {
		_, size := utf8.DecodeLastRuneInString(s[:j])
		j -= size
	}
	return s[j:]
}

func emitIfSet(rt *Runtime, eventType string, data any) {
	if rt.Emit != nil {
		rt.Emit(eventType, data)
	}
}
