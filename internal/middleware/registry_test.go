package middleware

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

var defaultLead = []string{
	"tool_error_guard", "tool_call_repair", "large_result_offload", "attachments", "skills", "subagents", "todos", "dynamic_context", "title", "context_compression", "model_retry",
	"subagent_limit", "loop_detection", "token_usage", "tool_approval", "safety_finish_reason", "clarification",
}

// reordered is defaultLead with the named middlewares put in the given
// order among the places they hold.
func reordered(order ...string) []string {
	out := append([]string(nil), defaultLead...)
	var slots []int
	for i, n := range out {
		for _, o := range order {
			if n == o {
				slots = append(slots, i)
			}
		}
	}
	for k, i := range slots {
		out[i] = order[k]
	}
	return out
}

// withUser is defaultLead with user middlewares between base and tail.
func withUser(user ...string) []string {
	var base, tail []string
	seg := make(map[string]Segment)
	for _, b := range Builtins() {
		seg[b.Name] = b.Segment
	}
	for _, n := range defaultLead {
		if seg[n] == SegmentBase {
			base = append(base, n)
		} else {
			tail = append(tail, n)
		}
	}
	return append(append(base, user...), tail...)
}

func settings(kv ...string) map[string]json.RawMessage {
	m := make(map[string]json.RawMessage)
	for i := 0; i < len(kv); i += 2 {
		m[kv[i]] = json.RawMessage(kv[i+1])
	}
	return m
}

func assembleNames(t *testing.T, cfg ChainConfig) []string {
	t.Helper()
	c, err := Assemble(cfg, Env{KnownTool: known("search", "shell")})
	if err != nil {
		t.Fatalf("Assemble: %v", err)
	}
	return c.Names()
}

func wantAssembleError(t *testing.T, cfg ChainConfig, contains ...string) {
	t.Helper()
	_, err := Assemble(cfg, Env{KnownTool: known("search", "shell")})
	if err == nil {
		t.Fatalf("Assemble accepted %+v", cfg)
	}
	for _, s := range contains {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not mention %q", err, s)
		}
	}
}

func TestAssemble_DefaultLeadChain(t *testing.T) {
	if got := assembleNames(t, ChainConfig{}); !reflect.DeepEqual(got, defaultLead) {
		t.Errorf("names = %v\nwant    %v", got, defaultLead)
	}
	sub, err := Assemble(ChainConfig{}, Env{Kind: KindSubagent})
	if err != nil {
		t.Fatal(err)
	}
	// A subagent's chain has everything but what needs a person.
	var wantSub []string
	for _, n := range defaultLead {
		if n != "clarification" && n != "subagent_limit" {
			wantSub = append(wantSub, n)
		}
	}
	if got := sub.Names(); !reflect.DeepEqual(got, wantSub) {
		t.Errorf("subagent names = %v\nwant           %v", got, wantSub)
	}
	// The hooks were built from the settings.
	c, err := Assemble(ChainConfig{Settings: settings("loop_detection", `{"warn_threshold":4,"hard_limit":9}`)}, Env{})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range c.Middlewares() {
		if l, ok := m.(*LoopDetection); ok && (l.WarnThreshold != 4 || l.HardLimit != 9 || l.WindowSize != 20) {
			t.Errorf("loop detection built as %+v", l)
		}
	}
}

func TestAssemble_TokenBudgetOffByDefault(t *testing.T) {
	for _, tc := range []struct {
		name string
		raw  string
		want bool
	}{
		{"absent", ``, false},
		{"settings without enabled", `{"max_tokens":5000}`, false},
		{"enabled false", `{"enabled":false,"max_tokens":5000}`, false},
		{"enabled true", `{"enabled":true,"max_tokens":5000}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := ChainConfig{}
			if tc.raw != "" {
				cfg.Settings = settings("token_budget", tc.raw)
			}
			names := assembleNames(t, cfg)
			has := false
			for i, n := range names {
				if n == "token_budget" {
					has = true
					if names[i-1] != "loop_detection" || names[i+1] != "token_usage" {
						t.Errorf("token_budget at the wrong place: %v", names)
					}
				}
			}
			if has != tc.want {
				t.Errorf("token_budget in chain = %v, want %v (%v)", has, tc.want, names)
			}
		})
	}
}

func TestAssemble_Errors(t *testing.T) {
	cases := []struct {
		name string
		cfg  ChainConfig
		want []string
	}{
		{"disable a required middleware",
			ChainConfig{Settings: settings("tool_call_repair", `{"enabled":false}`)},
			[]string{"settings.tool_call_repair.enabled"}},
		{"disable the error guard",
			ChainConfig{Settings: settings("tool_error_guard", `{"enabled":false}`)},
			[]string{"settings.tool_error_guard.enabled"}},
		{"unknown middleware in settings",
			ChainConfig{Settings: settings("loop_detector", `{}`)},
			[]string{"settings.loop_detector", "unknown middleware"}},
		{"unknown key for a middleware without settings",
			ChainConfig{Settings: settings("tool_call_repair", `{"strict":true}`)},
			[]string{"settings.tool_call_repair", "strict"}},
		{"negative max_retries",
			ChainConfig{Settings: settings("model_retry", `{"max_retries":-1}`)},
			[]string{"settings.model_retry", "max_retries"}},
		{"unknown settings key",
			ChainConfig{Settings: settings("loop_detection", `{"warn_treshold":3}`)},
			[]string{"settings.loop_detection", "warn_treshold"}},
		{"invalid settings value",
			ChainConfig{Settings: settings("loop_detection", `{"warn_threshold":5,"hard_limit":3}`)},
			[]string{"settings.loop_detection", "hard_limit"}},
		{"settings not an object",
			ChainConfig{Settings: settings("title", `[1]`)},
			[]string{"settings.title"}},
		{"enabled not a bool",
			ChainConfig{Settings: settings("title", `{"enabled":"yes"}`)},
			[]string{"settings.title", "enabled"}},
		{"user-only middleware in settings",
			ChainConfig{Settings: settings("tool_call_limit", `{"run_limit":3}`)},
			[]string{"settings.tool_call_limit", "user"}},
		{"unknown tool excluded",
			ChainConfig{Settings: settings("tool_exclusion", `{"exclude":["shel"]}`)},
			[]string{"settings.tool_exclusion", "shel"}},
		{"unknown user middleware",
			ChainConfig{User: []UserMiddleware{{Use: "tool_call_limit", Settings: json.RawMessage(`{"run_limit":1}`)}, {Use: "rate_limiter"}}},
			[]string{"user[1].use", "rate_limiter"}},
		{"unknown key in user settings",
			ChainConfig{User: []UserMiddleware{{Use: "tool_call_limit", Settings: json.RawMessage(`{"run_limt":1}`)}}},
			[]string{"user[0]", "run_limt"}},
		{"required middleware in the user segment",
			ChainConfig{User: []UserMiddleware{{Use: "tool_call_repair"}}},
			[]string{"user[0].use"}},
		{"two user middlewares with one name",
			ChainConfig{User: []UserMiddleware{
				{Use: "tool_call_limit", Settings: json.RawMessage(`{"run_limit":1}`)},
				{Use: "tool_call_limit", Settings: json.RawMessage(`{"run_limit":2}`)},
			}},
			[]string{"user[1].name", "tool_call_limit", "distinct name"}},
		{"unknown name in order",
			ChainConfig{Order: []string{"title", "titel"}},
			[]string{"order[1]", "titel"}},
		{"order across segments",
			ChainConfig{Order: []string{"title", "loop_detection"}},
			[]string{"order[1]", "segment"}},
		{"order moving a required middleware",
			ChainConfig{Order: []string{"dynamic_context", "tool_call_repair"}},
			[]string{"order[1]", "tool_call_repair"}},
		{"order naming a disabled middleware",
			ChainConfig{Settings: settings("title", `{"enabled":false}`), Order: []string{"title", "dynamic_context"}},
			[]string{"order[0]", "title", "not enabled"}},
		{"order listing one twice",
			ChainConfig{Order: []string{"title", "title"}},
			[]string{"order[1]", "twice"}},
		{"safety before loop detection",
			ChainConfig{Order: []string{"safety_finish_reason", "loop_detection"}},
			[]string{"safety_finish_reason", "loop_detection"}},
		{"safety before token budget",
			ChainConfig{Settings: settings("token_budget", `{"enabled":true}`), Order: []string{"safety_finish_reason", "token_budget"}},
			[]string{"safety_finish_reason", "token_budget"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { wantAssembleError(t, tc.cfg, tc.want...) })
	}
}

func TestAssemble_OrderWithinSegment(t *testing.T) {
	got := assembleNames(t, ChainConfig{Order: []string{"model_retry", "title", "dynamic_context"}})
	want := reordered("model_retry", "title", "dynamic_context")
	if !reflect.DeepEqual(got, want) {
		t.Errorf("names = %v\nwant    %v", got, want)
	}
	got = assembleNames(t, ChainConfig{Order: []string{"token_usage", "loop_detection"}})
	want = reordered("token_usage", "loop_detection")
	if !reflect.DeepEqual(got, want) {
		t.Errorf("names = %v\nwant    %v", got, want)
	}
}

func TestAssemble_DisableOptional(t *testing.T) {
	got := assembleNames(t, ChainConfig{Settings: settings("title", `{"enabled":false}`, "dynamic_context", `{"enabled":false}`)})
	for _, n := range got {
		if n == "title" || n == "dynamic_context" {
			t.Errorf("%s still in %v", n, got)
		}
	}
	if len(got) != len(defaultLead)-2 {
		t.Errorf("names = %v", got)
	}
}

func TestAssemble_UserSegmentBetweenBaseAndTail(t *testing.T) {
	got := assembleNames(t, ChainConfig{User: []UserMiddleware{
		{Use: "tool_call_limit", Name: "limit_all", Settings: json.RawMessage(`{"run_limit":20}`)},
		{Use: "tool_call_limit", Name: "limit_search", Settings: json.RawMessage(`{"tool":"search","run_limit":3,"exit_behavior":"end"}`)},
	}})
	want := withUser("limit_all", "limit_search")
	if !reflect.DeepEqual(got, want) {
		t.Errorf("names = %v\nwant    %v", got, want)
	}
	c, _ := Assemble(ChainConfig{User: []UserMiddleware{
		{Use: "tool_call_limit", Name: "limit_search", Settings: json.RawMessage(`{"tool":"search","run_limit":3,"exit_behavior":"end"}`)},
	}}, Env{})
	for _, m := range c.Middlewares() {
		if l, ok := m.(*ToolCallLimit); ok && (l.Tool != "search" || l.RunLimit != 3 || l.ExitBehavior != LimitEnd) {
			t.Errorf("limit built as %+v", l)
		}
	}
}

func TestAssemble_RequiredAcceptEnabledTrue(t *testing.T) {
	got := assembleNames(t, ChainConfig{Settings: settings("tool_call_repair", `{"enabled":true}`, "tool_error_guard", `{}`)})
	if !reflect.DeepEqual(got, defaultLead) {
		t.Errorf("names = %v", got)
	}
}

// model_retry settings: a configured 0 means none, not the default.
func TestAssemble_ModelRetrySettings(t *testing.T) {
	retryOf := func(raw string) *Retry {
		t.Helper()
		c, err := Assemble(ChainConfig{Settings: settings("model_retry", raw)}, Env{})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range c.Middlewares() {
			if r, ok := m.(*Retry); ok {
				return r
			}
		}
		t.Fatal("no model_retry in the chain")
		return nil
	}
	t.Setenv(EnvNetworkRetryBudget, "")
	if r := retryOf(`{}`); r.MaxRetries != 2 || r.NetworkBudget != 600*time.Second {
		t.Errorf("defaults: max_retries %d, budget %v", r.MaxRetries, r.NetworkBudget)
	}
	r := retryOf(`{"max_retries":3,"network_budget_seconds":120,"fallback_models":["mini"]}`)
	if r.MaxRetries != 3 || r.NetworkBudget != 120*time.Second || !reflect.DeepEqual(r.Fallbacks, []string{"mini"}) {
		t.Errorf("configured: %+v", r)
	}
	// Zero retries and a zero budget: one call, whatever the error.
	r = retryOf(`{"max_retries":0,"network_budget_seconds":0}`)
	c := newVClock()
	r.sleep, r.now = c.sleep, c.now
	for _, e := range []error{authErr(), netErr()} {
		f := failing(e)
		rt, _ := newRuntime("r1")
		if _, err := r.WrapModelCall(context.Background(), rt, baseRequest(), f.next); err != e || f.count() != 1 {
			t.Errorf("%v: err %v after %d calls, want it after 1", e, err, f.count())
		}
	}
}
