package tokens

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/natsagent/natsagent/internal/model"
)

func mustEncoding(t testing.TB, name string) Counter {
	t.Helper()
	c, err := ForEncoding(name)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// The expected counts were computed once with the real encoders (this
// package's ForEncoding over tiktoken-go v0.1.8 and the offline BPE files
// of tiktoken-go-loader v0.0.2) and hard-coded; "hello world" = 2 and
// "你好，世界" = 6 in cl100k_base are also what OpenAI's Python tiktoken
// gives.
func TestKnownCounts(t *testing.T) {
	cases := []struct {
		enc, name, text string
		want            int
	}{
		{CL100K, "hello", "hello world", 2},
		{O200K, "hello", "hello world", 2},
		{CL100K, "chinese short", "你好，世界", 6},
		{O200K, "chinese short", "你好，世界", 3},
		{CL100K, "english", sampleEnglish, 72},
		{O200K, "english", sampleEnglish, 72},
		{CL100K, "chinese", sampleChinese, 123},
		{O200K, "chinese", sampleChinese, 75},
		{CL100K, "json", sampleJSON, 105},
		{O200K, "json", sampleJSON, 103},
		{CL100K, "code", sampleCode, 81},
		{O200K, "code", sampleCode, 81},
		// A special token in user text is counted as text, the way a
		// provider counts it, and never panics.
		{CL100K, "special token as text", "<|endoftext|>", 7},
		{CL100K, "empty", "", 0},
	}
	for _, tc := range cases {
		t.Run(tc.enc+"/"+tc.name, func(t *testing.T) {
			if got := mustEncoding(t, tc.enc).Count(tc.text); got != tc.want {
				t.Errorf("Count = %d, want %d", got, tc.want)
			}
		})
	}
}

// TestApproximateError pins how far the approximate counter is from the
// real encoders on English, Chinese, JSON and code (documented on approx).
func TestApproximateError(t *testing.T) {
	cases := []struct {
		name, text string
		lo, hi     float64 // bounds of approx / exact, per encoding below
		enc        string
	}{
		{"english", sampleEnglish, 0.9, 1.15, CL100K},
		{"code", sampleCode, 0.8, 1.05, CL100K},
		{"json", sampleJSON, 0.85, 1.05, CL100K},
		{"json", sampleJSON, 0.85, 1.05, O200K},
		{"chinese", sampleChinese, 0.85, 1.05, CL100K},
		{"chinese", sampleChinese, 1.3, 1.6, O200K},
	}
	for _, tc := range cases {
		exact := mustEncoding(t, tc.enc).Count(tc.text)
		got := Approx.Count(tc.text)
		ratio := float64(got) / float64(exact)
		if ratio < tc.lo || ratio > tc.hi {
			t.Errorf("%s/%s: approx %d vs exact %d (ratio %.2f), want within [%.2f, %.2f]", tc.enc, tc.name, got, exact, ratio, tc.lo, tc.hi)
		}
	}
	if Approx.Count("") != 0 || Approx.Count("a") != 1 {
		t.Errorf("approx of tiny texts: %d %d", Approx.Count(""), Approx.Count("a"))
	}
}

func TestEncodingForModel(t *testing.T) {
	cases := []struct{ model, fallback, want string }{
		{"gpt-4o", "", O200K},
		{"gpt-4o-mini", "", O200K},
		{"gpt-4o-2024-08-06", CL100K, O200K},
		{"gpt-4", "", CL100K},
		{"gpt-4-turbo", "", CL100K},
		{"gpt-3.5-turbo-0125", "", CL100K},
		{"gpt-4.1-nano", CL100K, O200K},
		{"gpt-5-mini", CL100K, O200K},
		{"o3-mini", CL100K, O200K},
		{"openai/gpt-4o", CL100K, O200K},
		{"GPT-4o", CL100K, O200K},
		{"qwen2.5:7b", "", DefaultEncoding},
		{"qwen2.5:7b", CL100K, CL100K},
		{"deepseek-chat", O200K, O200K},
		{"", CL100K, CL100K},
		// tiktoken's table knows gpt2 but not its encoding: fallback.
		{"gpt2", CL100K, CL100K},
	}
	for _, tc := range cases {
		if got := EncodingForModel(tc.model, tc.fallback); got != tc.want {
			t.Errorf("EncodingForModel(%q, %q) = %s, want %s", tc.model, tc.fallback, got, tc.want)
		}
	}
	if ForModel("gpt-4o", "").Encoding() != O200K {
		t.Error("ForModel(gpt-4o) is not o200k_base")
	}
	if _, err := ForEncoding("p99k"); err == nil {
		t.Error("an unknown encoding was accepted")
	}
	if c, err := ForEncoding(Approximate); err != nil || c.Encoding() != Approximate {
		t.Errorf("ForEncoding(approximate) = %v, %v", c, err)
	}
	// One encoder per encoding and process.
	if a, b := mustEncoding(t, CL100K), mustEncoding(t, CL100K); a != b {
		t.Error("the cl100k_base encoder was built twice")
	}
}

func TestMessageOverhead(t *testing.T) {
	c := mustEncoding(t, CL100K)
	// OpenAI cookbook: 3 framing tokens, the role, the content.
	user := model.Message{Role: model.RoleUser, Content: "hello world"}
	if got := Message(c, &user); got != 3+1+2 {
		t.Errorf("user message = %d, want 6", got)
	}
	named := user
	named.Name = "alice"
	if got := Message(c, &named); got != 6+1+c.Count("alice") {
		t.Errorf("named message = %d", got)
	}
	call := model.Message{Role: model.RoleAssistant, ToolCalls: []model.ToolCall{{ID: "call_1", Name: "current_time", Arguments: `{"tz":"UTC"}`}}}
	if got, want := Message(c, &call), 4+PerToolCall+c.Count("current_time")+c.Count(`{"tz":"UTC"}`); got != want {
		t.Errorf("tool call message = %d, want %d", got, want)
	}
	if got, want := Output(c, &call), PerToolCall+c.Count("current_time")+c.Count(`{"tz":"UTC"}`); got != want {
		t.Errorf("output of a tool call = %d, want %d", got, want)
	}
	result := model.Message{Role: model.RoleTool, ToolCallID: "call_1", Name: "current_time", Content: "12:00"}
	if got, want := Message(c, &result), 4+c.Count("12:00")+PerName+c.Count("current_time")+c.Count("call_1"); got != want {
		t.Errorf("tool result = %d, want %d", got, want)
	}
	// Meta and status are never sent, never counted.
	withMeta := user
	withMeta.Meta = map[string]any{"usage": map[string]any{"input_tokens": 1000}}
	withMeta.Status = "success"
	if Message(c, &withMeta) != Message(c, &user) {
		t.Error("meta or status was counted")
	}
	spec := model.ToolSpec{Name: "current_time", Description: "Returns the time.", Parameters: []byte(`{"type":"object"}`)}
	if got, want := Tools(c, []model.ToolSpec{spec}), ToolsOverhead+PerTool+c.Count("current_time")+c.Count("Returns the time.")+c.Count(`{"type":"object"}`); got != want {
		t.Errorf("tools = %d, want %d", got, want)
	}
	if Tools(c, nil) != 0 || System(c, "") != 0 {
		t.Error("nothing costs something")
	}
	r := Request(c, "Be brief.", []model.Message{user}, []model.ToolSpec{spec})
	if r.Total != r.System+r.Messages+r.Tools+ReplyPriming || r.Messages != 6 || r.System != 4+c.Count("Be brief.") {
		t.Errorf("request = %+v", r)
	}
}

func transcript(n int) []model.Message {
	msgs := make([]model.Message, 0, n)
	for i := 0; len(msgs) < n; i++ {
		msgs = append(msgs, model.Message{ID: fmt.Sprintf("u%d", i), Role: model.RoleUser, Content: fmt.Sprintf("Question %d: %s", i, sampleEnglish)})
		if len(msgs) < n {
			msgs = append(msgs, model.Message{ID: fmt.Sprintf("a%d", i), Role: model.RoleAssistant, Content: "Let me look.",
				ToolCalls: []model.ToolCall{{ID: fmt.Sprintf("c%d", i), Name: "search", Arguments: `{"query":"paris weather"}`}}})
		}
		if len(msgs) < n {
			msgs = append(msgs, model.Message{ID: fmt.Sprintf("t%d", i), Role: model.RoleTool, ToolCallID: fmt.Sprintf("c%d", i), Name: "search", Content: sampleJSON})
		}
		if len(msgs) < n {
			msgs = append(msgs, model.Message{ID: fmt.Sprintf("z%d", i), Role: model.RoleAssistant, Content: sampleChinese})
		}
	}
	return msgs
}

func TestCacheCountsNewMessagesOnly(t *testing.T) {
	c := mustEncoding(t, CL100K)
	cache := NewCache(c, 0)
	msgs := transcript(100)
	want := Request(c, "sys", msgs, nil)
	if got := cache.Request("sys", msgs, nil); got != want {
		t.Fatalf("cached count %+v, uncached %+v", got, want)
	}
	if hits, misses := cache.Stats(); hits != 0 || misses != 100 {
		t.Fatalf("cold: hits %d misses %d", hits, misses)
	}
	msgs = append(msgs, transcript(103)[100:]...)
	cache.Request("sys", msgs, nil)
	if hits, misses := cache.Stats(); hits != 100 || misses != 103 {
		t.Fatalf("after 3 new messages: hits %d misses %d, want 100 and 103", hits, misses)
	}
	// The same transcript reloaded (a JSON round trip: new strings, same
	// text) is still a hit.
	reloaded := make([]model.Message, len(msgs))
	for i, m := range msgs {
		m.Content = strings.Clone(m.Content)
		reloaded[i] = m
	}
	if got := cache.Messages(reloaded); got != Request(c, "", msgs, nil).Messages {
		t.Fatalf("reloaded count %d", got)
	}
	if hits, _ := cache.Stats(); hits != 203 {
		t.Fatalf("reloaded transcript missed the cache: hits %d", hits)
	}
}

// A message edited under its id (compaction in a request) must never get
// the count of its old text, even with the same length.
func TestCacheEditedMessageIsRecounted(t *testing.T) {
	c := mustEncoding(t, CL100K)
	cache := NewCache(c, 0)
	orig := model.Message{ID: "m1", Role: model.RoleTool, ToolCallID: "c1", Content: strings.Repeat("word ", 200)}
	if got := cache.Message(&orig); got != Message(c, &orig) {
		t.Fatal("first count differs")
	}
	preview := orig
	preview.Content = "[result saved to /outputs/large_tool_results/ab12.txt]"
	if got, want := cache.Message(&preview), Message(c, &preview); got != want {
		t.Fatalf("compacted message = %d, want %d", got, want)
	}
	// Both versions stay cached: going back and forth is free.
	_, before := cache.Stats()
	cache.Message(&orig)
	cache.Message(&preview)
	if _, after := cache.Stats(); after != before {
		t.Fatalf("switching between versions recounted: misses %d -> %d", before, after)
	}
	same := orig
	same.Content = strings.Repeat("私", len(orig.Content)/3) + strings.Repeat("x", len(orig.Content)%3) // same byte length
	if len(same.Content) != len(orig.Content) {
		t.Fatal("test needs equal lengths")
	}
	if got, want := cache.Message(&same), Message(c, &same); got != want {
		t.Fatalf("edited message (same length) = %d, want %d", got, want)
	}
	args := model.Message{ID: "a1", Role: model.RoleAssistant, ToolCalls: []model.ToolCall{{ID: "c1", Name: "write_file", Arguments: `{"content":"aaaa"}`}}}
	cache.Message(&args)
	args2 := args.Clone()
	args2.ToolCalls[0].Arguments = `{"content":"bbbb"}`
	args2.ToolCalls[0].Name = "edit_file"
	if got, want := cache.Message(&args2), Message(c, &args2); got != want {
		t.Fatalf("edited tool call = %d, want %d", got, want)
	}
	// A message without an id is counted every time and never cached.
	anon := model.Message{Role: model.RoleUser, Content: "hi"}
	cache.Message(&anon)
	if cache.Len() != 3 { // m1 (its last full version and its preview), a1
		t.Fatalf("cache holds %d entries, want 3", cache.Len())
	}
}

func TestCacheIsBounded(t *testing.T) {
	cache := NewCache(Approx, 100)
	msgs := transcript(1000)
	cache.Messages(msgs)
	if n := cache.Len(); n > 100 {
		t.Fatalf("cache holds %d entries, bound 100", n)
	}
	// The most recent messages are still there.
	_, before := cache.Stats()
	cache.Messages(msgs[len(msgs)-40:])
	if _, after := cache.Stats(); after != before {
		t.Fatalf("recent messages were evicted: misses %d -> %d", before, after)
	}
}

func TestCacheToolsAndSystem(t *testing.T) {
	c := mustEncoding(t, CL100K)
	cache := NewCache(c, 0)
	specs := []model.ToolSpec{{Name: "a", Description: "first", Parameters: []byte(`{"type":"object"}`)}, {Name: "b", Description: "second"}}
	if cache.Tools(specs) != Tools(c, specs) {
		t.Fatal("tools count differs")
	}
	changed := append([]model.ToolSpec(nil), specs...)
	changed[0].Description = "first, now longer than before"
	if cache.Tools(changed) != Tools(c, changed) {
		t.Fatal("a changed schema kept its old count")
	}
	if cache.System("one prompt") != System(c, "one prompt") || cache.System("another, longer prompt") != System(c, "another, longer prompt") {
		t.Fatal("system count differs")
	}
}

func TestCacheConcurrent(t *testing.T) {
	c := mustEncoding(t, CL100K)
	cache := NewCache(c, 64)
	msgs := transcript(80)
	want := Request(c, "", msgs, nil).Messages
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if got := cache.Messages(msgs); got != want {
				t.Errorf("concurrent count %d, want %d", got, want)
			}
		}()
	}
	wg.Wait()
}

// A tally follows edited copies of a transcript: each call costs the
// messages that changed, and every count is exact.
func TestTallyFollowsEditedCopies(t *testing.T) {
	cc := &countingCounter{name: "test-tally"}
	cache := NewCache(cc, 0)
	var tally Tally
	msgs := transcript(40)
	check := func(what string, ms []model.Message) {
		t.Helper()
		if got, want := cache.Transcript(&tally, ms), Request(Approx, "", ms, nil).Messages; got != want {
			t.Fatalf("%s: %d, want %d", what, got, want)
		}
	}
	check("first", msgs)
	_, misses := cache.Stats()
	grown := append(append([]model.Message(nil), msgs...), transcript(42)[40:]...)
	check("two appended", grown)
	if _, m := cache.Stats(); m != misses+2 {
		t.Fatalf("two new messages: misses %d -> %d", misses, m)
	}
	edited := append([]model.Message(nil), grown...)
	edited[5].Content = "compacted"
	check("one edited", edited)
	if _, m := cache.Stats(); m != misses+3 {
		t.Fatalf("one edited message: misses %d -> %d", misses+2, m)
	}
	_, misses = cache.Stats()
	check("the same copy again", edited)
	if _, m := cache.Stats(); m != misses {
		t.Fatalf("an unchanged copy was looked up: misses %d -> %d", misses, m)
	}
	shifted := append([]model.Message(nil), edited[1:]...) // a message dropped at the front
	check("shifted", shifted)
	check("no id", append(shifted, model.Message{Role: model.RoleUser, Content: "anonymous"}))
}

// countingCounter counts its calls; its encoding name gives it a
// process-wide level of its own.
type countingCounter struct {
	name  string
	mu    sync.Mutex
	calls int
}

func (c *countingCounter) Count(text string) int {
	c.mu.Lock()
	c.calls++
	c.mu.Unlock()
	return Approx.Count(text)
}

func (c *countingCounter) Encoding() string { return c.name }

// The next run on the same worker starts with an empty run cache; the
// process-wide level serves its history without encoding it again, and
// does not serve an edited message.
func TestSharedLevelServesTheNextRun(t *testing.T) {
	cc := &countingCounter{name: "test-shared"}
	msgs := transcript(50)
	want := NewCache(cc, 0).Messages(msgs)
	encoded := cc.calls
	reloaded := make([]model.Message, len(msgs))
	for i, m := range msgs {
		m.Content = strings.Clone(m.Content)
		reloaded[i] = m
	}
	if got := NewCache(cc, 0).Messages(reloaded); got != want || cc.calls != encoded {
		t.Fatalf("next run: count %d (want %d), %d encoder calls (want none)", got, want, cc.calls-encoded)
	}
	reloaded[4].Content = strings.ToUpper(reloaded[4].Content) // English: same size, other text
	if got, wantEdited := NewCache(cc, 0).Messages(reloaded), Request(Approx, "", reloaded, nil).Messages; got != wantEdited || cc.calls == encoded {
		t.Fatalf("edited message: count %d (want %d), encoder calls %d", got, wantEdited, cc.calls-encoded)
	}
}

// BenchmarkTranscript counts a 1,000-message transcript: cold (every
// message encoded), next run (a new run cache on a worker that counted
// the thread before: the history is hashed, not encoded) and cached (one
// new message per call, as an agent step adds).
func BenchmarkTranscript(b *testing.B) {
	msgs := transcript(1000)
	for _, enc := range []string{CL100K, O200K, Approximate} {
		c := mustEncoding(b, enc)
		b.Run(enc+"/cold", func(b *testing.B) {
			for b.Loop() {
				cache := NewCache(c, 0)
				cache.shared = nil
				cache.Messages(msgs)
			}
		})
		if enc != Approximate {
			b.Run(enc+"/next_run", func(b *testing.B) {
				NewCache(c, 0).Messages(msgs)
				for b.Loop() {
					NewCache(c, 0).Messages(msgs)
				}
			})
		}
		b.Run(enc+"/edited_copy", func(b *testing.B) {
			cache := NewCache(c, 0)
			var tally Tally
			cache.Transcript(&tally, msgs)
			next := model.Message{Role: model.RoleUser, Content: "One more question about the forecast."}
			i := 0
			for b.Loop() {
				i++
				next.ID = fmt.Sprintf("n%d", i)
				cp := append(append(make([]model.Message, 0, len(msgs)+1), msgs...), next)
				cache.Transcript(&tally, cp)
			}
		})
		b.Run(enc+"/cached", func(b *testing.B) {
			cache := NewCache(c, 0)
			cache.Messages(msgs)
			next := model.Message{Role: model.RoleUser, Content: "One more question about the forecast."}
			i := 0
			for b.Loop() {
				i++
				next.ID = fmt.Sprintf("n%d", i)
				cache.Messages(append(msgs[:len(msgs):len(msgs)], next))
			}
		})
	}
}

// A tool schema is counted once per process, not once per run: a run's
// cache holds nothing of the tools it offers (no copy of the schemas, no
// map of its own), and a changed schema under the same name is counted
// again.
func TestToolCountsAreSharedByRuns(t *testing.T) {
	cc := &countingCounter{name: "test-tools"}
	specs := []model.ToolSpec{{Name: "shared_tool", Description: "first", Parameters: []byte(`{"type":"object","properties":{"a":{"type":"string"}}}`)}}
	want := Tools(Approx, specs)
	if got := NewCache(cc, 0).Tools(specs); got != want {
		t.Fatalf("first run counts %d, want %d", got, want)
	}
	cacheOnly := testing.AllocsPerRun(50, func() { _ = NewCache(cc, 0) })
	withTools := testing.AllocsPerRun(50, func() {
		if NewCache(cc, 0).Tools(specs) != want {
			t.Fatal("count changed")
		}
	})
	if withTools != cacheOnly {
		t.Errorf("a run's cache allocates %v times for tools the process counted already, want 0", withTools-cacheOnly)
	}
	changed := []model.ToolSpec{{Name: "shared_tool", Description: "first", Parameters: []byte(`{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"integer"}}}`)}}
	if got, want := NewCache(cc, 0).Tools(changed), Tools(Approx, changed); got != want {
		t.Errorf("a changed schema counts %d, want %d", got, want)
	}
	if got := NewCache(cc, 0).Tools(specs); got != want {
		t.Errorf("the first schema again counts %d, want %d", got, want)
	}
}
