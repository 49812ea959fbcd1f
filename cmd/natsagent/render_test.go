package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/protocol"
)

// An event sent again after a node loss arrives after events with a
// higher seq (docs/protocol.md 2.10.3): the renderer shows it when it
// fills a seq it skipped, but not a late delta (the completed message
// carries the whole text), and never an event twice.
func TestRendererShowsALateEventOnce(t *testing.T) {
	var out bytes.Buffer
	r := newRenderer(&out, style{}, false, false)
	at := time.Now().UTC()
	send := func(seq uint64, typ string, data any) {
		raw, err := json.Marshal(data)
		if err != nil {
			t.Fatal(err)
		}
		env, err := json.Marshal(protocol.Event{Type: typ, Seq: seq, RunID: "r1", ThreadID: "t1", Tenant: "default", Attempt: 1, Time: at, Data: raw})
		if err != nil {
			t.Fatal(err)
		}
		r.event(env)
	}
	send(1, protocol.EventRunStarted, protocol.StartedData{Attempt: 1})
	send(2, protocol.EventToolStarted, map[string]string{"tool_call_id": "c1", "name": "lookup", "arguments": "{}"})
	// seq 3 (tool.finished) and 4 (a delta) were lost in flight
	send(5, protocol.EventMessageDelta, map[string]string{"message_id": "m1", "delta": "world"})
	send(4, protocol.EventMessageDelta, map[string]string{"message_id": "m1", "delta": "LATE-DELTA"})
	send(3, protocol.EventToolFinished, map[string]string{"tool_call_id": "c1", "name": "lookup", "status": "error", "result": "boom"})
	send(3, protocol.EventToolFinished, map[string]string{"tool_call_id": "c1", "name": "lookup", "status": "error", "result": "boom"})
	got := out.String()
	if strings.Contains(got, "LATE-DELTA") {
		t.Errorf("a late delta was printed:\n%s", got)
	}
	if n := strings.Count(got, "boom"); n != 1 {
		t.Errorf("the late tool result was printed %d times, want once:\n%s", n, got)
	}
}

// Live deltas have no seq: the renderer prints them as they come (the
// follow placed them). A message.completed whose text the deltas did not
// all print (a follow that started mid-message, deltas dropped) prints
// what they missed: the rest, or the whole message when text in between
// is missing.
func TestRendererCompletesAPartlyStreamedMessage(t *testing.T) {
	at := time.Now().UTC()
	envelope := func(e protocol.Event, data any) []byte {
		raw, err := json.Marshal(data)
		if err != nil {
			t.Fatal(err)
		}
		e.RunID, e.ThreadID, e.Tenant, e.Attempt, e.Time, e.Data = "r1", "t1", "default", 1, at, raw
		env, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		return env
	}
	for _, c := range []struct {
		name   string
		deltas []string
		want   string
	}{
		{"all streamed", []string{"Hello ", "big ", "world"}, "Hello big world\n"},
		{"the end missed", []string{"Hello "}, "Hello big world\n"},
		{"the middle missed", []string{"Hello ", "world"}, "Hello world\n(the whole message, some of its text was missed:)\nHello big world\n"},
	} {
		var out bytes.Buffer
		r := newRenderer(&out, style{}, false, false)
		r.event(envelope(protocol.Event{Type: protocol.EventRunStarted, Seq: 2}, protocol.StartedData{Attempt: 1}))
		for i, d := range c.deltas {
			r.event(envelope(protocol.Event{Type: protocol.EventMessageDelta, Live: true, After: 2, Index: uint64(i + 1)},
				protocol.DeltaData{MessageID: "m1", Delta: d}))
		}
		r.event(envelope(protocol.Event{Type: protocol.EventMessageCompleted, Seq: 3}, map[string]string{"id": "m1", "role": "assistant", "content": "Hello big world"}))
		if got := out.String(); got != c.want {
			t.Errorf("%s: printed %q, want %q", c.name, got, c.want)
		}
	}
}
