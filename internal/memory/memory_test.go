package memory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/jobs"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
	"github.com/natsagent/natsagent/internal/testdeploy"
)

// env is an embedded JetStream server with natsagent provisioned and a
// memory store on it.
type env struct {
	t        *testing.T
	srv      *natstest.Server
	js       jetstream.JetStream
	settings bus.Settings
	store    *Store
	stores   *kv.Stores
}

func newEnv(t *testing.T, cfg Config) *env {
	t.Helper()
	// A long ack wait: no test here waits for a redelivery, and a 1 s one
	// could redeliver a memory job that ran (a second extraction) on a
	// loaded machine.
	d := testdeploy.Start(t, bus.Settings{AckWait: 30 * time.Second, MaxDeliver: 3})
	cfg.Names = d.Settings.Names
	if cfg.SettleDelay == 0 {
		cfg.SettleDelay = 10 * time.Millisecond
	}
	store, err := Open(context.Background(), d.JS, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, srv: d.Server, js: d.JS, settings: d.Settings, store: store, stores: d.Stores}
}

// chain assembles a profile chain with the memory middleware configured
// by settings (JSON) and returns the memory middleware.
func (e *env) memory(settings, kind string) *middleware.Memory {
	e.t.Helper()
	chain, err := middleware.Assemble(middleware.ChainConfig{Settings: map[string]json.RawMessage{"memory": json.RawMessage(settings)}},
		middleware.Env{Memory: e.store, Kind: kind, KnownTool: func(string) bool { return false }})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, m := range chain.Middlewares() {
		if mm, ok := m.(*middleware.Memory); ok {
			return mm
		}
	}
	e.t.Fatal("memory is not in the chain")
	return nil
}

type recorder struct {
	mu     sync.Mutex
	events []string
}

func (r *recorder) emit(t string, _ any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, t)
}

func (r *recorder) count(t string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.events {
		if e == t {
			n++
		}
	}
	return n
}

func runtime(t *testing.T, run, thread, user string) (*middleware.Runtime, *recorder) {
	rec := &recorder{}
	return &middleware.Runtime{RunID: run, ThreadID: thread, Tenant: protocol.DefaultTenant, Agent: "chatbot", User: user,
		Logger: zaptest.NewLogger(t), Emit: rec.emit}, rec
}

// request runs BeforeAgent and one WrapModelCall and returns the request
// the model would get.
func request(t *testing.T, m *middleware.Memory, rt *middleware.Runtime, st *state.State) *middleware.ModelRequest {
	t.Helper()
	if _, err := m.BeforeAgent(context.Background(), rt, st); err != nil {
		t.Fatal(err)
	}
	var got *middleware.ModelRequest
	_, err := m.WrapModelCall(context.Background(), rt, &middleware.ModelRequest{System: "You are helpful.", State: st, ModelName: "agent-model"},
		func(ctx context.Context, req *middleware.ModelRequest) (*middleware.ModelResponse, error) {
			got = req
			return &middleware.ModelResponse{Response: &model.Response{}}, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func offers(req *middleware.ModelRequest, tool string) bool {
	for _, s := range req.Tools {
		if s.Name == tool {
			return true
		}
	}
	return false
}

// remember calls the remember tool through the middleware.
func remember(t *testing.T, m *middleware.Memory, rt *middleware.Runtime, args string) *middleware.ToolResult {
	t.Helper()
	res, err := m.WrapToolCall(context.Background(), rt, &middleware.ToolCall{Call: model.ToolCall{ID: "c", Name: middleware.RememberTool, Arguments: args}},
		func(context.Context, *middleware.ToolCall) (*middleware.ToolResult, error) {
			t.Fatal("remember went on to the tool layer")
			return nil, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func TestNotesAreInjectedEscapedAndCapped(t *testing.T) {
	e := newEnv(t, Config{})
	ctx := context.Background()
	for _, n := range []string{"Name: Ada", "Prefers <b>short</b> answers & metric units", strings.Repeat("x", 300)} {
		if _, err := e.store.AppendNote(ctx, "default", "ada", n); err != nil {
			t.Fatal(err)
		}
	}
	m := e.memory(`{"enabled": true, "max_notes_chars": 200}`, middleware.KindLead)
	rt, _ := runtime(t, "r1", "h1", "ada")
	req := request(t, m, rt, &state.State{})
	sys := req.System
	if !strings.HasPrefix(sys, "You are helpful.\n\n<user_memory>") || !strings.HasSuffix(sys, "</user_memory>") {
		t.Fatalf("memory block not appended to the system prompt:\n%s", sys)
	}
	if !strings.Contains(sys, "- Name: Ada") || !strings.Contains(sys, "Prefers &lt;b&gt;short&lt;/b&gt; answers &amp; metric units") {
		t.Fatalf("notes missing or not escaped:\n%s", sys)
	}
	notes := sys[strings.Index(sys, "<notes>\n")+len("<notes>\n") : strings.Index(sys, "\n[")]
	if got := len([]rune(notes)); got > 200+len("&lt;&gt;&lt;/&gt;&amp;")+20 {
		t.Fatalf("notes shown are %d characters, cap is 200", got)
	}
	if !strings.Contains(sys, "more characters of notes not shown]") || strings.Contains(sys, strings.Repeat("x", 200)) {
		t.Fatalf("the cap did not apply:\n%s", sys)
	}
	if !offers(req, middleware.RememberTool) {
		t.Fatal("the lead chain does not offer remember")
	}
	// Request-only: no state update, and the caller's request is untouched.
	res, err := m.BeforeAgent(ctx, rt, &state.State{})
	if err != nil || !res.Update.Empty() {
		t.Fatalf("before_agent wrote state: %+v, %v", res, err)
	}
	orig := &middleware.ModelRequest{System: "base", Tools: []model.ToolSpec{{Name: "current_time"}}}
	m.WrapModelCall(ctx, rt, orig, func(ctx context.Context, req *middleware.ModelRequest) (*middleware.ModelResponse, error) {
		return nil, nil
	})
	if orig.System != "base" || len(orig.Tools) != 1 {
		t.Fatalf("the caller's request was edited: %+v", orig)
	}
}

func TestNoMemoryNoBlock(t *testing.T) {
	e := newEnv(t, Config{})
	m := e.memory(`{"enabled": true, "facts": {"enabled": true}}`, middleware.KindLead)
	rt, _ := runtime(t, "r1", "h1", "nobody")
	req := request(t, m, rt, &state.State{})
	if req.System != "You are helpful." || !offers(req, middleware.RememberTool) {
		t.Fatalf("system %q, tools %v", req.System, req.Tools)
	}
}

func TestRememberBoundsAndErrors(t *testing.T) {
	e := newEnv(t, Config{MaxNotesBytes: 120})
	m := e.memory(`{"enabled": true}`, middleware.KindLead)
	rt, rec := runtime(t, "r1", "h1", "bob")
	request(t, m, rt, &state.State{})

	cases := []struct{ args, want string }{
		{`{"note": ""}`, "the note is empty"},
		{`{}`, `remember takes {"note": "one line to keep"}`},
		{`{"note": "a", "extra": 1}`, `remember takes`},
		{`not json`, `remember takes`},
		{fmt.Sprintf(`{"note": %q}`, strings.Repeat("é", middleware.MaxNoteChars+1)), "the note has 501 characters; keep it under 500"},
	}
	for _, c := range cases {
		res := remember(t, m, rt, c.args)
		if res.Message.Status != model.ToolStatusError || !strings.Contains(res.Message.Content, c.want) {
			t.Errorf("%s: %+v", c.args, res.Message)
		}
	}
	res := remember(t, m, rt, `{"note": "Likes\n  green   tea"}`)
	if res.Message.Status == model.ToolStatusError || res.Message.Content != "Saved to memory." {
		t.Fatalf("remember: %+v", res.Message)
	}
	if res := remember(t, m, rt, `{"note": "likes green tea."}`); res.Message.Content != "Already in memory." {
		t.Fatalf("duplicate: %+v", res.Message)
	}
	notes, _ := e.store.Notes(context.Background(), "default", "bob")
	if notes != "- Likes green tea" {
		t.Fatalf("notes %q", notes)
	}
	// The next call of this run sees the new note, in its trailing
	// context: the system prompt keeps the memory the run started with,
	// so its cached prefix holds.
	var sys, trailing string
	m.WrapModelCall(context.Background(), rt, &middleware.ModelRequest{}, func(ctx context.Context, req *middleware.ModelRequest) (*middleware.ModelResponse, error) {
		sys = req.System
		if c, ok := middleware.ContextMessage(req); ok {
			trailing = c.Content
		}
		return nil, nil
	})
	if strings.Contains(sys, "green tea") || !strings.Contains(trailing, "<memory_saved>") || !strings.Contains(trailing, "- Likes green tea") {
		t.Fatalf("the run does not see its own note in its trailing context: system %q, context %q", sys, trailing)
	}
	// Full: 120 bytes in all.
	res = remember(t, m, rt, fmt.Sprintf(`{"note": %q}`, strings.Repeat("y", 101)))
	if res.Message.Status != model.ToolStatusError || !strings.Contains(res.Message.Content, "the memory notes are full: 17 of 120 bytes are used and this note needs 104 more") {
		t.Fatalf("full notes: %+v", res.Message)
	}
	if rec.count(middleware.EventRemembered) != 1 {
		t.Fatalf("%d memory.remembered events, want 1", rec.count(middleware.EventRemembered))
	}
	if _, err := e.store.AppendNote(context.Background(), "default", "bob", strings.Repeat("z", 200)); !errors.Is(err, middleware.ErrNotesFull) {
		t.Fatalf("store: %v", err)
	}
}

func TestConcurrentRemembersAllLand(t *testing.T) {
	e := newEnv(t, Config{})
	m := e.memory(`{"enabled": true}`, middleware.KindLead)
	const n = 16
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rt, _ := runtime(t, fmt.Sprintf("r%d", i), fmt.Sprintf("h%d", i), "carol")
			res := remember(t, m, rt, fmt.Sprintf(`{"note": "fact number %d"}`, i))
			if res.Message.Content != "Saved to memory." {
				t.Errorf("remember %d: %+v", i, res.Message)
			}
		}()
	}
	natstest.Wait(t, &wg, "the concurrent remembers")
	notes, err := e.store.Notes(context.Background(), "default", "carol")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(notes, "\n")
	if len(lines) != n {
		t.Fatalf("%d lines after %d concurrent remembers (a write was lost):\n%s", len(lines), n, notes)
	}
	for i := range n {
		if !strings.Contains(notes, fmt.Sprintf("- fact number %d\n", i)) && !strings.HasSuffix(notes, fmt.Sprintf("- fact number %d", i)) {
			t.Errorf("note %d is missing", i)
		}
	}
}

func TestFactsInjectedByConfidenceAndCapped(t *testing.T) {
	e := newEnv(t, Config{})
	ctx := context.Background()
	// Stored with a threshold of 0 so the low one exists; injection uses
	// the profile's own.
	_, err := e.store.MergeFacts(ctx, "default", "dan", []Fact{
		{Content: "The user is a nurse.", Category: "identity", Confidence: 0.8},
		{Content: "The user prefers tea.", Category: "preference", Confidence: 0.95},
		{Content: "The user might like jazz.", Category: "preference", Confidence: 0.5},
		{Content: "The user lives in Lyon.", Category: "context", Confidence: 0.9},
		{Content: "The user wants <short> answers.", Category: "preference", Confidence: 0.85},
	}, MergeOptions{MaxFacts: 100})
	if err != nil {
		t.Fatal(err)
	}
	m := e.memory(`{"enabled": true, "facts": {"enabled": true, "max_injected": 3, "min_confidence": 0.7}}`, middleware.KindLead)
	rt, _ := runtime(t, "r1", "h1", "dan")
	sys := request(t, m, rt, &state.State{}).System
	want := "<facts>\n- [preference | 0.95] The user prefers tea.\n- [context | 0.90] The user lives in Lyon.\n- [preference | 0.85] The user wants &lt;short&gt; answers.\n</facts>"
	if !strings.Contains(sys, want) {
		t.Fatalf("facts block wrong; want\n%s\nin\n%s", want, sys)
	}
	if strings.Contains(sys, "nurse") || strings.Contains(sys, "jazz") {
		t.Fatalf("facts beyond the cap or below min_confidence were injected:\n%s", sys)
	}
	// Facts off: the same user's facts are not shown.
	off := e.memory(`{"enabled": true}`, middleware.KindLead)
	rt2, _ := runtime(t, "r2", "h1", "dan")
	if sys := request(t, off, rt2, &state.State{}).System; strings.Contains(sys, "<facts>") {
		t.Fatalf("facts injected with facts disabled:\n%s", sys)
	}
}

// seedThread writes a thread whose state holds msgs, the way a worker's
// checkpoints do.
func (e *env) seedThread(thread string, lease *protocol.Lease, msgs ...model.Message) {
	e.t.Helper()
	ctx := context.Background()
	rec, rev, err := e.stores.Threads.Get(ctx, "default", thread)
	if errors.Is(err, kv.ErrNotFound) {
		rec = &protocol.Thread{ThreadID: thread, Tenant: "default", Status: protocol.ThreadIdle}
	} else if err != nil {
		e.t.Fatal(err)
	}
	id := fmt.Sprintf("e1-%d", time.Now().UnixNano())
	if _, err := e.stores.Checkpoints.Put(ctx, "default", thread, &kv.Delta{ID: id, Parent: rec.Head, Update: state.Update{Messages: msgs}}); err != nil {
		e.t.Fatal(err)
	}
	rec.Head, rec.Lease = id, lease
	if _, err := e.stores.Threads.Put(ctx, rec, rev); err != nil {
		e.t.Fatal(err)
	}
}

func msg(id, role, content, run string) model.Message {
	return model.Message{ID: id, Role: role, Content: content, Meta: map[string]any{"run_id": run}}
}

func hidden(m model.Message) model.Message {
	m.Meta[middleware.MetaHidden] = true
	return m
}

// scripted answers extraction requests with answers, in order, and
// records them.
type scripted struct {
	mu      sync.Mutex
	answers []string
	reqs    []*model.Request
	times   []time.Time
}

func (s *scripted) Generate(ctx context.Context, req *model.Request, _ func(model.Delta)) (*model.Response, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reqs = append(s.reqs, req)
	s.times = append(s.times, time.Now())
	a := s.answers[min(len(s.reqs), len(s.answers))-1]
	return &model.Response{Message: model.Message{Role: model.RoleAssistant, Content: a}}, nil
}

func (s *scripted) firstCall() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.times[0]
}

func (s *scripted) calls() []*model.Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*model.Request(nil), s.reqs...)
}

func jobFor(t *testing.T, p payload) *jobs.Job {
	data, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	return &jobs.Job{ID: "test", Kind: JobKind, Data: data, Attempt: 1}
}

const goodFacts = `{"facts":[
 {"content":"The user is vegetarian.","category":"preference","confidence":0.92},
 {"content":"The user lives in Lyon.","category":"context","confidence":0.8},
 {"content":"The user may like hiking.","category":"preference","confidence":0.4},
 {"content":"The user is vegetarian","category":"weird-category","confidence":0.7}
]}`

// TestExtractorSkipsHiddenAndTrivialMessages is deer-flow #3697: hidden
// framework messages never reach extraction; upload-only and trivial turns
// are skipped with their replies.
func TestExtractorSkipsHiddenAndTrivialMessages_DeerFlow3697(t *testing.T) {
	e := newEnv(t, Config{})
	ctx := context.Background()
	e.seedThread("h1", nil,
		msg("m1", model.RoleUser, "I'm vegetarian and I live in Lyon.", "r1"),
		model.Message{ID: "m2", Role: model.RoleAssistant, Content: "", ToolCalls: []model.ToolCall{{ID: "c1", Name: "current_time", Arguments: "{}"}}, Meta: map[string]any{"run_id": "r1"}},
		model.Message{ID: "m3", Role: model.RoleTool, ToolCallID: "c1", Name: "current_time", Content: "TOOL-OUTPUT-SECRET", Meta: map[string]any{"run_id": "r1"}},
		msg("m4", model.RoleAssistant, "<think>PRIVATE-REASONING</think>Noted: vegetarian in Lyon.", "r1"),
		hidden(msg("m5", model.RoleUser, "HIDDEN-FRAMEWORK-NOTE: subagent finished", "r2")),
		msg("m6", model.RoleUser, "thanks!", "r3"),
		msg("m7", model.RoleAssistant, "REPLY-TO-THANKS", "r3"),
		msg("m8", model.RoleUser, "<uploaded_files>UPLOAD-LIST a.pdf</uploaded_files>", "r4"),
		msg("m9", model.RoleAssistant, "REPLY-TO-UPLOAD", "r4"),
	)
	m := &scripted{answers: []string{goodFacts}}
	ex := NewExtractor(e.store, e.stores, m, zaptest.NewLogger(t))
	p := payload{Tenant: "default", User: "erin", Thread: "h1", Model: "extractor", MinConfidence: 0.7, MaxFacts: 100}
	if err := ex.Handle(ctx, jobFor(t, p)); err != nil {
		t.Fatal(err)
	}
	reqs := m.calls()
	if len(reqs) != 1 {
		t.Fatalf("%d model calls", len(reqs))
	}
	sent := reqs[0].Messages[0].Content
	if reqs[0].Model != "extractor" || !strings.Contains(reqs[0].System, "JSON") {
		t.Fatalf("request %+v", reqs[0])
	}
	for _, bad := range []string{"TOOL-OUTPUT-SECRET", "PRIVATE-REASONING", "HIDDEN-FRAMEWORK-NOTE", "thanks", "REPLY-TO-THANKS", "UPLOAD-LIST", "REPLY-TO-UPLOAD"} {
		if strings.Contains(sent, bad) {
			t.Errorf("%s reached extraction:\n%s", bad, sent)
		}
	}
	if !strings.Contains(sent, "user: I&#39;m vegetarian") && !strings.Contains(sent, "user: I'm vegetarian and I live in Lyon.") ||
		!strings.Contains(sent, "assistant: Noted: vegetarian in Lyon.") {
		t.Fatalf("the conversation is missing:\n%s", sent)
	}
	facts, err := e.store.Facts(ctx, "default", "erin")
	if err != nil {
		t.Fatal(err)
	}
	if len(facts) != 2 || facts[0].Content != "The user is vegetarian." || facts[0].Confidence != 0.92 || facts[1].Content != "The user lives in Lyon." ||
		facts[0].SourceThread != "h1" || facts[0].ID == "" || facts[1].Category != "context" {
		t.Fatalf("facts %+v", facts)
	}
	cur, _, _ := e.store.Cursor(ctx, "default", "erin", "h1")
	if cur.MessageID != "m9" || cur.Messages != 9 {
		t.Fatalf("cursor %+v", cur)
	}
	// Nothing new: no model call.
	if err := ex.Handle(ctx, jobFor(t, p)); err != nil || len(m.calls()) != 1 {
		t.Fatalf("a job with nothing new called the model (%d calls, %v)", len(m.calls()), err)
	}
	// Only trivial news: the cursor moves, the model is not asked.
	e.seedThread("h1", nil, msg("m10", model.RoleUser, "ok", "r5"), msg("m11", model.RoleAssistant, "Anything else?", "r5"))
	if err := ex.Handle(ctx, jobFor(t, p)); err != nil || len(m.calls()) != 1 {
		t.Fatalf("a trivial turn was sent for extraction (%d calls, %v)", len(m.calls()), err)
	}
	if cur, _, _ := e.store.Cursor(ctx, "default", "erin", "h1"); cur.MessageID != "m11" {
		t.Fatalf("cursor %+v", cur)
	}
}

func TestExtractorLeavesARunningRunAlone(t *testing.T) {
	e := newEnv(t, Config{})
	ctx := context.Background()
	e.seedThread("h1", &protocol.Lease{RunID: "r2", Worker: "w", Epoch: 2},
		msg("m1", model.RoleUser, "My name is Fay.", "r1"),
		msg("m2", model.RoleAssistant, "Hello Fay.", "r1"),
		msg("m3", model.RoleUser, "IN-PROGRESS I work as a pilot.", "r2"),
	)
	m := &scripted{answers: []string{`{"facts":[{"content":"The user is named Fay.","category":"identity","confidence":0.9}]}`}}
	ex := NewExtractor(e.store, e.stores, m, zaptest.NewLogger(t))
	if err := ex.Handle(ctx, jobFor(t, payload{Tenant: "default", User: "fay", Thread: "h1", MinConfidence: 0.7, MaxFacts: 100})); err != nil {
		t.Fatal(err)
	}
	if sent := m.calls()[0].Messages[0].Content; strings.Contains(sent, "IN-PROGRESS") {
		t.Fatalf("the running run's messages were extracted:\n%s", sent)
	}
	if cur, _, _ := e.store.Cursor(ctx, "default", "fay", "h1"); cur.MessageID != "m2" {
		t.Fatalf("cursor %+v, want m2", cur)
	}
}

func TestMergeFactsDedupesCapsAndThresholds(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	cur := []Fact{
		{ID: "a", Content: "The user likes tea.", Confidence: 0.75, Category: "preference"},
		{ID: "b", Content: "The user is a nurse.", Confidence: 0.9, Category: "identity"},
	}
	out := MergeFacts(cur, []Fact{
		{Content: "the user   likes TEA", Confidence: 0.85, Category: "preference"},
		{Content: "The user has a cat.", Confidence: 0.8, Category: "context"},
		{Content: "The user might be tired.", Confidence: 0.3, Category: "context"},
	}, MergeOptions{MinConfidence: 0.7, MaxFacts: 2, Thread: "h9", Now: now})
	if len(out) != 2 || out[0].ID != "b" || out[1].ID != "a" || out[1].Confidence != 0.85 || out[1].Content != "the user likes TEA" || !out[1].UpdatedAt.Equal(now) {
		t.Fatalf("merged %+v", out)
	}
	if cur[0].Confidence != 0.75 {
		t.Fatal("MergeFacts changed its input")
	}
}

func TestParseFactsIsStrict(t *testing.T) {
	good := []string{
		`{"facts":[]}`,
		"```json\n{\"facts\":[{\"content\":\"x\",\"category\":\"goal\",\"confidence\":1}]}\n```",
	}
	for _, g := range good {
		if _, err := ParseFacts(g); err != nil {
			t.Errorf("%q: %v", g, err)
		}
	}
	bad := []string{
		``,
		`Sure! Here are the facts: {"facts":[]}`,
		`{"facts":[]} and more`,
		`{"facts":[]}{"facts":[]}`,
		`{"fact":[]}`,
		`{}`,
		`{"facts":[{"content":"x","category":"goal"}]}`,
		`{"facts":[{"content":"x","category":"goal","confidence":1.5}]}`,
		`{"facts":[{"content":"  ","category":"goal","confidence":0.9}]}`,
		`{"facts":[{"content":"x","category":"goal","confidence":0.9,"reason":"y"}]}`,
		`{"facts":"none"}`,
		"```json\n{\"facts\":[]}",
	}
	for _, b := range bad {
		if _, err := ParseFacts(b); err == nil {
			t.Errorf("%q was accepted", b)
		}
	}
}
