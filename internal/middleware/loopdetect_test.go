package middleware

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
)

// thread builds a transcript the way the loop does: each turn is an
// assistant message with tool calls followed by one result per call, all
// tagged with the run.
type thread struct {
	st    *state.State
	runID string
	n     int
}

func newThread(runID string) *thread {
	return &thread{st: stateOf(inRun(runID, user("u0", "do the task"))...), runID: runID}
}

// call appends an assistant message asking for calls (the model's new
// response, not yet answered).
func (th *thread) ask(calls ...model.ToolCall) {
	th.n++
	cs := make([]model.ToolCall, len(calls))
	for i, c := range calls {
		c.ID = fmt.Sprintf("c%d_%d", th.n, i)
		cs[i] = c
	}
	th.st.Messages = append(th.st.Messages, inRun(th.runID, asst(fmt.Sprintf("a%d", th.n), "", cs...))...)
}

// answer appends results for the last assistant message's calls.
func (th *thread) answer() {
	last := th.st.Messages[len(th.st.Messages)-1]
	for _, c := range last.ToolCalls {
		th.st.Messages = append(th.st.Messages, inRun(th.runID, result("t"+c.ID, c.ID, c.Name, "result"))...)
	}
}

// tc is a tool call without an id (ask assigns ids).
func tc(name, args string) model.ToolCall { return model.ToolCall{Name: name, Arguments: args} }

func newLoop(t *testing.T, l LoopDetection) *LoopDetection {
	t.Helper()
	ld, err := NewLoopDetection(l)
	if err != nil {
		t.Fatal(err)
	}
	return ld
}

// step runs AfterModel on the thread's new response and, unless it
// stopped the run, answers the calls.
func (th *thread) step(t *testing.T, l *LoopDetection, rt *Runtime, calls ...model.ToolCall) Result {
	t.Helper()
	th.ask(calls...)
	res, err := l.AfterModel(context.Background(), rt, th.st)
	if err != nil {
		t.Fatal(err)
	}
	if res.Jump != JumpEnd {
		if !res.Update.Empty() {
			t.Fatalf("a warning must not change state: %+v", res.Update)
		}
		th.answer()
	}
	return res
}

func wantHardStop(t *testing.T, th *thread, res Result, noteHas string) {
	t.Helper()
	if res.Jump != JumpEnd || res.StopReason != protocol.StopLoopCapped {
		t.Fatalf("result = %+v, want a hard stop with %s", res, protocol.StopLoopCapped)
	}
	last := th.st.Messages[len(th.st.Messages)-1]
	if len(res.Update.Messages) != 1 {
		t.Fatalf("update = %+v, want the stripped assistant message", res.Update)
	}
	m := res.Update.Messages[0]
	if m.ID != last.ID || m.Role != model.RoleAssistant || len(m.ToolCalls) != 0 {
		t.Errorf("update message = %+v, want %s without tool calls", m, last.ID)
	}
	if !strings.Contains(m.Content, "[FORCED STOP]") || !strings.Contains(m.Content, noteHas) {
		t.Errorf("content = %q, want the [FORCED STOP] note mentioning %q", m.Content, noteHas)
	}
	if m.Meta[MetaStopNote] != protocol.StopLoopCapped || m.Meta["finish_reason"] != model.FinishStop || m.Meta["run_id"] != th.runID {
		t.Errorf("meta = %v", m.Meta)
	}
	// Applied, the transcript is a valid final answer.
	th.st.Apply(res.Update)
	if n := len(th.st.Messages); th.st.Messages[n-1].ID != last.ID || len(th.st.Messages[n-1].ToolCalls) != 0 {
		t.Errorf("the stop did not replace the message in place")
	}
	mustValidate(t, "", th.st.Messages)
}

func warnings(rt *Runtime) []string { return pendingGuidance(rt, loopWarningName) }

// deer-flow §5.3 #22/#29: identical call sets warn at 3 and stop at 5.
func TestLoopDetection_WarnAt3StopAt5(t *testing.T) {
	l := newLoop(t, LoopDetection{})
	th := newThread("r1")
	rt, ev := newRuntime("r1")
	same := []model.ToolCall{tc("search", `{"query":"weather"}`), tc("read_file", `{"path":"a.txt"}`)}
	for i := 1; i <= 4; i++ {
		res := th.step(t, l, rt, same...)
		if res.Jump != JumpNone {
			t.Fatalf("call %d: jump %v", i, res.Jump)
		}
		want := 0
		if i >= 3 {
			want = 1 // warned once, at the 3rd
		}
		if got := warnings(rt); len(got) != want {
			t.Fatalf("after call %d: warnings %q, want %d", i, got, want)
		}
	}
	if w := warnings(rt); !strings.Contains(w[0], "[LOOP DETECTED]") {
		t.Errorf("warning = %q", w[0])
	}
	if n := len(ev.ofType(EventLoopDetected)); n != 1 {
		t.Errorf("%d loop.detected events after the warning, want 1", n)
	}
	wantHardStop(t, th, th.step(t, l, rt, same...), "repeated")
	if evs := ev.ofType(EventLoopDetected); len(evs) != 2 || evs[1].Data.(map[string]any)["action"] != "stop" {
		t.Errorf("events = %+v", evs)
	}
}

// Repetitions that left the window of 20 tool-calling messages do not
// count.
func TestLoopDetection_Window(t *testing.T) {
	for _, tc2 := range []struct {
		between  int
		wantStop bool
	}{{15, true}, {16, false}} {
		t.Run(fmt.Sprintf("%d others between", tc2.between), func(t *testing.T) {
			l := newLoop(t, LoopDetection{})
			th := newThread("r1")
			rt, _ := newRuntime("r1")
			same := tc("search", `{"query":"same"}`)
			for range 4 {
				th.step(t, l, rt, same)
			}
			for i := range tc2.between {
				th.step(t, l, rt, tc("fetch", fmt.Sprintf(`{"url":"https://example.com/%d"}`, i)))
			}
			res := th.step(t, l, rt, same)
			if got := res.Jump == JumpEnd; got != tc2.wantStop {
				t.Errorf("stopped = %v, want %v", got, tc2.wantStop)
			}
		})
	}
}

func TestLoopDetection_PermutationsAreIdentical(t *testing.T) {
	a, b, c := tc("search", `{"query":"x"}`), tc("fetch", `{"url":"u"}`), tc("search", `{"query":"y"}`)
	if CallSetHash([]model.ToolCall{a, b, c}) != CallSetHash([]model.ToolCall{c, a, b}) {
		t.Error("a permutation hashes differently")
	}
	if CallSetHash([]model.ToolCall{a, b}) == CallSetHash([]model.ToolCall{a, b, b}) {
		t.Error("a different multiset hashes alike")
	}
	l := newLoop(t, LoopDetection{})
	th := newThread("r1")
	rt, _ := newRuntime("r1")
	th.step(t, l, rt, a, b, c)
	th.step(t, l, rt, b, c, a)
	th.step(t, l, rt, c, b, a)
	if len(warnings(rt)) != 1 {
		t.Errorf("3 permutations of one call set: warnings %q, want 1", warnings(rt))
	}
	th.step(t, l, rt, a, c, b)
	wantHardStop(t, th, th.step(t, l, rt, b, a, c), "repeated")
}

// Salient arguments: only what identifies the call counts.
func TestLoopDetection_SalientArguments(t *testing.T) {
	x := tc("search", `{"query":"x","max_results":5}`)
	y := tc("search", `{"max_results":10,"query":"x"}`)
	if CallSetHash([]model.ToolCall{x}) != CallSetHash([]model.ToolCall{y}) {
		t.Error("calls differing only in non-salient arguments hash differently")
	}
	z := tc("search", `{"query":"z","max_results":5}`)
	if CallSetHash([]model.ToolCall{x}) == CallSetHash([]model.ToolCall{z}) {
		t.Error("calls with different queries hash alike")
	}
}

// deer-flow #23: read_file ranges in one 200-line bucket count as the
// same call; ranges in different buckets do not.
func TestLoopDetection_DeerFlow23_ReadFileBuckets(t *testing.T) {
	read := func(offset, limit int) model.ToolCall {
		return tc("read_file", fmt.Sprintf(`{"path":"/data/log.txt","offset":%d,"limit":%d}`, offset, limit))
	}
	lines1to100, lines150to180, lines250to300 := read(1, 100), read(150, 31), read(250, 51)
	h := func(c model.ToolCall) string { return CallSetHash([]model.ToolCall{c}) }
	if h(lines1to100) != h(lines150to180) {
		t.Error("lines 1-100 and 150-180 should count as identical")
	}
	if h(lines1to100) == h(lines250to300) {
		t.Error("lines 1-100 and 250-300 should not count as identical")
	}
	if h(lines1to100) == h(tc("read_file", `{"path":"/data/other.txt","offset":1,"limit":100}`)) {
		t.Error("the same lines of another file count as identical")
	}

	t.Run("same bucket warns", func(t *testing.T) {
		l := newLoop(t, LoopDetection{})
		th := newThread("r1")
		rt, _ := newRuntime("r1")
		th.step(t, l, rt, lines1to100)
		th.step(t, l, rt, lines1to100)
		th.step(t, l, rt, lines150to180)
		if len(warnings(rt)) != 1 {
			t.Errorf("warnings = %q, want 1", warnings(rt))
		}
	})
	t.Run("other bucket does not", func(t *testing.T) {
		l := newLoop(t, LoopDetection{})
		th := newThread("r1")
		rt, _ := newRuntime("r1")
		th.step(t, l, rt, lines1to100)
		th.step(t, l, rt, lines1to100)
		th.step(t, l, rt, lines250to300)
		if len(warnings(rt)) != 0 {
			t.Errorf("warnings = %q, want none", warnings(rt))
		}
	})
}

// deer-flow #24: writes to one path with different content are different
// calls (the content matters).
func TestLoopDetection_DeerFlow24_WriteFileContentMatters(t *testing.T) {
	write := func(content string) model.ToolCall {
		return tc("write_file", fmt.Sprintf(`{"path":"out.md","content":%q}`, content))
	}
	if CallSetHash([]model.ToolCall{write("v1")}) == CallSetHash([]model.ToolCall{write("v2")}) {
		t.Error("writes with different content hash alike")
	}
	l := newLoop(t, LoopDetection{})
	th := newThread("r1")
	rt, _ := newRuntime("r1")
	for i := range 4 {
		if res := th.step(t, l, rt, write(fmt.Sprintf("draft %d", i))); res.Jump != JumpNone {
			t.Fatal("stopped")
		}
	}
	th.step(t, l, rt, write("draft 3"))
	if len(warnings(rt)) != 0 {
		t.Errorf("warnings = %q, want none", warnings(rt))
	}
	th.step(t, l, rt, write("draft 3"))
	if len(warnings(rt)) != 1 {
		t.Errorf("3 identical writes: warnings = %q, want 1", warnings(rt))
	}
}

// deer-flow #5243 / PR #5246: a batch of 3 calls of one tool with freq
// warn=2, hard=3 must stop, not warn: the whole batch is counted first.
func TestLoopDetection_DeerFlow5243_BatchReachesHardLimit(t *testing.T) {
	l := newLoop(t, LoopDetection{Overrides: map[string]FreqLimit{"search": {Warn: 2, Hard: 3}}})
	th := newThread("r1")
	rt, _ := newRuntime("r1")
	res := th.step(t, l, rt, tc("search", `{"query":"a"}`), tc("search", `{"query":"b"}`), tc("search", `{"query":"c"}`))
	wantHardStop(t, th, res, "search")

	t.Run("a layer-1 warning does not hide a layer-2 stop", func(t *testing.T) {
		l := newLoop(t, LoopDetection{Overrides: map[string]FreqLimit{"bash": {Warn: 5, Hard: 6}}})
		th := newThread("r1")
		rt, _ := newRuntime("r1")
		set := []model.ToolCall{tc("bash", `{"command":"ls"}`), tc("bash", `{"command":"pwd"}`)}
		th.step(t, l, rt, set...)
		th.step(t, l, rt, set...)
		// 3rd identical set (a layer-1 warning) and 6th bash call (stop).
		wantHardStop(t, th, th.step(t, l, rt, set...), "bash")
	})
	t.Run("per-tool warning once when crossing", func(t *testing.T) {
		l := newLoop(t, LoopDetection{Overrides: map[string]FreqLimit{"search": {Warn: 2, Hard: 10}}})
		th := newThread("r1")
		rt, _ := newRuntime("r1")
		th.step(t, l, rt, tc("search", `{"query":"a"}`))
		if len(warnings(rt)) != 0 {
			t.Fatal("warned below the threshold")
		}
		th.step(t, l, rt, tc("search", `{"query":"b"}`), tc("search", `{"query":"c"}`))
		w := warnings(rt)
		if len(w) != 1 || !strings.Contains(w[0], "search") {
			t.Fatalf("warnings = %q, want one about search", w)
		}
		th.step(t, l, rt, tc("search", `{"query":"d"}`))
		if len(warnings(rt)) != 1 {
			t.Errorf("warned again above the threshold: %q", warnings(rt))
		}
	})
}

// deer-flow #2116/#27: legitimate batch work is not stopped, and an
// override lets 50 distinct calls of one tool pass.
func TestLoopDetection_DeerFlow2116_BatchWork(t *testing.T) {
	distinct := func(n int) []model.ToolCall {
		calls := make([]model.ToolCall, n)
		for i := range calls {
			calls[i] = tc("bash", fmt.Sprintf(`{"command":"process sample_%d.fastq"}`, i))
		}
		return calls
	}
	t.Run("below the threshold", func(t *testing.T) {
		l := newLoop(t, LoopDetection{})
		th := newThread("r1")
		rt, _ := newRuntime("r1")
		if res := th.step(t, l, rt, distinct(20)...); res.Jump != JumpNone || len(warnings(rt)) != 0 {
			t.Errorf("20 distinct bash calls: result %+v, warnings %q", res, warnings(rt))
		}
	})
	t.Run("50 by default stops", func(t *testing.T) {
		l := newLoop(t, LoopDetection{})
		th := newThread("r1")
		rt, _ := newRuntime("r1")
		wantHardStop(t, th, th.step(t, l, rt, distinct(50)...), "bash")
	})
	t.Run("50 with an override pass", func(t *testing.T) {
		l := newLoop(t, LoopDetection{Overrides: map[string]FreqLimit{"bash": {Warn: 100, Hard: 200}}})
		th := newThread("r1")
		rt, _ := newRuntime("r1")
		if res := th.step(t, l, rt, distinct(50)...); res.Jump != JumpNone || len(warnings(rt)) != 0 {
			t.Errorf("result %+v, warnings %q", res, warnings(rt))
		}
	})
	t.Run("50 one at a time with an override pass", func(t *testing.T) {
		l := newLoop(t, LoopDetection{Overrides: map[string]FreqLimit{"bash": {Warn: 100, Hard: 200}}})
		th := newThread("r1")
		rt, _ := newRuntime("r1")
		for _, c := range distinct(50) {
			if res := th.step(t, l, rt, c); res.Jump != JumpNone {
				t.Fatalf("stopped at %s", c.Arguments)
			}
		}
		if len(warnings(rt)) != 0 {
			t.Errorf("warnings %q", warnings(rt))
		}
	})
}

// Only a new response with tool calls is judged.
func TestLoopDetection_IgnoresOtherMessages(t *testing.T) {
	l := newLoop(t, LoopDetection{WarnThreshold: 1, HardLimit: 1, WindowSize: 5})
	rt, _ := newRuntime("r1")
	for name, st := range map[string]*state.State{
		"final answer":      stateOf(user("u", "q"), asst("a", "done")),
		"empty":             stateOf(),
		"last is a result":  stateOf(user("u", "q"), asst("a", "", call("c", "search", `{}`)), result("t", "c", "search", "r")),
		"last is user text": stateOf(user("u", "q")),
	} {
		res, err := l.AfterModel(context.Background(), rt, st)
		if err != nil || res.Jump != JumpNone || !res.Update.Empty() {
			t.Errorf("%s: result %+v, err %v", name, res, err)
		}
	}
}

// deer-flow #2724/#2752 and §5.3 #26: the warning goes into the next
// request only, after the tool results, once; a failed call keeps it for
// the retry.
func TestLoopDetection_DeerFlow2724_WarningInNextRequestOnly(t *testing.T) {
	l := newLoop(t, LoopDetection{})
	th := newThread("r1")
	rt, _ := newRuntime("r1")
	for range 3 {
		th.step(t, l, rt, tc("search", `{"query":"same"}`))
	}
	if len(warnings(rt)) != 1 {
		t.Fatalf("warnings = %q", warnings(rt))
	}
	before := th.st.Clone()
	req := func() *ModelRequest {
		return &ModelRequest{System: "sys", Messages: append([]model.Message(nil), th.st.Messages...), State: th.st}
	}
	ctx := context.Background()

	// Another run on the thread (a new runtime) never sees it.
	rt2, _ := newRuntime("r2")
	var other captureNext
	if _, err := l.WrapModelCall(ctx, rt2, req(), other.handle); err != nil {
		t.Fatal(err)
	}
	if got := other.last(t); len(got.Messages) != len(th.st.Messages) {
		t.Error("another run received the warning")
	}

	// A failed call carries the warning and keeps it.
	failed := captureNext{err: errors.New("connection reset")}
	if _, err := l.WrapModelCall(ctx, rt, req(), failed.handle); err == nil {
		t.Fatal("want the handler's error")
	}
	var next captureNext
	if _, err := l.WrapModelCall(ctx, rt, req(), next.handle); err != nil {
		t.Fatal(err)
	}
	for name, got := range map[string]*ModelRequest{"failed call": failed.last(t), "retry": next.last(t)} {
		n := len(got.Messages)
		if n != len(th.st.Messages)+1 {
			t.Fatalf("%s: %d messages, want the transcript plus the warning", name, n)
		}
		w := got.Messages[n-1]
		if w.Role != model.RoleUser || w.Name != loopWarningName || !strings.Contains(w.Content, "[LOOP DETECTED]") {
			t.Errorf("%s: last message = %+v, want the loop warning", name, w)
		}
		if got.Messages[n-2].Role != model.RoleTool {
			t.Errorf("%s: the warning must come after the tool results", name)
		}
		mustValidate(t, got.System, got.Messages, "search")
	}
	if !reflect.DeepEqual(th.st, before) {
		t.Error("delivering the warning changed the state")
	}
	// Delivered once.
	var again captureNext
	if _, err := l.WrapModelCall(ctx, rt, req(), again.handle); err != nil {
		t.Fatal(err)
	}
	if got := again.last(t); len(got.Messages) != len(th.st.Messages) {
		t.Errorf("the warning was repeated: %+v", got.Messages[len(got.Messages)-1])
	}
}

func TestNewLoopDetection_Validation(t *testing.T) {
	l, err := NewLoopDetection(LoopDetection{})
	if err != nil {
		t.Fatal(err)
	}
	if l.WarnThreshold != 3 || l.HardLimit != 5 || l.WindowSize != 20 || l.ToolFreqWarn != 30 || l.ToolFreqHard != 50 {
		t.Errorf("defaults = %+v", l)
	}
	for name, bad := range map[string]LoopDetection{
		"hard below warn":          {WarnThreshold: 5, HardLimit: 3},
		"warn below 1":             {WarnThreshold: -1},
		"window below hard":        {WindowSize: 4},
		"freq hard below warn":     {ToolFreqWarn: 40, ToolFreqHard: 35},
		"override hard below warn": {Overrides: map[string]FreqLimit{"bash": {Warn: 5, Hard: 3}}},
		"override warn zero":       {Overrides: map[string]FreqLimit{"bash": {Hard: 3}}},
	} {
		if _, err := NewLoopDetection(bad); err == nil {
			t.Errorf("%s: accepted %+v", name, bad)
		}
	}
}

// The history is the run's own: the same single call made once in each of
// five runs on a thread is five turns of a conversation, not a loop.
func TestLoopDetection_EarlierRunsDoNotCount(t *testing.T) {
	l := newLoop(t, LoopDetection{})
	var st *state.State
	for i := 0; i < 5; i++ {
		runID := fmt.Sprintf("r%d", i)
		th := newThread(runID)
		if st != nil {
			th.st.Messages = append(append([]model.Message(nil), st.Messages...), th.st.Messages...)
		}
		rt, _ := newRuntime(runID)
		res := th.step(t, l, rt, tc("search", `{"query":"weather"}`))
		if res.Jump != JumpNone || len(pendingGuidance(rt, loopWarningName)) != 0 {
			t.Fatalf("run %d: %+v / %v; calls of earlier runs must not count", i, res, pendingGuidance(rt, loopWarningName))
		}
		st = th.st
	}
	// Within one run the same five calls do stop it.
	th := newThread("solo")
	rt, _ := newRuntime("solo")
	var res Result
	for i := 0; i < 5; i++ {
		res = th.step(t, l, rt, tc("search", `{"query":"weather"}`))
	}
	wantHardStop(t, th, res, "[FORCED STOP]")
}

// deer-flow §5.3 #28 (#2569): 220 alternating search/fetch calls with
// arguments that all differ escape both DeerFlow layers (no set repeats;
// each tool has 25 of the last 50 calls). The cycle layer warns at 15
// rounds and stops at 25.
func TestLoopDetection_Case28_AlternatingCycleStops(t *testing.T) {
	l := newLoop(t, LoopDetection{})
	th := newThread("r1")
	rt, ev := newRuntime("r1")
	warnedAt, stoppedAt := 0, 0
	for i := 1; i <= 220; i++ {
		name, args := "search", fmt.Sprintf(`{"query":"tidal power %d"}`, i)
		if i%2 == 0 {
			name, args = "fetch", fmt.Sprintf(`{"url":"https://example.org/%d"}`, i)
		}
		res := th.step(t, l, rt, tc(name, args))
		if w := warnings(rt); warnedAt == 0 && len(w) > 0 {
			warnedAt = i
			if !strings.Contains(w[0], "search → fetch 15 times") {
				t.Errorf("warning = %q", w[0])
			}
		}
		clearGuidance(rt, loopWarningName)
		if res.Jump == JumpEnd {
			stoppedAt = i
			wantHardStop(t, th, res, "search → fetch")
			break
		}
	}
	if warnedAt != 30 || stoppedAt != 50 {
		t.Fatalf("warned at call %d, stopped at %d; want 30 and 50", warnedAt, stoppedAt)
	}
	if n := len(ev.ofType(EventLoopDetected)); n != 2 {
		t.Errorf("%d loop.detected events, want a warning and a stop", n)
	}
}

// Legitimate rounds stay below the thresholds, a round of one tool is not
// a cycle (layer 2 governs it), longer periods are found, and a cycle of
// tools the overrides allow is batch work.
func TestLoopDetection_CycleLayer(t *testing.T) {
	run := func(l *LoopDetection, n int, round ...string) (warned bool, stopped int) {
		th := newThread("r1")
		rt, _ := newRuntime("r1")
		for i := 1; i <= n; i++ {
			name := round[(i-1)%len(round)]
			res := th.step(t, l, rt, tc(name, fmt.Sprintf(`{"query":"q%d"}`, i)))
			warned = warned || len(warnings(rt)) > 0
			if res.Jump == JumpEnd {
				return warned, i
			}
		}
		return warned, 0
	}
	def := newLoop(t, LoopDetection{})
	if w, s := run(def, 20, "search", "fetch"); w || s != 0 {
		t.Errorf("10 rounds of search, fetch: warned %v, stopped at %d", w, s)
	}
	if w, s := run(def, 29, "bash"); w || s != 0 {
		t.Errorf("29 distinct bash calls: warned %v, stopped at %d", w, s)
	}
	if _, s := run(def, 200, "search", "fetch", "summarize"); s != 75 {
		t.Errorf("a 3-step cycle stopped at %d, want 75", s)
	}
	if _, s := run(def, 200, "search", "search", "fetch"); s != 75 {
		t.Errorf("search, search, fetch stopped at %d, want 75", s)
	}
	small := newLoop(t, LoopDetection{CycleWarn: 2, CycleHard: 3, CycleMaxPeriod: 2})
	if _, s := run(small, 20, "search", "fetch"); s != 6 {
		t.Errorf("cycle_hard_limit 3 stopped at %d, want 6", s)
	}
	allowed := newLoop(t, LoopDetection{Overrides: map[string]FreqLimit{"search": {Warn: 200, Hard: 300}, "fetch": {Warn: 200, Hard: 300}}})
	if w, s := run(allowed, 120, "search", "fetch"); w || s != 0 {
		t.Errorf("overridden tools: warned %v, stopped at %d", w, s)
	}
	for _, bad := range []LoopDetection{{CycleWarn: 1}, {CycleWarn: 10, CycleHard: 5}, {CycleMaxPeriod: 11}, {CycleMaxPeriod: 1}} {
		if _, err := NewLoopDetection(bad); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}
