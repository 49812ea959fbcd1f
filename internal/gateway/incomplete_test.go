package gateway

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
)

// A run max_steps cut short says incomplete on every HTTP surface, never
// success: the run object (native), the natsagent stream's run.finished,
// the run list's status filter, and LangGraph's routes (runs.wait's
// status header and values, the end event of a values stream, join). Its
// output says it was cut and carries no unanswered tool call.
func TestIncompleteRunOverHTTP(t *testing.T) {
	m := model.NewScripted(func(int, *model.Request) model.Reply {
		return model.Reply{ToolCalls: []model.ToolCall{{ID: "c", Name: "current_time", Arguments: `{}`}}}
	})
	e := newEnv(t, m)
	capped := func(run string) map[string]any {
		return map[string]any{"run_id": run, "config": map[string]any{"max_steps": 1},
			"input": map[string]any{"messages": []any{map[string]any{"role": "user", "content": "what time is it?"}}}}
	}
	checkRecord := func(rec protocol.Run) {
		t.Helper()
		if rec.Status != protocol.StatusIncomplete || rec.StopReason != protocol.StopMaxSteps ||
			rec.IncompleteDetails == nil || rec.IncompleteDetails.Reason != protocol.StopMaxSteps {
			t.Fatalf("run %s: status %s, stop_reason %q, incomplete_details %+v", rec.RunID, rec.Status, rec.StopReason, rec.IncompleteDetails)
		}
		if rec.Output == nil || !strings.Contains(rec.Output.Content, "[STOPPED: max_steps]") || len(rec.Output.ToolCalls) != 0 {
			t.Fatalf("run %s: output %+v", rec.RunID, rec.Output)
		}
	}

	// LangGraph's runs.wait: the thread's values, the status in a header.
	r := e.do("POST", "/threads/h1/runs/wait", capped("r1")).expect(t, http.StatusOK)
	if got := r.header.Get("X-Natsagent-Run-Status"); got != string(protocol.StatusIncomplete) {
		t.Fatalf("runs.wait: X-Natsagent-Run-Status %q", got)
	}
	var values struct {
		Messages []map[string]any `json:"messages"`
		Error    any              `json:"__error__"`
	}
	r.decode(t, &values)
	if values.Error != nil || len(values.Messages) != 2 || values.Messages[1]["type"] != "ai" ||
		!strings.Contains(values.Messages[1]["content"].(string), "[STOPPED: max_steps]") {
		t.Fatalf("runs.wait values: %s", r.body)
	}
	if calls, _ := values.Messages[1]["tool_calls"].([]any); len(calls) != 0 {
		t.Fatalf("the cut answer keeps tool calls: %s", r.body)
	}
	// The run object, and the list filtered by status.
	checkRecord(e.do("GET", "/threads/h1/runs/r1", nil).expect(t, http.StatusOK).run(t))
	var listed []protocol.Run
	e.do("GET", "/threads/h1/runs?status=incomplete", nil).expect(t, http.StatusOK).decode(t, &listed)
	if len(listed) != 1 || listed[0].RunID != "r1" {
		t.Fatalf("runs with status incomplete: %+v", listed)
	}
	e.do("GET", "/threads/h1/runs?status=success", nil).expect(t, http.StatusOK).decode(t, &listed)
	if len(listed) != 0 {
		t.Fatalf("runs with status success: %+v", listed)
	}
	join := e.do("GET", "/threads/h1/runs/r1/join", nil).expect(t, http.StatusOK)
	if strings.Contains(string(join.body), "__error__") || !strings.Contains(string(join.body), "[STOPPED: max_steps]") {
		t.Fatalf("join: %s", join.body)
	}

	// natsagent's own stream: run.finished.
	var fin *protocol.Event
	for _, ev := range e.openStream("POST", "/threads/h2/runs/stream", capped("r2")).rest(30 * time.Second) {
		if ev.env.Type == "run.finished" {
			fin = &ev.env
		}
	}
	if fin == nil {
		t.Fatal("no run.finished on the natsagent stream")
	}
	var data struct {
		Status            protocol.Status             `json:"status"`
		StopReason        string                      `json:"stop_reason"`
		IncompleteDetails *protocol.IncompleteDetails `json:"incomplete_details"`
	}
	if err := json.Unmarshal(fin.Data, &data); err != nil || data.Status != protocol.StatusIncomplete ||
		data.StopReason != protocol.StopMaxSteps || data.IncompleteDetails == nil || data.IncompleteDetails.Reason != protocol.StopMaxSteps {
		t.Fatalf("run.finished: %s (%v)", fin.Data, err)
	}
	checkRecord(e.awaitRun("h2", "r2"))

	// A LangGraph values stream ends with the status, and no error event.
	var end string
	for _, ev := range e.openLangGraphStream("POST", "/threads/h3/runs/stream", capped("r3")).rest(30 * time.Second) {
		switch ev.event {
		case "error":
			t.Fatalf("an incomplete run streamed an error event: %s", ev.data)
		case "end":
			end = ev.data
		}
	}
	var ended struct {
		Status protocol.Status `json:"status"`
	}
	if err := json.Unmarshal([]byte(end), &ended); err != nil || ended.Status != protocol.StatusIncomplete {
		t.Fatalf("end event %q (%v)", end, err)
	}
	checkRecord(e.awaitRun("h3", "r3"))
}
