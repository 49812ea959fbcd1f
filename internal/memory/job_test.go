package memory

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/natsagent/natsagent/internal/jobs"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/state"
	"github.com/natsagent/natsagent/internal/testdeploy"
)

// queued is how many memory jobs wait in the jobs stream (scheduled or
// due).
func (e *env) queued() uint64 {
	e.t.Helper()
	st, err := e.js.Stream(context.Background(), e.settings.Names.JobsStream())
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := st.Info(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	return info.State.Msgs
}

func (e *env) lastSeq() uint64 {
	e.t.Helper()
	st, err := e.js.Stream(context.Background(), e.settings.Names.JobsStream())
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := st.Info(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	return info.State.LastSeq
}

// runJobs runs a job runner with the extractor on m until the test ends.
func (e *env) runJobs(m model.Model) {
	e.t.Helper()
	ex := NewExtractor(e.store, e.stores, m, zaptest.NewLogger(e.t))
	r, err := jobs.NewRunner(context.Background(), e.js, jobs.Config{
		Settings: e.settings,
		Handlers: map[string]jobs.Handler{JobKind: ex.Handle},
		Backoff:  func(int) time.Duration { return 50 * time.Millisecond },
		Logger:   zaptest.NewLogger(e.t),
	})
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	e.t.Cleanup(func() { cancel(); natstest.Recv(e.t, done, "the job runner to stop") })
}

// turn is the state after a run r on thread h.
func turn(msgs ...model.Message) *state.State {
	st := &state.State{}
	st.Apply(state.Update{Messages: msgs})
	return st
}

func afterAgent(t *testing.T, m *middleware.Memory, rt *middleware.Runtime, st *state.State) {
	t.Helper()
	if _, err := m.AfterAgent(context.Background(), rt, st); err != nil {
		t.Fatal(err)
	}
}

// TestTwoRunsInOneWindowMakeOneJob_DeerFlow2547: two agents' runs on one
// thread inside one window make one job, and that job covers both runs
// (deer-flow #2547/#2548 dropped the first agent's pending update).
func TestTwoRunsInOneWindowMakeOneJob_DeerFlow2547(t *testing.T) {
	e := newEnv(t, Config{})
	m := e.memory(`{"enabled": true, "facts": {"enabled": true, "debounce_seconds": 2, "model": "extractor"}}`, middleware.KindLead)
	e.seedThread("h1", nil,
		msg("m1", model.RoleUser, "I am a night-shift nurse.", "r1"), msg("m2", model.RoleAssistant, "Got it.", "r1"),
		msg("m3", model.RoleUser, "I also keep bees.", "r2"), msg("m4", model.RoleAssistant, "Lovely.", "r2"))
	// Start just after a window opens, so both runs end inside it.
	now := time.Now()
	boundary := time.Unix((now.Unix()/2+1)*2, 0)
	time.Sleep(time.Until(boundary) + 50*time.Millisecond)
	for i, run := range []string{"r1", "r2"} {
		rt, _ := runtime(t, run, "h1", "gil")
		rt.Agent = []string{"chatbot", "researcher"}[i]
		afterAgent(t, m, rt, turn(msg("x"+run, model.RoleUser, "something real "+run, run)))
	}
	if n := e.queued(); n != 1 {
		t.Fatalf("%d jobs queued for two runs in one window, want 1", n)
	}
	if seq := e.lastSeq(); seq != 1 {
		t.Fatalf("the second run's job was stored (last seq %d), not dropped as a duplicate of the window's job", seq)
	}
	due := boundary.Add(2 * time.Second)
	extractor := &scripted{answers: []string{`{"facts":[{"content":"The user is a nurse.","category":"identity","confidence":0.9}]}`}}
	e.runJobs(extractor)
	// The job runs when its window ends and the runner gets to it: under
	// load that is seconds later, so the waits are for liveness only.
	testdeploy.WaitFor(t, 30*time.Second, "the memory job", func() bool { return len(extractor.calls()) >= 1 })
	if at := extractor.firstCall(); at.Before(due) {
		t.Fatalf("the job ran at %s, before the end of its window at %s", at, due)
	}
	testdeploy.WaitFor(t, 30*time.Second, "the facts", func() bool {
		f, _ := e.store.Facts(context.Background(), "default", "gil")
		return len(f) == 1
	})
	// Once the job is acked no call of it can come any more: only then
	// does counting the calls say it ran once.
	testdeploy.WaitFor(t, 30*time.Second, "the job acked", func() bool { return e.queued() == 0 })
	if n := len(extractor.calls()); n != 1 {
		t.Fatalf("the model was asked %d times, want 1", n)
	}
	req := extractor.calls()[0]
	if req.Model != "extractor" || !strings.Contains(req.Messages[0].Content, "night-shift nurse") || !strings.Contains(req.Messages[0].Content, "keep bees") {
		t.Fatalf("one job must cover both runs: %+v", req)
	}
}

func TestBadExtractionJSONRetriesThenDeadLetters(t *testing.T) {
	e := newEnv(t, Config{})
	e.seedThread("h1", nil, msg("m1", model.RoleUser, "I prefer trains to planes.", "r1"), msg("m2", model.RoleAssistant, "Noted.", "r1"))
	extractor := &scripted{answers: []string{"The user prefers trains."}}
	e.runJobs(extractor)
	err := e.store.EnqueueMemoryJob(context.Background(), middleware.MemoryJob{Tenant: "default", User: "hal", Thread: "h1", MinConfidence: 0.7, MaxFacts: 100, Debounce: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var dead []jetstream.Msg
	testdeploy.WaitFor(t, 8*time.Second, "the dead letter", func() bool {
		dead = e.deadLetters()
		return len(dead) == 1
	})
	if n := len(extractor.calls()); n != e.settings.MaxDeliver {
		t.Fatalf("the model was asked %d times, want max_deliver = %d", n, e.settings.MaxDeliver)
	}
	if r := dead[0].Headers().Get(jobs.HeaderDLQReason); !strings.Contains(r, "extraction model answered no valid facts JSON") {
		t.Fatalf("reason %q", r)
	}
	if f, _ := e.store.Facts(context.Background(), "default", "hal"); len(f) != 0 {
		t.Fatalf("facts stored from a bad answer: %+v", f)
	}
	if cur, rev, _ := e.store.Cursor(context.Background(), "default", "hal", "h1"); rev != 0 {
		t.Fatalf("the cursor moved past messages never distilled: %+v", cur)
	}
}

func (e *env) deadLetters() []jetstream.Msg {
	e.t.Helper()
	c, err := e.js.OrderedConsumer(context.Background(), e.settings.Names.DLQStream(),
		jetstream.OrderedConsumerConfig{FilterSubjects: []string{e.settings.Names.DLQJobSubject(JobKind)}})
	if err != nil {
		e.t.Fatal(err)
	}
	b, err := c.Fetch(10, jetstream.FetchMaxWait(200*time.Millisecond))
	if err != nil {
		e.t.Fatal(err)
	}
	var out []jetstream.Msg
	for m := range b.Messages() {
		out = append(out, m)
	}
	return out
}

// TestSubagentChainWritesNothing is deer-flow #3875: a subagent's chain
// reads the user's memory but never writes it.
func TestSubagentChainWritesNothing_DeerFlow3875(t *testing.T) {
	e := newEnv(t, Config{})
	ctx := context.Background()
	if _, err := e.store.AppendNote(ctx, "default", "ivy", "Prefers French"); err != nil {
		t.Fatal(err)
	}
	m := e.memory(`{"enabled": true, "facts": {"enabled": true, "debounce_seconds": 1}}`, middleware.KindSubagent)
	rt, _ := runtime(t, "sub1", "child", "ivy")
	req := request(t, m, rt, &state.State{})
	if offers(req, middleware.RememberTool) || !strings.Contains(req.System, "Prefers French") || strings.Contains(req.System, "remember tool") {
		t.Fatalf("subagent request: tools %v, system %q", req.Tools, req.System)
	}
	passed := false
	_, err := m.WrapToolCall(ctx, rt, &middleware.ToolCall{Call: model.ToolCall{ID: "c", Name: middleware.RememberTool, Arguments: `{"note":"x"}`}},
		func(context.Context, *middleware.ToolCall) (*middleware.ToolResult, error) {
			passed = true
			return &middleware.ToolResult{}, nil
		})
	if err != nil || !passed {
		t.Fatal("a subagent's remember call was handled by memory instead of being refused as an unknown tool")
	}
	afterAgent(t, m, rt, turn(msg("u1", model.RoleUser, "Research the history of Lyon for me, I am moving there.", "sub1"),
		msg("a1", model.RoleAssistant, "Done.", "sub1")))
	if n := e.queued(); n != 0 {
		t.Fatalf("a subagent run enqueued %d memory jobs", n)
	}
	if notes, _ := e.store.Notes(ctx, "default", "ivy"); notes != "- Prefers French" {
		t.Fatalf("notes changed: %q", notes)
	}
}

func TestOnlyTurnsWorthRememberingAreEnqueued(t *testing.T) {
	e := newEnv(t, Config{})
	m := e.memory(`{"enabled": true, "facts": {"enabled": true, "debounce_seconds": 300}}`, middleware.KindLead)
	earlier := msg("u0", model.RoleUser, "I'm allergic to peanuts.", "r0")
	skipped := map[string]*state.State{
		"trivial":     turn(earlier, msg("u1", model.RoleUser, "Thanks!!", "r1"), msg("a1", model.RoleAssistant, "You're welcome.", "r1")),
		"hidden":      turn(earlier, hidden(msg("u1", model.RoleUser, "subagent result: ...", "r1")), msg("a1", model.RoleAssistant, "Here it is.", "r1")),
		"upload-only": turn(earlier, msg("u1", model.RoleUser, "<current_uploads>a.csv</current_uploads>\n", "r1"), msg("a1", model.RoleAssistant, "Received.", "r1")),
		"emoji":       turn(earlier, msg("u1", model.RoleUser, " 👍 ", "r1")),
	}
	for name, st := range skipped {
		rt, _ := runtime(t, "r1", "h-"+name, "jo")
		afterAgent(t, m, rt, st)
		if n := e.queued(); n != 0 {
			t.Fatalf("%s turn enqueued a memory job", name)
		}
	}
	// facts disabled: nothing either.
	off := e.memory(`{"enabled": true}`, middleware.KindLead)
	rt, _ := runtime(t, "r1", "h-off", "jo")
	afterAgent(t, off, rt, turn(msg("u1", model.RoleUser, "I'm allergic to peanuts.", "r1")))
	if n := e.queued(); n != 0 {
		t.Fatal("facts disabled, yet a job was enqueued")
	}
	// A resume run has no user message of its own: the one it continues
	// decides.
	rt, _ = runtime(t, "r2", "h-resume", "jo")
	afterAgent(t, m, rt, turn(earlier, msg("a2", model.RoleAssistant, "Noted.", "r2")))
	if n := e.queued(); n != 1 {
		t.Fatalf("%d jobs after a resumed turn, want 1", n)
	}
	rt, _ = runtime(t, "r3", "h-real", "jo")
	afterAgent(t, m, rt, turn(msg("u3", model.RoleUser, "<uploaded_files>a.pdf</uploaded_files> Summarise it; I'm a lawyer.", "r3")))
	if n := e.queued(); n != 2 {
		t.Fatalf("%d jobs after a real turn with uploads, want 2", n)
	}
}
