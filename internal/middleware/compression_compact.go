package middleware

// Deterministic compaction of one message for context compression: tool
// results over the token limit become a preview naming the workdir file
// that holds them in full (a structured preview for JSON search results),
// and long write_file/edit_file arguments are cut inside valid JSON. The
// same message always compacts to the same text and path, so any worker
// projects a thread the same way.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"unicode/utf8"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/tokens"
	"github.com/natsagent/natsagent/internal/tools"
)

type compKey struct {
	id   string
	size int
}

// compEntry is a message's compaction, remembered for the run.
type compEntry struct {
	content string
	calls   []model.ToolCall
	// outContent and outCalls replace the message's when changed.
	outContent string
	outCalls   []model.ToolCall
	changed    bool
}

func compKeyOf(m *model.Message) compKey {
	size := len(m.Content)
	for i := range m.ToolCalls {
		size += len(m.ToolCalls[i].Arguments) + 1
	}
	return compKey{id: m.ID, size: size}
}

func sameCalls(a, b []model.ToolCall) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// compactMessage returns m as the compacted view shows it, whether that
// differs from m, and whether it was compacted for the first time in this
// run.
func (c *ContextCompression) compactMessage(ctx context.Context, rt *Runtime, run *ccRun, rc *runCounter, m *model.Message) (model.Message, bool, bool) {
	switch {
	case m.Role == model.RoleTool:
		// A token is at least a byte: short results need no count.
		if len(m.Content) <= c.ToolResultTokenLimit {
			return *m, false, false
		}
	case m.Role == model.RoleAssistant && len(m.ToolCalls) > 0:
		if !hasLongFileArgs(m.ToolCalls, c.ToolArgMaxChars) {
			return *m, false, false
		}
	default:
		return *m, false, false
	}
	k := compKeyOf(m)
	e := run.byID[k]
	fresh := false
	if m.ID == "" || e == nil || e.content != m.Content || !sameCalls(e.calls, m.ToolCalls) {
		e = c.compute(ctx, rt, run, rc, m)
		fresh = e.changed
		if m.ID != "" {
			if run.byID == nil {
				run.byID = make(map[compKey]*compEntry)
			}
			run.byID[k] = e
		}
	}
	if !e.changed {
		return *m, false, false
	}
	out := *m
	out.Content, out.ToolCalls = e.outContent, e.outCalls
	return out, true, fresh
}

func (c *ContextCompression) compute(ctx context.Context, rt *Runtime, run *ccRun, rc *runCounter, m *model.Message) *compEntry {
	e := &compEntry{content: m.Content, calls: m.ToolCalls, outContent: m.Content, outCalls: m.ToolCalls}
	if m.Role == model.RoleAssistant {
		calls := make([]model.ToolCall, len(m.ToolCalls))
		for i, tc := range m.ToolCalls {
			calls[i] = tc
			if args, ok := truncateFileArgs(tc, c.ToolArgMaxChars); ok {
				calls[i].Arguments = args
				e.changed = true
			}
		}
		if e.changed {
			e.outCalls = calls
		}
		return e
	}
	n := contentTokens(rc, m)
	if n <= c.ToolResultTokenLimit {
		return e
	}
	path, why := "", ""
	if p, _ := m.Meta[MetaOffloadedTo].(string); p != "" {
		// large_result_offload saved the whole result already; this
		// content is its notice.
		path = p
	} else {
		p := ToolResultPath(m.Content)
		if err := c.save(ctx, rt, run, p, m.Content); err != nil {
			why = err.Error()
			if rt.Logger != nil && !errors.Is(err, errNoWorkdir) {
				rt.Logger.Warn("compacted tool result could not be saved; keeping a preview only", zap.String("path", p), zap.Error(err))
			}
		} else {
			path = p
		}
	}
	e.outContent = c.toolPreview(m, n, path, why)
	e.changed = true
	return e
}

// contentTokens is the size of a message's content in tokens, from the
// run's count of the whole message (cached) less its framing.
func contentTokens(rc *runCounter, m *model.Message) int {
	counter := rc.cache.Counter()
	n := rc.cache.Message(m) - tokens.PerMessage - tokens.PerRole
	if m.Name != "" {
		n -= tokens.PerName + counter.Count(m.Name)
	}
	if m.ToolCallID != "" {
		n -= counter.Count(m.ToolCallID)
	}
	return max(n, 0)
}

// ToolResultPath is the workdir file a compacted tool result is saved to:
// named by a hash of its content, so the same content is written once
// and any worker finds the same path.
func ToolResultPath(content string) string {
	sum := sha256.Sum256([]byte(content))
	return ToolResultsDir + "/" + hex.EncodeToString(sum[:16]) + ".txt"
}

var errNoWorkdir = errors.New("this run has no workdir")

// save writes content to path unless the workdir holds it already (the
// directory is listed once per run).
func (c *ContextCompression) save(ctx context.Context, rt *Runtime, run *ccRun, path, content string) error {
	w := rt.Files
	if w == nil {
		return errNoWorkdir
	}
	if run.known[path] {
		return nil
	}
	if !run.listed {
		run.listed = true
		if run.known == nil {
			run.known = make(map[string]bool)
		}
		if infos, err := w.List(ctx, ToolResultsDir); err == nil {
			for _, info := range infos {
				p := info.Path
				if !strings.HasPrefix(p, "/") {
					p, _ = files.Join(ToolResultsDir, p)
				}
				run.known[p] = true
			}
		}
		if run.known[path] {
			return nil
		}
	}
	if err := w.Write(ctx, path, []byte(content)); err != nil {
		return err
	}
	run.known[path] = true
	return nil
}

// previewChars is the size of a preview: four characters a token.
func (c *ContextCompression) previewChars() int { return c.ToolResultTokenLimit * 4 }

// toolPreview is what replaces a compacted tool result.
func (c *ContextCompression) toolPreview(m *model.Message, tokensN int, path, why string) string {
	chars := utf8.RuneCountInString(m.Content)
	name := m.Name
	if name == "" {
		name = "a tool"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "[Tool result of %s compacted to save context: about %d tokens, %d characters.", name, tokensN, chars)
	if path != "" {
		fmt.Fprintf(&b, " The full result is in the file %s: read it with read_file (offset and limit) or search it with grep when you need more than this preview.]\n", path)
	} else {
		fmt.Fprintf(&b, " It could not be saved to a file (%s), so this preview is all that is left of it.]\n", why)
	}
	if sp, ok := structuredPreview(m.Content, c.previewChars()); ok {
		b.WriteString("Structured preview of the JSON results: ")
		b.WriteString(sp)
		return b.String()
	}
	b.WriteString(headMiddleTail(m.Content, c.previewChars()))
	return b.String()
}

// headMiddleTail keeps the start, a piece of the middle and the end of s,
// about maxChars characters in all (after Yuxi's preview: 2/5, 1/5, 2/5).
func headMiddleTail(s string, maxChars int) string {
	if utf8.RuneCountInString(s) <= maxChars {
		return s
	}
	const (
		lHead   = "[HEAD]\n"
		lMiddle = "\n[... MIDDLE ...]\n"
		lTail   = "\n[... TAIL ...]\n"
	)
	r := []rune(s)
	budget := maxChars - len(lHead) - len(lMiddle) - len(lTail)
	if budget <= 0 {
		return string(r[:maxChars])
	}
	head, middle := budget*2/5, budget/5
	tail := budget - head - middle
	ms := max((len(r)-middle)/2, head)
	return lHead + string(r[:head]) + lMiddle + string(r[ms:ms+middle]) + lTail + string(r[len(r)-tail:])
}

// Keys a structured preview keeps from each result, in this order of
// preference; the first text field found is its body.
var (
	previewKeys     = []string{"id", "title", "name", "url", "link", "path", "file", "source", "score", "type", "status", "date", "published", "kb_id", "file_id"}
	previewBodyKeys = []string{"snippet", "content", "text", "summary", "description", "body"}
)

const previewItems = 8

// structuredPreview previews JSON search-style results (an array of
// objects, or an object with a "results" or "items" array): the count
// and the key fields of the first results, within maxChars.
func structuredPreview(content string, maxChars int) (string, bool) {
	t := strings.TrimSpace(content)
	if t == "" || (t[0] != '[' && t[0] != '{') {
		return "", false
	}
	dec := json.NewDecoder(strings.NewReader(t))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil || dec.More() {
		return "", false
	}
	out := map[string]any{}
	var items []any
	switch x := v.(type) {
	case []any:
		items = x
	case map[string]any:
		for _, k := range []string{"results", "items"} {
			if a, ok := x[k].([]any); ok {
				items = a
				break
			}
		}
		if items == nil {
			return "", false
		}
		for k, val := range x {
			switch s := val.(type) {
			case string:
				out[k] = clipText(s, 200)
			case json.Number, bool:
				out[k] = s
			}
		}
	default:
		return "", false
	}
	if len(items) == 0 {
		return "", false
	}
	if _, ok := items[0].(map[string]any); !ok {
		return "", false
	}
	out["result_count"] = len(items)
	var recs []map[string]any
	for _, it := range items[:min(len(items), previewItems)] {
		obj, ok := it.(map[string]any)
		if !ok {
			continue
		}
		recs = append(recs, previewRecord(obj))
	}
	encode := func(n, body int) (string, bool) {
		o := make(map[string]any, len(out)+2)
		for k, v := range out {
			o[k] = v
		}
		shown := make([]map[string]any, n)
		for i := range n {
			r := make(map[string]any, len(recs[i]))
			for k, v := range recs[i] {
				if s, ok := v.(string); ok && k == bodyKeyOf(recs[i]) {
					v = clipText(s, body)
				}
				r[k] = v
			}
			shown[i] = r
		}
		o["results"] = shown
		if n < len(items) {
			o["omitted_results"] = len(items) - n
		}
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(o); err != nil {
			return "", false
		}
		s := strings.TrimSuffix(buf.String(), "\n")
		return s, utf8.RuneCountInString(s) <= maxChars
	}
	for n := len(recs); n >= 1; n-- {
		for body := 240; body >= 40; body -= 40 {
			if s, ok := encode(n, body); ok {
				return s, true
			}
		}
	}
	if s, ok := encode(0, 0); ok {
		return s, true
	}
	return "", false
}

func previewRecord(obj map[string]any) map[string]any {
	r := map[string]any{}
	for _, k := range previewKeys {
		switch v := obj[k].(type) {
		case string:
			r[k] = clipText(v, 160)
		case json.Number, bool:
			r[k] = v
		}
	}
	for _, k := range previewBodyKeys {
		if s, ok := obj[k].(string); ok {
			r[k] = s
			break
		}
	}
	if len(r) == 0 {
		// No familiar key: the first few scalar fields, by name.
		keys := make([]string, 0, len(obj))
		for k := range obj {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if len(r) == 4 {
				break
			}
			switch v := obj[k].(type) {
			case string:
				r[k] = clipText(v, 160)
			case json.Number, bool:
				r[k] = v
			}
		}
	}
	return r
}

func bodyKeyOf(r map[string]any) string {
	for _, k := range previewBodyKeys {
		if _, ok := r[k]; ok {
			return k
		}
	}
	return ""
}

// fileArgKeys are the arguments of the file tools that carry file text.
var fileArgKeys = map[string][]string{
	tools.ToolWriteFile: {"content"},
	tools.ToolEditFile:  {"old_string", "new_string"},
}

func hasLongFileArgs(calls []model.ToolCall, maxChars int) bool {
	for i := range calls {
		if _, ok := fileArgKeys[calls[i].Name]; ok && len(calls[i].Arguments) > maxChars {
			return true
		}
	}
	return false
}

// truncateFileArgs cuts the file text of a write_file or edit_file call
// over maxChars characters to its start and a note, keeping the arguments
// valid JSON. Invalid arguments are left as they are.
func truncateFileArgs(tc model.ToolCall, maxChars int) (string, bool) {
	keys, ok := fileArgKeys[tc.Name]
	if !ok || len(tc.Arguments) <= maxChars {
		return "", false
	}
	var args map[string]json.RawMessage
	if err := json.Unmarshal([]byte(tc.Arguments), &args); err != nil {
		return "", false
	}
	changed := false
	for _, k := range keys {
		raw, ok := args[k]
		if !ok {
			continue
		}
		var s string
		if json.Unmarshal(raw, &s) != nil {
			continue
		}
		n := utf8.RuneCountInString(s)
		if n <= maxChars {
			continue
		}
		note := prefixRunes(s, 20) + fmt.Sprintf("...(argument truncated for context view: %d characters; the file holds the full text)", n)
		enc, err := marshalNoEscape(note)
		if err != nil {
			continue
		}
		args[k] = enc
		changed = true
	}
	if !changed {
		return "", false
	}
	out, err := json.Marshal(args)
	if err != nil {
		return "", false
	}
	return string(out), true
}

func marshalNoEscape(v any) (json.RawMessage, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}
