package worker

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsagent/natsagent/internal/protocol"
)

// A request published with headers the server acts on (here an expected
// stream, which the dead-letter stream would refuse) still lands in the
// dead-letter stream: the copy keeps the client's own headers and drops
// the server's.
func TestDeadLetterDropsServerHeaders(t *testing.T) {
	h := newHarness(t)
	h.startWorker(textModel("fine", 1, 0), nil)
	w := h.watch("default", "t1", "hdr")
	m := nats.NewMsg(h.names.RunSubject("default", "t1"))
	m.Data = []byte(`{"run_id": "hdr", "thread_id": `)
	m.Header.Set(nats.MsgIdHdr, "default.hdr")
	m.Header.Set("Nats-Expected-Stream", h.names.RunsStream())
	m.Header.Set("X-Trace", "abc")
	ack, err := h.js.PublishMsg(context.Background(), m)
	if err != nil {
		t.Fatal(err)
	}
	if fin := w.finished(t, 10*time.Second); fin.Status != protocol.StatusError {
		t.Fatalf("run ended %s", fin.Status)
	}
	dl := h.deadLetter(t, "default", "t1", ack.Sequence)
	if dl.Header.Get("X-Trace") != "abc" {
		t.Fatalf("dead letter lost the client's header: %v", dl.Header)
	}
	// (A direct get adds Nats-Stream, Nats-Sequence and the like to
	// what it returns; those are not on the stored copy.)
	if dl.Header.Get("Nats-Expected-Stream") != "" {
		t.Fatal("dead letter kept the server header Nats-Expected-Stream")
	}
	if id := dl.Header.Get(nats.MsgIdHdr); id != h.names.RunsStream()+"-"+strconv.FormatUint(ack.Sequence, 10) {
		t.Fatalf("dead letter's own dedupe id %q", id)
	}
	h.waitRunsStreamEmpty(t)
}
