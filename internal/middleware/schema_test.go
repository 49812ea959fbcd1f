package middleware

import (
	"encoding/json"
	"os"
	"slices"
	"testing"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/tools/toolstest"
)

// middlewareTools are the tools middleware provide, for a lead with two
// subagents and the default await bound.
func middlewareTools(t *testing.T) map[string]model.ToolSpec {
	s, err := NewSubagents(Subagents{}, Env{Kind: KindLead, Subagents: []SubagentInfo{{Name: "general-purpose"}, {Name: "researcher"}}})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]model.ToolSpec{}
	for _, sp := range append(s.specs(), clarificationSpec, rememberSpec, writeTodosSpec, toolSearchSpec, viewImageSpec) {
		out[sp.Name] = sp
	}
	return out
}

// The generated schemas accept what the hand-written ones did
// (testdata/schemas_before.json): see tools.TestBuiltinSchemasMatchBefore.
func TestMiddlewareToolSchemasMatchBefore(t *testing.T) {
	raw, err := os.ReadFile("testdata/schemas_before.json")
	if err != nil {
		t.Fatal(err)
	}
	var before map[string]json.RawMessage
	if err := json.Unmarshal(raw, &before); err != nil {
		t.Fatal(err)
	}
	got := middlewareTools(t)
	if len(got) != len(before) {
		t.Fatalf("%d tools, %d recorded", len(got), len(before))
	}
	for name, b := range before {
		sp, ok := got[name]
		if !ok {
			t.Errorf("%s is gone", name)
			continue
		}
		if d := toolstest.SameShape(b, sp.Parameters); d != "" {
			t.Errorf("%s's schema changed:\n%s", name, d)
		}
	}
}

func TestMiddlewareToolSchemasDecodeExamples(t *testing.T) {
	examples := map[string]struct {
		args    string
		decoded any
	}{
		TaskTool:           {`{"description":"find it","subagent_type":"researcher","thread_id":"t1"}`, delegation{}},
		SubagentStartTool:  {`{"description":"find it","subagent_type":"general-purpose"}`, delegation{}},
		SubagentStatusTool: {`{"run_id":"r1"}`, subagentRunArgs{}},
		SubagentCancelTool: {`{"run_id":"r1"}`, subagentRunArgs{}},
		SubagentAwaitTool:  {`{"run_id":"r1","timeout_seconds":30}`, subagentAwaitArgs{}},
		ClarificationTool:  {`{"question":"Which?","type":"approach_choice","context":"two ways","options":["a","b"]}`, clarificationArgs{}},
		RememberTool:       {`{"note":"likes tea"}`, rememberArgs{}},
		WriteTodosTool:     {`{"todos":[{"content":"plan","status":"in_progress"}]}`, writeTodosArgs{}},
		ToolSearchTool:     {`{"query":"select:a,b"}`, toolSearchArgs{}},
		ViewImageTool:      {`{"path":"/uploads/a.png"}`, viewImageArgs{}},
	}
	for name, sp := range middlewareTools(t) {
		ex, ok := examples[name]
		if !ok {
			t.Errorf("%s has no example", name)
			continue
		}
		toolstest.CheckExample(t, name, sp.Parameters, ex.args, ex.decoded)
	}
}

// The schema's enum of clarification types is the list the tool checks.
func TestClarificationTypesInSchema(t *testing.T) {
	var s struct {
		Properties map[string]struct {
			Enum []string `json:"enum"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(clarificationSpec.Parameters, &s); err != nil {
		t.Fatal(err)
	}
	if got := s.Properties["type"].Enum; !slices.Equal(got, clarificationTypes) {
		t.Fatalf("schema enum %v, tool %v", got, clarificationTypes)
	}
}
