package protocol

import (
	"encoding/json"
	"fmt"
	"testing"
)

func totals(model string, in, out int, cached *int) UsageTotals {
	var u UsageTotals
	u.AddCall(model, PurposeMain, in, out, cached, false)
	return u
}

// A subagent's usage is part of its parent's view exactly once, however
// often the child reports.
func TestRunUsage_ChildCountedOnce(t *testing.T) {
	r := &RunUsage{RunID: "parent"}
	r.Own = totals("gpt-4o", 100, 10, nil)
	r.Recompute()
	r.SetChild("child1", totals("gpt-4o-mini", 40, 4, nil))
	r.SetChild("child1", totals("gpt-4o-mini", 50, 5, nil)) // a later, final report
	r.SetChild("child2", totals("gpt-4o-mini", 7, 1, nil))
	if r.Total.Input != 157 || r.Total.Output != 16 || r.Total.Calls != 3 || r.Own.Input != 100 {
		t.Fatalf("total %+v own %+v", r.Total.TokenCounts, r.Own.TokenCounts)
	}
	if b := r.Total.Models["gpt-4o-mini"]; b == nil || b.Main.Input != 57 {
		t.Fatalf("models %+v", r.Total.Models)
	}
	// The stored form reads back the same and recomputes the same.
	data, _ := json.Marshal(r)
	var back RunUsage
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	back.Recompute()
	if back.Total.Input != 157 || len(back.Children) != 2 {
		t.Fatalf("round trip %+v", back)
	}
	// A clone is independent.
	c := r.Clone()
	c.SetChild("child3", totals("x", 1000, 0, nil))
	if r.Total.Input != 157 {
		t.Fatal("a clone changed the original")
	}
}

func TestTokenCounts_CachedAbsentIsNotZero(t *testing.T) {
	var a TokenCounts
	a.AddCall(10, 1, nil, false)
	if a.Cached != nil || a.CachedCalls != 0 {
		t.Fatalf("%+v", a)
	}
	data, _ := json.Marshal(a)
	if string(data) != `{"input_tokens":10,"output_tokens":1,"total_tokens":11,"calls":1}` {
		t.Fatalf("json %s", data)
	}
	zero := 0
	a.AddCall(10, 1, &zero, true)
	three := 3
	a.AddCall(10, 1, &three, false)
	if a.Cached == nil || *a.Cached != 3 || a.CachedCalls != 2 || a.Calls != 3 || a.ApproximateCalls != 1 {
		t.Fatalf("%+v", a)
	}
}

func TestThreadUsage_ApplyReplacesAndFolds(t *testing.T) {
	var th ThreadUsage
	if !th.Apply("r1", totals("m", 10, 1, nil), 2) {
		t.Fatal("first apply changed nothing")
	}
	if th.Apply("r1", totals("m", 10, 1, nil), 2) {
		t.Fatal("the same totals applied twice changed the record")
	}
	th.Apply("r2", totals("m", 20, 2, nil), 2)
	th.Apply("r1", totals("m", 15, 1, nil), 2) // replaced, now the newest
	if th.Total.Input != 35 || th.Total.Calls != 2 {
		t.Fatalf("total %+v", th.Total.TokenCounts)
	}
	th.Apply("r3", totals("m", 30, 3, nil), 2) // r2 is the oldest applied
	if _, ok := th.Runs["r2"]; ok || th.FoldedRuns != 1 || th.Folded.Input != 20 || th.Total.Input != 65 || th.Total.Calls != 3 {
		t.Fatalf("after folding: %+v", th)
	}
}

// A thread's cancelled runs list each run once, newest last, and drop the
// oldest beyond ThreadCancelledRuns.
func TestThreadAddCancelledRun(t *testing.T) {
	var th Thread
	if th.RunCancelled("r0") {
		t.Fatal("an empty thread lists r0")
	}
	for i := range ThreadCancelledRuns {
		th.AddCancelledRun(fmt.Sprintf("r%d", i))
	}
	th.AddCancelledRun("r5")
	if len(th.CancelledRuns) != ThreadCancelledRuns || !th.RunCancelled("r5") || !th.RunCancelled("r0") {
		t.Fatalf("cancelled runs %v", th.CancelledRuns)
	}
	th.AddCancelledRun("new")
	if len(th.CancelledRuns) != ThreadCancelledRuns || th.RunCancelled("r0") || !th.RunCancelled("new") || th.CancelledRuns[ThreadCancelledRuns-1] != "new" {
		t.Fatalf("cancelled runs %v", th.CancelledRuns)
	}
}

// A thread's recent runs keep each run once, in the order they took the
// lease, and push the oldest out beyond ThreadRecentRuns.
func TestThreadAddRecentRun(t *testing.T) {
	var th Thread
	for i := range ThreadRecentRuns {
		if ev := th.AddRecentRun(fmt.Sprintf("r%d", i)); ev != nil {
			t.Fatalf("run %d evicted %v", i, ev)
		}
	}
	if ev := th.AddRecentRun("r5"); ev != nil || len(th.RecentRuns) != ThreadRecentRuns {
		t.Fatalf("a run taken over again: evicted %v, %d runs", ev, len(th.RecentRuns))
	}
	ev := th.AddRecentRun("new")
	if len(ev) != 1 || ev[0] != "r0" || len(th.RecentRuns) != ThreadRecentRuns || th.RecentRuns[0] != "r1" || th.RecentRuns[ThreadRecentRuns-1] != "new" {
		t.Fatalf("evicted %v, recent %v", ev, th.RecentRuns)
	}
}
