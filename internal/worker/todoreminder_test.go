package worker

import (
	"strings"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/model/openaitest"
	"github.com/natsagent/natsagent/internal/protocol"
)

// A worker that dies after the todo reminder sent a final answer back and
// before the model call that carries the reminder: the run's next worker
// makes that call, with the reminder, instead of ending on the answer the
// reminder refused. The transcript it sends passes the strict provider.
func TestTodoReminderSurvivesAWorkerDeath(t *testing.T) {
	h := newHarness(t)
	stuck := make(chan struct{})
	dying := model.NewScripted(func(n int, req *model.Request) model.Reply {
		switch n {
		case 0:
			return model.Reply{ToolCalls: []model.ToolCall{{ID: "call_todos", Name: middleware.WriteTodosTool,
				Arguments: `{"todos":[{"content":"read the file","status":"completed"},{"content":"write the summary","status":"in_progress"}]}`}}}
		case 1:
			return model.Reply{Text: "done, I think"}
		}
		// The call the reminder asked for: the worker dies in it, before
		// anything of it is saved.
		close(stuck)
		return model.Reply{Delay: time.Hour}
	})
	a := h.startWorker(dying, nil)
	w := h.watch(protocol.DefaultTenant, "t1", "r1")
	h.submit(request("t1", "r1", "summarise the file"))
	select {
	case <-stuck:
	case <-time.After(60 * time.Second):
		t.Fatalf("the reminder's model call never came; events %v", w.types())
	}
	a.nc.Close() // no acks, no heartbeats, no writes

	srv, healthy := strictModel(t, func(req *openaitest.Request) openaitest.Reply {
		return openaitest.Text("the summary is written")
	})
	h.startWorker(healthy, nil)
	fin := w.finished(t, 60*time.Second)
	if fin.Status != protocol.StatusSuccess || fin.Output == nil || fin.Output.Content != "the summary is written" {
		t.Fatalf("run ended %s with %+v: want the answer after the reminder", fin.Status, fin.Output)
	}
	if v := srv.Violations(); len(v) > 0 {
		t.Fatalf("strict provider: %v", v)
	}
	reqs := srv.Requests()
	if len(reqs) != 1 {
		t.Fatalf("the next worker made %d model calls, want 1", len(reqs))
	}
	msgs := reqs[0].Messages
	answer := -1
	for i, m := range msgs {
		if m.Role == "assistant" && m.Content == "done, I think" {
			answer = i
		}
	}
	if answer < 0 {
		t.Fatalf("the refused answer is not in the transcript: %+v", msgs)
	}
	reminded := false
	for _, m := range msgs[answer+1:] {
		if m.Role == "user" && strings.Contains(m.Content, "<system_reminder>") && strings.Contains(m.Content, "write the summary") {
			reminded = true
		}
	}
	if !reminded {
		t.Fatalf("no reminder after the refused answer: %+v", msgs[answer+1:])
	}
	for _, m := range h.threadState(protocol.DefaultTenant, "t1") {
		if strings.Contains(m.Content, "<system_reminder>") {
			t.Fatalf("the reminder was stored: %+v", m)
		}
	}
}
