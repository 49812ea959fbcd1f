package gateway

import (
	"net/http"
	"strings"
	"testing"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
)

// clarifyingModel asks a question on a new message and repeats the
// answer it gets back.
func clarifyingModel() *model.Scripted {
	return model.NewScripted(func(_ int, req *model.Request) model.Reply {
		last := req.Messages[len(req.Messages)-1]
		if last.Role == model.RoleUser {
			return model.Reply{ToolCalls: []model.ToolCall{{ID: "q1", Name: "ask_clarification",
				Arguments: `{"question":"Which city?","type":"missing_info"}`}}}
		}
		return model.Reply{Text: "got: " + last.Content}
	})
}

// A resume is checked before anything is published: 409 when the thread
// waits for nothing, 400 when the answer does not fit the question; the
// thread keeps waiting, and a fitting resume then finishes the run.
func TestResumeCheckedBeforePublish(t *testing.T) {
	e := newEnv(t, clarifyingModel())
	resume := func(v any) map[string]any {
		return map[string]any{"command": map[string]any{"resume": v}}
	}

	// A new thread waits for nothing.
	e.do("POST", "/threads", map[string]any{"thread_id": "fresh"}).expect(t, http.StatusOK)
	if err := e.do("POST", "/threads/fresh/runs", resume(map[string]any{"answer": "Lyon"})).expect(t, http.StatusConflict).apiError(t); !strings.Contains(err.Message, "not waiting") {
		t.Fatalf("resume on an idle thread: %+v", err)
	}

	first := e.do("POST", "/threads/t1/runs/wait?format=natsagent", input("book a flight")).expect(t, http.StatusOK).run(t)
	if first.Status != protocol.StatusInterrupted || first.Interrupt == nil || first.Interrupt.Question != "Which city?" {
		t.Fatalf("first run %+v", first)
	}
	for name, body := range map[string]any{
		"empty answer":   map[string]any{"answer": "  "},
		"a number":       42,
		"empty string":   " ",
		"decisions only": map[string]any{"decisions": []map[string]any{{"type": "approve"}}},
	} {
		if err := e.do("POST", "/threads/t1/runs", resume(body)).expect(t, http.StatusBadRequest).apiError(t); !strings.HasPrefix(err.Field, "command.resume") {
			t.Errorf("%s: error %+v does not name command.resume", name, err)
		}
	}
	runs := e.do("GET", "/threads/t1/runs", nil).expect(t, http.StatusOK)
	var list []protocol.Run
	runs.decode(t, &list)
	if len(list) != 1 {
		t.Fatalf("refused resumes left runs behind: %d runs", len(list))
	}

	done := e.do("POST", "/threads/t1/runs/wait?format=natsagent", resume(map[string]any{"answer": "Lyon"})).expect(t, http.StatusOK).run(t)
	if done.Status != protocol.StatusSuccess || done.Output == nil || !strings.Contains(done.Output.Content, "Lyon") {
		t.Fatalf("resumed run %+v", done)
	}
	// Answered once, the thread waits for nothing again.
	e.do("POST", "/threads/t1/runs", resume(map[string]any{"answer": "Paris"})).expect(t, http.StatusConflict)
}
