package middleware

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/state"
	"github.com/natsagent/natsagent/internal/tokens"
)

// stepHook is a middleware whose before-model, after-model and
// after-agent hooks all run fn.
type stepHook struct {
	name string
	fn   func(st *state.State) (Result, error)
	log  *[]string
}

func (h stepHook) Name() string { return h.name }

func (h stepHook) run(st *state.State) (Result, error) {
	if h.log != nil {
		*h.log = append(*h.log, h.name)
	}
	if h.fn == nil {
		return Result{}, nil
	}
	return h.fn(st)
}

func (h stepHook) BeforeModel(ctx context.Context, rt *Runtime, st *state.State) (Result, error) {
	return h.run(st)
}

func (h stepHook) AfterModel(ctx context.Context, rt *Runtime, st *state.State) (Result, error) {
	return h.run(st)
}

func (h stepHook) AfterAgent(ctx context.Context, rt *Runtime, st *state.State) (Result, error) {
	return h.run(st)
}

func upsert(ms ...model.Message) func(*state.State) (Result, error) {
	return func(*state.State) (Result, error) { return Result{Update: state.Update{Messages: ms}}, nil }
}

func remove(ids ...string) func(*state.State) (Result, error) {
	return func(*state.State) (Result, error) { return Result{Update: state.Update{Remove: ids}}, nil }
}

// The merged update of a hook pass, applied to the state as it was before
// the pass (a checkpoint replay), gives the state the hooks left.
func TestRunHooks_MergedUpdateReplaysLikeTheHooks(t *testing.T) {
	for _, tc := range []struct {
		name  string
		hooks []func(*state.State) (Result, error)
	}{
		{"add then remove", []func(*state.State) (Result, error){upsert(user("x", "transient")), remove("x")}},
		{"replace then remove", []func(*state.State) (Result, error){upsert(user("u1", "edited")), remove("u1")}},
		{"remove then add back", []func(*state.State) (Result, error){remove("u1"), upsert(user("u1", "back"))}},
		{"add, replace, add", []func(*state.State) (Result, error){upsert(user("x", "1")), upsert(user("x", "2"), user("y", "3"))}},
		{"remove then re-add then remove", []func(*state.State) (Result, error){remove("u1"), upsert(user("u1", "again")), remove("u1")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ms []Middleware
			for i, fn := range tc.hooks {
				ms = append(ms, stepHook{name: string(rune('a' + i)), fn: fn})
			}
			c, err := NewChain(ms)
			if err != nil {
				t.Fatal(err)
			}
			rt, _ := newRuntime("r1")
			st := stateOf(user("u1", "question"), asst("a1", "answer"))
			before := st.Clone()
			res, err := c.RunHooks(context.Background(), HookBeforeModel, rt, st)
			if err != nil {
				t.Fatal(err)
			}
			before.Apply(roundTripUpdate(t, res.Update)) // as a checkpoint stores it
			if !reflect.DeepEqual(before.Messages, st.Messages) {
				t.Errorf("replaying the merged update gives\n%s\nthe hooks left\n%s", dump(before.Messages), dump(st.Messages))
			}
		})
	}
}

func roundTripUpdate(t *testing.T, u state.Update) state.Update {
	t.Helper()
	data, err := json.Marshal(u)
	if err != nil {
		t.Fatal(err)
	}
	var out state.Update
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestRunHooks_Semantics(t *testing.T) {
	ctx := context.Background()
	t.Run("each hook sees the updates of the hooks before it", func(t *testing.T) {
		var seen int
		c, _ := NewChain([]Middleware{
			stepHook{name: "a", fn: upsert(user("x", "from a"))},
			stepHook{name: "b", fn: func(st *state.State) (Result, error) {
				seen = st.Index("x")
				return Result{}, nil
			}},
		})
		rt, _ := newRuntime("r1")
		if _, err := c.RunHooks(ctx, HookBeforeModel, rt, stateOf(user("u1", "q"))); err != nil {
			t.Fatal(err)
		}
		if seen != 1 {
			t.Errorf("b saw x at %d, want 1", seen)
		}
	})
	t.Run("orders and jumps", func(t *testing.T) {
		var log []string
		end := func(*state.State) (Result, error) { return Result{Jump: JumpEnd, StopReason: "guard"}, nil }
		c, _ := NewChain([]Middleware{
			stepHook{name: "a", log: &log},
			stepHook{name: "b", log: &log, fn: end},
			stepHook{name: "c", log: &log},
		})
		rt, _ := newRuntime("r1")
		res, err := c.RunHooks(ctx, HookBeforeModel, rt, stateOf())
		if err != nil || res.Jump != JumpEnd || res.StopReason != "guard" || !reflect.DeepEqual(log, []string{"a", "b"}) {
			t.Errorf("before-model: result %+v, err %v, ran %v; want a, b then the jump", res, err, log)
		}
		log = nil
		res, _ = c.RunHooks(ctx, HookAfterModel, rt, stateOf())
		if res.Jump != JumpEnd || !reflect.DeepEqual(log, []string{"c", "b"}) {
			t.Errorf("after-model: result %+v, ran %v; want c, b then the jump", res, log)
		}
		log = nil
		res, _ = c.RunHooks(ctx, HookAfterAgent, rt, stateOf())
		if res.Jump != JumpNone || !reflect.DeepEqual(log, []string{"c", "b", "a"}) {
			t.Errorf("after-agent: result %+v, ran %v; want all of c, b, a and no jump", res, log)
		}
	})
	t.Run("an error names the middleware and stops the pass", func(t *testing.T) {
		var log []string
		boom := errors.New("boom")
		c, _ := NewChain([]Middleware{
			stepHook{name: "a", log: &log},
			stepHook{name: "failing", log: &log, fn: func(*state.State) (Result, error) { return Result{}, boom }},
			stepHook{name: "c", log: &log},
		})
		rt, _ := newRuntime("r1")
		_, err := c.RunHooks(ctx, HookBeforeModel, rt, stateOf())
		if !errors.Is(err, boom) || !strings.Contains(err.Error(), "failing") || !reflect.DeepEqual(log, []string{"a", "failing"}) {
			t.Errorf("err %v, ran %v", err, log)
		}
	})
}

func TestNewChain(t *testing.T) {
	if _, err := NewChain([]Middleware{stepHook{name: "a"}}, []Middleware{stepHook{name: "a"}}); err == nil || !strings.Contains(err.Error(), `"a"`) {
		t.Errorf("duplicate name across segments: err %v", err)
	}
	if _, err := NewChain([]Middleware{stepHook{name: ""}}); err == nil {
		t.Error("empty name accepted")
	}
	c, err := NewChain([]Middleware{stepHook{name: "a"}, nil}, nil, []Middleware{ToolCallRepair{}})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Names(); !reflect.DeepEqual(got, []string{"a", "tool_call_repair"}) {
		t.Errorf("names = %v", got)
	}
}

func TestScratch_PerRuntime(t *testing.T) {
	rt1, _ := newRuntime("r1")
	rt2, _ := newRuntime("r2")
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			queueGuidance(rt1, "owner", "note")
		}()
	}
	wg.Wait()
	if got := pendingGuidance(rt1, "owner"); len(got) != 1 {
		t.Errorf("notes = %q, want one (deduplicated)", got)
	}
	if got := pendingGuidance(rt2, "owner"); len(got) != 0 {
		t.Errorf("another runtime sees %q", got)
	}
	for i := range 10 {
		queueGuidance(rt2, "owner", strings.Repeat("n", i+1))
	}
	if got := pendingGuidance(rt2, "owner"); len(got) != maxGuidancePerRun {
		t.Errorf("%d notes queued, want at most %d", len(got), maxGuidancePerRun)
	}
}

// TestScratch_KeyBuiltPerCall: the middlewares that find their scratch
// value on every call by a key made of a prefix and a name (a guidance
// owner, a token encoding) find it without allocating.
func TestScratch_KeyBuiltPerCall(t *testing.T) {
	rt, _ := newRuntime("r1")
	owner := "loop_warning"
	queueGuidance(rt, owner, "note")
	counter := tokens.ForModel("gpt-4o", "")
	rc := runCounterOf(rt, counter)
	if n := testing.AllocsPerRun(100, func() { clearGuidance(rt, owner); runCounterOf(rt, counter) }); n != 0 {
		t.Errorf("%v allocations to find two scratch values, want 0", n)
	}
	if runCounterOf(rt, counter) != rc || len(pendingGuidance(rt, owner)) != 0 {
		t.Error("the scratch values are not the ones stored")
	}
	var many keyCache
	many.prefix = "p:"
	for i := range 2 * maxCachedKeys {
		if k := many.key(strconv.Itoa(i)); k != "p:"+strconv.Itoa(i) {
			t.Fatalf("key %q", k)
		}
	}
	if len(many.keys) != maxCachedKeys {
		t.Errorf("%d keys cached, want at most %d", len(many.keys), maxCachedKeys)
	}
}
