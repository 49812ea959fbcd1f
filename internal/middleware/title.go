package middleware

// Title. Boundary: state (the thread's "title" value). Reads the first user
// message (and, with a title model, the first answer); writes the title
// value, which the worker copies onto the thread record; emits
// thread.titled (updates kind). The title is set from the first
// user message before the first model call (6 words, 60 characters,
// reasoning tags removed), so even a first turn that is cancelled or
// interrupted leaves one. With a title model configured, a better title is
// asked for in the background after the first exchange and replaces the
// fallback if it is ready before the run ends; it never delays the run.

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
)

// TitleValue is the state value holding the thread's title.
const TitleValue = protocol.TitleValue

// Title gives a thread its title.
type Title struct {
	MaxWords int `json:"max_words"`
	MaxChars int `json:"max_chars"`
	// Model is the title model's name; empty means the local fallback
	// only.
	Model string `json:"model"`
	// Timeout bounds the title model call (default 10s).
	TimeoutSeconds int `json:"timeout_seconds"`
	provider       model.Model
}

// NewTitle checks the settings; provider serves the title model.
func NewTitle(t Title, provider model.Model) (*Title, error) {
	if t.MaxWords == 0 {
		t.MaxWords = 6
	}
	if t.MaxChars == 0 {
		t.MaxChars = 60
	}
	if t.TimeoutSeconds == 0 {
		t.TimeoutSeconds = 10
	}
	if t.MaxWords < 1 || t.MaxWords > 20 {
		return nil, fmt.Errorf("max_words must be 1 to 20, not %d", t.MaxWords)
	}
	if t.MaxChars < 10 || t.MaxChars > 200 {
		return nil, fmt.Errorf("max_chars must be 10 to 200, not %d", t.MaxChars)
	}
	t.provider = provider
	return &t, nil
}

// Name implements Middleware.
func (*Title) Name() string { return "title" }

// EventTitled is emitted when the thread gets a title.
const EventTitled = protocol.EventThreadTitled

type titledData struct {
	Title string `json:"title"`
}

// AppendEventDataJSON writes what json.Marshal writes, without it.
func (d titledData) AppendEventDataJSON(b []byte) ([]byte, bool) {
	b = append(b, `{"title":`...)
	return append(protocol.AppendJSONString(b, d.Title), '}'), true
}

type titleJob struct {
	mu       sync.Mutex
	start    bool
	done     bool
	title    string
	fallback string // the fallback title of the first user message
}

// BeforeAgent sets the fallback title on a thread that has none.
func (t *Title) BeforeAgent(ctx context.Context, rt *Runtime, st *state.State) (Result, error) {
	if hasTitle(st) {
		return Result{}, nil
	}
	for _, m := range st.Messages {
		if m.Role == model.RoleUser && m.Meta[MetaHidden] != true {
			return t.set(rt, FallbackTitle(m.Content, t.MaxWords, t.MaxChars))
		}
	}
	return Result{}, nil
}

// hasTitle reports whether st's title is a non-empty string. Every run
// of a titled thread asks, so the stored value is decoded only when a
// look cannot tell: valid JSON that opens and closes with a quote is one
// string, and one with anything between its quotes is not empty.
func hasTitle(st *state.State) bool {
	raw := st.Values[TitleValue]
	if n := len(raw); n > len(`""`) && raw[0] == '"' && raw[n-1] == '"' && json.Valid(raw) {
		return true
	}
	var cur string
	ok, _ := st.Value(TitleValue, &cur)
	return ok && cur != ""
}

func (t *Title) set(rt *Runtime, title string) (Result, error) {
	u, err := state.SetValue(TitleValue, title)
	if err != nil {
		return Result{}, err
	}
	if rt.Emit != nil {
		rt.Emit(EventTitled, titledData{Title: title})
	}
	return Result{Update: u}, nil
}

// AfterModel starts the title model after the thread's first exchange, and
// applies its answer once it is ready.
func (t *Title) AfterModel(ctx context.Context, rt *Runtime, st *state.State) (Result, error) {
	if t.Model == "" || t.provider == nil {
		return Result{}, nil
	}
	job := Scratch(rt, "title:job", func() *titleJob { return &titleJob{} })
	if r, ok := t.ready(rt, st, job); ok {
		return r, nil
	}
	job.mu.Lock()
	defer job.mu.Unlock()
	if job.start {
		return Result{}, nil
	}
	var users, answers []string
	for _, m := range st.Messages {
		switch {
		case m.Role == model.RoleUser && m.Meta[MetaHidden] != true:
			users = append(users, m.Content)
		case m.Role == model.RoleAssistant && strings.TrimSpace(m.Content) != "":
			answers = append(answers, m.Content)
		}
	}
	if len(users) != 1 || len(answers) == 0 {
		return Result{}, nil
	}
	job.start = true
	job.fallback = FallbackTitle(users[0], t.MaxWords, t.MaxChars)
	go t.generate(context.WithoutCancel(ctx), job, users[0], answers[0])
	return Result{}, nil
}

// AfterAgent applies a title the model finished in time.
func (t *Title) AfterAgent(ctx context.Context, rt *Runtime, st *state.State) (Result, error) {
	if t.Model == "" {
		return Result{}, nil
	}
	r, _ := t.ready(rt, st, Scratch(rt, "title:job", func() *titleJob { return &titleJob{} }))
	return r, nil
}

// ready applies the title model's answer once, and only over the fallback
// title: a title someone set by other means stays.
func (t *Title) ready(rt *Runtime, st *state.State, job *titleJob) (Result, bool) {
	job.mu.Lock()
	done, title, fallback := job.done, job.title, job.fallback
	if done {
		job.title = "" // apply once
	}
	job.mu.Unlock()
	if !done || title == "" {
		return Result{}, false
	}
	var cur string
	if _, err := st.Value(TitleValue, &cur); err != nil || (cur != "" && cur != fallback) {
		return Result{}, false
	}
	r, err := t.set(rt, title)
	return r, err == nil
}

func (t *Title) generate(ctx context.Context, job *titleJob, user, answer string) {
	ctx, cancel := context.WithTimeout(ctx, time.Duration(t.TimeoutSeconds)*time.Second)
	defer cancel()
	title := ""
	defer func() {
		// A panicking provider leaves the fallback title; it must not take
		// the worker down.
		_ = recover()
		job.mu.Lock()
		job.done, job.title = true, title
		job.mu.Unlock()
	}()
	prompt := fmt.Sprintf("Write a title of at most %d words for this conversation. Answer with the title only, no quotes.\n\nUser: %s\n\nAssistant: %s",
		t.MaxWords, clipText(stripReasoning(user), 500), clipText(stripReasoning(answer), 500))
	resp, err := t.provider.Generate(ctx, &model.Request{Model: t.Model, Messages: []model.Message{{Role: model.RoleUser, Content: prompt}}}, nil)
	if err == nil {
		title = truncateChars(strings.Trim(strings.TrimSpace(stripReasoning(resp.Message.Content)), `"'`), t.MaxChars)
	}
}

var reasoningTags = regexp.MustCompile(`(?s)<(think|thinking|reasoning)>.*?</(think|thinking|reasoning)>`)

func stripReasoning(s string) string {
	if !strings.Contains(s, "</") {
		return strings.TrimSpace(s) // no closing tag: nothing to strip, no regexp
	}
	return strings.TrimSpace(reasoningTags.ReplaceAllString(s, ""))
}

// FallbackTitle makes a title from a user message: reasoning tags removed,
// whitespace collapsed, at most maxWords words and maxChars characters
// (an ellipsis, when added, fits within maxChars).
func FallbackTitle(text string, maxWords, maxChars int) string {
	words := strings.Fields(stripReasoning(text))
	if len(words) == 0 {
		return "New conversation"
	}
	cut := len(words) > maxWords
	if cut {
		words = words[:maxWords]
	}
	title := strings.Join(words, " ")
	if cut {
		title += "..."
	}
	return truncateChars(title, maxChars)
}

func truncateChars(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return strings.TrimSpace(string(r[:n-3])) + "..."
}
