package worker

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/protocol"
)

func (h *harness) dlqState(t *testing.T) jetstream.StreamState {
	t.Helper()
	st, err := h.js.Stream(context.Background(), h.names.DLQStream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State
}

// One tenant publishing many oversized requests grows the dead-letter
// stream by at most DLQKeepBytes (plus headers) each, not by the requests'
// size: the stream is shared by every tenant.
func TestOversizedRequestsAreDeadLetteredTruncated(t *testing.T) {
	h := newHarness(t)
	h.startWorker(textModel("fine", 1, 0), nil)
	before := h.dlqState(t).Bytes
	const n, size = 50, 900 << 10
	body := append([]byte(`{"run_id":"big","thread_id":"t1","input":{"messages":[{"role":"user","content":"`), bytes.Repeat([]byte("x"), size)...)
	body = append(body, `"}]}}`...)
	var last uint64
	for i := range n {
		last = h.publishRaw(h.names.RunSubject("default", "t1"), body, fmt.Sprintf("big-%d", i))
	}
	dl := h.deadLetter(t, "default", "t1", last)
	if len(dl.Data) != DLQKeepBytes || !bytes.Equal(dl.Data, body[:DLQKeepBytes]) {
		t.Fatalf("dead letter holds %d bytes, want the first %d of the request", len(dl.Data), DLQKeepBytes)
	}
	if dl.Header.Get(HeaderDLQTruncated) != "true" || dl.Header.Get(HeaderDLQOriginalBytes) != strconv.Itoa(len(body)) {
		t.Fatalf("dead letter headers do not say it was truncated from %d bytes: %v", len(body), dl.Header)
	}
	h.waitRunsStreamEmpty(t)
	state := h.dlqState(t)
	if state.Msgs != n {
		t.Fatalf("dead-letter stream holds %d messages, want %d", state.Msgs, n)
	}
	grew := state.Bytes - before
	if limit := uint64(n * (DLQKeepBytes + 1024)); grew > limit {
		t.Fatalf("%d oversized requests grew the dead-letter stream by %d bytes, over %d", n, grew, limit)
	}
	t.Logf("%d requests of %d bytes grew the dead-letter stream by %d bytes", n, len(body), grew)
}

// A dead-letter stream at its max bytes drops its oldest dead letters for
// new ones, and the worker keeps serving.
func TestFullDeadLetterStreamDropsOldest(t *testing.T) {
	h := newHarnessWith(t, bus.Settings{AckWait: 2 * time.Second, MaxDeliver: 5, DLQMaxBytes: 1 << 20})
	h.startWorker(textModel("fine", 1, 0), nil)
	// Fill the stream to near its limit with older dead letters.
	filler := bytes.Repeat([]byte("f"), 300<<10)
	for range 3 {
		m := nats.NewMsg(h.names.Prefix + ".dlq.runs.default.old")
		m.Data = filler
		if _, err := h.js.PublishMsg(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	body := append([]byte(`{"run_id":"bad","thread_id":"t1","agent":"nope","input":{"messages":[{"role":"user","content":"`), bytes.Repeat([]byte("y"), 200<<10)...)
	body = append(body, `"}]}}`...)
	var last uint64
	for i := range 40 {
		last = h.publishRaw(h.names.RunSubject("default", "t1"), body, fmt.Sprintf("bad-%d", i))
	}
	h.deadLetter(t, "default", "t1", last)
	state := h.dlqState(t)
	if state.FirstSeq == 1 {
		t.Fatalf("the oldest dead letter was kept in a full stream: %+v", state)
	}
	if state.Bytes > 1<<20 {
		t.Fatalf("dead-letter stream holds %d bytes, over its max of %d", state.Bytes, 1<<20)
	}
	w := h.watch("default", "t2", "good")
	h.submit(request("t2", "good", "hello"))
	if fin := w.finished(t, 10*time.Second); fin.Status != protocol.StatusSuccess {
		t.Fatalf("run after a full dead-letter stream ended %s: %s", fin.Status, fin.Error)
	}
}

// checkDeadLetterBody checks that the dead letter of an invalid request
// holds it whole, or its first DLQKeepBytes marked as truncated.
func checkDeadLetterBody(t *testing.T, m *jetstream.RawStreamMsg, data []byte) {
	t.Helper()
	if len(data) <= DLQKeepBytes {
		if !bytes.Equal(m.Data, data) || m.Header.Get(HeaderDLQTruncated) != "" {
			t.Fatal("dead letter does not hold the original request")
		}
		return
	}
	if !bytes.Equal(m.Data, data[:DLQKeepBytes]) || m.Header.Get(HeaderDLQTruncated) != "true" || m.Header.Get(HeaderDLQOriginalBytes) != strconv.Itoa(len(data)) {
		t.Fatalf("dead letter of a %d-byte request holds %d bytes, headers %v; want the first %d, marked truncated", len(data), len(m.Data), m.Header, DLQKeepBytes)
	}
}
