package worker

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/events"
	"github.com/natsagent/natsagent/internal/protocol"
)

// Issue 16: a run's token deltas go out live (core NATS) and are not
// stored, unless the run asks for a resumable stream; a reader through
// events.Follow sees the same token stream either way, each delta before
// the message.completed that repeats them.
func TestDeltasAreLiveUnlessTheRunAsksForAResumableStream(t *testing.T) {
	h := newHarness(t)
	words := strings.Fields(strings.Repeat("tok ", 50))
	text := strings.Join(words, " ")
	h.startWorker(textModel(text, 50, 0), nil)
	ctx := context.Background()
	for _, resumable := range []bool{false, true} {
		run := "r-live"
		if resumable {
			run = "r-resumable"
		}
		f, err := events.OpenFollow(ctx, h.js, h.names, h.names.RunEvents("default", "t-"+run, run), events.FeedConfig{DropStale: true})
		if err != nil {
			t.Fatal(err)
		}
		req := request("t-"+run, run, "stream please")
		req.StreamResumable = resumable
		h.submit(req)
		var streamed strings.Builder
		deltas, live, completed := 0, 0, false
		for {
			it, err := f.NextWithin(ctx, 20*time.Second)
			if err != nil {
				t.Fatalf("resumable %v: %v after %d deltas", resumable, err, deltas)
			}
			if it.Live != (it.StreamSeq == 0) {
				t.Fatalf("item live %v with stream sequence %d", it.Live, it.StreamSeq)
			}
			if it.Live {
				live++
			}
			var ev protocol.Event
			if err := json.Unmarshal(it.Data, &ev); err != nil || ev.V != protocol.EnvelopeVersion {
				t.Fatalf("envelope %s (%v)", it.Data, err)
			}
			switch ev.Type {
			case protocol.EventMessageDelta:
				if completed {
					t.Fatalf("a delta after message.completed")
				}
				var d protocol.DeltaData
				_ = json.Unmarshal(ev.Data, &d)
				streamed.WriteString(d.Delta)
				deltas++
			case protocol.EventMessageCompleted:
				completed = true
			}
			if ev.Type == protocol.EventRunFinished {
				break
			}
		}
		f.Close()
		if streamed.String() != text || deltas != 50 {
			t.Fatalf("resumable %v: streamed %d deltas %q, want 50 making %q", resumable, deltas, streamed.String(), text)
		}
		st, err := h.js.Stream(ctx, h.names.EventsStream())
		if err != nil {
			t.Fatal(err)
		}
		subject := h.names.EventSubject("default", "t-"+run, run, protocol.KindMessages)
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(subject))
		if err != nil {
			t.Fatal(err)
		}
		// message.completed alone, or with the 50 deltas.
		wantStored, wantLive := uint64(1), 51 // the deltas and thread.titled
		if resumable {
			wantStored, wantLive = 51, 0
		}
		if got := info.State.Subjects[subject]; got != wantStored || live != wantLive {
			t.Fatalf("resumable %v: %d message events stored, %d live, want %d and %d", resumable, got, live, wantStored, wantLive)
		}
	}
}
