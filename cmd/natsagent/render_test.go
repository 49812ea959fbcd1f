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
