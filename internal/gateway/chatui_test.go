package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestAgentChatUIStartInBrowser runs, in headless Chromium, a page that
// makes Agent Chat UI's start-up calls with the official SDK
// (testdata/usestream/src/chatui.jsx): GET /info, assistants.search for the graph
// picker, threads.search on metadata graph_id with limit 100 for the
// history, useStream with fetchStateHistory on a chosen thread, and a
// submit on it and on a new thread. It checks the history lists the
// graph's threads of the tenant newest first (not another graph's, not
// another tenant's), a chosen thread shows the messages the gateway
// stored, and a thread a run touches moves to the top, a new one too,
// tagged with its graph and assistant as LangGraph tags them.
func TestAgentChatUIStartInBrowser(t *testing.T) {
	dist := buildUseStreamPage(t)
	p := openBrowserFor(t, 3*time.Minute)
	e := newEnv(t, echoModel())

	e.do("POST", "/threads/old1/runs/wait", with(input("first question"), "assistant_id", "chatbot")).expect(t, http.StatusOK)
	e.do("POST", "/threads/old2/runs/wait", with(input("second question"), "assistant_id", "chatbot")).expect(t, http.StatusOK)
	e.do("POST", "/threads", map[string]any{"thread_id": "elsewhere", "metadata": map[string]any{"graph_id": "other"}}).expect(t, http.StatusOK)
	e.do("POST", "/threads/theirs/runs/wait", with(input("not yours"), "assistant_id", "chatbot"), "X-Tenant", "tb").expect(t, http.StatusOK)

	mux := http.NewServeMux()
	mux.Handle("/app/", http.StripPrefix("/app/", http.FileServer(http.Dir(dist))))
	mux.Handle("/", e.gw.Handler())
	site := httptest.NewServer(mux)
	t.Cleanup(func() {
		site.CloseClientConnections()
		site.Close()
	})

	history := func() []string {
		t.Helper()
		var ids []string
		if err := json.Unmarshal([]byte(p.eval(t, `JSON.stringify([...document.querySelectorAll("#history .thread")].map((el) => el.dataset.id))`)), &ids); err != nil {
			t.Fatal(err)
		}
		return ids
	}
	waitHistory := func(what string, ok func([]string) bool) []string {
		t.Helper()
		p.waitEval(t, what, `JSON.stringify([...document.querySelectorAll("#history .thread")].map((el) => el.dataset.id))`, func(s string) bool {
			var ids []string
			return json.Unmarshal([]byte(s), &ids) == nil && ok(ids)
		})
		return history()
	}
	shown := func() []string {
		t.Helper()
		var out []string
		if err := json.Unmarshal([]byte(p.eval(t, `JSON.stringify([...document.querySelectorAll("#messages .msg")].map(
			(el) => el.querySelector(".type").textContent + ":" + el.querySelector(".text").textContent))`)), &out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	stored := func(thread string) []string {
		t.Helper()
		var s lgSnapshot
		e.do("GET", "/threads/"+thread+"/state", nil).expect(t, http.StatusOK).decode(t, &s)
		return s.texts()
	}
	waitShown := func(what string, want []string) {
		t.Helper()
		p.waitEval(t, what, `JSON.stringify([...document.querySelectorAll("#messages .msg")].map(
			(el) => el.querySelector(".type").textContent + ":" + el.querySelector(".text").textContent))`, equals(mustJSON(want)))
	}

	p.do(t, "open the page", chromedp.Navigate(site.URL+"/app/chatui.html?assistantId=chatbot"), chromedp.WaitVisible(chromedp.ID("message")))

	// The server check Agent Chat UI makes first.
	p.waitText(t, "#server", equals("ok"))
	// The graph picker: the deployment's graph as its system assistant.
	p.waitText(t, "#graphs-state", equals("1"))
	if got := p.eval(t, `document.querySelector("#graphs option").value + " " + document.querySelector("#graphs option").dataset.assistant`); got != "chatbot "+systemAssistantID("chatbot") {
		t.Fatalf("the graph picker offers %q", got)
	}
	// The history: the tenant's threads of the graph, newest first.
	if got := waitHistory("the history", func(ids []string) bool { return len(ids) > 0 }); fmt.Sprint(got) != "[old2 old1]" {
		t.Fatalf("the history lists %v, want [old2 old1]", got)
	}
	// Titled with the first message of the thread's values, which the
	// search returns.
	if got := p.eval(t, `document.querySelector('#history .thread[data-id="old1"] .open').textContent`); got != "first question" {
		t.Fatalf("the history titles old1 %q, want its first message", got)
	}

	// A chosen thread shows what the gateway stored (its history).
	p.do(t, "open old1", chromedp.Click(`#history .thread[data-id="old1"] .open`))
	want := []string{"human:first question", "ai:echo: first question"}
	if got := stored("old1"); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("the gateway stored %q", got)
	}
	waitShown("old1's messages", want)

	// A message on it: the answer shows, and old1 moves to the top.
	p.do(t, "send on old1", typeInto(chromedp.ID("message"), "follow up"), chromedp.Click(chromedp.ID("send")))
	want = append(want, "human:follow up", "ai:echo: follow up")
	waitShown("old1 after the follow-up", want)
	p.waitText(t, "#status", equals("idle"))
	if got := stored("old1"); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("the gateway stored %q, the page shows %q", got, shown())
	}
	waitHistory("old1 first", func(ids []string) bool { return fmt.Sprint(ids) == "[old1 old2]" })

	// A new chat: the SDK creates the thread, the run tags it with its
	// graph and assistant, and the history lists it first.
	p.do(t, "new chat", chromedp.Click(chromedp.ID("new")))
	waitShown("an empty chat", []string{})
	p.do(t, "send on a new thread", typeInto(chromedp.ID("message"), "hello there"), chromedp.Click(chromedp.ID("send")))
	waitShown("the new thread", []string{"human:hello there", "ai:echo: hello there"})
	p.waitText(t, "#status", equals("idle"))
	thread := p.waitText(t, "#thread", func(s string) bool { return s != "" })
	got := waitHistory("the new thread first", func(ids []string) bool { return len(ids) == 3 })
	if fmt.Sprint(got) != fmt.Sprint([]string{thread, "old1", "old2"}) {
		t.Fatalf("the history lists %v after the new chat %s", got, thread)
	}
	var th threadView
	e.do("GET", "/threads/"+thread, nil).expect(t, http.StatusOK).decode(t, &th)
	if th.Metadata["graph_id"] != "chatbot" || th.Metadata["assistant_id"] != systemAssistantID("chatbot") {
		t.Fatalf("the new thread's metadata %v", th.Metadata)
	}

	p.checkClean(t, site.URL)
}

func mustJSON(v any) string {
	data, _ := json.Marshal(v)
	return string(data)
}
