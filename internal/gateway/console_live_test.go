package gateway

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/model"
)

// signIn opens the console at url and gives it consoleKey when it asks.
func (p *tab) signIn(t *testing.T, url string) {
	t.Helper()
	p.do(t, "open the console", chromedp.Navigate(url))
	p.do(t, "give the key",
		chromedp.WaitVisible(chromedp.ID("key-input")),
		typeInto(chromedp.ID("key-input"), consoleKey),
		chromedp.Click(chromedp.ID("key-save")),
		chromedp.WaitVisible(chromedp.ID("threads-h")))
}

// lastUser is the text of the last user message of a model request.
func lastUser(req *model.Request) string {
	for i := len(req.Messages) - 1; i >= 0; i-- {
		if req.Messages[i].Role == model.RoleUser {
			return req.Messages[i].Content
		}
	}
	return ""
}

// A run that streams its whole answer at once, submitted in the page: the
// page shows every delta, because it submits and follows the run in one
// request. A page that submitted first and followed after (POST /runs,
// then GET .../stream) joined after the deltas and showed the text only
// from message.completed. The prompt shows first, and every item and
// event has its time.
func TestConsoleQuickRunShowsEveryDelta(t *testing.T) {
	p := openBrowserFor(t, 3*time.Minute)
	const answer = "Quick answers stream too: each of these words reaches the page as a delta of its own."
	pieces := len(strings.Fields(answer)) // one word a delta
	m := model.NewScripted(func(int, *model.Request) model.Reply {
		return model.Reply{Text: answer, Pieces: pieces}
	})
	e := newEnvWith(t, m, keyed)
	base := e.http.URL
	p.signIn(t, base+"/console/")

	p.do(t, "submit a quick run",
		typeInto(chromedp.ID("run-message"), "be quick <b>now</b>"),
		chromedp.Click(chromedp.ID("run-submit")))
	p.waitText(t, "#run-status", equals("success"))
	p.waitText(t, "#timeline .message.assistant .text", equals(answer))
	msg := `document.querySelector("#timeline .message.assistant")`
	if n := p.eval(t, msg+`.dataset.deltas`); n != strconv.Itoa(pieces) {
		t.Fatalf("the page showed %s of the run's %d deltas: it followed the run after it began streaming", n, pieces)
	}
	if n := p.eval(t, msg+`.dataset.streamedChars`); n != strconv.Itoa(len(answer)) {
		t.Fatalf("the deltas shown carry %s characters, the answer has %d", n, len(answer))
	}

	// The prompt comes first, as text.
	if got := p.eval(t, `document.querySelector("#timeline > li").className + "|" + document.querySelector("#timeline > li .text").textContent`); got != "message user|be quick <b>now</b>" {
		t.Fatalf("the first item of the conversation is %q", got)
	}
	if n := p.eval(t, `String(document.querySelectorAll("#timeline b").length)`); n != "0" {
		t.Fatal("the prompt became markup")
	}

	// Every conversation item and every logged event has a time.
	for _, sel := range []string{"#timeline > li", "#event-log > li"} {
		got := p.eval(t, fmt.Sprintf(`(() => {
			const items = [...document.querySelectorAll(%q)];
			const timed = items.filter((li) => {
				const c = li.querySelector("time.clock");
				return c && /^\d\d:\d\d:\d\d$/.test(c.textContent) && !Number.isNaN(Date.parse(c.getAttribute("datetime")));
			});
			return items.length + "/" + timed.length;
		})()`, sel))
		var all, timed int
		if _, err := fmt.Sscanf(got, "%d/%d", &all, &timed); err != nil || all < 2 || timed != all {
			t.Fatalf("%s: %s items have a time (all/timed)", sel, got)
		}
	}
	p.checkClean(t, base)
}

// While a run streams, the page shows its token totals: what each
// finished model call reported, and an estimate for the text streaming
// now; once the run ended, the record's totals. An approval answered
// elsewhere (here over HTTP) takes the form off the page, and the thread's
// run list no longer says the run waits.
func TestConsoleLiveTotalsAndAnsweredApproval(t *testing.T) {
	p := openBrowserFor(t, 3*time.Minute)
	m := model.NewScripted(func(_ int, req *model.Request) model.Reply {
		last := req.Messages[len(req.Messages)-1]
		asked := lastUser(req)
		switch {
		case strings.Contains(asked, "two steps") && last.Role == model.RoleTool:
			// Long enough to be seen streaming on a loaded machine; the
			// test cancels it.
			return model.Reply{Text: strings.Repeat("tick ", 600), Pieces: 600, PieceDelay: 100 * time.Millisecond,
				Usage: &model.Usage{PromptTokens: 150, CompletionTokens: 40, TotalTokens: 190}}
		case strings.Contains(asked, "two steps"):
			return model.Reply{ToolCalls: []model.ToolCall{{ID: "e1", Name: "emit_events", Arguments: `{}`}},
				Usage: &model.Usage{PromptTokens: 100, CompletionTokens: 20, TotalTokens: 120}}
		case last.Role == model.RoleTool:
			return model.Reply{Text: "Saved the note."}
		case strings.Contains(asked, "save"):
			return model.Reply{ToolCalls: []model.ToolCall{{ID: "w1", Name: "write_file",
				Arguments: `{"path":"/notes.txt","content":"remember the milk"}`}}}
		}
		return model.Reply{Text: "ok"}
	})
	wd := &workdirs{m: map[string]*files.Memory{}}
	e := newEnvWith(t, nil, func(s *Server) {
		keyed(s)
		s.cfg.Files = wd.open
	})
	e.startFileWorker(m, wd, emitTool{})
	base := e.http.URL
	auth := []string{"Authorization", "Bearer " + consoleKey}
	p.signIn(t, base+"/console/")

	p.do(t, "submit a run of two model calls",
		typeInto(chromedp.ID("run-thread"), "live"),
		typeInto(chromedp.ID("run-message"), "two steps please"),
		chromedp.Click(chromedp.ID("run-submit")))
	// The first call finished and is counted; the second streams, estimated.
	live := `["#run-status", "#run-usage-calls", "#run-usage-input", "#run-usage-output", "#run-usage-total", "#run-usage-streaming"]
		.map((s) => (document.querySelector(s) || {}).textContent || "").join("|")`
	p.waitEval(t, "the live totals", live, func(s string) bool {
		f := strings.Split(s, "|")
		return len(f) == 6 && f[0] == "running" && f[1] == "1" && f[2] == "100" && f[3] == "20" && f[4] == "120" &&
			strings.HasPrefix(f[5], "≈ ") && f[5] != "≈ 0 output tokens"
	})
	p.waitText(t, "#run-usage-note", contains("estimated"))
	// The estimate grows with the streamed text.
	first := p.eval(t, `document.querySelector("#run-usage-streaming").textContent`)
	p.waitText(t, "#run-usage-streaming", func(s string) bool { return s != first && s != "" })

	runHash := p.eval(t, "location.hash")
	runID := runHash[strings.LastIndex(runHash, "/")+1:]
	p.do(t, "cancel", chromedp.Click(chromedp.ID("cancel-run")))
	p.waitText(t, "#run-status", equals("cancelled"))
	// The record's totals replace the live ones.
	var rec struct {
		Usage *struct {
			Total struct {
				TotalTokens int `json:"total_tokens"`
			} `json:"total"`
		} `json:"usage"`
	}
	e.do("GET", "/threads/live/runs/"+runID, nil, auth...).expect(t, http.StatusOK).decode(t, &rec)
	if rec.Usage == nil || rec.Usage.Total.TotalTokens < 120 {
		t.Fatalf("the record's usage: %+v", rec.Usage)
	}
	p.waitText(t, "#run-usage-note", contains("from its record"))
	if got, want := p.eval(t, `document.querySelector("#run-usage-total").textContent`), fmt.Sprint(rec.Usage.Total.TotalTokens); got != want {
		t.Fatalf("the page shows %s tokens, the record %s", got, want)
	}
	if n := p.eval(t, `String(document.querySelectorAll("#run-usage-streaming").length)`); n != "0" {
		t.Fatal("an ended run still shows text streaming")
	}

	// An approval answered elsewhere.
	p.do(t, "open the thread", chromedp.Click(chromedp.ID("run-thread-link")), chromedp.WaitVisible(chromedp.ID("send-h")))
	p.do(t, "submit a run that writes",
		typeInto(chromedp.ID("run-message"), "please save a note"),
		chromedp.Click(chromedp.ID("run-submit")))
	p.waitText(t, "#run-status", equals("interrupted"))
	p.waitText(t, "#approval-form legend", contains("write_file"))
	asked := p.eval(t, "location.hash")
	asked = asked[strings.LastIndex(asked, "/")+1:]
	answer := e.do("POST", "/threads/live/runs", map[string]any{"run_id": "answeredelsewhere",
		"command": map[string]any{"resume": map[string]any{"decisions": []map[string]any{{"type": "approve"}}}}}, auth...).
		expect(t, http.StatusOK).run(t)
	p.waitText(t, "#interrupt-answered", contains("answeredelsewhere came after it"))
	if n := p.eval(t, `String(document.querySelectorAll("#approval-form").length)`); n != "0" {
		t.Fatal("the approval form is still offered")
	}
	if got := p.eval(t, "location.hash"); !strings.HasSuffix(got, "/"+asked) {
		t.Fatalf("the page left the interrupted run for %s", got)
	}
	waitRunEnded(t, e, "live", answer.RunID, auth)

	p.do(t, "open the thread again", chromedp.Click(chromedp.ID("run-thread-link")))
	row := fmt.Sprintf(`#runs tr[data-run-id=%q] .run-note`, asked)
	p.waitText(t, row, contains("answered"))
	if got := p.eval(t, `document.querySelector("#runs").textContent`); strings.Contains(got, "waits for") {
		t.Fatalf("the run list still says a run waits: %s", got)
	}
	p.checkClean(t, base)
}

// waitRunEnded waits until a run ended, read over HTTP with auth.
func waitRunEnded(t *testing.T, e *env, thread, run string, auth []string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		rec := e.do("GET", "/threads/"+thread+"/runs/"+run, nil, auth...).expect(t, http.StatusOK).run(t)
		if rec.Status.Terminal() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s is still %s", run, rec.Status)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The thread list: a page at a time, a status filter, a search by id and
// by metadata, delete after a confirmation, and only the tenant's threads
// (another tenant's, with the same metadata, never shows). A title
// holding markup stays text.
func TestConsoleThreads(t *testing.T) {
	p := openBrowserFor(t, 3*time.Minute)
	m := model.NewScripted(func(_ int, req *model.Request) model.Reply {
		if req.Messages[len(req.Messages)-1].Role == model.RoleTool {
			return model.Reply{Text: "done"}
		}
		if strings.Contains(lastUser(req), "slowly") {
			return model.Reply{Text: strings.Repeat("word ", 600), Pieces: 600, PieceDelay: 100 * time.Millisecond}
		}
		return model.Reply{ToolCalls: []model.ToolCall{{ID: "w1", Name: "write_file", Arguments: `{"path":"/a.txt","content":"a"}`}}}
	})
	const otherKey = "console-test-key-other"
	wd := &workdirs{m: map[string]*files.Memory{}}
	e := newEnvWith(t, nil, func(s *Server) {
		auth, err := newAuthenticator([]APIKey{
			{Name: "console", Tenant: "acme", SHA256: sha256.Sum256([]byte(consoleKey))},
			{Name: "other", Tenant: "other", SHA256: sha256.Sum256([]byte(otherKey))},
		})
		if err != nil {
			t.Fatal(err)
		}
		s.auth = auth
		s.cfg.Files = wd.open
	})
	e.startFileWorker(m, wd)
	base := e.http.URL
	auth := []string{"Authorization", "Bearer " + consoleKey}

	// 23 idle threads, t01 oldest; five are project apollo.
	apollo := map[string]bool{}
	for i := 1; i <= 23; i++ {
		id := fmt.Sprintf("t%02d", i)
		project := "gemini"
		if i%5 == 0 {
			project = "apollo"
			apollo[id] = true
		}
		e.do("POST", "/threads", map[string]any{"thread_id": id, "metadata": map[string]any{"project": project}}, auth...).expect(t, http.StatusOK)
	}
	e.do("POST", "/threads", map[string]any{"thread_id": "theirs", "metadata": map[string]any{"project": "apollo"}},
		"Authorization", "Bearer "+otherKey).expect(t, http.StatusOK)
	// The newest: a run waiting for approval, titled from its markup-laden prompt.
	rec := e.do("POST", "/threads/waiting/runs", input(`save <b>bold</b> <img src="/console/evil.png">`), auth...).expect(t, http.StatusOK).run(t)
	waitRunEnded(t, e, "waiting", rec.RunID, auth)

	rows := `JSON.stringify([...document.querySelectorAll("#threads-table tbody tr")].map((tr) => tr.dataset.threadId))`
	shown := func(what string, ok func([]string) bool) []string {
		t.Helper()
		var ids []string
		p.waitEval(t, what, rows, func(s string) bool {
			ids = nil
			return json.Unmarshal([]byte(s), &ids) == nil && ok(ids)
		})
		return ids
	}
	n := func(k int) func([]string) bool { return func(ids []string) bool { return len(ids) == k } }

	p.signIn(t, base+"/console/")
	// Page 1: the 20 newest, the waiting thread first.
	ids := shown("the first page", n(20))
	if ids[0] != "waiting" || ids[1] != "t23" || ids[19] != "t05" {
		t.Fatalf("the first page lists %v", ids)
	}
	p.waitText(t, "#threads-page", contains("1–20"))
	if got := p.eval(t, `document.querySelector("#threads-prev").disabled + " " + document.querySelector("#threads-next").disabled`); got != "true false" {
		t.Fatalf("on the first page, prev and next disabled: %s", got)
	}
	if n := p.eval(t, `String(document.querySelectorAll("#threads-table b, #threads-table img").length)`); n != "0" {
		t.Fatal("a thread's title became markup")
	}
	p.waitText(t, `#threads-table tr[data-thread-id="waiting"] a`, contains("<b>bold</b>"))
	// Page 2: the rest; then back.
	p.do(t, "next page", chromedp.Click(chromedp.ID("threads-next")))
	if ids := shown("the second page", n(4)); fmt.Sprint(ids) != "[t04 t03 t02 t01]" {
		t.Fatalf("the second page lists %v", ids)
	}
	p.waitText(t, "#threads-page", contains("21–24"))
	if got := p.eval(t, `document.querySelector("#threads-prev").disabled + " " + document.querySelector("#threads-next").disabled`); got != "false true" {
		t.Fatalf("on the last page, prev and next disabled: %s", got)
	}
	if got := p.eval(t, "location.hash"); got != "#/?page=2" {
		t.Fatalf("the second page's fragment is %q", got)
	}
	p.do(t, "previous page", chromedp.Click(chromedp.ID("threads-prev")))
	shown("the first page again", func(ids []string) bool { return len(ids) == 20 && ids[0] == "waiting" })

	// The status filter.
	filter := func(status string) {
		t.Helper()
		p.do(t, "filter "+status, chromedp.Evaluate[chromedp.Void](fmt.Sprintf(
			`(() => { const s = document.querySelector("#threads-status"); s.value = %q; s.dispatchEvent(new Event("change")); })()`, status)))
	}
	filter("interrupted")
	if ids := shown("the interrupted threads", func(ids []string) bool { return len(ids) == 1 }); ids[0] != "waiting" {
		t.Fatalf("interrupted threads: %v", ids)
	}
	filter("idle")
	shown("the idle threads", func(ids []string) bool { return len(ids) == 20 && ids[0] == "t23" })
	filter("")
	shown("threads of any status", func(ids []string) bool { return len(ids) == 20 && ids[0] == "waiting" })

	// Search by metadata: the tenant's apollo threads, not the other
	// tenant's; the search survives a reload.
	search := func(q string) {
		t.Helper()
		p.do(t, "search "+q,
			chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`document.querySelector("#threads-query").value = %q`, q)),
			chromedp.Click(chromedp.ID("threads-search")))
	}
	search("project=apollo")
	ids = shown("the apollo threads", n(len(apollo)))
	for _, id := range ids {
		if !apollo[id] {
			t.Fatalf("project=apollo lists %v", ids)
		}
	}
	p.do(t, "reload", chromedp.Reload())
	shown("the apollo threads after a reload", n(len(apollo)))
	if got := p.eval(t, `document.querySelector("#threads-query").value`); got != "project=apollo" {
		t.Fatalf("after a reload the search box holds %q", got)
	}
	// By id; another tenant's id finds nothing.
	search("t07")
	if ids := shown("t07", n(1)); ids[0] != "t07" {
		t.Fatalf("searching t07 lists %v", ids)
	}
	search("theirs")
	p.waitText(t, "#threads", contains("No thread matches"))
	search("not an id")
	p.waitText(t, "#threads .error", contains("thread id"))
	search("")
	shown("every thread", n(20))

	// Delete: nothing happens until the person confirms.
	del := `#threads-table tr[data-thread-id="t23"] .delete-thread`
	p.do(t, "ask to delete t23", chromedp.Click(del), chromedp.WaitVisible(chromedp.ID("confirm-dialog")))
	p.waitText(t, "#confirm-text", contains("t23"))
	p.do(t, "keep it", chromedp.Click(chromedp.ID("confirm-no")))
	p.waitEval(t, "the dialog closed", `String(document.querySelectorAll("#confirm-dialog").length)`, equals("0"))
	e.do("GET", "/threads/t23", nil, auth...).expect(t, http.StatusOK)
	p.do(t, "delete t23", chromedp.Click(del), chromedp.WaitVisible(chromedp.ID("confirm-yes")), chromedp.Click(chromedp.ID("confirm-yes")))
	p.waitText(t, "#threads-note", equals("Deleted thread t23."))
	ids = shown("the list without t23", func(ids []string) bool { return len(ids) == 20 && ids[1] == "t22" })
	if ids[0] != "waiting" || ids[19] != "t04" {
		t.Fatalf("after the deletion the first page lists %v", ids)
	}
	e.do("GET", "/threads/t23", nil, auth...).expect(t, http.StatusNotFound)
	e.do("GET", "/threads/theirs", nil, "Authorization", "Bearer "+otherKey).expect(t, http.StatusOK)

	// A busy thread, deleted from its own page: the gateway refuses while
	// its run lives; the page offers to cancel the run first, and does.
	busy := e.do("POST", "/threads/busy1/runs", input("talk slowly"), auth...).expect(t, http.StatusOK).run(t)
	for deadline := time.Now().Add(30 * time.Second); ; {
		var th threadView
		e.do("GET", "/threads/busy1", nil, auth...).expect(t, http.StatusOK).decode(t, &th)
		if th.Status == "busy" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the thread is still %s", th.Status)
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.do(t, "open the busy thread", chromedp.Navigate(base+"/console/#/threads/busy1"))
	p.waitText(t, "#thread-info", contains("busy"))
	p.do(t, "delete the busy thread", chromedp.Click(chromedp.ID("delete-thread")),
		chromedp.WaitVisible(chromedp.ID("confirm-yes")), chromedp.Click(chromedp.ID("confirm-yes")))
	p.waitText(t, "#thread-note .error", contains("busy"))
	e.do("GET", "/threads/busy1", nil, auth...).expect(t, http.StatusOK)
	p.do(t, "cancel and delete", chromedp.Click(chromedp.ID("delete-cancel-run")))
	p.waitEval(t, "the thread list", "location.hash", equals("#/"))
	e.do("GET", "/threads/busy1", nil, auth...).expect(t, http.StatusNotFound)
	e.do("GET", "/threads/busy1/runs/"+busy.RunID, nil, auth...).expect(t, http.StatusNotFound)

	p.mu.Lock()
	for _, u := range p.requests {
		if strings.Contains(u, "evil.png") {
			t.Errorf("the page fetched %s: a title became markup", u)
		}
	}
	p.mu.Unlock()
	p.checkClean(t, base)
}
