package middleware

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
	"github.com/natsagent/natsagent/internal/tokens"
)

// Checkpoints written before cached tokens, model and purpose existed
// read back as main calls without a cache report.
func TestUsageOf_OldAndNewCheckpoints(t *testing.T) {
	old := model.Message{ID: "a", Role: model.RoleAssistant, Meta: map[string]any{"run_id": "r1", MetaUsage: map[string]any{"input_tokens": float64(10), "output_tokens": float64(2), "approximate": false}}}
	u, ok := UsageOf(&old)
	if !ok || u.Input != 10 || u.Output != 2 || u.Cached != nil || u.Model != "" || u.Purpose != "" || u.Approximate {
		t.Fatalf("old usage %+v", u)
	}
	cached := 7
	m := model.Message{ID: "b", Role: model.RoleAssistant}
	SetUsage(&m, Usage{Input: 30, Output: 3, Cached: &cached, Model: "gpt-4o", Purpose: protocol.PurposeMain})
	st := jsonRoundTrip(t, stateOf(m))
	u, _ = UsageOf(&st.Messages[0])
	if u.Input != 30 || u.Cached == nil || *u.Cached != 7 || u.Model != "gpt-4o" || u.Purpose != protocol.PurposeMain {
		t.Fatalf("round-tripped usage %+v", u)
	}
	// Numbers decoded as json.Number (a decoder with UseNumber) too.
	var meta map[string]any
	dec := json.NewDecoder(strings.NewReader(`{"input_tokens": 5, "output_tokens": 1, "cached_tokens": 0}`))
	dec.UseNumber()
	if err := dec.Decode(&meta); err != nil {
		t.Fatal(err)
	}
	n := model.Message{Meta: map[string]any{MetaUsage: meta}}
	if u, _ := UsageOf(&n); u.Input != 5 || u.Cached == nil || *u.Cached != 0 {
		t.Fatalf("json.Number usage %+v", u)
	}
}

func usedBy(runID, id string, u Usage) model.Message {
	m := inRun(runID, asst(id, "answer "+id))[0]
	SetUsage(&m, u)
	return m
}

// A run's totals come from its own messages and summary calls only, main
// and summary apart, per model; an earlier run's figures and summary
// calls are not its own.
func TestRunTotals_MainAndSummaryApart(t *testing.T) {
	c5 := 5
	st := stateOf(
		usedBy("r0", "x", Usage{Input: 1000, Output: 100, Model: "gpt-4o"}),
		inRun("r1", user("u1", "q"))[0],
		usedBy("r1", "a1", Usage{Input: 100, Output: 10, Cached: &c5, Model: "gpt-4o"}),
		inRun("r1", result("t1", "c1", "echo", "r"))[0],
		usedBy("r1", "a2", Usage{Input: 120, Output: 12, Approximate: true, Model: "gpt-4o-mini"}),
	)
	rt, _ := newRuntime("r0")
	u, err := RecordSummaryUsage(st, rt, "s0", Usage{Input: 9999, Output: 999, Model: "gpt-4o-mini"})
	if err != nil {
		t.Fatal(err)
	}
	st.Apply(u)
	rt.RunID = "r1"
	for _, id := range []string{"s1", "s2", "s1"} { // s1 recorded twice: once
		u, err := RecordSummaryUsage(st, rt, id, Usage{Input: 50, Output: 20, Model: "gpt-4o-mini"})
		if err != nil {
			t.Fatal(err)
		}
		st.Apply(u)
	}
	st = jsonRoundTrip(t, st)
	tot := RunTotals(st, "r1")
	if tot.Calls != 4 || tot.Input != 320 || tot.Output != 62 || tot.Total != 382 || tot.ApproximateCalls != 1 {
		t.Fatalf("all: %+v", tot.TokenCounts)
	}
	if tot.Main.Calls != 2 || tot.Main.Input != 220 || tot.Summary.Calls != 2 || tot.Summary.Input != 100 || tot.Summary.Output != 40 {
		t.Fatalf("main %+v summary %+v", tot.Main, tot.Summary)
	}
	if tot.Cached == nil || *tot.Cached != 5 || tot.CachedCalls != 1 {
		t.Fatalf("cached %+v", tot.TokenCounts)
	}
	mini := tot.Models["gpt-4o-mini"]
	if mini == nil || mini.Main.Calls != 1 || mini.Summary.Calls != 2 || tot.Models["gpt-4o"].Main.Input != 100 {
		t.Fatalf("models %+v", tot.Models)
	}
	// r0 summarized before r1 did: its record was replaced by r1's.
	if old := RunTotals(st, "r0"); old.Calls != 0 {
		t.Fatalf("r0 is not the tail, yet %+v", old)
	}
}

// countingCounter counts the texts it encodes.
type countingCounter struct {
	mu    sync.Mutex
	texts int
}

func (c *countingCounter) Count(s string) int {
	c.mu.Lock()
	c.texts++
	c.mu.Unlock()
	return tokens.Approx.Count(s)
}

func (c *countingCounter) Encoding() string { return "test-counting" }

// Counting a request on the state's own transcript costs its new
// messages: old ones are neither encoded nor looked up again. A
// replaced message is counted again, the others come from the cache.
func TestRunCounter_CostsNewMessagesOnly(t *testing.T) {
	cc := &countingCounter{}
	rt, _ := newRuntime("r1")
	rc := runCounterOf(rt, cc)
	st := &state.State{}
	for i := range 100 {
		st.Apply(state.Update{Messages: []model.Message{user(fmt.Sprintf("m%d", i), fmt.Sprintf("message number %d", i))}})
	}
	want := tokens.Request(tokens.Approx, "", st.Messages, nil).Messages
	if got := rc.messages(st, st.Messages); got != want {
		t.Fatalf("count %d, want %d", got, want)
	}
	hits, misses := rc.cache.Stats()
	st.Apply(state.Update{Messages: []model.Message{user("n1", "one more"), user("n2", "and another")}})
	want = tokens.Request(tokens.Approx, "", st.Messages, nil).Messages
	if got := rc.messages(st, st.Messages); got != want {
		t.Fatalf("count %d, want %d", got, want)
	}
	if h, m := rc.cache.Stats(); h != hits || m != misses+2 {
		t.Fatalf("after 2 new messages: cache hits %d→%d, misses %d→%d: old messages were looked up", hits, h, misses, m)
	}
	// A replaced message: the prefix is not trusted any more; only the
	// replaced message is encoded again.
	before := cc.texts
	st.Apply(state.Update{Messages: []model.Message{user("m50", "message number fifty, rewritten")}})
	want = tokens.Request(tokens.Approx, "", st.Messages, nil).Messages
	if got := rc.messages(st, st.Messages); got != want {
		t.Fatalf("after a rewrite: count %d, want %d", got, want)
	}
	if cc.texts != before+1 {
		t.Fatalf("after a rewrite %d texts encoded, want 1", cc.texts-before)
	}
	// An edited copy of the transcript (a wrapper's request) is counted
	// message by message.
	edited := append([]model.Message(nil), st.Messages...)
	edited[3] = user("m3", "compacted")
	if got, want := rc.messages(st, edited), tokens.Request(tokens.Approx, "", edited, nil).Messages; got != want {
		t.Fatalf("edited copy: count %d, want %d", got, want)
	}
	// Another state (a reloaded thread) is never served the prefix sum.
	other := stateOf(user("z", "short"))
	if got, want := rc.messages(other, other.Messages), tokens.Request(tokens.Approx, "", other.Messages, nil).Messages; got != want {
		t.Fatalf("other state: count %d, want %d", got, want)
	}
}
