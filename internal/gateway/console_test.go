package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go"
	"go.uber.org/zap/zaptest"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/tools"
	"github.com/natsagent/natsagent/internal/worker"
)

const consoleKey = "console-test-key-1"

// keyed makes the gateway require consoleKey, acting for tenant "acme".
func keyed(s *Server) {
	auth, err := newAuthenticator([]APIKey{{Name: "console", Tenant: "acme", SHA256: sha256.Sum256([]byte(consoleKey))}})
	if err != nil {
		panic(err)
	}
	s.auth = auth
}

// The console's files are served without a key (they hold no data), with
// their content types and the CSP; the API keeps asking for the key.
func TestConsoleAssets(t *testing.T) {
	e := newEnvWith(t, nil, keyed)

	page := e.do("GET", "/console/", nil).expect(t, http.StatusOK)
	checkConsoleHeaders(t, "/console/", page, "text/html; charset=utf-8")
	html := string(page.body)

	// Every file the page names is served, with its type.
	refs := regexp.MustCompile(`(?:src|href)="([^"#]+)"`).FindAllStringSubmatch(html, -1)
	if len(refs) < 3 {
		t.Fatalf("the page names %d files: %q", len(refs), refs)
	}
	for _, ref := range refs {
		p := path.Join("/console", ref[1])
		r := e.do("GET", p, nil).expect(t, http.StatusOK)
		checkConsoleHeaders(t, p, r, consoleTypes[path.Ext(p)])
	}

	// Every embedded script is served as JavaScript (a module served as
	// anything else does not run), and its imports exist.
	scripts := 0
	err := fs.WalkDir(consoleFiles, "console", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(consoleFiles, p)
		if err != nil {
			return err
		}
		checkNoExternalURL(t, p, string(data))
		if path.Ext(p) != ".js" {
			return nil
		}
		scripts++
		url := "/" + p
		checkConsoleHeaders(t, url, e.do("GET", url, nil).expect(t, http.StatusOK), "text/javascript; charset=utf-8")
		for _, imp := range regexp.MustCompile(`from '(\./[^']+)'`).FindAllStringSubmatch(string(data), -1) {
			target := path.Join(path.Dir(url), imp[1])
			if _, ok := consoleAssets[strings.TrimPrefix(target, ConsolePath)]; !ok {
				t.Errorf("%s imports %s, which is not served", url, target)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if scripts < 2 {
		t.Fatalf("found %d scripts", scripts)
	}

	// The CSP forbids inline code, so the page must have none.
	for _, bad := range []*regexp.Regexp{
		regexp.MustCompile(`<script(?:\s+[^>]*)?>\s*[^<\s]`), // a script with a body
		regexp.MustCompile(`\son[a-z]+\s*=`),                 // an event handler attribute
		regexp.MustCompile(`\sstyle\s*=`),                    // an inline style
		regexp.MustCompile(`<style`),
	} {
		if m := bad.FindString(html); m != "" {
			t.Errorf("the page has inline code the CSP would block: %q", m)
		}
	}

	// Revalidation is cheap.
	etag := page.header.Get("ETag")
	e.do("GET", "/console/", nil, "If-None-Match", etag).expect(t, http.StatusNotModified)

	// Around the console.
	if loc := e.redirect(t, "/console", "", http.StatusMovedPermanently); loc != ConsolePath {
		t.Fatalf("/console redirects to %q", loc)
	}
	if loc := e.redirect(t, "/", "text/html,application/xhtml+xml", http.StatusFound); loc != ConsolePath {
		t.Fatalf("/ redirects a browser to %q", loc)
	}
	if err := e.do("GET", "/", nil, "Accept", "application/json").expect(t, http.StatusNotFound).apiError(t); err.Code != "not_found" {
		t.Fatalf("/ for an API client: %+v", err)
	}
	e.do("GET", "/console/nope.js", nil).expect(t, http.StatusNotFound).apiError(t)
	e.do("POST", "/console/", nil, "Authorization", "Bearer "+consoleKey).expect(t, http.StatusMethodNotAllowed)

	// The API is as closed as before.
	e.do("GET", "/threads", nil).expect(t, http.StatusUnauthorized)
	e.do("GET", "/threads", nil, "Authorization", "Bearer "+consoleKey).expect(t, http.StatusOK)
	if h := e.do("GET", "/threads", nil, "Authorization", "Bearer "+consoleKey).header.Get("Content-Security-Policy"); h != "" {
		t.Fatalf("the API sends the console's CSP: %q", h)
	}
}

// redirect sends a GET without following redirects and returns Location.
func (e *env) redirect(t *testing.T, p, accept string, status int) string {
	t.Helper()
	req, err := http.NewRequest("GET", e.http.URL+p, nil)
	if err != nil {
		t.Fatal(err)
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	c := *e.http.Client()
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != status {
		t.Fatalf("GET %s: status %d, want %d", p, resp.StatusCode, status)
	}
	return resp.Header.Get("Location")
}

func checkConsoleHeaders(t *testing.T, p string, r response, ctype string) {
	t.Helper()
	want := map[string]string{
		"Content-Type":            ctype,
		"Content-Security-Policy": consoleCSP,
		"X-Content-Type-Options":  "nosniff",
		"Referrer-Policy":         "no-referrer",
		"X-Frame-Options":         "DENY",
	}
	for k, v := range want {
		if got := r.header.Get(k); got != v || v == "" {
			t.Errorf("%s: %s is %q, want %q", p, k, got, v)
		}
	}
	for _, d := range []string{"default-src 'none'", "script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"} {
		if !strings.Contains(r.header.Get("Content-Security-Policy"), d) {
			t.Errorf("%s: CSP lacks %q", p, d)
		}
	}
	if strings.Contains(consoleCSP, "unsafe") {
		t.Errorf("the CSP allows unsafe code: %q", consoleCSP)
	}
}

// checkNoExternalURL fails on a URL of another origin in a console file;
// the one allowed is SVG's XML namespace, which is a name, not a fetch.
func checkNoExternalURL(t *testing.T, name, text string) {
	t.Helper()
	for _, m := range regexp.MustCompile(`(?:https?:)?//[A-Za-z0-9.-]+\.[A-Za-z]{2,}[^\s"'<>)]*`).FindAllString(text, -1) {
		if m == "http://www.w3.org/2000/svg" {
			continue
		}
		t.Errorf("%s refers to %s: the console must fetch nothing from elsewhere", name, m)
	}
}

// workdirs keeps one in-memory workdir per thread, shared by the worker and
// the gateway as a deployment's object store would be.
type workdirs struct {
	mu sync.Mutex
	m  map[string]*files.Memory
}

func (w *workdirs) open(tenant, thread string) files.Workdir {
	w.mu.Lock()
	defer w.mu.Unlock()
	k := tenant + "/" + thread
	if w.m[k] == nil {
		w.m[k] = files.NewMemory()
	}
	return w.m[k]
}

// startFileWorker is env.startWorker with workdirs for the file tools,
// and more tools the chatbot may call.
func (e *env) startFileWorker(m model.Model, wd *workdirs, extra ...tools.Tool) {
	e.t.Helper()
	nc, err := nats.Connect(e.srv.URL(), nats.MaxReconnects(-1))
	if err != nil {
		e.t.Fatal(err)
	}
	reg := tools.NewRegistry()
	profile := agent.Chatbot()
	for _, tl := range extra {
		reg.Register(tl)
		profile.Tools = append(profile.Tools, tl.Spec().Name)
	}
	agents, err := agent.NewAgents(m, reg, profile)
	if err != nil {
		e.t.Fatal(err)
	}
	w, err := worker.New(context.Background(), nc, worker.Config{
		Settings: e.settings, Concurrency: 4, Agents: agents, Logger: zaptest.NewLogger(e.t),
		WaitPoll: 200 * time.Millisecond, ShutdownGrace: 5 * time.Second, Files: wd.open,
	})
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	e.t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			e.t.Error("worker did not stop")
		}
		nc.Close()
	})
}

// emitTool publishes the events other middlewares and tools emit
// (subagents, context compression, todos, anything custom), so the test
// sees the console render each, whoever produces them in a deployment.
type emitTool struct{}

func (emitTool) Spec() model.ToolSpec {
	return model.ToolSpec{Name: "emit_events", Description: "test", Parameters: json.RawMessage(`{"type":"object"}`)}
}

func (emitTool) Call(_ context.Context, c *tools.Call) (*tools.Result, error) {
	child := map[string]any{"run_id": "child1", "thread_id": "childthread", "subagent": "researcher", "tool_call_id": c.ID}
	with := func(kv ...any) map[string]any {
		out := map[string]any{}
		for k, v := range child {
			out[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			out[kv[i].(string)] = kv[i+1]
		}
		return out
	}
	c.Env.Emit("subagent.started", with("status", "pending"))
	c.Env.Emit("subagent.progress", with("line", "reading sources"))
	c.Env.Emit("subagent.finished", with("status", "success"))
	c.Env.Emit("context_compression", map[string]any{"phase": "completed", "reason": "trigger", "tokens_before": 90000, "tokens_after": 12000})
	c.Env.Emit("state.todos", map[string]any{"todos": []map[string]string{
		{"content": "gather facts", "status": "completed"}, {"content": "write summary", "status": "in_progress"}}})
	c.Env.Emit("demo.custom", map[string]any{"note": "<b>not markup</b>"})
	return tools.Text("emitted"), nil
}

// chromium finds a headless Chromium; NATSAGENT_CHROMIUM names one.
func chromium() string {
	if p := os.Getenv("NATSAGENT_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// tab is a headless browser tab that records what the page fetched and
// every error it reported.
type tab struct {
	ctx context.Context

	mu       sync.Mutex
	requests []string
	problems []string
}

// openBrowserFor is openBrowser with the time the whole tab may take.
func openBrowserFor(t *testing.T, limit time.Duration) *tab {
	t.Helper()
	bin := chromium()
	if bin == "" {
		msg := "headless Chromium not found (Debian: apt-get install chromium; or set NATSAGENT_CHROMIUM)"
		if os.Getenv("NATSAGENT_BROWSER_TESTS") == "1" {
			t.Fatal(msg + "; NATSAGENT_BROWSER_TESTS=1 requires it")
		}
		t.Skip(msg + "; set NATSAGENT_BROWSER_TESTS=1 to make this a failure")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin),
		// CI containers run as root or without user namespaces, where
		// Chromium's sandbox cannot start; the page is our own.
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.WindowSize(1280, 900),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	p := &tab{}
	ctx, cancelTab := chromedp.NewContext(actx, chromedp.WithListener(p.listen))
	ctx, cancelTimeout := context.WithTimeout(ctx, limit)
	t.Cleanup(func() {
		cancelTimeout()
		cancelTab()
		cancelAlloc()
	})
	p.ctx = ctx
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	return p
}

// listen runs in the tab's event loop: record and return.
func (p *tab) listen(ev any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch ev := ev.(type) {
	case *network.EventRequestWillBeSent:
		p.requests = append(p.requests, ev.Request.URL)
	case *runtime.EventExceptionThrown:
		text := ev.ExceptionDetails.Text
		if ev.ExceptionDetails.Exception != nil {
			text += " " + ev.ExceptionDetails.Exception.Description
		}
		p.problems = append(p.problems, "exception: "+text)
	case *runtime.EventConsoleAPICalled:
		if ev.Type == runtime.ConsoleAPICalledTypeError || ev.Type == runtime.ConsoleAPICalledTypeAssert {
			p.problems = append(p.problems, "console."+string(ev.Type))
		}
	case *log.EventEntryAdded:
		// The API's expected 401 is logged by the network source; a CSP
		// violation or a blocked fetch is not.
		if ev.Entry.Source != log.EntrySourceNetwork && ev.Entry.Level == log.EntryLevelError {
			p.problems = append(p.problems, fmt.Sprintf("%s: %s", ev.Entry.Source, ev.Entry.Text))
		}
	}
}

func (p *tab) do(t *testing.T, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(p.ctx, actions...); err != nil {
		p.fail(t, what, err)
	}
}

// text waits until the element's text satisfies ok, and returns it.
func (p *tab) waitText(t *testing.T, sel string, ok func(string) bool) string {
	t.Helper()
	return p.waitEval(t, sel, fmt.Sprintf(`(document.querySelector(%q) || {}).textContent || ""`, sel), ok)
}

// waitFollowing waits until the run page's event stream is open: the
// gateway follows the run from then on, so the live events (token
// deltas) the model sends after it reach the page.
func (p *tab) waitFollowing(t *testing.T) {
	t.Helper()
	p.waitEval(t, "the run's event stream", `(document.querySelector("#timeline") || {dataset: {}}).dataset.following || ""`, equals("true"))
}

// waitEval waits until expr, a string expression, satisfies ok.
func (p *tab) waitEval(t *testing.T, what, expr string, ok func(string) bool) string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	last := ""
	for time.Now().Before(deadline) {
		v, err := chromedp.Run(p.ctx, chromedp.Evaluate[string](expr))
		if err != nil {
			p.fail(t, "read "+what, err)
		}
		if ok(v) {
			return v
		}
		last = v
		time.Sleep(50 * time.Millisecond)
	}
	p.fail(t, "wait for "+what, fmt.Errorf("it is still %q", last))
	return ""
}

func (p *tab) eval(t *testing.T, expr string) string {
	t.Helper()
	v, err := chromedp.Run(p.ctx, chromedp.Evaluate[string](expr))
	if err != nil {
		p.fail(t, expr, err)
	}
	return v
}

// fail reports what the page showed, to tell a broken page from a slow one.
// checkClean fails the test when the page shows an error in #error,
// reported problems, or fetched anything outside origin.
func (p *tab) checkClean(t *testing.T, origin string) {
	t.Helper()
	if got := p.eval(t, `(document.querySelector("#error") || {}).textContent || ""`); got != "" {
		t.Fatalf("the page reported an error: %s", got)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.problems) > 0 {
		t.Errorf("the page reported problems: %q", p.problems)
	}
	for _, u := range p.requests {
		if !strings.HasPrefix(u, origin+"/") {
			t.Errorf("the page fetched %s, outside its origin", u)
		}
	}
}

func (p *tab) fail(t *testing.T, what string, err error) {
	t.Helper()
	body, _ := chromedp.Run(context.WithoutCancel(p.ctx), chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
	p.mu.Lock()
	defer p.mu.Unlock()
	t.Fatalf("%s: %v\nproblems: %q\npage text:\n%s", what, err, p.problems, body)
}

func equals(want string) func(string) bool { return func(s string) bool { return s == want } }

func contains(want string) func(string) bool {
	return func(s string) bool { return strings.Contains(s, want) }
}

// The console in a real browser against a real gateway, worker and
// JetStream, with an API key: the page asks for the key, a run submitted
// in the page streams its answer, a run stopped for approval is approved
// in the page and finishes, and the page fetched nothing from elsewhere.
func TestConsoleInBrowser(t *testing.T) {
	// A whole session on a shared, loaded machine: generous.
	p := openBrowserFor(t, 3*time.Minute)
	// Some answers wait until the page follows their run: deltas and
	// progress lines are live, so a page that joins after them sees none.
	gates := map[string]*gate{"hello there": newGate(t), "show me events": newGate(t)}
	m := model.NewScripted(func(_ int, req *model.Request) model.Reply {
		last := req.Messages[len(req.Messages)-1]
		if g := gates[last.Content]; g != nil {
			g.wait()
		}
		switch {
		case last.Role == model.RoleTool:
			return model.Reply{Text: "Saved the note.", Pieces: 2}
		case strings.Contains(last.Content, "save"):
			return model.Reply{ToolCalls: []model.ToolCall{{ID: "w1", Name: "write_file",
				Arguments: `{"path":"/notes.txt","content":"remember the milk"}`}}}
		case strings.Contains(last.Content, "events"):
			return model.Reply{ToolCalls: []model.ToolCall{{ID: "e1", Name: "emit_events", Arguments: `{}`}}}
		case strings.Contains(last.Content, "slowly"):
			return model.Reply{Text: strings.Repeat("word ", 100), Pieces: 100, PieceDelay: 100 * time.Millisecond}
		}
		return model.Reply{Text: "Hello from the scripted model, streamed.", Pieces: 6, PieceDelay: 20 * time.Millisecond}
	})
	wd := &workdirs{m: map[string]*files.Memory{}}
	e := newEnvWith(t, nil, func(s *Server) {
		keyed(s)
		s.cfg.Files = wd.open
	})
	e.startFileWorker(m, wd, emitTool{})
	base := e.http.URL

	// The page asks for the key once.
	p.do(t, "open the console", chromedp.Navigate(base+"/"))
	p.do(t, "give the key",
		chromedp.WaitVisible(chromedp.ID("key-input")),
		typeInto(chromedp.ID("key-input"), consoleKey),
		chromedp.Click(chromedp.ID("key-save")),
		chromedp.WaitVisible(chromedp.ID("threads-h")))
	p.waitText(t, "#threads", contains("No threads yet"))
	if got := p.eval(t, `sessionStorage.getItem("natsagent.console.key") || ""`); got != consoleKey {
		t.Fatalf("the key in sessionStorage is %q", got)
	}

	// A run submitted in the page streams its answer.
	p.do(t, "submit a run",
		typeInto(chromedp.ID("run-thread"), "web"),
		typeInto(chromedp.ID("run-message"), "hello there"),
		chromedp.Click(chromedp.ID("run-submit")))
	p.waitFollowing(t)
	gates["hello there"].open()
	p.waitText(t, "#run-status", equals("success"))
	p.waitText(t, "#timeline .message.assistant .text", equals("Hello from the scripted model, streamed."))
	if n := p.eval(t, `document.querySelector("#timeline .message.assistant").dataset.deltas`); n != "6" {
		t.Fatalf("the answer came in %s deltas, want 6: it was not streamed", n)
	}
	p.waitText(t, "#timeline .message.user", contains("hello there"))
	p.waitText(t, "#context-text", contains("tokens"))
	p.waitText(t, "#run-usage-total", func(s string) bool { return s != "" && s != "0" })
	if !strings.HasPrefix(p.eval(t, "location.hash"), "#/threads/web/runs/") {
		t.Fatalf("the page shows %s", p.eval(t, "location.hash"))
	}

	// A run that wants to write a file stops for approval; approve it in
	// the page and it finishes.
	p.do(t, "open the thread",
		chromedp.Click(chromedp.ID("run-thread-link")),
		chromedp.WaitVisible(chromedp.ID("send-h")))
	p.waitText(t, "#runs", contains("success"))
	p.do(t, "submit a run that writes",
		typeInto(chromedp.ID("run-message"), "please save a note"),
		chromedp.Click(chromedp.ID("run-submit")))
	p.waitText(t, "#run-status", equals("interrupted"))
	firstRun := p.eval(t, "location.hash")
	p.waitText(t, "#approval-form legend", contains("write_file"))
	p.waitText(t, "#approval-form .tool-args", contains("remember the milk"))
	p.do(t, "approve",
		chromedp.Click(chromedp.ID("decision-0-approve")),
		chromedp.Click(chromedp.ID("approval-send")))
	p.waitText(t, "#run-status", equals("success"))
	if p.eval(t, "location.hash") == firstRun {
		t.Fatal("the page still shows the interrupted run")
	}
	p.waitText(t, `#timeline .tool[data-status="success"] .tool-name`, equals("write_file"))
	p.waitText(t, "#timeline .tool .tool-result", contains("Created /notes.txt"))
	p.waitText(t, "#timeline .message.assistant .text", equals("Saved the note."))

	// The interrupted run, seen again, knows it was answered.
	p.do(t, "back to the interrupted run", chromedp.Navigate(base+"/console/"+firstRun))
	p.waitText(t, "#run-status", equals("interrupted"))
	p.waitText(t, "#interrupt-answered", contains("came after it"))

	// The thread shows the file the approved call wrote.
	p.do(t, "open the thread again", chromedp.Click(chromedp.ID("run-thread-link")))
	p.waitText(t, "#files", contains("/notes.txt"))

	// Steer a running run: the page follows the steer run, and the
	// steered run says what replaced it.
	p.do(t, "submit a slow run",
		typeInto(chromedp.ID("run-message"), "count slowly"),
		chromedp.Click(chromedp.ID("run-submit")))
	p.waitText(t, "#timeline .message.assistant .text", contains("word"))
	slow := p.eval(t, "location.hash")
	p.do(t, "steer",
		typeInto(chromedp.ID("steer-message"), "change of plan"),
		chromedp.Click(chromedp.ID("steer-send")))
	p.waitText(t, "#run-status", equals("success"))
	p.waitText(t, "#timeline .message.user", contains("change of plan"))
	steer := p.eval(t, "location.hash")
	if steer == slow {
		t.Fatal("the page did not follow the steer run")
	}
	p.do(t, "back to the steered run", chromedp.Navigate(base+"/console/"+slow))
	p.waitText(t, "#run-status", equals("steered"))
	p.waitText(t, "#superseded-link", func(s string) bool { return s != "" })
	if link := p.eval(t, `document.querySelector("#superseded-link").getAttribute("href")`); link != steer {
		t.Fatalf("the steered run links to %s, want %s", link, steer)
	}

	// Events of other parts: subagents, compression, todos, custom ones,
	// shown as text (never as markup).
	p.do(t, "open the thread for events", chromedp.Click(chromedp.ID("run-thread-link")))
	p.do(t, "submit a run that emits",
		typeInto(chromedp.ID("run-message"), "show me events"),
		chromedp.Click(chromedp.ID("run-submit")))
	p.waitFollowing(t)
	gates["show me events"].open()
	p.waitText(t, "#run-status", equals("success"))
	p.waitText(t, "#subagents", contains("researcher success"))
	p.waitText(t, "#subagents", contains("reading sources"))
	if link := p.eval(t, `document.querySelector("#subagents a").getAttribute("href")`); link != "#/threads/childthread/runs/child1" {
		t.Fatalf("the subagent links to %s", link)
	}
	p.waitText(t, "#compressions", contains("phase: completed"))
	p.waitText(t, "#todos", contains("in progress write summary"))
	p.waitText(t, "#event-log", contains("demo.custom"))
	if n := p.eval(t, `String(document.querySelectorAll("#event-log b").length)`); n != "0" {
		t.Fatal("event data became markup")
	}

	// Cancel a running run.
	p.do(t, "open the thread for a cancel", chromedp.Click(chromedp.ID("run-thread-link")))
	p.do(t, "submit a run to cancel",
		typeInto(chromedp.ID("run-message"), "talk slowly"),
		chromedp.Click(chromedp.ID("run-submit")))
	p.waitText(t, "#timeline .message.assistant .text", contains("word"))
	p.do(t, "cancel", chromedp.Click(chromedp.ID("cancel-run")))
	p.waitText(t, "#run-status", equals("cancelled"))
	if hidden := p.eval(t, `String(document.querySelector("#run-controls").hidden)`); hidden != "true" {
		t.Fatal("steer and cancel are still offered on a finished run")
	}

	if open := p.eval(t, `String(document.getElementById("key-dialog").open)`); open != "false" {
		t.Fatal("the page asks for the key again")
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.problems) > 0 {
		t.Errorf("the page reported problems: %q", p.problems)
	}
	if len(p.requests) < 10 {
		t.Fatalf("recorded %d requests", len(p.requests))
	}
	for _, u := range p.requests {
		if !strings.HasPrefix(u, base+"/") && !strings.HasPrefix(u, "blob:") && !strings.HasPrefix(u, "data:") {
			t.Errorf("the page fetched %s, outside the gateway", u)
		}
		if strings.Contains(u, consoleKey) {
			t.Errorf("the key is in a URL: %s", u)
		}
	}
}

// gate holds a scripted model's answer until the test opens it.
type gate struct {
	ch   chan struct{}
	once sync.Once
}

func newGate(t *testing.T) *gate {
	g := &gate{ch: make(chan struct{})}
	t.Cleanup(g.open)
	return g
}

func (g *gate) wait() { <-g.ch }
func (g *gate) open() { g.once.Do(func() { close(g.ch) }) }

// typeInto types text into the element sel names, as chromedp.SendKeys
// does for anything but a file input. SendKeys (chromedp v0.23.1) reads
// the node's attributes before it takes the node's lock, while chromedp's
// DOM event handler writes them under it: the race detector reported it
// once, in TestAgentChatUIStartInBrowser under load. Focus reads only the
// node's id.
func typeInto[S chromedp.Selectable](sel S, text string) chromedp.Action[chromedp.Void] {
	return chromedp.Steps(chromedp.Focus(sel, chromedp.NodeVisible), chromedp.KeyEvent(text))
}
