package gateway

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/events"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/testdeploy"
)

// Issue 15 (item 6): once a finished run's events expired
// (nats.events_max_age), a client resuming with the id of the
// run.finished it got (an EventSource reconnects after every stream end)
// gets an empty stream, as before the expiry, not run.finished again; a
// client that had not got it (an older id, or none) gets the one built
// from the record.
func TestResumeAfterRunFinishedOnceEventsExpired(t *testing.T) {
	const maxAge = time.Second
	e := newEnvSettings(t, echoModel(), bus.Settings{AckWait: 2 * time.Second, MaxDeliver: 5, EventsMaxAge: maxAge, DuplicateWindow: maxAge / 2}, nil)
	evs := e.openStream("POST", "/threads/t1/runs/stream", with(input("hi"), "run_id", "r1")).rest(10 * time.Second)
	if len(evs) < 3 || evs[len(evs)-1].event != protocol.EventRunFinished {
		t.Fatalf("streamed %v", types(evs))
	}
	finishedID := evs[len(evs)-1].id
	startedID := ""
	for _, ev := range evs {
		if ev.event == protocol.EventRunStarted {
			startedID = ev.id
		}
	}
	rec := e.run("default", "r1")
	if strconv.FormatUint(rec.FinishedEventID, 10) != finishedID {
		t.Fatalf("record's finished_event_id %d, want the streamed run.finished's id %s", rec.FinishedEventID, finishedID)
	}

	ctx := context.Background()
	st, err := e.js.Stream(ctx, e.settings.Names.EventsStream())
	if err != nil {
		t.Fatal(err)
	}
	testdeploy.WaitFor(t, 30*time.Second, "the run's events to expire", func() bool {
		_, err := st.GetLastMsgForSubject(ctx, e.settings.Names.RunEvents("default", "t1", "r1"))
		return errors.Is(err, jetstream.ErrMsgNotFound)
	})

	if got := e.openStream("GET", "/threads/t1/runs/r1/stream", nil, "Last-Event-ID", finishedID).rest(5 * time.Second); len(got) != 0 {
		t.Fatalf("resumed after run.finished once the events expired: got %v, want an empty stream", types(got))
	}
	if got := e.openStream("GET", "/threads/t1/runs/r1/stream?last_event_id="+finishedID, nil).rest(5 * time.Second); len(got) != 0 {
		t.Fatalf("?last_event_id= after run.finished: got %v, want an empty stream", types(got))
	}
	for _, c := range []struct{ name, header string }{{"an older id", startedID}, {"no id", ""}} {
		var headers []string
		if c.header != "" {
			headers = []string{"Last-Event-ID", c.header}
		}
		got := e.openStream("GET", "/threads/t1/runs/r1/stream", nil, headers...).rest(5 * time.Second)
		if len(got) != 1 || got[0].event != protocol.EventRunFinished || got[0].id != "" {
			t.Fatalf("%s: got %v (ids %v), want one run.finished built from the record, without an id", c.name, types(got), ids(got))
		}
		if fin := finished(t, got[0]); fin.Status != protocol.StatusSuccess {
			t.Fatalf("%s: %+v", c.name, fin)
		}
	}
}

// (e.run reads a run record.)
func (e *env) run(tenant, run string) *protocol.Run {
	e.t.Helper()
	rec, _, err := e.stores.Runs.Get(context.Background(), tenant, run)
	if err != nil {
		e.t.Fatal(err)
	}
	return rec
}

// Issue 15: an event a superseded attempt published after the newer
// attempt's run.started (a worker paused past its lease) is not sent on
// the run's SSE stream, whether read live or resumed; run.finished is.
func TestStreamDropsSupersededAttempts(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	now := time.Now().UTC()
	if _, err := e.stores.Runs.Create(ctx, &protocol.Run{Tenant: "default", ThreadID: "t1", RunID: "r1", Status: protocol.StatusSuccess, Attempt: 2, CreatedAt: now, FinishedAt: &now, Seq: 6}); err != nil {
		t.Fatal(err)
	}
	pub, err := events.NewPublisher(ctx, e.js, e.settings.Names, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	emit := func(attempt int, seq uint64, typ string, data any) {
		t.Helper()
		m, err := pub.Msg("default", "t1", "r1", attempt, seq, typ, data, "")
		if err != nil {
			t.Fatal(err)
		}
		if err := pub.Publish(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	emit(1, 1, protocol.EventRunStarted, protocol.StartedData{Attempt: 1})
	emit(1, 2, protocol.EventMessageDelta, protocol.DeltaData{MessageID: "m1", Delta: "old "})
	emit(2, 3, protocol.EventRunStarted, protocol.StartedData{Attempt: 2})
	emit(1, 3, protocol.EventMessageCompleted, map[string]string{"id": "m1"}) // the paused worker's, late
	emit(2, 4, protocol.EventMessageDelta, protocol.DeltaData{MessageID: "m2", Delta: "new"})
	emit(2, 5, protocol.EventRunFinished, protocol.FinishedData{Status: protocol.StatusSuccess})

	all := e.openStream("GET", "/threads/t1/runs/r1/stream", nil).rest(5 * time.Second)
	want := []string{protocol.EventRunStarted, protocol.EventMessageDelta, protocol.EventRunStarted, protocol.EventMessageDelta, protocol.EventRunFinished}
	if got := types(all); len(got) != len(want) {
		t.Fatalf("streamed %v, want %v", got, want)
	}
	for i, ev := range all {
		if ev.event != want[i] || (i >= 2 && ev.env.Attempt != 2) {
			t.Fatalf("event %d: %s of attempt %d, want %s", i, ev.event, ev.env.Attempt, want[i])
		}
	}
	// Resumed after the second run.started: the stale event still goes.
	got := e.openStream("GET", "/threads/t1/runs/r1/stream", nil, "Last-Event-ID", all[2].id).rest(5 * time.Second)
	if len(got) != 2 || got[0].env.Attempt != 2 || got[1].event != protocol.EventRunFinished {
		t.Fatalf("resumed: %v", types(got))
	}
	_ = http.StatusOK
}
