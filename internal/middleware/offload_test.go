package middleware_test

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/model/openaitest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
	"github.com/natsagent/natsagent/internal/tools"
)

// filesEvent is an event a run emitted, with its data.
type filesEvent struct {
	typ  string
	data any
}

type filesRun struct {
	out    agent.Outcome
	st     *state.State
	host   *memHost
	mu     sync.Mutex
	events []filesEvent
}

func (r *filesRun) eventsOf(typ string) []any {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []any
	for _, e := range r.events {
		if e.typ == typ {
			out = append(out, e.data)
		}
	}
	return out
}

// runWithFiles runs the loop on thread state st with workdir w (nil for
// none), the way the worker does: the workdir reaches the middlewares
// (Runtime.Files) and the tools (ToolEnv.Files).
func runWithFiles(t *testing.T, st *state.State, chain *middleware.Chain, m model.Model, set *tools.Set, w files.Workdir, input ...model.Message) *filesRun {
	t.Helper()
	r := &filesRun{st: st, host: &memHost{base: st.Clone()}}
	rt := &middleware.Runtime{RunID: "r1", ThreadID: "h1", Tenant: "default", Agent: "test", Tools: set, Files: w, Logger: zap.NewNop(),
		Emit: func(typ string, data any) {
			r.host.Emit(typ, data)
			r.mu.Lock()
			r.events = append(r.events, filesEvent{typ, data})
			r.mu.Unlock()
		}}
	if len(input) == 0 {
		input = []model.Message{{ID: "u1", Role: model.RoleUser, Content: "hello"}}
	}
	r.out = agent.Execute(context.Background(), &agent.Run{
		Runtime: rt, Chain: chain, Model: m, ModelName: "test-model", System: "sys",
		MaxSteps: 20, State: st, Input: input, Host: r.host, ToolEnv: tools.Env{Files: w},
	})
	if r.out.Stopped != nil || r.out.Status == protocol.StatusError {
		t.Fatalf("run failed: %+v", r.out)
	}
	if err := r.host.Checkpoint(context.Background(), r.out.Pending); err != nil {
		t.Fatal(err)
	}
	return r
}

// offloadChain is the base of a lead chain up to the files middlewares,
// with the offload built from settings.
func offloadChain(t *testing.T, settings string) *middleware.Chain {
	t.Helper()
	var o middleware.LargeResultOffload
	if settings != "" {
		if err := json.Unmarshal([]byte(settings), &o); err != nil {
			t.Fatal(err)
		}
	}
	off, err := middleware.NewLargeResultOffload(o)
	if err != nil {
		t.Fatal(err)
	}
	att, err := middleware.NewAttachments(middleware.Attachments{})
	if err != nil {
		t.Fatal(err)
	}
	return newChain(t, middleware.ToolErrorGuard{}, middleware.ToolCallRepair{}, off, att)
}

// bigTool returns lines "row N: xxx", each width characters with its
// newline.
func bigTool(name string, lines int, width int) tools.Tool {
	return tools.Func(model.ToolSpec{Name: name, Description: "returns a lot", Parameters: json.RawMessage(`{"type":"object"}`)},
		func(ctx context.Context, args json.RawMessage) (string, error) {
			var b strings.Builder
			for i := 1; i <= lines; i++ {
				row := fmt.Sprintf("row %d: ", i)
				b.WriteString(row + strings.Repeat("x", max(width-1-len(row), 0)) + "\n")
			}
			return b.String(), nil
		})
}

func toolSet(t *testing.T, ts ...tools.Tool) *tools.Set {
	t.Helper()
	set, err := tools.NewSet(ts...)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

func fileTool(name string) tools.Tool { return tools.NewRegistry().Get(name) }

var offloadedPath = regexp.MustCompile(`/large_tool_results/[0-9a-f]{32}\.txt`)

func toolMessages(st *state.State) []model.Message {
	var out []model.Message
	for _, m := range st.Messages {
		if m.Role == model.RoleTool {
			out = append(out, m)
		}
	}
	return out
}

// A large result is saved to the workdir and replaced by a preview and
// the path; the model reads the rest back with the real read_file, whose
// result is never offloaded. The whole run goes through the strict
// OpenAI-compatible server.
func TestOffload_PreviewAndReadBack(t *testing.T) {
	w := files.NewMemory()
	srv := openaitest.NewServer(t, func(req *openaitest.Request) openaitest.Reply {
		last := req.LastMessage()
		switch {
		case last.Role == model.RoleUser:
			return openaitest.ToolCall("search", `{}`)
		case strings.Contains(last.Content, "saved to the file"):
			p := offloadedPath.FindString(last.Content)
			return openaitest.ToolCall(tools.ToolReadFile, fmt.Sprintf(`{"path":%q,"offset":500,"limit":2}`, p))
		}
		return openaitest.Text("done")
	})
	m, err := model.NewOpenAI(model.OpenAIConfig{BaseURL: srv.URL(), Model: "test-model"})
	if err != nil {
		t.Fatal(err)
	}
	set := toolSet(t, bigTool("search", 1000, 60), fileTool(tools.ToolReadFile))
	r := runWithFiles(t, &state.State{}, offloadChain(t, ""), m, set, w)
	if v := srv.Violations(); len(v) > 0 {
		t.Fatalf("transcript violations: %q", v)
	}
	if r.out.Output == nil || r.out.Output.Content != "done" {
		t.Fatalf("outcome %+v", r.out)
	}
	results := toolMessages(r.host.replay())
	if len(results) != 2 {
		t.Fatalf("%d tool messages", len(results))
	}
	notice := results[0].Content
	p := offloadedPath.FindString(notice)
	if p == "" || results[0].Meta[middleware.MetaOffloadedTo] != p {
		t.Fatalf("no offload path in %q (meta %v)", notice, results[0].Meta)
	}
	for _, want := range []string{"read_file", "offset", "limit", "     1\trow 1: x", "    20\trow 20: x", "... [970 lines omitted] ...", "   991\trow 991: x", "  1000\trow 1000: x", "60000 characters"} {
		if !strings.Contains(notice, want) {
			t.Errorf("notice lacks %q:\n%s", want, notice)
		}
	}
	if strings.Contains(notice, "row 21:") || strings.Contains(notice, "row 990:") {
		t.Errorf("the preview holds the middle of the result")
	}
	if len(notice) > 4000 {
		t.Errorf("notice of %d bytes", len(notice))
	}
	// The file holds the whole result, exactly.
	data, err := w.Read(context.Background(), p)
	if err != nil || len(data) != 60000 || !strings.HasPrefix(string(data), "row 1: ") || !strings.HasSuffix(string(data), "row 1000: "+strings.Repeat("x", 49)+"\n") {
		t.Fatalf("offloaded file: %d bytes, %v", len(data), err)
	}
	// read_file read it back through the real tool.
	if want := "   500\trow 500: " + strings.Repeat("x", 50) + "\n   501\trow 501: " + strings.Repeat("x", 50); !strings.HasPrefix(results[1].Content, want) {
		t.Errorf("read back %q, want prefix %q", results[1].Content, want)
	}
	ev := r.eventsOf(middleware.EventToolResultOffloaded)
	if len(ev) != 1 {
		t.Fatalf("%d offload events", len(ev))
	}
	if d := ev[0].(middleware.OffloadedData); d.Path != p || d.Chars != 60000 || d.ToolCallID == "" {
		t.Errorf("event data %+v", d)
	}
}

// deepagentsjs #82 / #172: read_file is never offloaded, even when its
// (self-capped) output is over the threshold, so re-reading an offloaded
// result with long lines cannot loop.
func TestOffload_ReadFileNeverOffloaded_82_172(t *testing.T) {
	w := files.NewMemory()
	var lines []string
	for i := range 300 {
		lines = append(lines, fmt.Sprintf("%d:%s", i, strings.Repeat("y", 3000)))
	}
	if err := w.Write(context.Background(), "/large_tool_results/wide.txt", []byte(strings.Join(lines, "\n"))); err != nil {
		t.Fatal(err)
	}
	m := model.NewScripted(func(n int, req *model.Request) model.Reply {
		if n == 0 {
			return model.Reply{ToolCalls: []model.ToolCall{{ID: "call_1", Name: tools.ToolReadFile, Arguments: `{"path":"/large_tool_results/wide.txt"}`}}}
		}
		return model.Reply{Text: "done"}
	})
	r := runWithFiles(t, &state.State{}, offloadChain(t, `{"max_chars":5000}`), m, toolSet(t, fileTool(tools.ToolReadFile)), w)
	res := toolMessages(r.host.replay())[0]
	if len(res.Content) <= 5000 || offloadedPath.MatchString(res.Content) || res.Meta[middleware.MetaOffloadedTo] != nil {
		t.Errorf("read_file result was offloaded or cut by the offload: %d bytes", len(res.Content))
	}
	if !strings.Contains(res.Content, "line cut") || !strings.Contains(res.Content, "Output capped") {
		t.Errorf("read_file did not cap itself")
	}
	if len(res.Content) > tools.MaxOutputBytes+500 {
		t.Errorf("read_file output of %d bytes", len(res.Content))
	}
	if n := len(r.eventsOf(middleware.EventToolResultOffloaded)); n != 0 {
		t.Errorf("%d offload events", n)
	}
	var offloaded int
	_ = w.Walk(context.Background(), "/large_tool_results", func(files.Info) error { offloaded++; return nil })
	if offloaded != 1 {
		t.Errorf("%d files in /large_tool_results, want only the one read", offloaded)
	}
}

// deepagents #5559 / #5560: a very long tool call id (LiteLLM's Gemini
// thought signatures, about 1.5 KB) never becomes part of a file name or
// the prompt; the offload still works on a real file system.
func TestOffload_LongToolCallID_5559(t *testing.T) {
	w, err := files.NewLocal(t.TempDir(), "default", "h1")
	if err != nil {
		t.Fatal(err)
	}
	longID := "call_" + strings.Repeat("Q2lwaGVyVGV4dA/+=", 90)
	m := model.NewScripted(func(n int, req *model.Request) model.Reply {
		if n == 0 {
			return model.Reply{ToolCalls: []model.ToolCall{{ID: longID, Name: "search", Arguments: `{}`}}}
		}
		return model.Reply{Text: "done"}
	})
	r := runWithFiles(t, &state.State{}, offloadChain(t, ""), m, toolSet(t, bigTool("search", 500, 100)), w)
	res := toolMessages(r.host.replay())[0]
	p := offloadedPath.FindString(res.Content)
	if p == "" {
		t.Fatalf("not offloaded: %q", res.Content[:200])
	}
	if strings.Contains(res.Content, longID[:40]) || strings.Contains(p, "call_") {
		t.Errorf("the tool call id leaked into the notice or the path")
	}
	if p != middleware.OffloadPath(longID, mustRead(t, w, p)) {
		t.Errorf("path %s is not the hash of the id and the content", p)
	}
	if res.ToolCallID != longID {
		t.Errorf("the tool message lost its id")
	}
}

func mustRead(t *testing.T, w files.Workdir, p string) string {
	t.Helper()
	data, err := w.Read(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// Without a workdir, a large result is cut to the threshold with a note,
// keeping its start and its end.
func TestOffload_NoWorkdirTruncates(t *testing.T) {
	m := model.NewScripted(func(n int, req *model.Request) model.Reply {
		if n == 0 {
			return model.Reply{ToolCalls: []model.ToolCall{{ID: "call_1", Name: "search", Arguments: `{}`}}}
		}
		return model.Reply{Text: "done"}
	})
	r := runWithFiles(t, &state.State{}, offloadChain(t, `{"max_chars":3000}`), m, toolSet(t, bigTool("search", 100, 100)), nil)
	res := toolMessages(r.host.replay())[0]
	if n := len([]rune(res.Content)); n > 3200 {
		t.Errorf("truncated result has %d characters", n)
	}
	for _, want := range []string{"row 1: x", "row 100: x", "characters omitted", "no workdir"} {
		if !strings.Contains(res.Content, want) {
			t.Errorf("truncated result lacks %q", want)
		}
	}
	ev := r.eventsOf(middleware.EventToolResultTruncated)
	if len(ev) != 1 || ev[0].(middleware.TruncatedData).Chars != 10000 {
		t.Errorf("truncation events %+v", ev)
	}
}

func TestOffload_SmallResultsUntouched(t *testing.T) {
	w := files.NewMemory()
	r := runWithFiles(t, &state.State{}, offloadChain(t, ""), toolThenAnswer(), echoTool(t), w)
	if res := toolMessages(r.host.replay())[0]; res.Content != `echo {"x":1}` {
		t.Errorf("result changed: %q", res.Content)
	}
	if list, _ := w.List(context.Background(), "/"); len(list) != 0 {
		t.Errorf("files written: %v", list)
	}
}

func TestOffload_Settings(t *testing.T) {
	if _, err := middleware.Assemble(middleware.ChainConfig{Settings: map[string]json.RawMessage{
		"large_result_offload": json.RawMessage(`{"max_chars":100}`)}}, middleware.Env{}); err == nil || !strings.Contains(err.Error(), "settings.large_result_offload") {
		t.Errorf("max_chars 100: %v", err)
	}
	if _, err := middleware.Assemble(middleware.ChainConfig{Settings: map[string]json.RawMessage{
		"large_result_offload": json.RawMessage(`{"max_char":100}`)}}, middleware.Env{}); err == nil {
		t.Error("unknown setting accepted")
	}
	c, err := middleware.Assemble(middleware.ChainConfig{Settings: map[string]json.RawMessage{
		"large_result_offload": json.RawMessage(`{"enabled":false}`), "attachments": json.RawMessage(`{"enabled":false}`)}}, middleware.Env{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Names() {
		if n == "large_result_offload" || n == "attachments" {
			t.Errorf("%s still in the chain", n)
		}
	}
}
