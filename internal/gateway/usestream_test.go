package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/model/openaitest"
)

// useStreamDir is the npm project of the useStream page: React, vite and
// the official LangGraph SDK, pinned (.ci/run installs it with npm ci).
const useStreamDir = "testdata/usestream"

// buildUseStreamPage builds the page with vite into a temporary directory
// and returns it. Without node or the installed packages it skips, unless
// NATSAGENT_LANGGRAPH_TESTS=1 (CI), where it fails.
func buildUseStreamPage(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	missing := ""
	if err != nil {
		missing = "node not found on PATH (Node 20.19 or later)"
	} else {
		for _, p := range []string{"vite/bin/vite.js", "@langchain/langgraph-sdk/package.json", "react/package.json", "react-dom/package.json"} {
			if _, err := os.Stat(filepath.Join(useStreamDir, "node_modules", p)); err != nil {
				missing = "the useStream page's packages are not installed (run npm ci in internal/gateway/" + useStreamDir + ")"
				break
			}
		}
	}
	if missing != "" {
		if os.Getenv("NATSAGENT_LANGGRAPH_TESTS") == "1" {
			t.Fatal(missing + "; NATSAGENT_LANGGRAPH_TESTS=1 requires it")
		}
		t.Skip(missing + "; set NATSAGENT_LANGGRAPH_TESTS=1 to make this a failure")
	}
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "node_modules/vite/bin/vite.js", "build", "--outDir", out, "--emptyOutDir")
	cmd.Dir = useStreamDir
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("vite build: %v\n%s", err, msg)
	}
	if _, err := os.Stat(filepath.Join(out, "index.html")); err != nil {
		t.Fatalf("vite built no page: %v", err)
	}
	return out
}

// useStreamStory is the answer the page must show stream word by word:
// the model holds it after useStreamHold deltas until the test has seen
// part of it on screen.
const (
	useStreamStory = "Once upon a time a queue kept every message safe, and the agents that read it lived happily ever after."
	useStreamPoem  = "Roses are red, subjects are dotted, no message is lost."
	useStreamPoem2 = "Violets are blue, streams are replicated, every step is checkpointed."
	useStreamHold  = 4
)

// lgMessage is a message of LangGraph values as the test reads them.
type lgMessage struct {
	Type    string `json:"type"`
	Content any    `json:"content"`
	ID      string `json:"id"`
}

func (m lgMessage) text() string {
	if s, ok := m.Content.(string); ok {
		return s
	}
	data, _ := json.Marshal(m.Content)
	return string(data)
}

// lgSnapshot is a LangGraph thread state as the test reads it.
type lgSnapshot struct {
	Values struct {
		Messages []lgMessage `json:"messages"`
	} `json:"values"`
	Next  []string `json:"next"`
	Tasks []struct {
		Name       string `json:"name"`
		Interrupts []struct {
			Value struct {
				ActionRequests []struct {
					Name string         `json:"name"`
					Args map[string]any `json:"args"`
				} `json:"action_requests"`
			} `json:"value"`
		} `json:"interrupts"`
	} `json:"tasks"`
	Checkpoint struct {
		CheckpointID string `json:"checkpoint_id"`
	} `json:"checkpoint"`
	ParentCheckpoint *struct {
		CheckpointID string `json:"checkpoint_id"`
	} `json:"parent_checkpoint"`
}

func (s lgSnapshot) texts() []string {
	out := make([]string, len(s.Values.Messages))
	for i, m := range s.Values.Messages {
		out[i] = m.Type + ":" + m.text()
	}
	return out
}

// TestUseStreamInBrowser runs a React page built on useStream from the
// official LangGraph SDK (testdata/usestream, built with vite) in headless
// Chromium against the gateway, a worker and a model behind the
// OpenAI-compatible test server, and checks what the page renders against
// what the gateway stored: an answer streams onto the page token by token
// (the model holds it half way until the page shows the part sent); a run
// stopped for approval shows the interrupt, the page resumes it with
// LangChain's decisions and the run finishes; editing an earlier message
// forks the thread at its parent checkpoint, editing the first one forks
// it at the input checkpoint, regenerating an answer runs the model again
// from the question's checkpoint (one per step, as LangGraph stores them),
// and the page switches between the branches.
// Skips without Chromium or the page's packages unless
// NATSAGENT_BROWSER_TESTS=1 or NATSAGENT_LANGGRAPH_TESTS=1 make it fail.
func TestUseStreamInBrowser(t *testing.T) {
	dist := buildUseStreamPage(t)
	p := openBrowserFor(t, 3*time.Minute)

	var poems atomic.Int32
	llm := openaitest.NewServer(t, func(req *openaitest.Request) openaitest.Reply {
		last := req.LastMessage()
		switch {
		case last.Role == string(model.RoleTool):
			return openaitest.Reply{Text: "Saved the note.", ChunkDelay: 5 * time.Millisecond}
		case strings.Contains(last.Content, "save a note"):
			return openaitest.Reply{ToolCalls: []openaitest.Call{{ID: "call_w1", Name: "write_file",
				Arguments: `{"path":"/notes.txt","content":"remember the milk"}`}}}
		case strings.Contains(last.Content, "poem instead") && poems.Add(1) > 1:
			// Asked again (a regenerate): another poem.
			return openaitest.Reply{Text: useStreamPoem2, ChunkDelay: 5 * time.Millisecond}
		case strings.Contains(last.Content, "poem"):
			return openaitest.Reply{Text: useStreamPoem, ChunkDelay: 5 * time.Millisecond}
		case strings.Contains(last.Content, "story"):
			return openaitest.Reply{Text: useStreamStory, ChunkDelay: 20 * time.Millisecond}
		}
		return openaitest.Text("I do not know that one.")
	})
	oa, err := model.NewOpenAI(model.OpenAIConfig{BaseURL: llm.URL(), Model: "test"})
	if err != nil {
		t.Fatal(err)
	}
	// The story's deltas stop after useStreamHold words until the test
	// opens the gate: the page must show the partial answer meanwhile.
	hold := newGate(t)
	m := model.Func(func(ctx context.Context, req *model.Request, onDelta func(model.Delta)) (*model.Response, error) {
		last := req.Messages[len(req.Messages)-1]
		if last.Role == model.RoleUser && strings.Contains(last.Content, "story") && onDelta != nil {
			inner, n := onDelta, 0
			onDelta = func(d model.Delta) {
				inner(d)
				if n++; n == useStreamHold {
					select {
					case <-hold.ch:
					case <-ctx.Done():
					}
				}
			}
		}
		return oa.Generate(ctx, req, onDelta)
	})
	wd := &workdirs{m: map[string]*files.Memory{}}
	e := newEnvWith(t, nil, func(s *Server) { s.cfg.Files = wd.open })
	e.startFileWorker(m, wd)

	// The page and the API share one origin, as a page served next to
	// its agent server does.
	mux := http.NewServeMux()
	mux.Handle("/app/", http.StripPrefix("/app/", http.FileServer(http.Dir(dist))))
	mux.Handle("/", e.gw.Handler())
	site := httptest.NewServer(mux)
	t.Cleanup(func() {
		hold.open() // a failed test must not leave the run waiting
		site.CloseClientConnections()
		site.Close()
	})

	state := func(thread string) lgSnapshot {
		t.Helper()
		var s lgSnapshot
		e.do("GET", "/threads/"+thread+"/state", nil).expect(t, http.StatusOK).decode(t, &s)
		return s
	}
	// shown is what the page lists: "type:text" per message.
	shown := func() []string {
		t.Helper()
		var out []string
		if err := json.Unmarshal([]byte(p.eval(t, `JSON.stringify([...document.querySelectorAll("#messages .msg")].map(
			(el) => el.querySelector(".type").textContent + ":" + el.querySelector(".text").textContent))`)), &out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	waitShown := func(what string, want []string) {
		t.Helper()
		wantJSON, _ := json.Marshal(want)
		p.waitText(t, "#messages", func(string) bool {
			got, _ := json.Marshal(shown())
			return string(got) == string(wantJSON)
		})
		if got := shown(); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%s: the page shows %q, want %q", what, got, want)
		}
	}
	send := func(input, button, text string) {
		t.Helper()
		p.do(t, "send "+text,
			chromedp.WaitVisible(chromedp.ID(input)),
			typeInto(chromedp.ID(input), text),
			chromedp.Click(chromedp.ID(button)))
	}

	p.do(t, "open the page", chromedp.Navigate(site.URL+"/app/"), chromedp.WaitVisible(chromedp.ID("message")))

	// 1. The answer streams onto the page token by token.
	send("message", "send", "tell me a story")
	partial := p.waitText(t, "#messages .msg.ai .text", func(s string) bool { return s != "" })
	if !strings.HasPrefix(useStreamStory, partial) || partial == useStreamStory {
		t.Fatalf("the page shows %q while the answer streams: not a part of it", partial)
	}
	if got := p.eval(t, `document.querySelector("#status").textContent`); got != "loading" {
		t.Fatalf("the page is %q while the model still holds the answer", got)
	}
	hold.open()
	p.waitText(t, "#status", equals("idle"))
	waitShown("after the story", []string{"human:tell me a story", "ai:" + useStreamStory})
	// The screen showed the answer grow: several partial texts, each a
	// prefix of the next, while the run was loading.
	var renders []struct {
		Loading bool `json:"loading"`
		Texts   []struct {
			Text string `json:"text"`
		} `json:"texts"`
	}
	if err := json.Unmarshal([]byte(p.eval(t, `JSON.stringify(window.__renders)`)), &renders); err != nil {
		t.Fatal(err)
	}
	var grew []string
	for _, r := range renders {
		if !r.Loading || len(r.Texts) != 1 {
			continue
		}
		if s := r.Texts[0].Text; s != "" && s != useStreamStory && (len(grew) == 0 || s != grew[len(grew)-1]) {
			grew = append(grew, s)
		}
	}
	if len(grew) < 2 {
		t.Fatalf("the answer appeared in %d partial texts while streaming (%q): it was not streamed token by token", len(grew), grew)
	}
	for i, s := range grew {
		if !strings.HasPrefix(useStreamStory, s) || (i > 0 && !strings.HasPrefix(s, grew[i-1])) {
			t.Fatalf("partial texts %q do not grow into the answer", grew)
		}
	}
	t.Logf("the answer grew on screen through %q", grew)
	thread := p.eval(t, `document.querySelector("#thread").textContent`)
	afterStory := state(thread)
	if got, want := afterStory.texts(), []string{"human:tell me a story", "ai:" + useStreamStory}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("the gateway stored %q, want %q", got, want)
	}
	ids := p.eval(t, `[...document.querySelectorAll("#messages .msg")].map((el) => el.dataset.id).join(",")`)
	if want := afterStory.Values.Messages[0].ID + "," + afterStory.Values.Messages[1].ID; ids != want {
		t.Fatalf("the page shows messages %s, the gateway stored %s", ids, want)
	}

	// 2. A tool call that needs approval: the page shows the interrupt,
	// approves it, and the run finishes.
	send("message", "send", "please save a note")
	p.waitText(t, "#interrupt .action-name", equals("write_file"))
	p.waitText(t, "#interrupt .action-args", contains("remember the milk"))
	p.waitText(t, "#status", equals("idle"))
	waiting := state(thread)
	if len(waiting.Tasks) != 1 || len(waiting.Tasks[0].Interrupts) != 1 ||
		len(waiting.Tasks[0].Interrupts[0].Value.ActionRequests) != 1 || waiting.Tasks[0].Interrupts[0].Value.ActionRequests[0].Name != "write_file" {
		t.Fatalf("the gateway's state does not wait for the approval: %+v", waiting.Tasks)
	}
	var th struct {
		Status string `json:"status"`
	}
	e.do("GET", "/threads/"+thread, nil).expect(t, http.StatusOK).decode(t, &th)
	if th.Status != "interrupted" {
		t.Fatalf("thread status %q while the page shows the interrupt", th.Status)
	}
	p.do(t, "approve", chromedp.Click(chromedp.ID("approve")))
	p.waitText(t, "#messages .msg:last-child .text", equals("Saved the note."))
	p.waitText(t, "#status", equals("idle"))
	if n := p.eval(t, `String(document.querySelectorAll("#interrupt").length)`); n != "0" {
		t.Fatal("the page still shows the interrupt after the run finished")
	}
	p.waitText(t, "#messages .msg.tool .text", contains("/notes.txt"))
	done := state(thread)
	if len(done.Next) != 0 || len(done.Tasks) != 0 {
		t.Fatalf("the thread still waits: next %v, tasks %+v", done.Next, done.Tasks)
	}
	if got := done.texts(); len(got) != 6 || got[2] != "human:please save a note" || got[5] != "ai:Saved the note." {
		t.Fatalf("the gateway stored %q after the approval", got)
	}
	note, err := wd.open("default", thread).Read(context.Background(), "/notes.txt")
	if err != nil || string(note) != "remember the milk" {
		t.Fatalf("the approved write left %q, %v", note, err)
	}

	// 3. Edit the second question: the page forks the thread at the
	// checkpoint before it and shows the new branch.
	p.do(t, "edit", chromedp.Click(`#messages .msg.human[data-index="2"] .edit`))
	send("edit-text", "edit-send", "tell me a poem instead")
	p.waitText(t, "#status", equals("idle"))
	waitShown("after the edit", []string{"human:tell me a story", "ai:" + useStreamStory, "human:tell me a poem instead", "ai:" + useStreamPoem})
	if got := p.eval(t, `window.__forkedFrom ? window.__forkedFrom.checkpoint_id : ""`); got != afterStory.Checkpoint.CheckpointID {
		t.Fatalf("the page forked from %q, want the checkpoint after the story %q", got, afterStory.Checkpoint.CheckpointID)
	}
	head := state(thread)
	if got, want := head.texts(), shown(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("the gateway's head is %q, the page shows %q", got, want)
	}
	var history []lgSnapshot
	e.do("POST", "/threads/"+thread+"/history", map[string]any{"limit": 100}).expect(t, http.StatusOK).decode(t, &history)
	children := 0
	oldBranch := false
	for _, s := range history {
		if s.ParentCheckpoint != nil && s.ParentCheckpoint.CheckpointID == afterStory.Checkpoint.CheckpointID {
			children++
		}
		if strings.Contains(fmt.Sprint(s.texts()), "ai:Saved the note.") {
			oldBranch = true
		}
	}
	if children != 2 || !oldBranch {
		t.Fatalf("the history has %d branches after the story (want 2), the old branch kept: %v", children, oldBranch)
	}
	// The page offers both branches and switches between them.
	p.waitText(t, `#messages .msg.human[data-index="2"] .branch-at`, equals("2/2"))
	p.do(t, "previous branch", chromedp.Click(`#messages .msg.human[data-index="2"] .branch-prev`))
	waitShown("the old branch", done.texts())
	p.do(t, "next branch", chromedp.Click(`#messages .msg.human[data-index="2"] .branch-next`))
	waitShown("back on the new branch", head.texts())

	// Regenerate the poem: the page runs again without input from the
	// step before the answer (the question's checkpoint), the thread gets
	// a new answer on a new branch, and the page switches between the two
	// answers.
	p.do(t, "regenerate", chromedp.Click(`#messages .msg.ai[data-index="3"] .regenerate`))
	p.waitText(t, "#status", equals("idle"))
	waitShown("after regenerating", []string{"human:tell me a story", "ai:" + useStreamStory, "human:tell me a poem instead", "ai:" + useStreamPoem2})
	from := p.eval(t, `window.__regeneratedFrom ? window.__regeneratedFrom.checkpoint_id : ""`)
	e.do("POST", "/threads/"+thread+"/history", map[string]any{"limit": 100}).expect(t, http.StatusOK).decode(t, &history)
	var question *lgSnapshot
	answers := 0
	for i, s := range history {
		if s.Checkpoint.CheckpointID == from {
			question = &history[i]
		}
		if s.ParentCheckpoint != nil && s.ParentCheckpoint.CheckpointID == from {
			answers++
		}
	}
	if question == nil || fmt.Sprint(question.texts()) != fmt.Sprint([]string{"human:tell me a story", "ai:" + useStreamStory, "human:tell me a poem instead"}) ||
		fmt.Sprint(question.Next) != "[model]" {
		t.Fatalf("the page regenerated from %q, want the checkpoint of the question before the answer (history %+v)", from, history)
	}
	if answers != 2 {
		t.Fatalf("the question's checkpoint has %d children after regenerating, want the old answer and the new", answers)
	}
	regenerated := state(thread)
	if got, want := regenerated.texts(), shown(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("the gateway's head is %q, the page shows %q", got, want)
	}
	p.waitText(t, `#messages .msg.ai[data-index="3"] .branch-at`, equals("2/2"))
	p.do(t, "previous answer", chromedp.Click(`#messages .msg.ai[data-index="3"] .branch-prev`))
	waitShown("the first answer", head.texts())
	p.do(t, "next answer", chromedp.Click(`#messages .msg.ai[data-index="3"] .branch-next`))
	waitShown("back on the regenerated answer", regenerated.texts())

	// Edit the first question: the page forks from the thread's input
	// checkpoint, and the thread starts over on a third branch.
	p.do(t, "edit the first", chromedp.Click(`#messages .msg.human[data-index="0"] .edit`))
	send("edit-text", "edit-send", "tell me a poem")
	p.waitText(t, "#status", equals("idle"))
	waitShown("after editing the first message", []string{"human:tell me a poem", "ai:" + useStreamPoem})
	if got := p.eval(t, `window.__forkedFrom ? window.__forkedFrom.checkpoint_id : ""`); got != inputCheckpoint {
		t.Fatalf("the page forked from %q, want the input checkpoint", got)
	}
	if got, want := state(thread).texts(), shown(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("the gateway's head is %q, the page shows %q", got, want)
	}
	e.do("POST", "/threads/"+thread+"/history", map[string]any{"limit": 100}).expect(t, http.StatusOK).decode(t, &history)
	roots := 0
	for _, s := range history {
		if s.ParentCheckpoint != nil && s.ParentCheckpoint.CheckpointID == inputCheckpoint {
			roots++
		}
	}
	if roots != 2 {
		t.Fatalf("the input checkpoint has %d children, want 2", roots)
	}
	p.waitText(t, `#messages .msg.human[data-index="0"] .branch-at`, equals("2/2"))
	p.do(t, "previous first branch", chromedp.Click(`#messages .msg.human[data-index="0"] .branch-prev`))
	waitShown("the branch before the restart", regenerated.texts())

	p.checkClean(t, site.URL)
	if v := llm.Violations(); len(v) > 0 {
		t.Errorf("the model server saw invalid requests: %q", v)
	}
}
