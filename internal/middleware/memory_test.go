package middleware

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/model"
)

// Behaviour over the real store (injection, remember, jobs, the whole
// path on JetStream) is tested in internal/memory; these tests cover the
// settings and the pure parts.

// unusedMemory satisfies MemoryStore for assembling chains; no test here
// calls it.
type unusedMemory struct{}

func (unusedMemory) Notes(context.Context, string, string) (string, error) { return "", nil }
func (unusedMemory) AppendNote(context.Context, string, string, string) (NoteAppend, error) {
	return NoteAppend{}, nil
}
func (unusedMemory) Facts(context.Context, string, string) ([]MemoryFact, error) { return nil, nil }
func (unusedMemory) EnqueueMemoryJob(context.Context, MemoryJob) error           { return nil }

func TestMemorySettings(t *testing.T) {
	env := Env{Memory: unusedMemory{}, KnownTool: func(n string) bool { return n == "current_time" }}
	chain, err := Assemble(ChainConfig{}, env)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(chain.Names(), "memory") {
		t.Fatal("memory is on by default")
	}
	chain, err = Assemble(ChainConfig{Settings: map[string]json.RawMessage{"memory": json.RawMessage(`{"enabled": true}`)}}, env)
	if err != nil {
		t.Fatal(err)
	}
	names := chain.Names()
	if i := slices.Index(names, "memory"); i < 0 || i > slices.Index(names, "dynamic_context") || i < slices.Index(names, "tool_call_repair") {
		t.Fatalf("memory is not in the base segment before dynamic_context: %v", names)
	}
	bad := map[string]string{
		`{"enabled": true, "max_notes_chars": 50}`:                                       "settings.memory: max_notes_chars must be 200 to 32000, not 50",
		`{"enabled": true, "facts": {"debounce_seconds": 301}}`:                          "facts.debounce_seconds must be 1 to 300, not 301",
		`{"enabled": true, "facts": {"min_confidence": 1.5}}`:                            "facts.min_confidence must be 0 to 1, not 1.5",
		`{"enabled": true, "facts": {"max_facts": 5}}`:                                   "facts.max_facts must be 10 to 500, not 5",
		`{"enabled": true, "facts": {"max_injected": 30, "max_facts": 20}}`:              "facts.max_injected (30) must not exceed facts.max_facts (20)",
		`{"enabled": true, "facts": {"enabled": true, "debounce": 3}}`:                   `unknown key "debounce"; did you mean debounce_seconds?`,
		`{"enabled": true, "notes": true}`:                                               `unknown key "notes"`,
		`{"enabled": true, "facts": {"enabled": true, "max_injected": 0, "model": "x"}}`: "",
	}
	for raw, want := range bad {
		_, err := Assemble(ChainConfig{Settings: map[string]json.RawMessage{"memory": json.RawMessage(raw)}}, env)
		switch {
		case want == "" && err != nil:
			t.Errorf("%s: %v", raw, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("%s: got %v, want %q", raw, err, want)
		}
	}
	// Without a store, enabling memory fails at start with a reason.
	_, err = Assemble(ChainConfig{Settings: map[string]json.RawMessage{"memory": json.RawMessage(`{"enabled": true}`)}}, Env{})
	if err == nil || !strings.Contains(err.Error(), "settings.memory: this deployment has no memory store") {
		t.Fatalf("no store: %v", err)
	}
	// A profile tool named remember would be shadowed.
	_, err = Assemble(ChainConfig{Settings: map[string]json.RawMessage{"memory": json.RawMessage(`{"enabled": true}`)}},
		Env{Memory: unusedMemory{}, KnownTool: func(n string) bool { return n == RememberTool }})
	if err == nil || !strings.Contains(err.Error(), "the profile has a tool named remember") {
		t.Fatalf("remember tool clash: %v", err)
	}
}

func TestMemoryTranscript(t *testing.T) {
	hiddenNote := user("h", "injected context")
	hiddenNote.Meta = map[string]any{MetaHidden: true}
	got := MemoryTranscript([]model.Message{
		system("sys"),
		user("u1", "ok"),
		asst("a1", "", call("c1", "current_time", "{}")),
		result("t1", "c1", "current_time", "noon"),
		asst("a2", "It is noon."), // the reply to "ok": dropped
		user("u2", "<current_uploads>a.txt</current_uploads>  I run a bakery in Nantes."),
		asst("a3", "<think>hm</think>Nice!"),
		hiddenNote,
		asst("a4", "Context read."),
		user("u3", strings.Repeat("é", MaxMemoryMessageChars+10)),
	})
	want := []string{
		"user:I run a bakery in Nantes.",
		"assistant:Nice!",
		"assistant:Context read.",
		"user:" + strings.Repeat("é", MaxMemoryMessageChars) + "…",
	}
	var have []string
	for _, m := range got {
		have = append(have, m.Role+":"+m.Content)
	}
	if !slices.Equal(have, want) {
		t.Fatalf("transcript:\n%q\nwant\n%q", have, want)
	}
}

func TestSelectFacts(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	facts := []MemoryFact{
		{ID: "a", Content: "a", Confidence: 0.8, UpdatedAt: t0},
		{ID: "b", Content: "b", Confidence: 0.9, UpdatedAt: t0},
		{ID: "c", Content: "c", Confidence: 0.8, UpdatedAt: t0.Add(time.Hour)},
		{ID: "d", Content: "d", Confidence: 0.6, UpdatedAt: t0},
		{ID: "e", Content: " ", Confidence: 1, UpdatedAt: t0},
	}
	var ids []string
	for _, f := range SelectFacts(facts, 0.7, 3) {
		ids = append(ids, f.ID)
	}
	if !slices.Equal(ids, []string{"b", "c", "a"}) {
		t.Fatalf("selected %v", ids)
	}
}
