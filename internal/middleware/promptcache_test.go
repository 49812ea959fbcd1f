package middleware_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/model/openaitest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
	"github.com/natsagent/natsagent/internal/tools"
)

// notesStore is a MemoryStore holding one user's notes in memory.
type notesStore struct {
	mu    sync.Mutex
	notes string
}

func (s *notesStore) Notes(context.Context, string, string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.notes, nil
}

func (s *notesStore) AppendNote(_ context.Context, _, _, note string) (middleware.NoteAppend, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if strings.Contains(s.notes, note) {
		return middleware.NoteAppend{Notes: s.notes, Unchanged: true}, nil
	}
	s.notes = strings.TrimSpace(s.notes + "\n" + note)
	return middleware.NoteAppend{Notes: s.notes}, nil
}

func (s *notesStore) Facts(context.Context, string, string) ([]middleware.MemoryFact, error) {
	return nil, nil
}

func (s *notesStore) EnqueueMemoryJob(context.Context, middleware.MemoryJob) error { return nil }

// cacheRun is a 20-step run of the default lead chain (memory on) against
// the strict server simulating a prompt cache: the model plans with
// write_todos, calls a tool whose results are a few hundred bytes, updates
// the list every fourth step, saves one memory note, and answers. It
// returns the cached share of the prompt bytes over the run's calls and
// the run's stored messages.
func cacheRun(t *testing.T) (float64, []openaitest.Request, *state.State) {
	t.Helper()
	const steps = 20
	todos := func(done int) string {
		items := make([]map[string]string, 5)
		for i := range items {
			status := "pending"
			switch {
			case i < done:
				status = "completed"
			case i == done:
				status = "in_progress"
			}
			items[i] = map[string]string{"content": fmt.Sprintf("Collect the figures of region %d", i+1), "status": status}
		}
		raw, _ := json.Marshal(map[string]any{"todos": items})
		return string(raw)
	}
	srv := openaitest.NewServer(t, func(req *openaitest.Request) openaitest.Reply {
		n := req.Index
		switch {
		case n == steps-1:
			return openaitest.Text("All five regions are collected.")
		case n%4 == 0:
			return openaitest.ToolCall(middleware.WriteTodosTool, todos(n/4))
		case n == 6:
			return openaitest.ToolCall(middleware.RememberTool, `{"note":"Prefers figures in euros."}`)
		}
		return openaitest.ToolCall("fetch", fmt.Sprintf(`{"region":%d,"page":%d}`, n/4+1, n))
	})
	srv.SimulatePromptCache()
	m, err := model.NewOpenAI(model.OpenAIConfig{BaseURL: srv.URL(), Model: "test-model"})
	if err != nil {
		t.Fatal(err)
	}
	set, err := tools.NewSet(tools.Func(model.ToolSpec{Name: "fetch", Description: "Fetches a page of a region's figures.",
		Parameters: json.RawMessage(`{"type":"object","properties":{"region":{"type":"integer"},"page":{"type":"integer"}}}`)},
		func(ctx context.Context, args json.RawMessage) (string, error) {
			return "figures for " + string(args) + ": " + strings.Repeat("1234.5 ", 60), nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	store := &notesStore{notes: "Works at a bakery in Nantes."}
	// The run answers with its last item in progress: no completion
	// reminder, so the calls are the ones the figures were measured on.
	chain, err := middleware.Assemble(middleware.ChainConfig{Settings: map[string]json.RawMessage{
		"memory": json.RawMessage(`{"enabled": true}`),
		"todos":  json.RawMessage(`{"completion_reminders": 0}`),
	}}, middleware.Env{Memory: store, KnownTool: func(n string) bool { return set.Get(n) != nil }})
	if err != nil {
		t.Fatal(err)
	}
	st := &state.State{}
	host := &eventHost{}
	rt := &middleware.Runtime{RunID: "r1", ThreadID: "h1", Tenant: "default", Agent: "test", User: "u", Tools: set, Logger: zap.NewNop(), Emit: host.Emit}
	out := agent.Execute(context.Background(), &agent.Run{
		Runtime: rt, Chain: chain, Model: m, ModelName: "test-model", System: "You are a careful analyst.",
		MaxSteps: 40, State: st, Input: []model.Message{{ID: "u1", Role: model.RoleUser, Content: "Collect the figures of the five regions."}}, Host: host,
	})
	if out.Status != protocol.StatusSuccess || out.StopReason != "" {
		t.Fatalf("run ended %+v", out)
	}
	if v := srv.Violations(); len(v) > 0 {
		t.Fatalf("the strict server refused requests: %v", v)
	}
	reqs := srv.Requests()
	if len(reqs) != steps {
		t.Fatalf("%d model calls, want %d", len(reqs), steps)
	}
	if !strings.Contains(store.notes, "euros") {
		t.Fatalf("the note was not saved: %q", store.notes)
	}
	var prompt, cached int
	for i := range st.Messages {
		m := &st.Messages[i]
		if m.Role != model.RoleAssistant {
			continue
		}
		u, ok := middleware.UsageOf(m)
		if !ok || u.Cached == nil {
			t.Fatalf("message %s records no cached tokens: %+v", m.ID, m.Meta)
		}
		prompt += u.Input
		cached += *u.Cached
	}
	return float64(cached) / float64(prompt), reqs, st
}

// The prompt is laid out so that what changes during a run (the todo
// list, a note saved to memory) comes after the history: every call
// shares with the one before it everything but the newest step. With the
// list and the notes in the system prompt, each change re-sent the whole
// history uncached: 74.9% of the prompt bytes were cached in this run
// then, 86.2% now (the first call, all new, weighs on both). The test
// measures both: the run's own calls, and the same calls with their
// trailing context moved into the system prompt (76.1%).
func TestPromptCache_PrefixStableWithinARun(t *testing.T) {
	share, reqs, _ := cacheRun(t)
	t.Logf("cached share of the prompt bytes over %d calls: %.1f%%", len(reqs), 100*share)
	if share < 0.8 {
		t.Errorf("only %.1f%% of the prompt bytes were cached; the prefix changes within the run", 100*share)
	}
	// The same calls laid out as before: the trailing context in the
	// system prompt. Measured the same way, the share falls to what the
	// old layout gave, so the gain is the layout's and not the run's.
	if sent := simulatedShare(reqs, false); sent < share-0.001 || sent > share+0.001 {
		t.Errorf("the prompts as sent share %.1f%%, the usage recorded %.1f%%: the measure is not the server's", 100*sent, 100*share)
	}
	before := simulatedShare(reqs, true)
	t.Logf("the same calls with the context in the system prompt: %.1f%% cached", 100*before)
	if before > 0.78 || share-before < 0.08 {
		t.Errorf("context in the system prompt caches %.1f%%, after the history %.1f%%: the layout should gain at least 8 points", 100*before, 100*share)
	}
	// Every call after the first starts with the whole previous request
	// but its trailing context: the system prompt and the tools never
	// change, and the history only grows.
	for i := 1; i < len(reqs); i++ {
		prev, cur := reqs[i-1], reqs[i]
		if cur.Messages[0].Content != prev.Messages[0].Content {
			t.Fatalf("call %d changed the system prompt:\n%s\n---\n%s", i, prev.Messages[0].Content, cur.Messages[0].Content)
		}
		if a, b := toolNames(prev.Tools), toolNames(cur.Tools); a != b {
			t.Fatalf("call %d changed the tools: %s -> %s", i, a, b)
		}
		stable := prev
		if last := prev.LastMessage(); last.Role == "user" && strings.HasPrefix(last.Content, "<system-reminder>") {
			stable.Messages = prev.Messages[:len(prev.Messages)-1]
		}
		want := openaitest.PromptBytes(&stable)
		if got := openaitest.PromptBytes(&cur); !strings.HasPrefix(string(got), string(want)) {
			n := 0
			for n < len(got) && n < len(want) && got[n] == want[n] {
				n++
			}
			t.Fatalf("call %d does not start with call %d less its trailing context; they part at\n%s\n---\n%s", i, i-1, want[max(0, n-200):min(len(want), n+200)], got[max(0, n-200):min(len(got), n+200)])
		}
	}
	// The list and the note are in the trailing context, after the
	// newest tool result.
	last := reqs[len(reqs)-1].LastMessage()
	if last.Role != "user" || !strings.Contains(last.Content, "[in_progress] Collect the figures of region 5") ||
		!strings.Contains(last.Content, "- Prefers figures in euros.") || !strings.HasPrefix(last.Content, "<system-reminder>") {
		t.Fatalf("last call's trailing message: %+v", last)
	}
}

func toolNames(ts []openaitest.Tool) string {
	var out []string
	for _, t := range ts {
		out = append(out, t.Function.Name)
	}
	return strings.Join(out, ",")
}

// simulatedShare is the cached share of reqs' prompt bytes as the test
// server simulates it (each call against the previous one, bytes in
// common from the start). inSystem moves each call's trailing context
// into its system prompt, the layout before the context moved after the
// history.
func simulatedShare(reqs []openaitest.Request, inSystem bool) float64 {
	var prev []byte
	var total, cached int
	for _, r := range reqs {
		r.Messages = append([]openaitest.Message(nil), r.Messages...)
		if last := r.LastMessage(); inSystem && last.Role == "user" && strings.HasPrefix(last.Content, "<system-reminder>") {
			r.Messages = r.Messages[:len(r.Messages)-1]
			r.Messages[0].Content += "\n\n" + last.Content
		}
		cur := openaitest.PromptBytes(&r)
		n := 0
		for n < len(prev) && n < len(cur) && prev[n] == cur[n] {
			n++
		}
		total += len(cur)
		cached += n
		prev = cur
	}
	return float64(cached) / float64(total)
}
