package tokens

import (
	"fmt"
	"testing"

	"github.com/natsagent/natsagent/internal/model"
)

// Two profiles offering a tool under one name with different schemas (an
// MCP server's and a local one) each keep their own count: counting them
// in turn counts nothing again, and does not wear the process's cap down
// until it drops the counts of other tools.
func TestToolCountsKeepEachSchemaUnderOneName(t *testing.T) {
	// The approximate encoding has no process-wide level behind the
	// tool counts: every count not found is the counter's call.
	cc := &countingCounter{name: Approximate}
	a := []model.ToolSpec{{Name: "search", Description: "Search the web.", Parameters: []byte(`{"type":"object","properties":{"q":{"type":"string"}}}`)}}
	b := []model.ToolSpec{{Name: "search", Description: "Search the company wiki, by space and query.", Parameters: []byte(`{"type":"object","properties":{"space":{"type":"string"},"query":{"type":"string"},"limit":{"type":"integer"}}}`)}}
	other := []model.ToolSpec{{Name: "unrelated", Description: "Another tool.", Parameters: []byte(`{"type":"object"}`)}}
	wantA, wantB, wantOther := Tools(Approx, a), Tools(Approx, b), Tools(Approx, other)
	if wantA == wantB {
		t.Fatal("the two schemas count the same: the test cannot tell them apart")
	}
	c := NewCache(cc, 0)
	c.Tools(a)
	c.Tools(b)
	c.Tools(other)
	cc.mu.Lock()
	warm := cc.calls
	cc.mu.Unlock()
	for i := range 2 * maxTools {
		if got := c.Tools(a); got != wantA {
			t.Fatalf("round %d: the first schema counts %d, want %d", i, got, wantA)
		}
		if got := c.Tools(b); got != wantB {
			t.Fatalf("round %d: the second schema counts %d, want %d", i, got, wantB)
		}
	}
	if got := c.Tools(other); got != wantOther {
		t.Fatalf("the other tool counts %d, want %d", got, wantOther)
	}
	cc.mu.Lock()
	again := cc.calls - warm
	cc.mu.Unlock()
	if again != 0 {
		t.Errorf("the counter was called %d times after both schemas and the other tool were counted, want 0", again)
	}
}

// However many schemas a process meets (MCP servers come and go), the
// counts it keeps stay bounded, and a schema counted after the cap was
// reached is counted right.
func TestToolCountsStayBounded(t *testing.T) {
	cc := &countingCounter{name: Approximate}
	c := NewCache(cc, 0)
	for i := range 3 * maxTools {
		// Half the schemas share a handful of names, half have their own.
		name := fmt.Sprintf("tool_%d", i%7)
		if i%2 == 1 {
			name = fmt.Sprintf("tool_own_%d", i)
		}
		s := []model.ToolSpec{{Name: name, Description: "v", Parameters: fmt.Appendf(nil, `{"type":"object","description":"version %d"}`, i)}}
		if got, want := c.Tools(s), Tools(Approx, s); got != want {
			t.Fatalf("schema %d counts %d, want %d", i, got, want)
		}
		if n := toolCountsHeld(); n > maxTools {
			t.Fatalf("after %d schemas the process keeps %d tool counts, over its cap of %d", i+1, n, maxTools)
		}
	}
}

// toolCountsHeld counts the tool counts the process keeps.
func toolCountsHeld() int {
	n := 0
	toolCounts.Range(func(_, v any) bool {
		n += len(v.(*toolVariants).entries)
		return true
	})
	return n
}

// BenchmarkToolsTwoSchemasOneName counts, in turn, the tools of two
// profiles that offer a tool under the same name with different schemas.
func BenchmarkToolsTwoSchemasOneName(b *testing.B) {
	c := NewCache(Approx, 0)
	a := []model.ToolSpec{{Name: "bench_search", Description: "Search the web.", Parameters: []byte(`{"type":"object","properties":{"q":{"type":"string"}}}`)}}
	w := []model.ToolSpec{{Name: "bench_search", Description: "Search the wiki.", Parameters: []byte(`{"type":"object","properties":{"space":{"type":"string"},"query":{"type":"string"}}}`)}}
	b.ReportAllocs()
	for b.Loop() {
		c.Tools(a)
		c.Tools(w)
	}
}
