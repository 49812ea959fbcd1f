package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/tools"
)

// A raw NATS request nested 10,000 levels deep, or with invalid UTF-8 in
// a field, takes the invalid-request path like any other bad input: an
// error run whose reason names the field, the request in the dead-letter
// stream, the worker still serving. A request over the server's max
// payload never reaches the stream: the publish itself is refused.
func TestDeepNestingAndInvalidUTF8AreDeadLettered(t *testing.T) {
	h := newHarness(t)
	h.startWorker(textModel("fine", 1, 0), nil)
	msgs := `"input":{"messages":[{"role":"user","content":"hi"}]}`
	cases := []struct {
		name, run, data, reason string
	}{
		{"10000 nested arrays in metadata", "deep", `{"run_id":"deep","thread_id":"t1",` + msgs + `,"metadata":{"x":` + strings.Repeat("[", 10000) + strings.Repeat("]", 10000) + `}}`,
			"metadata.x[0][0]"},
		{"deep resume", "deep-resume", `{"run_id":"deep-resume","thread_id":"t1","command":{"resume":` + strings.Repeat(`{"a":`, 65) + "1" + strings.Repeat("}", 65) + `}}`,
			"command.resume.a.a"},
		{"invalid UTF-8 in content", "badutf-content", "{\"run_id\":\"badutf-content\",\"thread_id\":\"t1\",\"input\":{\"messages\":[{\"role\":\"user\",\"content\":\"caf\xe9\"}]}}",
			"input.messages[0].content: is not valid UTF-8"},
		{"invalid UTF-8 in a metadata key", "badutf-key", "{\"run_id\":\"badutf-key\",\"thread_id\":\"t1\"," + msgs + ",\"metadata\":{\"\xc3\":1}}",
			"metadata: has a key that is not valid UTF-8"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := h.watch("default", "t1", c.run)
			seq := h.publishRaw(h.names.RunSubject("default", "t1"), []byte(c.data), c.run)
			fin := w.finished(t, 10*time.Second)
			if fin.Status != protocol.StatusError || !strings.Contains(fin.Error, c.reason) {
				t.Fatalf("run ended %s with %q, want error containing %q", fin.Status, fin.Error, c.reason)
			}
			if rec := h.run("default", c.run); rec.Status != protocol.StatusError || !strings.Contains(rec.Error, c.reason) {
				t.Fatalf("record %+v", rec)
			}
			m := h.deadLetter(t, "default", "t1", seq)
			if !strings.Contains(m.Header.Get(HeaderDLQReason), c.reason) {
				t.Fatalf("dead letter reason %q", m.Header.Get(HeaderDLQReason))
			}
			checkDeadLetterBody(t, m, []byte(c.data))
		})
	}

	// Over the server's max payload (1 MiB here, as by default): refused
	// when published, nothing is stored.
	big := make([]byte, h.nc.MaxPayload()+1)
	_, err := h.js.PublishMsg(context.Background(), &nats.Msg{Subject: h.names.RunSubject("default", "t1"), Data: big})
	if !errors.Is(err, nats.ErrMaxPayload) {
		t.Fatalf("publishing %d bytes: %v, want nats.ErrMaxPayload", len(big), err)
	}

	w := h.watch("default", "t1", "good")
	h.submit(request("t1", "good", "hello"))
	if fin := w.finished(t, 10*time.Second); fin.Status != protocol.StatusSuccess {
		t.Fatalf("good run %s: %s", fin.Status, fin.Error)
	}
	h.waitRunsStreamEmpty(t)
}

// A model that sends tool arguments nested 10,000 levels deep (or 100, or
// with a broken encoding) gets an error result that says why, the tool
// never runs, and the run goes on: no stack blowup, no failed run.
func TestDeeplyNestedToolArguments(t *testing.T) {
	h := newHarness(t)
	var ran atomic.Int32
	h.tools.Register(tools.Func(model.ToolSpec{Name: "take_args"}, func(ctx context.Context, args json.RawMessage) (string, error) {
		ran.Add(1)
		return "ran", nil
	}))
	cases := []struct{ name, args, want string }{
		{"10000 levels", `{"a":` + strings.Repeat("[", 10000) + strings.Repeat("]", 10000) + `}`, "a[0][0][0]"},
		{"100 levels, valid JSON", strings.Repeat(`{"b":`, 100) + "1" + strings.Repeat("}", 100), "b.b.b.b"},
		{"invalid UTF-8", "{\"path\":\"caf\xe9\"}", "path: is not valid UTF-8"},
	}
	// The user's message says which arguments the model sends.
	h.startWorker(model.NewScripted(func(n int, req *model.Request) model.Reply {
		last := req.Messages[len(req.Messages)-1]
		if last.Role == model.RoleTool {
			return model.Reply{Text: "saw: " + last.Content}
		}
		var i int
		fmt.Sscan(last.Content, &i)
		return model.Reply{ToolCalls: []model.ToolCall{{ID: "c1", Name: "take_args", Arguments: cases[i].args}}}
	}), nil)
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			run := fmt.Sprintf("args%d", i)
			w := h.watch("default", run, run)
			h.submit(request(run, run, fmt.Sprint(i)))
			fin := w.finished(t, 10*time.Second)
			if fin.Status != protocol.StatusSuccess || fin.Output == nil || !strings.HasPrefix(fin.Output.Content, "saw: ") {
				t.Fatalf("run ended %s (%s) with %+v", fin.Status, fin.Error, fin.Output)
			}
			got := strings.TrimPrefix(fin.Output.Content, "saw: ")
			if !strings.Contains(got, "arguments of take_args") || !strings.Contains(got, c.want) {
				t.Fatalf("the model read %q, want the reason with %q", got, c.want)
			}
		})
	}
	if n := ran.Load(); n != 0 {
		t.Fatalf("the tool ran %d times with arguments it must not get", n)
	}
}

// A run request's Nats-Msg-Id must be "<tenant>.<run>": another tenant's
// id, or the bare run id of old, is dead-lettered with the reason, so a
// message id can never stand for another tenant's run.
func TestRunRequestWithAForeignMsgIDIsDeadLettered(t *testing.T) {
	h := newHarness(t)
	h.startWorker(textModel("fine", 1, 0), nil)
	for _, c := range []struct{ run, msgID string }{{"r7", "globex.r7"}, {"r8", "r8"}, {"r9", "default.r1"}} {
		w := h.watch("default", "t1", c.run)
		m := nats.NewMsg(h.names.RunSubject("default", "t1"))
		m.Data = []byte(`{"run_id":"` + c.run + `","thread_id":"t1","input":{"messages":[{"role":"user","content":"hi"}]}}`)
		m.Header.Set(nats.MsgIdHdr, c.msgID)
		ack, err := h.js.PublishMsg(context.Background(), m)
		if err != nil {
			t.Fatal(err)
		}
		fin := w.finished(t, 10*time.Second)
		want := `Nats-Msg-Id: "` + c.msgID + `" does not match the run: it must be "default.` + c.run + `"`
		if fin.Status != protocol.StatusError || !strings.Contains(fin.Error, want) {
			t.Fatalf("msg id %s: run ended %s with %q, want error containing %q", c.msgID, fin.Status, fin.Error, want)
		}
		if dl := h.deadLetter(t, "default", "t1", ack.Sequence); !strings.Contains(dl.Header.Get(HeaderDLQReason), "Nats-Msg-Id") {
			t.Fatalf("dead letter reason %q", dl.Header.Get(HeaderDLQReason))
		}
	}
	h.waitRunsStreamEmpty(t)
}
