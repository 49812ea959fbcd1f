package protocol

import (
	"testing"
	"time"
)

func TestRunView(t *testing.T) {
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	later := now.Add(time.Second)
	created := now.Add(-time.Second)
	lease := &Lease{RunID: "r1", Worker: "w2", Epoch: 7, MsgSeq: 40, AcquiredAt: later, Attempt: 2, Agent: "chatbot", BaseCheckpoint: "e5-1", CreatedAt: &created}
	thread := func(l *Lease, last *Run) *Thread {
		return &Thread{ThreadID: "t1", Tenant: "default", Lease: l, LastRun: last}
	}
	pending := &Run{RunID: "r1", ThreadID: "t1", Tenant: "default", Agent: "chatbot", Status: StatusPending, CreatedAt: now, Metadata: map[string]any{"k": "v"}, Seq: 1}
	ended := &Run{RunID: "r1", ThreadID: "t1", Tenant: "default", Agent: "chatbot", Status: StatusSuccess, Attempt: 2, CreatedAt: now, FinishedAt: &later, Epoch: 7, MsgSeq: 40, Seq: 5}

	t.Run("missing record, lease names the run", func(t *testing.T) {
		v := RunView("r1", nil, thread(lease, nil))
		if v == nil || v.Status != StatusRunning || v.Attempt != 2 || v.Worker != "w2" || v.Epoch != 7 || v.MsgSeq != 40 ||
			v.BaseCheckpoint != "e5-1" || v.Agent != "chatbot" || !v.CreatedAt.Equal(created) || v.StartedAt == nil || !v.StartedAt.Equal(later) {
			t.Fatalf("%+v", v)
		}
	})
	t.Run("pending record, lease names the run", func(t *testing.T) {
		v := RunView("r1", pending, thread(lease, nil))
		if v.Status != StatusRunning || v.Attempt != 2 || v.Metadata["k"] != "v" || !v.CreatedAt.Equal(now) {
			t.Fatalf("%+v", v)
		}
		if pending.Status != StatusPending {
			t.Fatal("the view edited the record")
		}
	})
	t.Run("another copy's lease", func(t *testing.T) {
		rec := *pending
		rec.MsgSeq = 39
		if v := RunView("r1", &rec, thread(lease, nil)); v.Status != StatusPending {
			t.Fatalf("%+v", v)
		}
	})
	t.Run("another run's lease", func(t *testing.T) {
		other := *lease
		other.RunID = "r2"
		if v := RunView("r1", nil, thread(&other, nil)); v != nil {
			t.Fatalf("%+v", v)
		}
		if v := RunView("r1", pending, thread(&other, nil)); v != pending {
			t.Fatalf("%+v", v)
		}
	})
	t.Run("last_run ended it", func(t *testing.T) {
		v := RunView("r1", pending, thread(nil, ended))
		if v.Status != StatusSuccess || v.Seq != 5 || v.Metadata["k"] != "v" {
			t.Fatalf("%+v", v)
		}
		if v := RunView("r1", nil, thread(nil, ended)); v == nil || v.Status != StatusSuccess {
			t.Fatalf("%+v", v)
		}
	})
	t.Run("a terminal record stands", func(t *testing.T) {
		rec := *ended
		rec.Status = StatusCancelled
		if v := RunView("r1", &rec, thread(lease, ended)); v.Status != StatusCancelled {
			t.Fatalf("%+v", v)
		}
	})
	t.Run("a v1 running record of a later attempt stands", func(t *testing.T) {
		rec := *pending
		rec.Status, rec.Epoch, rec.Attempt = StatusRunning, 8, 3
		if v := RunView("r1", &rec, thread(lease, nil)); v.Epoch != 8 || v.Attempt != 3 {
			t.Fatalf("%+v", v)
		}
	})
	t.Run("a v1 lease has no attempt", func(t *testing.T) {
		old := &Lease{RunID: "r1", Worker: "w1", Epoch: 3, MsgSeq: 40, AcquiredAt: later}
		if v := RunView("r1", nil, thread(old, nil)); v.Attempt != 1 || v.Status != StatusRunning {
			t.Fatalf("%+v", v)
		}
	})
	t.Run("another thread's record", func(t *testing.T) {
		rec := *pending
		rec.ThreadID = "t2"
		if v := RunView("r1", &rec, thread(lease, nil)); v != &rec {
			t.Fatalf("%+v", v)
		}
	})
}
