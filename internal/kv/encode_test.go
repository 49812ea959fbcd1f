package kv

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
)

// finishedThread is a thread record as a run's release writes it: its
// last_run carries the answer and the usage, so it is well over the
// encoder's first guess of a record's size.
func finishedThread(now time.Time, answer string) *protocol.Thread {
	var u protocol.UsageTotals
	u.AddCall("gpt", protocol.PurposeMain, 10, 2, nil, true)
	usage := &protocol.RunUsage{RunID: "r1", ThreadID: "t1", Tenant: "default", Own: u, Total: u, Final: true, UpdatedAt: now}
	return &protocol.Thread{
		ThreadID: "t1", Tenant: "default", CreatedAt: now, UpdatedAt: now, Status: protocol.ThreadIdle, Head: "cp1", Epoch: 4,
		LastRunID: "r1", Owner: "alice",
		LastRun: &protocol.Run{RunID: "r1", ThreadID: "t1", Tenant: "default", Agent: "chatbot", Status: protocol.StatusSuccess, Attempt: 1,
			CreatedAt: now, StartedAt: &now, FinishedAt: &now, Worker: "w1", Epoch: 4, MsgSeq: 98, Seq: 3, Usage: usage,
			Output: &model.Message{ID: "msg_1", Role: model.RoleAssistant, Content: answer}},
	}
}

// TestEncodeAllocatesOnce: a record that outgrows the encoder's first
// guess of its size costs one allocation, not a guess and its growths,
// once the encoder has seen a record of that kind; and the bytes stay
// encoding/json's, whatever size the buffer started with.
func TestEncodeAllocatesOnce(t *testing.T) {
	now := time.Now().UTC()
	for _, answer := range []string{"ok", strings.Repeat("a long answer ", 150)} {
		th := finishedThread(now, answer)
		want, err := json.Marshal(th)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := encode(th); err != nil { // the encoder learns the size
			t.Fatal(err)
		}
		if n := testing.AllocsPerRun(50, func() { _, _ = encode(th) }); n != 1 {
			t.Errorf("thread record of %d bytes: %v allocations per encode, want 1", len(want), n)
		}
		got, err := encode(th)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("encode = %s, %v; want %s", got, err, want)
		}
		run := th.LastRun
		if want, err = json.Marshal(run); err != nil {
			t.Fatal(err)
		}
		if _, err := encode(run); err != nil {
			t.Fatal(err)
		}
		if n := testing.AllocsPerRun(50, func() { _, _ = encode(run) }); n != 1 {
			t.Errorf("run record of %d bytes: %v allocations per encode, want 1", len(want), n)
		}
		if got, err = encode(run); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("encode = %s, %v; want %s", got, err, want)
		}
	}
	// A run writes its thread leased (no last_run on a new thread) and
	// released (with last_run), in turn: each still costs one allocation,
	// and a small record after a large one encodes to the same bytes.
	small := &protocol.Thread{ThreadID: "t2", Tenant: "default", CreatedAt: now, UpdatedAt: now, Status: protocol.ThreadBusy,
		Lease: &protocol.Lease{RunID: "r1", Worker: "w1", Epoch: 1, AcquiredAt: now, RenewedAt: now, Attempt: 1, Agent: "chatbot"}}
	large := finishedThread(now, "ok")
	if n := testing.AllocsPerRun(50, func() { _, _ = encode(small); _, _ = encode(large) }); n != 2 {
		t.Errorf("a leased and a released thread record: %v allocations, want 2", n)
	}
	want, _ := json.Marshal(small)
	if got, err := encode(small); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("encode = %s, %v; want %s", got, err, want)
	}
}

// TestTimeEntryMatchesEncodingJSON: the index entries (a thread's
// creation, a run of a thread, a thread's status) encode by hand to
// what encoding/json writes for their structs, in one allocation, and
// a time encoding/json refuses still goes to encoding/json.
func TestTimeEntryMatchesEncodingJSON(t *testing.T) {
	now := time.Now().UTC()
	for _, at := range []time.Time{now, {}, now.Truncate(time.Second), now.In(time.FixedZone("x", -5*3600)),
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), now.In(time.FixedZone("far", 25*3600))} {
		for _, c := range []struct {
			got  []byte
			want any
		}{
			{timeEntry(`{"created_at":`, at), CreatedEntry{CreatedAt: at}},
			{timeEntry(`{"created_at":`, at), runIndexEntry{CreatedAt: at}},
			{timeEntry(`{"at":`, at), statusEntry{At: at}},
		} {
			want, _ := json.Marshal(c.want)
			if !bytes.Equal(c.got, want) {
				t.Errorf("%v: hand %q, encoding/json %q", at, c.got, want)
			}
		}
	}
	if n := testing.AllocsPerRun(50, func() { _ = timeEntry(`{"at":`, now) }); n != 1 {
		t.Errorf("%v allocations per entry, want 1", n)
	}
}
