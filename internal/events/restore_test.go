package events

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/testdeploy"
)

type restoreEnv struct {
	js       jetstream.JetStream
	settings bus.Settings
	p        *Publisher
}

func newRestoreEnv(t *testing.T) restoreEnv {
	t.Helper()
	d := testdeploy.Start(t, bus.Settings{})
	p, err := NewPublisher(context.Background(), d.JS, d.Settings.Names, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	return restoreEnv{js: d.JS, settings: d.Settings, p: p}
}

// stored counts the events of run r1 the stream holds, by attempt and seq.
func (e restoreEnv) stored(t *testing.T) map[[2]uint64]int {
	t.Helper()
	ctx := context.Background()
	cons, err := e.js.OrderedConsumer(ctx, e.settings.Names.EventsStream(), jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{e.settings.Names.RunEvents("default", "t1", "r1")},
	})
	if err != nil {
		t.Fatal(err)
	}
	counts := make(map[[2]uint64]int)
	for {
		batch, err := cons.FetchNoWait(100)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			var env protocol.Event
			if err := json.Unmarshal(m.Data(), &env); err != nil {
				t.Fatal(err)
			}
			counts[[2]uint64{uint64(env.Attempt), env.Seq}]++
		}
		if n == 0 {
			return counts
		}
	}
}

func (e restoreEnv) delta(t *testing.T, attempt int, seq uint64) *nats.Msg {
	t.Helper()
	m, err := e.p.Msg("default", "t1", "r1", attempt, seq, protocol.EventMessageDelta, map[string]string{"delta": "x"}, "")
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// Issue 9 (seq has no gaps): events without a message id whose publish
// failed the way a node loss fails it are looked for through the
// stream's leader; the ones stored (their acknowledgement was lost) are
// not sent again, the lost ones are, once each.
func TestFlushRestoresEventsLostInFlight(t *testing.T) {
	e := newRestoreEnv(t)
	ctx := context.Background()
	s := e.p.NewStream("default", "t1", "r1", 2, 0)
	s.SetResumable(true)                                                    // deltas stored
	s.Emit(protocol.EventMessageDelta, map[string]string{"delta": "a"}, "") // seq 1
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// Another attempt's seq 3 must not count as this attempt's.
	if _, err := e.js.PublishMsg(ctx, e.delta(t, 1, 3)); err != nil {
		t.Fatal(err)
	}
	s.Emit(protocol.EventMessageDelta, map[string]string{"delta": "b"}, "") // seq 2, acknowledged
	storedNoAck := e.delta(t, 2, s.Reserve())                               // seq 3: stored, its ack lost
	if _, err := e.js.PublishMsg(ctx, storedNoAck); err != nil {
		t.Fatal(err)
	}
	lost := e.delta(t, 2, s.Reserve())                                      // seq 4: never stored
	s.Emit(protocol.EventMessageDelta, map[string]string{"delta": "e"}, "") // seq 5
	lostLast := e.delta(t, 2, s.Reserve())                                  // seq 6: never stored
	s.mu.Lock()
	s.failed(storedNoAck, nats.ErrTimeout)
	s.failed(lost, nats.ErrNoResponders)
	s.failed(lostLast, nats.ErrTimeout)
	s.mu.Unlock()
	if err := s.Flush(ctx); err != nil {
		t.Fatalf("flush: %v", err)
	}
	got := e.stored(t)
	for seq := uint64(1); seq <= 6; seq++ {
		if n := got[[2]uint64{2, seq}]; n != 1 {
			t.Errorf("attempt 2 seq %d stored %d times, want once (all: %v)", seq, n, got)
		}
	}
	if n := got[[2]uint64{1, 3}]; n != 1 {
		t.Errorf("attempt 1 seq 3 stored %d times, want once", n)
	}
}

// The same through the real path: the stream stops taking the run's
// subjects (no responders, as while a stream has no leader), the
// asynchronous publishes fail, the stream comes back, and Flush stores
// what was lost.
func TestFlushRestoresEventsWhosePublishFoundNoStream(t *testing.T) {
	e := newRestoreEnv(t)
	ctx := context.Background()
	st, err := e.js.Stream(ctx, e.settings.Names.EventsStream())
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	s := e.p.NewStream("default", "t1", "r1", 1, 0)
	s.SetResumable(true) // deltas stored
	s.Emit(protocol.EventMessageDelta, map[string]string{"delta": "a"}, "")
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	away := cfg
	away.Subjects = []string{"elsewhere.>"}
	if _, err := e.js.UpdateStream(ctx, away); err != nil {
		t.Fatal(err)
	}
	s.Emit(protocol.EventMessageDelta, map[string]string{"delta": "b"}, "")
	s.Emit(protocol.EventMessageCompleted, map[string]string{"message_id": "m"}, "")
	deadline := time.Now().Add(10 * time.Second)
	for e.js.PublishAsyncPending() > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the publishes to a subject no stream takes never failed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := e.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(ctx); err != nil {
		t.Fatalf("flush: %v", err)
	}
	got := e.stored(t)
	for seq := uint64(1); seq <= 3; seq++ {
		if n := got[[2]uint64{1, seq}]; n != 1 {
			t.Errorf("seq %d stored %d times, want once (all: %v)", seq, n, got)
		}
	}
}

// A failure that no resend cures is reported and nothing is sent again.
func TestFlushReportsAPermanentFailureOfAnEventWithoutID(t *testing.T) {
	e := newRestoreEnv(t)
	s := e.p.NewStream("default", "t1", "r1", 1, 0)
	tooLarge := &jetstream.APIError{Code: 400, ErrorCode: 10054, Description: "message size exceeds maximum allowed"}
	s.mu.Lock()
	kept := s.failed(e.delta(t, 1, s.seq+1), tooLarge)
	s.mu.Unlock()
	if kept {
		t.Fatal("an oversized event's refusal was kept for a resend")
	}
	if err := s.Flush(context.Background()); !errors.Is(err, tooLarge) {
		t.Fatalf("flush: %v, want %v", err, tooLarge)
	}
	if got := e.stored(t); len(got) != 0 {
		t.Fatalf("stored %v, want nothing", got)
	}
}

// An event a full store refused was surely not stored: Flush, which comes
// after the run waited for room, sends it again, and it is stored once.
func TestFlushResendsAnEventAFullStoreRefused(t *testing.T) {
	e := newRestoreEnv(t)
	s := e.p.NewStream("default", "t1", "r1", 1, 0)
	full := &jetstream.APIError{Code: 503, ErrorCode: 10023, Description: "insufficient resources"}
	s.mu.Lock()
	s.seq++
	kept := s.failed(e.delta(t, 1, s.seq), full)
	s.mu.Unlock()
	if !kept {
		t.Fatal("a full store's refusal was not kept for a resend")
	}
	if err := s.Flush(context.Background()); err != nil {
		t.Fatalf("flush: %v", err)
	}
	if got := e.stored(t); got[[2]uint64{1, 1}] != 1 || len(got) != 1 {
		t.Fatalf("stored %v, want seq 1 once", got)
	}
}

// Issue 9 (seq has no gaps): a worker taking a run over marks each seq
// the stream skips (events its dead predecessor published but a node loss
// swallowed) with event.lost; asked again, it finds nothing missing.
func TestFillGapsMarksTheSeqsTheStreamSkips(t *testing.T) {
	e := newRestoreEnv(t)
	ctx := context.Background()
	for _, seq := range []uint64{1, 2, 4, 6} {
		if _, err := e.js.PublishMsg(ctx, e.delta(t, 1, seq)); err != nil {
			t.Fatal(err)
		}
	}
	for i, want := range []int{2, 0} {
		top, n, err := e.p.FillGaps(ctx, "default", "t1", "r1", 2, 0)
		if err != nil {
			t.Fatal(err)
		}
		if top != 6 || n != want {
			t.Fatalf("call %d: top %d, marked %d, want 6 and %d", i+1, top, n, want)
		}
	}
	got := e.stored(t)
	for _, want := range [][2]uint64{{1, 1}, {1, 2}, {2, 3}, {1, 4}, {2, 5}, {1, 6}} {
		if n := got[want]; n != 1 {
			t.Errorf("attempt %d seq %d stored %d times, want once (all: %v)", want[0], want[1], n, got)
		}
	}
	if len(got) != 6 {
		t.Errorf("stored %v, want seqs 1-6 and nothing after", got)
	}
}

// The highest seq, not the last stored event's, is where a takeover
// numbers on: an event sent again is stored after higher seqs.
func TestFillGapsReturnsTheHighestSeq(t *testing.T) {
	e := newRestoreEnv(t)
	ctx := context.Background()
	if top, n, err := e.p.FillGaps(ctx, "default", "t1", "r1", 2, 0); err != nil || top != 0 || n != 0 {
		t.Fatalf("run without events: top %d, marked %d, %v; want 0, 0, nil", top, n, err)
	}
	for _, seq := range []uint64{1, 2, 4, 3} {
		if _, err := e.js.PublishMsg(ctx, e.delta(t, 1, seq)); err != nil {
			t.Fatal(err)
		}
	}
	top, n, err := e.p.FillGaps(ctx, "default", "t1", "r1", 2, 0)
	if err != nil || top != 4 || n != 0 {
		t.Fatalf("top %d, marked %d, %v; want 4, 0, nil", top, n, err)
	}
}

// A finished run whose worker stopped before run.finished, and before
// its last events were stored: the recovery that publishes run.finished
// marks them first, up to the seq before run.finished.
func TestEnsureFinishedMarksTheEventsLostBeforeIt(t *testing.T) {
	e := newRestoreEnv(t)
	ctx := context.Background()
	for _, seq := range []uint64{1, 2, 3} {
		if _, err := e.js.PublishMsg(ctx, e.delta(t, 1, seq)); err != nil {
			t.Fatal(err)
		}
	}
	at := time.Now().UTC()
	rec := &protocol.Run{RunID: "r1", ThreadID: "t1", Tenant: "default", Status: protocol.StatusSuccess, Attempt: 1, Seq: 6, CreatedAt: at, FinishedAt: &at}
	if err := e.p.EnsureFinished(ctx, rec); err != nil {
		t.Fatal(err)
	}
	got := e.stored(t)
	for seq := uint64(1); seq <= 6; seq++ {
		if n := got[[2]uint64{1, seq}]; n != 1 {
			t.Errorf("seq %d stored %d times, want once (all: %v)", seq, n, got)
		}
	}
}

// LastSeq numbers a recovery's events (a cancel's run.finished, a
// takeover's fallback): it must be the highest seq even when the last
// stored event was sent again late with a lower one.
func TestLastSeqIsTheHighestWhenAResentEventCameLast(t *testing.T) {
	e := newRestoreEnv(t)
	ctx := context.Background()
	for _, seq := range []uint64{1, 2, 4} {
		if _, err := e.js.PublishMsg(ctx, e.delta(t, 1, seq)); err != nil {
			t.Fatal(err)
		}
	}
	late := e.delta(t, 1, 3)
	late.Header.Set(jetstream.MsgIDHeader, resentID("r1", 1, 3))
	if _, err := e.js.PublishMsg(ctx, late); err != nil {
		t.Fatal(err)
	}
	if n, err := e.p.LastSeq(ctx, "default", "t1", "r1"); err != nil || n != 4 {
		t.Fatalf("LastSeq %d, %v; want 4", n, err)
	}
}
