package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
)

// takeRunEvents runs a run to its end and removes its stored events from
// the stream, returning them in order: the stream of a finished run then
// finds its record terminal and no event, as when its events trail the
// record (written first; a worker whose lease fence paused holds them).
func (e *env) takeRunEvents(thread, run string) [][]byte {
	e.t.Helper()
	evs := e.openStream("POST", "/threads/"+thread+"/runs/stream", with(input("hi"), "run_id", run)).rest(10 * time.Second)
	if len(evs) < 3 || evs[len(evs)-1].event != protocol.EventRunFinished {
		e.t.Fatalf("streamed %v", types(evs))
	}
	ctx := context.Background()
	subject := e.settings.Names.RunEvents(protocol.DefaultTenant, thread, run)
	st, err := e.js.Stream(ctx, e.settings.Names.EventsStream())
	if err != nil {
		e.t.Fatal(err)
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
	if err != nil {
		e.t.Fatal(err)
	}
	var stored [][]byte
	for {
		batch, err := cons.FetchNoWait(100)
		if err != nil {
			e.t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			stored = append(stored, m.Data())
			n++
		}
		if n == 0 {
			break
		}
	}
	if len(stored) != len(storedOnly(evs)) {
		e.t.Fatalf("read %d stored events, the stream sent %d", len(stored), len(storedOnly(evs)))
	}
	if err := st.Purge(ctx, jetstream.WithPurgeSubject(subject)); err != nil {
		e.t.Fatal(err)
	}
	return stored
}

// republishOnTrailing makes the gateway's next trailing stream (a
// finished run with no stored event) find stored back once it waits.
func (e *env) republishOnTrailing(thread, run string, stored [][]byte) <-chan error {
	done := make(chan error, 1)
	subject := e.settings.Names.RunEvents(protocol.DefaultTenant, thread, run)
	e.gw.testHookTrailing = func() {
		for _, data := range stored {
			if _, err := e.js.Publish(context.Background(), subject, data); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}
	return done
}

// The stream of a finished run whose events are not stored yet waits for
// them instead of ending at once with the run.finished built from the
// record: it sends them all, and one run.finished, the stored one (it
// has an id). Before, it sent the record's run.finished alone.
func TestStreamWaitsForEventsThatTrailTheRecord(t *testing.T) {
	// A long silence bound: only the stored run.finished ends these
	// streams in time.
	e := newEnvWith(t, echoModel(), func(s *Server) { s.trailWait = 10 * time.Minute })

	stored := e.takeRunEvents("t1", "r1")
	republished := e.republishOnTrailing("t1", "r1", stored)
	got := e.openStream("GET", "/threads/t1/runs/r1/stream", nil).rest(time.Minute)
	if err := natstest.Recv(t, republished, "the events republished once the stream waited"); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(stored) {
		t.Fatalf("streamed %v, want the %d stored events", types(got), len(stored))
	}
	for i, ev := range got {
		if want := envelopeType(stored[i]); ev.event != want || ev.id == "" {
			t.Fatalf("event %d: %s (id %q), want the stored %s", i, ev.event, ev.id, want)
		}
	}
	if finished(t, got[len(got)-1]).Status != protocol.StatusSuccess {
		t.Fatalf("run.finished %s", got[len(got)-1].data)
	}

	// The same in LangGraph's stream modes: the values the events build,
	// then one end, the stored run.finished's.
	stored = e.takeRunEvents("t2", "r2")
	republished = e.republishOnTrailing("t2", "r2", stored)
	lg := e.openLangGraphStream("GET", "/threads/t2/runs/r2/stream?stream_mode=values&stream_mode=messages-tuple", nil).rest(time.Minute)
	if err := natstest.Recv(t, republished, "the events republished once the LangGraph stream waited"); err != nil {
		t.Fatal(err)
	}
	names := eventNames(lg)
	if len(only(lg, "end")) != 1 || names[len(names)-1] != "end" || lg[len(lg)-1].id == "" {
		t.Fatalf("LangGraph stream %v (ids %v), want one end, with the stored run.finished's id", names, ids(lg))
	}
	if len(only(lg, "messages")) == 0 {
		t.Fatalf("LangGraph stream %v: the answer's message events are missing", names)
	}
}

// A finished run whose events never come (purged, or lost with a node)
// still ends its stream, with the record's run.finished, once the feed
// stayed silent for trailWait: the wait is bounded.
func TestStreamOfAFinishedRunWithoutEventsEnds(t *testing.T) {
	e := newEnvWith(t, echoModel(), func(s *Server) { s.trailWait = 200 * time.Millisecond })
	e.takeRunEvents("t1", "r1")
	waited := make(chan struct{}, 2)
	e.gw.testHookTrailing = func() { waited <- struct{}{} }

	got := e.openStream("GET", "/threads/t1/runs/r1/stream", nil).rest(time.Minute)
	natstest.Recv(t, waited, "the native stream to wait for trailing events")
	if len(got) != 1 || got[0].event != protocol.EventRunFinished || got[0].id != "" {
		t.Fatalf("streamed %v (ids %v), want one run.finished built from the record", types(got), ids(got))
	}
	if fin := finished(t, got[0]); fin.Status != protocol.StatusSuccess || fin.Output == nil {
		t.Fatalf("run.finished %+v", fin)
	}

	lg := e.openLangGraphStream("GET", "/threads/t1/runs/r1/stream?stream_mode=values", nil).rest(time.Minute)
	natstest.Recv(t, waited, "the LangGraph stream to wait for trailing events")
	if names := eventNames(lg); len(only(lg, "end")) != 1 || names[len(names)-1] != "end" {
		t.Fatalf("LangGraph stream %v, want one end", names)
	}
}

// A run without a record that no lease or last_run names, whose request
// waits in the stream (published over NATS and not taken yet, or handed
// back between workers: both look the same), reads pending, not 404; on
// another thread, or by an id no request names, it is not found.
func TestRunWhoseRequestWaitsIsPending(t *testing.T) {
	e := newEnv(t, nil) // no worker: the request waits
	data, err := json.Marshal(protocol.RunRequest{RunID: "r1", ThreadID: "t1", Tenant: protocol.DefaultTenant, Agent: protocol.DefaultAgent,
		Input: &protocol.Input{Messages: []model.Message{{Role: model.RoleUser, Content: "hi"}}}})
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(e.settings.Names.RunSubject(protocol.DefaultTenant, "t1"))
	m.Data = data
	m.Header.Set(jetstream.MsgIDHeader, protocol.RunMsgID(protocol.DefaultTenant, "r1"))
	if _, err := e.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	if rec := e.do("GET", "/threads/t1/runs/r1", nil).expect(t, http.StatusOK).run(t); rec.Status != protocol.StatusPending || rec.RunID != "r1" || rec.ThreadID != "t1" {
		t.Fatalf("the waiting run reads %+v", rec)
	}
	e.do("GET", "/threads/t2/runs/r1", nil).expect(t, http.StatusNotFound)
	e.do("GET", "/threads/t1/runs/r2", nil).expect(t, http.StatusNotFound)
}
