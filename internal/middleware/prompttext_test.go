package middleware

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/state"
)

// Runs of one profile share the system prompt and tool list their chain
// builds (a waiting run holds them for its model call's length), and
// still each gets its own request: concurrent runs with different
// switches see their own tools, nobody writes into the profile's tool
// list, and a wrapper that appends to a shared list copies it.
func TestSharedRequestParts_RunsShareAndStayApart(t *testing.T) {
	c, err := Assemble(ChainConfig{}, Env{KnownTool: known("search")})
	if err != nil {
		t.Fatal(err)
	}
	// The profile's list, with room a careless append would write into.
	profile := append(make([]model.ToolSpec, 0, 8), specs("search")...)
	off := false
	call := func(clarification *bool) *ModelRequest {
		rt, _ := newRuntime("r")
		rt.Config.Clarification = clarification
		var got *ModelRequest
		base := func(ctx context.Context, req *ModelRequest) (*ModelResponse, error) {
			got = req
			return &ModelResponse{Response: &model.Response{Message: asst("", "ok"), FinishReason: model.FinishStop}}, nil
		}
		if _, err := c.ModelCall(rt, base)(context.Background(), &ModelRequest{System: "You help.", Tools: profile, State: &state.State{}}); err != nil {
			t.Error(err)
		}
		return got
	}
	reqs := make([]*ModelRequest, 4)
	var wg sync.WaitGroup
	for i := range reqs {
		wg.Go(func() {
			if i%2 == 1 {
				reqs[i] = call(&off)
			} else {
				reqs[i] = call(nil)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	for i, r := range reqs {
		has := slices.Contains(specNames(r.Tools), ClarificationTool)
		if want := i%2 == 0; has != want {
			t.Errorf("run %d offers %s: %v, want %v (tools %v)", i, ClarificationTool, has, want, specNames(r.Tools))
		}
		if len(r.Tools) != cap(r.Tools) {
			t.Errorf("run %d: tool list has room (len %d, cap %d): an append would write into the list other runs hold", i, len(r.Tools), cap(r.Tools))
		}
	}
	if len(profile) != 1 || profile[:2][1].Name != "" {
		t.Errorf("the profile's tool list was written into: %v", specNames(profile[:2]))
	}
	// Shared: the same run configuration gets the same list and prompt.
	if &reqs[0].Tools[0] != &reqs[2].Tools[0] {
		t.Error("two runs of one profile got copies of the same tool list")
	}
	if unsafe.StringData(reqs[0].System) != unsafe.StringData(reqs[2].System) || reqs[0].System == "You help." {
		t.Error("two runs of one profile got copies of the same system prompt")
	}
	// A later wrapper's append copies; the other run's list stays as it was.
	before := specNames(reqs[2].Tools)
	_ = append(reqs[0].Tools, model.ToolSpec{Name: "extra"})
	if got := specNames(reqs[2].Tools); !slices.Equal(got, before) {
		t.Errorf("an append to one run's list changed another's: %v, was %v", got, before)
	}
}

// A tool of the same name with another spec is not taken for the one
// added before.
func TestWithTools_SameNameOtherSpec(t *testing.T) {
	base := specs("a")
	first := withTools(base, model.ToolSpec{Name: "x", Description: "one"})
	second := withTools(base, model.ToolSpec{Name: "x", Description: "two"})
	if first[1].Description != "one" || second[1].Description != "two" {
		t.Errorf("got %q then %q, want one then two", first[1].Description, second[1].Description)
	}
}

// A thread's memory makes its system prompt its own; the shared sections
// appended after it (the todo guide, the date) then make prompts no other
// run builds. Those must not take the shared prompts' places: after many
// runs with distinct memory, a run without memory still gets the prompt
// the profile's runs share, not a copy built anew.
func TestSharedPrompts_OwnPromptsDoNotEvictShared(t *testing.T) {
	c, err := Assemble(ChainConfig{Settings: map[string]json.RawMessage{"memory": json.RawMessage(`{"enabled": true}`)}},
		Env{Memory: unusedMemory{}, KnownTool: known("search")})
	if err != nil {
		t.Fatal(err)
	}
	call := func(notes string) string {
		rt, _ := newRuntime("r")
		Scratch(rt, "memory:load", func() *memoryLoad { return &memoryLoad{notes: notes} })
		var got string
		base := func(ctx context.Context, req *ModelRequest) (*ModelResponse, error) {
			got = req.System
			return &ModelResponse{Response: &model.Response{Message: asst("", "ok"), FinishReason: model.FinishStop}}, nil
		}
		if _, err := c.ModelCall(rt, base)(context.Background(), &ModelRequest{System: "You help.", Tools: specs("search"), State: &state.State{}}); err != nil {
			t.Fatal(err)
		}
		return got
	}
	shared := call("")
	if shared == "You help." {
		t.Fatal("the chain appended no shared section: nothing to test")
	}
	for i := range 4 * maxShared {
		note := fmt.Sprintf("note %d", i)
		own := call(note)
		if !strings.Contains(own, note) || !strings.HasSuffix(own, shared[strings.LastIndex(shared, "\n\n"):]) {
			t.Fatalf("a run with memory got the prompt %q", own)
		}
	}
	if again := call(""); unsafe.StringData(again) != unsafe.StringData(shared) {
		t.Errorf("after %d runs with their own memory, a run without got a new copy of the profile's prompt: own prompts pushed the shared one out", 4*maxShared)
	}
}
