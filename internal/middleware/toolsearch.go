package middleware

// Tool search (deferred tools). Boundary: prompt and tools offered
// (request only), tool call, state. Some of a run's tools are deferred
// (by default every tool whose name holds "__": MCP tools): the system
// prompt lists only their names, the request leaves out their schemas, and
// the middleware's own tool_search tool loads the schemas of the tools it
// finds and promotes them, so they are offered from then on. Reads and
// writes the state value "promoted_tools" ({catalog_hash, names}); emits
// state.promoted_tools (updates kind) when it grows. Promotions belong to
// the thread and survive its runs, but only under the catalog they were
// made in: the catalog hash covers the deferred tools' names and schemas,
// so a renamed or changed tool is never exposed by an old promotion. A
// call to a deferred tool that is not promoted is refused with an error
// result, also when the model names it without having seen it: hiding is
// not the enforcement (deer-flow #2513).
//
// Parallel tool_search calls in one batch each write the union they know,
// and each result carries its promotion in Meta, so the next before-model
// hook (or the after-agent hook) completes the union from the batch's
// results, also after a redelivery.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"html"
	"path"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"unicode"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/state"
	"github.com/natsagent/natsagent/internal/tools"
)

// ToolSearchTool is the name of the tool the tool_search middleware
// provides.
const ToolSearchTool = "tool_search"

// PromotedToolsValue is the state value holding the promoted deferred
// tools (a Promoted).
const PromotedToolsValue = "promoted_tools"

// MetaPromotedTools marks a tool_search result that promoted tools; its
// value is a Promoted.
const MetaPromotedTools = "promoted_tools"

// EventToolsPromoted is emitted with {"names": [...]} when the promoted
// set grows.
const EventToolsPromoted = "state.promoted_tools"

// maxToolSearchQuery bounds a query, in bytes.
const maxToolSearchQuery = 1000

// Promoted is the set of deferred tools a thread has loaded, valid for
// one catalog of deferred tools.
type Promoted struct {
	CatalogHash string   `json:"catalog_hash"`
	Names       []string `json:"names"`
}

// ToolSearch defers tools and provides tool_search.
type ToolSearch struct {
	// Deferred are name patterns (path.Match: "github__*", "*_admin",
	// exact names) of the tools to defer; empty means every tool whose
	// name contains "__" (MCP tools).
	Deferred []string `json:"deferred"`
	// MaxResults caps the tools one search returns (default 5); a
	// "select:" query has no cap.
	MaxResults int `json:"max_results"`
	// AutoPromoteTopK promotes up to that many deferred tools whose names
	// and descriptions share words with the run's latest user message,
	// before the first model call (0, the default, is off).
	AutoPromoteTopK int `json:"auto_promote_top_k"`
}

// NewToolSearch fills defaults and checks the settings.
func NewToolSearch(t ToolSearch) (*ToolSearch, error) {
	for i, p := range t.Deferred {
		if strings.TrimSpace(p) == "" {
			return nil, fmt.Errorf("deferred[%d]: empty pattern", i)
		}
		if _, err := path.Match(p, ""); err != nil {
			return nil, fmt.Errorf("deferred[%d]: pattern %q: %w", i, p, err)
		}
	}
	if t.MaxResults == 0 {
		t.MaxResults = 5
	}
	if t.MaxResults < 1 || t.MaxResults > 50 {
		return nil, fmt.Errorf("max_results must be 1 to 50, not %d", t.MaxResults)
	}
	if t.AutoPromoteTopK < 0 || t.AutoPromoteTopK > 20 {
		return nil, fmt.Errorf("auto_promote_top_k must be 0 (off) to 20, not %d", t.AutoPromoteTopK)
	}
	return &t, nil
}

// Name implements Middleware.
func (*ToolSearch) Name() string { return "tool_search" }

var toolSearchSpec = model.ToolSpec{
	Name: ToolSearchTool,
	Description: "Loads the schemas of deferred tools (listed by name in the system prompt) so you can call them. " +
		`Query forms: "select:name_a,name_b" loads exactly those tools; "+word other words" finds tools whose name contains word, ranked by the other words; ` +
		"anything else is a case-insensitive regular expression matched against tool names and descriptions. Returns the matching tools' schemas as JSON.",
	Parameters: tools.SchemaJSON[toolSearchArgs](),
}

type toolSearchArgs struct {
	Query string `json:"query" jsonschema:"select:<names>, +<name part> <words>, or a regular expression"`
}

// deferred reports whether the tool name is deferred.
func (t *ToolSearch) deferred(name string) bool {
	if name == ToolSearchTool {
		return false
	}
	if len(t.Deferred) == 0 {
		return strings.Contains(name, "__")
	}
	for _, p := range t.Deferred {
		if ok, _ := path.Match(p, name); ok {
			return true
		}
	}
	return false
}

// toolCatalog is a run's deferred tools, resolved once per run.
type toolCatalog struct {
	specs map[string]model.ToolSpec
	names []string // sorted
	hash  string

	mu sync.Mutex
	// known holds what this run's searches promoted, so parallel searches
	// of one batch write the union they know.
	known map[string]bool
}

func (t *ToolSearch) catalog(rt *Runtime) *toolCatalog {
	return Scratch(rt, "tool_search", func() *toolCatalog {
		c := &toolCatalog{specs: make(map[string]model.ToolSpec), known: make(map[string]bool)}
		for _, spec := range rt.Tools.Specs() {
			if t.deferred(spec.Name) {
				c.specs[spec.Name] = spec
				c.names = append(c.names, spec.Name)
			}
		}
		sort.Strings(c.names)
		c.hash = catalogHash(c.names, c.specs)
		return c
	})
}

// catalogHash identifies a set of deferred tools by their names and
// schemas. Schemas are re-encoded (object keys sorted) so the same schema
// hashes the same whatever key order its server sent.
func catalogHash(names []string, specs map[string]model.ToolSpec) string {
	type entry struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Parameters  json.RawMessage `json:"parameters,omitempty"`
	}
	list := make([]entry, len(names))
	for i, n := range names {
		s := specs[n]
		params := s.Parameters
		var v any
		if len(params) > 0 && json.Unmarshal(params, &v) == nil {
			params, _ = json.Marshal(v)
		}
		list[i] = entry{Name: n, Description: s.Description, Parameters: params}
	}
	data, _ := json.Marshal(list)
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:8])
}

func (c *toolCatalog) has(name string) bool {
	_, ok := c.specs[name]
	return ok
}

// promoted returns the promoted names of st that are valid for the
// catalog: none when they were promoted under another catalog.
func (c *toolCatalog) promoted(st *state.State) []string {
	var p Promoted
	if st == nil {
		return nil
	}
	if ok, err := st.Value(PromotedToolsValue, &p); !ok || err != nil || p.CatalogHash != c.hash {
		return nil
	}
	out := make([]string, 0, len(p.Names))
	for _, n := range p.Names {
		if _, ok := c.specs[n]; ok {
			out = append(out, n)
		}
	}
	return out
}

// WrapModelCall lists the deferred tools by name, leaves out those not
// promoted, and offers tool_search.
func (t *ToolSearch) WrapModelCall(ctx context.Context, rt *Runtime, req *ModelRequest, next ModelHandler) (*ModelResponse, error) {
	c := t.catalog(rt)
	if len(c.names) == 0 {
		return next(ctx, req)
	}
	promoted := c.promoted(req.State)
	r := *req
	r.Tools = make([]model.ToolSpec, 0, len(req.Tools)+1)
	for _, spec := range req.Tools {
		if _, ok := c.specs[spec.Name]; ok && !slices.Contains(promoted, spec.Name) {
			continue
		}
		if spec.Name == ToolSearchTool {
			continue
		}
		r.Tools = append(r.Tools, spec)
	}
	r.Tools = append(r.Tools, toolSearchSpec)
	r.appendShared(t.prompt(c))
	return next(ctx, &r)
}

// prompt is the deferred tools section of the system prompt. It lists
// every deferred name, promoted or not, so it stays the same from call to
// call (prompt caches keep working).
func (t *ToolSearch) prompt(c *toolCatalog) string {
	var b strings.Builder
	b.WriteString("## Deferred tools\n\nThe tools listed below exist, but their schemas are not loaded yet. ")
	b.WriteString("Before you call one, load it with tool_search (for example select:<name>); a loaded tool stays available in this conversation.\n")
	b.WriteString("<available-deferred-tools>\n")
	for _, n := range c.names {
		b.WriteString(html.EscapeString(n))
		b.WriteString("\n")
	}
	b.WriteString("</available-deferred-tools>")
	return b.String()
}

// WrapToolCall answers tool_search and refuses deferred tools not
// promoted.
func (t *ToolSearch) WrapToolCall(ctx context.Context, rt *Runtime, call *ToolCall, next ToolHandler) (*ToolResult, error) {
	c := t.catalog(rt)
	name := call.Call.Name
	if len(c.names) == 0 {
		return next(ctx, call)
	}
	if name == ToolSearchTool {
		return t.runSearch(rt, c, call), nil
	}
	if _, ok := c.specs[name]; ok && !slices.Contains(c.promoted(call.State), name) {
		res := errorResult(fmt.Sprintf("Error: %s is a deferred tool and its schema is not loaded. Call tool_search with select:%s first, then call %s again.", name, name, name))
		res.Message.Meta = map[string]any{MetaBlockedBy: t.Name()}
		return res, nil
	}
	return next(ctx, call)
}

func (t *ToolSearch) runSearch(rt *Runtime, c *toolCatalog, call *ToolCall) *ToolResult {
	var args toolSearchArgs
	if err := json.Unmarshal([]byte(call.Call.Arguments), &args); err != nil || strings.TrimSpace(args.Query) == "" {
		return errorResult(`Error: tool_search takes {"query": "..."}: select:<names>, +<name part> <words>, or a regular expression.`)
	}
	query := strings.TrimSpace(args.Query)
	if len(query) > maxToolSearchQuery {
		return errorResult(fmt.Sprintf("Error: the query is longer than %d bytes; search with a few words.", maxToolSearchQuery))
	}
	found, missing := t.search(rt, c, query)
	if len(found) == 0 {
		text := "No deferred tools match: " + query
		if len(missing) > 0 {
			text += "\n" + strings.Join(missing, "\n")
		}
		return &ToolResult{Message: model.Message{Content: text, Status: model.ToolStatusSuccess}}
	}
	schemas := make([]model.ToolSpec, len(found))
	names := make([]string, len(found))
	for i, n := range found {
		schemas[i], names[i] = c.specs[n], n
	}
	data, err := json.MarshalIndent(schemas, "", "  ")
	if err != nil {
		return errorResult("Error: " + err.Error())
	}
	text := string(data)
	if len(missing) > 0 {
		text += "\n" + strings.Join(missing, "\n")
	}

	c.mu.Lock()
	for _, n := range names {
		c.known[n] = true
	}
	known := make([]string, 0, len(c.known))
	for n := range c.known {
		known = append(known, n)
	}
	c.mu.Unlock()
	res := &ToolResult{Message: model.Message{
		Content: text, Status: model.ToolStatusSuccess,
		Meta: map[string]any{MetaPromotedTools: Promoted{CatalogHash: c.hash, Names: names}},
	}}
	res.Update = t.promote(rt, c, call.State, known)
	return res
}

// promote is the update adding names to the state's promoted tools, or
// an empty one when they are all there.
func (t *ToolSearch) promote(rt *Runtime, c *toolCatalog, st *state.State, names []string) state.Update {
	current := c.promoted(st)
	next := mergeNames(current, names)
	var stored Promoted
	if st != nil {
		_, _ = st.Value(PromotedToolsValue, &stored)
	}
	if len(next) == 0 || (stored.CatalogHash == c.hash && len(next) == len(current)) {
		return state.Update{}
	}
	u, _ := state.SetValue(PromotedToolsValue, Promoted{CatalogHash: c.hash, Names: next})
	if rt.Emit != nil {
		rt.Emit(EventToolsPromoted, map[string]any{"names": next})
	}
	return u
}

// mergeNames returns the sorted union of a and b.
func mergeNames(a, b []string) []string {
	out := slices.Concat(a, b)
	slices.Sort(out)
	return slices.Compact(out)
}

// search returns the deferred tool names a query finds, best first, and
// notes about select names that are not deferred tools.
func (t *ToolSearch) search(rt *Runtime, c *toolCatalog, query string) (found, notes []string) {
	if list, ok := strings.CutPrefix(query, "select:"); ok {
		// Exact names, no cap: the model asked for these (deer-flow
		// #4054).
		for _, n := range strings.Split(list, ",") {
			n = strings.TrimSpace(n)
			switch {
			case n == "" || slices.Contains(found, n):
			case c.has(n):
				found = append(found, n)
			case rt.Tools.Get(n) != nil || n == ToolSearchTool:
				notes = append(notes, fmt.Sprintf("%s is not deferred: it is available already.", n))
			default:
				notes = append(notes, fmt.Sprintf("%s: no such deferred tool.", n))
			}
		}
		return found, notes
	}

	type hit struct {
		name  string
		score int
	}
	var hits []hit
	if strings.HasPrefix(query, "+") {
		var required, rest []string
		for _, f := range strings.Fields(query) {
			if r, ok := strings.CutPrefix(f, "+"); ok {
				if r != "" {
					required = append(required, strings.ToLower(r))
				}
				continue
			}
			rest = append(rest, f)
		}
		var re *regexp.Regexp
		if len(rest) > 0 {
			re = searchRegexp(strings.Join(rest, " "))
		}
	names:
		for _, n := range c.names {
			lower := strings.ToLower(n)
			for _, r := range required {
				if !strings.Contains(lower, r) {
					continue names
				}
			}
			score := 0
			if re != nil {
				score = 2*len(re.FindAllStringIndex(n, -1)) + len(re.FindAllStringIndex(c.specs[n].Description, -1))
			}
			hits = append(hits, hit{n, score})
		}
	} else {
		re := searchRegexp(query)
		for _, n := range c.names {
			score := 0
			if re.MatchString(n) {
				score += 2
			}
			if re.MatchString(c.specs[n].Description) {
				score++
			}
			if score > 0 {
				hits = append(hits, hit{n, score})
			}
		}
	}
	sort.SliceStable(hits, func(i, j int) bool { return hits[i].score > hits[j].score })
	for i, h := range hits {
		if i == t.MaxResults {
			break
		}
		found = append(found, h.name)
	}
	return found, nil
}

// searchRegexp compiles a query as a case-insensitive regular expression,
// or as literal text when it is not a valid one.
func searchRegexp(q string) *regexp.Regexp {
	if re, err := regexp.Compile("(?i)" + q); err == nil {
		return re
	}
	return regexp.MustCompile("(?i)" + regexp.QuoteMeta(q))
}

// BeforeAgent promotes the deferred tools the run's latest user message
// speaks of, when auto_promote_top_k is set.
func (t *ToolSearch) BeforeAgent(ctx context.Context, rt *Runtime, st *state.State) (Result, error) {
	if t.AutoPromoteTopK == 0 || rt.Resume != nil {
		return Result{}, nil
	}
	c := t.catalog(rt)
	if len(c.names) == 0 {
		return Result{}, nil
	}
	text := latestUserText(st)
	if text == "" {
		return Result{}, nil
	}
	picked := t.autoPromote(c, text)
	if len(picked) == 0 {
		return Result{}, nil
	}
	return Result{Update: t.promote(rt, c, st, picked)}, nil
}

// latestUserText is the text of the last message a person wrote.
func latestUserText(st *state.State) string {
	for i := len(st.Messages) - 1; i >= 0; i-- {
		m := st.Messages[i]
		if m.Role != model.RoleUser {
			continue
		}
		if hidden, _ := m.Meta[MetaHidden].(bool); hidden {
			continue
		}
		return m.Content
	}
	return ""
}

// autoPromote ranks the deferred tools by the words they share with text:
// two points a word in the name, one a word in the description.
func (t *ToolSearch) autoPromote(c *toolCatalog, text string) []string {
	want := make(map[string]bool)
	for _, w := range words(text) {
		want[w] = true
	}
	type hit struct {
		name  string
		score int
	}
	var hits []hit
	for _, n := range c.names {
		score := 0
		seen := make(map[string]bool)
		for _, w := range words(n) {
			if want[w] && !seen[w] {
				seen[w] = true
				score += 2
			}
		}
		for _, w := range words(c.specs[n].Description) {
			if want[w] && !seen[w] {
				seen[w] = true
				score++
			}
		}
		if score > 0 {
			hits = append(hits, hit{n, score})
		}
	}
	sort.SliceStable(hits, func(i, j int) bool { return hits[i].score > hits[j].score })
	var out []string
	for i, h := range hits {
		if i == t.AutoPromoteTopK {
			break
		}
		out = append(out, h.name)
	}
	return out
}

// stopWords are left out of auto-promotion matching: they say nothing of
// which tool is meant.
var stopWords = map[string]bool{
	"the": true, "and": true, "for": true, "with": true, "that": true, "this": true, "from": true,
	"into": true, "you": true, "your": true, "are": true, "was": true, "can": true, "please": true,
	"what": true, "which": true, "when": true, "how": true, "all": true, "any": true, "use": true,
	"tool": true, "tools": true, "given": true, "returns": true, "about": true, "have": true, "has": true,
}

// words splits text into lower-case words of three letters or more, on
// anything that is not a letter or digit (so "github__create_issue" gives
// github, create, issue).
func words(text string) []string {
	var out []string
	for _, w := range strings.FieldsFunc(strings.ToLower(text), func(r rune) bool {
		return !unicode.IsLetter(r) && !unicode.IsDigit(r)
	}) {
		if len([]rune(w)) >= 3 && !stopWords[w] {
			out = append(out, w)
		}
	}
	return out
}

// BeforeModel completes the promotions of the last tool batch.
func (t *ToolSearch) BeforeModel(ctx context.Context, rt *Runtime, st *state.State) (Result, error) {
	return t.reconcile(rt, st), nil
}

// AfterAgent does the same when the run ends right after a tool batch.
func (t *ToolSearch) AfterAgent(ctx context.Context, rt *Runtime, st *state.State) (Result, error) {
	return t.reconcile(rt, st), nil
}

func (t *ToolSearch) reconcile(rt *Runtime, st *state.State) Result {
	c := t.catalog(rt)
	if len(c.names) == 0 {
		return Result{}
	}
	var add []string
	for i := len(st.Messages) - 1; i >= 0; i-- {
		m := st.Messages[i]
		if m.Role == model.RoleAssistant {
			break
		}
		var p Promoted
		if m.Role != model.RoleTool || !metaAs(m.Meta[MetaPromotedTools], &p) || p.CatalogHash != c.hash {
			continue
		}
		add = append(add, p.Names...)
	}
	if len(add) == 0 {
		return Result{}
	}
	return Result{Update: t.promote(rt, c, st, add)}
}

// metaAs decodes a Meta value into v: in the run that wrote it, it is the
// Go value; after a checkpoint round trip, decoded JSON.
func metaAs(raw any, v any) bool {
	if raw == nil {
		return false
	}
	data, err := json.Marshal(raw)
	if err != nil {
		return false
	}
	return json.Unmarshal(data, v) == nil
}

// ProvidedTools implements ToolProvider.
func (*ToolSearch) ProvidedTools() []string { return []string{ToolSearchTool} }
