package middleware

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
)

func TestFallbackTitle(t *testing.T) {
	long := strings.Repeat("x", 100)
	cases := []struct {
		name     string
		in       string
		words    int
		chars    int
		want     string
		wantMaxN int // when want is empty: the title's rune count must be <= this
	}{
		{name: "short", in: "Hello there", words: 6, chars: 60, want: "Hello there"},
		{name: "six words kept", in: "one two three four five six", words: 6, chars: 60, want: "one two three four five six"},
		{name: "seventh word cut", in: "one two three four five six seven eight", words: 6, chars: 60, want: "one two three four five six..."},
		{name: "whitespace collapsed", in: "  plan\n\nmy \t trip  ", words: 6, chars: 60, want: "plan my trip"},
		{name: "deer-flow #1884 think stripped", in: "<think>The user wants a trip.\nLet me see.</think>Plan my trip to Rome", words: 6, chars: 60, want: "Plan my trip to Rome"},
		{name: "thinking and reasoning tags", in: "<thinking>a</thinking>Fix <reasoning>b</reasoning>the bug", words: 6, chars: 60, want: "Fix the bug"},
		{name: "empty", in: "", words: 6, chars: 60, want: "New conversation"},
		{name: "only whitespace", in: " \n\t", words: 6, chars: 60, want: "New conversation"},
		{name: "only reasoning", in: "<think>just thinking</think>", words: 6, chars: 60, want: "New conversation"},
		{name: "deer-flow #4052 one long word within 60", in: long, words: 6, chars: 60, want: strings.Repeat("x", 57) + "..."},
		{name: "deer-flow #4052 long words within 60", in: strings.Repeat("abcdefghijklmn ", 6), words: 6, chars: 60, wantMaxN: 60},
		{name: "deer-flow #4052 ellipsis within 10", in: "abcdefghijklmnop", words: 6, chars: 10, want: "abcdefg..."},
		{name: "words cut and chars cut", in: strings.Repeat("word ", 20), words: 20, chars: 30, wantMaxN: 30},
		{name: "multibyte counted in characters", in: strings.Repeat("日本語", 30), words: 6, chars: 20, wantMaxN: 20},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := FallbackTitle(tc.in, tc.words, tc.chars)
			if tc.want != "" && got != tc.want {
				t.Errorf("FallbackTitle(%q) = %q, want %q", tc.in, got, tc.want)
			}
			if n := utf8.RuneCountInString(got); n > tc.chars || (tc.wantMaxN > 0 && n > tc.wantMaxN) {
				t.Errorf("title %q has %d characters, over %d", got, n, tc.chars)
			}
			if !utf8.ValidString(got) {
				t.Errorf("title %q is not valid UTF-8", got)
			}
			if tc.wantMaxN > 0 && !strings.HasSuffix(got, "...") {
				t.Errorf("title %q was cut without an ellipsis", got)
			}
		})
	}
}

func titleOf(t *testing.T, st *state.State) string {
	t.Helper()
	var title string
	if _, err := st.Value(TitleValue, &title); err != nil {
		t.Fatal(err)
	}
	return title
}

func newTitleMW(t *testing.T, tt Title, provider model.Model) *Title {
	t.Helper()
	m, err := NewTitle(tt, provider)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func runHook(t *testing.T, hook func(context.Context, *Runtime, *state.State) (Result, error), rt *Runtime, st *state.State) Result {
	t.Helper()
	res, err := hook(context.Background(), rt, st)
	if err != nil {
		t.Fatal(err)
	}
	st.Apply(res.Update)
	return res
}

// deer-flow #3859/#3874: the title is set from the first user message
// before any model call, so an interrupted first turn still has one.
func TestTitle_DeerFlow3859_BeforeAgentSetsFallback(t *testing.T) {
	tm := newTitleMW(t, Title{}, nil)
	rt, ev := newRuntime("r1")
	hidden := user("h", "<current_date>2026-01-01</current_date>")
	hidden.Meta = map[string]any{MetaHidden: true}
	st := stateOf(hidden, user("u1", "Plan a three day trip to Rome in spring please"))
	res := runHook(t, tm.BeforeAgent, rt, st)
	if res.Jump != JumpNone {
		t.Errorf("jump = %v", res.Jump)
	}
	if got := titleOf(t, st); got != "Plan a three day trip to..." {
		t.Errorf("title = %q", got)
	}
	if evs := ev.ofType(EventTitled); len(evs) != 1 {
		t.Errorf("thread.titled events = %+v", evs)
	}

	t.Run("a thread with a title keeps it", func(t *testing.T) {
		rt, ev := newRuntime("r2")
		st := stateOf(user("u1", "something else entirely"))
		u, _ := state.SetValue(TitleValue, "Chosen by the user")
		st.Apply(u)
		res := runHook(t, tm.BeforeAgent, rt, st)
		if !res.Update.Empty() || titleOf(t, st) != "Chosen by the user" || len(ev.all) != 0 {
			t.Errorf("result %+v, title %q", res, titleOf(t, st))
		}
	})
	t.Run("no user message: nothing", func(t *testing.T) {
		rt, _ := newRuntime("r3")
		if res := runHook(t, tm.BeforeAgent, rt, stateOf(hidden)); !res.Update.Empty() {
			t.Errorf("result %+v", res)
		}
	})
	t.Run("no title model: after-model does nothing", func(t *testing.T) {
		rt, _ := newRuntime("r4")
		st := stateOf(user("u1", "q"), asst("a1", "answer"))
		if res := runHook(t, tm.AfterModel, rt, st); !res.Update.Empty() {
			t.Errorf("result %+v", res)
		}
	})
}

// waitTitleJob waits until the background title call of rt has finished.
func waitTitleJob(t *testing.T, rt *Runtime) {
	t.Helper()
	job := Scratch(rt, "title:job", func() *titleJob { return &titleJob{} })
	deadline := time.Now().Add(5 * time.Second)
	for {
		job.mu.Lock()
		started, done := job.start, job.done
		job.mu.Unlock()
		if !started {
			t.Fatal("the title model was not started")
		}
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the title model call did not finish")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestTitle_TitleModel(t *testing.T) {
	firstTurn := func() *state.State {
		return stateOf(
			user("u1", "<think>x</think>Plan a three day trip to Rome in spring please"),
			asst("a1", "<think>The user wants Rome.</think>Here is a plan: day one, the Colosseum."),
		)
	}
	t.Run("the model's title replaces the fallback in a later hook", func(t *testing.T) {
		provider := model.NewScripted(func(int, *model.Request) model.Reply {
			return model.Reply{Text: "<think>short please</think> \"Rome Spring Trip\" "}
		})
		tm := newTitleMW(t, Title{Model: "title-model"}, provider)
		rt, ev := newRuntime("r1")
		st := firstTurn()
		runHook(t, tm.BeforeAgent, rt, st)
		fallback := titleOf(t, st)
		if res := runHook(t, tm.AfterModel, rt, st); !res.Update.Empty() {
			t.Errorf("after-model waited for the title model: %+v", res)
		}
		runHook(t, tm.AfterModel, rt, st) // a second response before the title is ready starts nothing new
		waitTitleJob(t, rt)
		if titleOf(t, st) != fallback {
			t.Fatalf("title changed before a hook applied it")
		}
		runHook(t, tm.AfterModel, rt, st)
		if got := titleOf(t, st); got != "Rome Spring Trip" {
			t.Errorf("title = %q, want the model's", got)
		}
		if res := runHook(t, tm.AfterAgent, rt, st); !res.Update.Empty() {
			t.Errorf("the title was applied twice: %+v", res)
		}
		reqs := provider.Requests()
		if len(reqs) != 1 {
			t.Fatalf("title model called %d times, want 1", len(reqs))
		}
		prompt := reqs[0].Messages[0].Content
		if reqs[0].Model != "title-model" || !strings.Contains(prompt, "Plan a three day trip") || !strings.Contains(prompt, "the Colosseum") || strings.Contains(prompt, "think>") {
			t.Errorf("title request = %+v", reqs[0])
		}
		if n := len(ev.ofType(EventTitled)); n != 2 {
			t.Errorf("thread.titled events = %d, want 2 (fallback, model)", n)
		}
	})
	t.Run("applied at the end of the run", func(t *testing.T) {
		provider := model.NewScripted(func(int, *model.Request) model.Reply {
			return model.Reply{Text: strings.Repeat("Very long title ", 10)}
		})
		tm := newTitleMW(t, Title{Model: "title-model", MaxChars: 20}, provider)
		rt, _ := newRuntime("r1")
		st := firstTurn()
		runHook(t, tm.AfterModel, rt, st)
		waitTitleJob(t, rt)
		runHook(t, tm.AfterAgent, rt, st)
		if got := titleOf(t, st); got == "" || utf8.RuneCountInString(got) > 20 {
			t.Errorf("title = %q, want the model's, at most 20 characters", got)
		}
	})
	t.Run("the fallback stays when the model errors", func(t *testing.T) {
		provider := model.NewScripted(func(int, *model.Request) model.Reply {
			return model.Reply{Err: errors.New("title model unavailable")}
		})
		tm := newTitleMW(t, Title{Model: "title-model"}, provider)
		rt, ev := newRuntime("r1")
		st := firstTurn()
		runHook(t, tm.BeforeAgent, rt, st)
		fallback := titleOf(t, st)
		runHook(t, tm.AfterModel, rt, st)
		waitTitleJob(t, rt)
		runHook(t, tm.AfterModel, rt, st)
		runHook(t, tm.AfterAgent, rt, st)
		if got := titleOf(t, st); got != fallback || fallback == "" {
			t.Errorf("title = %q, want the fallback %q", got, fallback)
		}
		if n := len(ev.ofType(EventTitled)); n != 1 {
			t.Errorf("thread.titled events = %d, want 1", n)
		}
	})
	t.Run("not after the first exchange", func(t *testing.T) {
		provider := model.NewScripted(func(int, *model.Request) model.Reply { return model.Reply{Text: "T"} })
		tm := newTitleMW(t, Title{Model: "title-model"}, provider)
		rt, _ := newRuntime("r2")
		st := stateOf(user("u1", "first"), asst("a1", "one"), user("u2", "second"), asst("a2", "two"))
		runHook(t, tm.AfterModel, rt, st)
		runHook(t, tm.AfterAgent, rt, st)
		if provider.Calls() != 0 {
			t.Errorf("title model called on a later turn")
		}
	})
}

func TestNewTitle_Validation(t *testing.T) {
	for name, bad := range map[string]Title{
		"max_words 21":  {MaxWords: 21},
		"max_words -1":  {MaxWords: -1},
		"max_chars 9":   {MaxChars: 9},
		"max_chars 201": {MaxChars: 201},
	} {
		if _, err := NewTitle(bad, nil); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// thread.titled's data encodes by hand to what encoding/json writes.
func TestTitledDataJSON(t *testing.T) {
	for _, title := range []string{"", "What time is it?", "<a & b> \u2028 \"q\" \\ \x01 é \xff"} {
		want, err := json.Marshal(titledData{Title: title})
		if err != nil {
			t.Fatal(err)
		}
		got, ok := protocol.AppendEventDataJSON(nil, titledData{Title: title})
		if !ok || string(got) != string(want) {
			t.Fatalf("title %q: hand %s (%v), encoding/json %s", title, got, ok, want)
		}
	}
}

// TestTitle_TitledThreadCostsNothing: the run of a thread that has its
// title reads the stored value without decoding it (no allocation),
// and every stored value that does not decode to a non-empty string
// still gets the fallback title, as it did when the value was decoded.
func TestTitle_TitledThreadCostsNothing(t *testing.T) {
	tm := newTitleMW(t, Title{}, nil)
	for raw, keeps := range map[string]bool{
		`"Chosen"`: true, `" "`: true, `"\u0000"`: true, `"日本"`: true, `"a\"b"`: true,
		`""`: false, `"`: false, `"abc`: false, `123`: false, `{"a":1}`: false, `"a"b"`: false, `["x"]`: false, `"\x"`: false,
		`"" `: false, ` "x"`: true, "\"x\"\n": true, `"a" "b"`: false,
	} {
		rt, ev := newRuntime("r1")
		st := stateOf(user("u1", "Plan a trip"))
		st.Apply(state.Update{Values: map[string]json.RawMessage{TitleValue: json.RawMessage(raw)}})
		var cur string
		decoded, _ := st.Value(TitleValue, &cur)
		if want := decoded && cur != ""; want != keeps {
			t.Fatalf("%s: the case table is wrong: decodes to %q", raw, cur)
		}
		res := runHook(t, tm.BeforeAgent, rt, st)
		if set := !res.Update.Empty(); set == keeps || len(ev.ofType(EventTitled)) == 0 == set {
			t.Errorf("stored title %s: update %+v, events %+v; want a new title: %v", raw, res.Update, ev.all, !keeps)
		}
	}
	rt, _ := newRuntime("r2")
	st := stateOf(user("u1", "Plan a trip"))
	u, _ := state.SetValue(TitleValue, "Chosen by the user")
	st.Apply(u)
	ctx := context.Background()
	if n := testing.AllocsPerRun(100, func() { _, _ = tm.BeforeAgent(ctx, rt, st) }); n != 0 {
		t.Errorf("a titled thread's run: %v allocations, want 0", n)
	}
}
