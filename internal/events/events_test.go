package events

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
)

// The hand-written envelope encoder must produce what encoding/json would
// decode back into the same event, for every kind of string.
func TestAppendEnvelopeRoundTrip(t *testing.T) {
	cases := []protocol.Event{
		{Type: "run.started", Seq: 2, RunID: "r1", ThreadID: "t1", Tenant: "default", Attempt: 1, Data: json.RawMessage(`{"attempt":1}`)},
		{Type: "run.queued", Seq: 1, RunID: "r-1_x", ThreadID: "T", Tenant: "acme"},
		{Type: "message.delta", Seq: 9, RunID: "r", ThreadID: "t", Tenant: "d", Attempt: 3, Data: json.RawMessage(`{"message_id":"m","delta":"héllo \"quoted\" <b>\n"}`)},
		{Type: "custom \"odd\"\n\u2028type", Seq: 1 << 40, RunID: "é", ThreadID: "<t>", Tenant: "a\\b"},
		// Live: after and index instead of seq.
		{Type: "message.delta", Live: true, After: 7, Index: 12, RunID: "r", ThreadID: "t", Tenant: "d", Attempt: 2, Data: json.RawMessage(`{"message_id":"m","delta":"x"}`)},
		{Type: "thread.titled", Live: true, After: 0, Index: 1, RunID: "r", ThreadID: "t", Tenant: "d"},
	}
	for _, want := range cases {
		want.Time = time.Date(2026, 11, 30, 1, 2, 3, 456789000, time.UTC)
		b := AppendEnvelope(nil, &want)
		// Every envelope says its version, whatever the event's V.
		want.V = protocol.EnvelopeVersion
		if !json.Valid(b) {
			t.Fatalf("invalid JSON: %s", b)
		}
		var got protocol.Event
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		if !got.Time.Equal(want.Time) {
			t.Fatalf("time %v, want %v", got.Time, want.Time)
		}
		got.Time = want.Time
		if len(want.Data) > 0 && !jsonEqual(got.Data, want.Data) {
			t.Fatalf("data %s, want %s", got.Data, want.Data)
		}
		got.Data, want.Data = nil, nil
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("got %+v\nwant %+v\nfrom %s", got, want, b)
		}
	}
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && reflect.DeepEqual(x, y)
}

func BenchmarkEnvelope(b *testing.B) {
	e := protocol.Event{Type: "message.delta", Seq: 42, RunID: "6yd4wqnbotmdocolqddgc2wbcs", ThreadID: "demo", Tenant: "default", Attempt: 1,
		Time: time.Now(), Data: json.RawMessage(`{"message_id":"msg_dH1KIT487ZYXD14QfJmcIr","delta":"some streamed text "}`)}
	b.Run("append", func(b *testing.B) {
		b.ReportAllocs()
		buf := make([]byte, 0, 512)
		for b.Loop() {
			buf = AppendEnvelope(buf[:0], &e)
		}
	})
	b.Run("encoding/json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(e); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// run.queued is stored only while its run has no lifecycle event: a
// request published again after its run finished (beyond the duplicate
// window) never queues it a second time, and saying so is not an error.
func TestQueuedOnlyForARunWithoutEvents(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect()
	natstest.Provision(t, nc, bus.Settings{})
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	p, err := NewPublisher(ctx, js, bus.DefaultNames(), nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := &protocol.Run{RunID: "r1", ThreadID: "t1", Tenant: "default", Status: protocol.StatusSuccess, Seq: 1}
	if err := p.PublishFinished(ctx, rec); err != nil {
		t.Fatal(err)
	}
	req := &protocol.RunRequest{RunID: "r1", ThreadID: "t1", Tenant: "default", Agent: "chatbot", MultitaskStrategy: "enqueue"}
	if err := p.PublishQueued(ctx, req); err != nil {
		t.Fatalf("a refused run.queued must not be an error: %v", err)
	}
	s := p.NewStream("default", "t1", "r1", 1, 0)
	s.EmitQueued(req)
	if err := s.Flush(ctx); err != nil {
		t.Fatalf("flush: %v", err)
	}
	st, _ := js.Stream(ctx, "AGENT_EVENTS")
	info, _ := st.Info(ctx)
	if info.State.Msgs != 1 {
		t.Fatalf("%d events stored, want only the run.finished", info.State.Msgs)
	}
	// A new run gets its run.queued.
	req.RunID = "r2"
	if err := p.PublishQueued(ctx, req); err != nil {
		t.Fatal(err)
	}
	if n, err := p.LastSeq(ctx, "default", "t1", "r2"); err != nil || n != 1 {
		t.Fatalf("r2 last seq %d (%v)", n, err)
	}
}

// The events stream dedupes message ids over every tenant, and run ids
// are unique only within one: two tenants' runs with the same id each get
// their lifecycle events stored.
func TestLifecycleEventsOfTheSameRunIDInTwoTenants(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect()
	natstest.Provision(t, nc, bus.Settings{})
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	p, err := NewPublisher(ctx, js, bus.DefaultNames(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tenant := range []string{"acme", "globex"} {
		req := &protocol.RunRequest{RunID: "r1", ThreadID: "t1", Tenant: tenant, Agent: "chatbot", MultitaskStrategy: "enqueue"}
		if err := p.PublishQueued(ctx, req); err != nil {
			t.Fatal(err)
		}
		if err := p.PublishFinished(ctx, &protocol.Run{RunID: "r1", ThreadID: "t1", Tenant: tenant, Status: protocol.StatusSuccess, Seq: 2}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tenant := range []string{"acme", "globex"} {
		if n, err := p.LastSeq(ctx, tenant, "t1", "r1"); err != nil || n != 2 {
			t.Fatalf("%s's r1: last seq %d (%v), want its run.finished (2)", tenant, n, err)
		}
	}
}

// Issue 15: once a stream's fence says the attempt lost its lease, what
// it emits is dropped, not stored, and its seqs are not used; its live
// events are dropped the same way.
func TestFencedStreamDropsItsEvents(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect()
	natstest.Provision(t, nc, bus.Settings{})
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	p, err := NewPublisher(ctx, js, bus.DefaultNames(), nil)
	if err != nil {
		t.Fatal(err)
	}
	reader := srv.Connect()
	liveSub, err := reader.SubscribeSync(bus.DefaultNames().RunLive("default", "t1", "r1"))
	if err != nil || reader.Flush() != nil {
		t.Fatal(err)
	}
	live := true
	s := p.NewStream("default", "t1", "r1", 1, 0)
	s.SetFence(func() bool { return live })
	s.Emit(protocol.EventRunStarted, protocol.StartedData{Attempt: 1}, StartedID("r1", 1))
	s.Emit(protocol.EventMessageDelta, protocol.DeltaData{MessageID: "m", Delta: "a"}, "")
	s.Emit(protocol.EventToolStarted, protocol.ToolEventData{ToolCallID: "c", Name: "x"}, "")
	live = false
	s.Emit(protocol.EventMessageDelta, protocol.DeltaData{MessageID: "m", Delta: "b"}, "")
	s.Emit(protocol.EventMessageCompleted, map[string]string{"id": "m"}, "")
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if s.Seq() != 2 {
		t.Fatalf("seq %d after the fence, want 2", s.Seq())
	}
	seen, low, top, err := p.readSeqs(ctx, "default", "t1", "r1")
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != 2 || low != 1 || top != 2 {
		t.Fatalf("stored seqs %v (low %d, top %d), want 1 and 2", seen, low, top)
	}
	m, err := liveSub.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatalf("the delta before the fence did not go out live: %v", err)
	}
	var ev protocol.Event
	if err := json.Unmarshal(m.Data, &ev); err != nil || !ev.Live || ev.After != 1 || ev.Index != 1 || ev.Seq != 0 ||
		!strings.Contains(string(ev.Data), `"delta":"a"`) || m.Subject != "agent.live.default.t1.r1.messages" {
		t.Fatalf("live delta on %s: %s (%v)", m.Subject, m.Data, err)
	}
	if m, err := liveSub.NextMsg(500 * time.Millisecond); err == nil {
		t.Fatalf("a live event went out after the fence: %s", m.Data)
	}
}

// Issue 16: a run's token deltas go out live, never to the events
// stream, unless the run asked for a resumable stream; the other events
// are stored with seqs that skip none.
func TestDeltasAreLiveUnlessResumable(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect()
	natstest.Provision(t, nc, bus.Settings{})
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	names := bus.DefaultNames()
	p, err := NewPublisher(ctx, js, names, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, resumable := range []bool{false, true} {
		run := fmt.Sprintf("r-%v", resumable)
		reader := srv.Connect()
		liveSub, err := reader.SubscribeSync(names.RunLive("default", "t1", run))
		if err != nil || reader.Flush() != nil {
			t.Fatal(err)
		}
		s := p.NewStream("default", "t1", run, 1, 0)
		s.SetResumable(resumable)
		s.Emit(protocol.EventRunStarted, protocol.StartedData{Attempt: 1}, StartedID(run, 1))
		for i := range 50 {
			s.Emit(protocol.EventMessageDelta, protocol.DeltaData{MessageID: "m", Delta: strconv.Itoa(i)}, "")
		}
		s.Emit(protocol.EventThreadTitled, map[string]string{"title": "t"}, "")
		s.Emit(protocol.EventMessageCompleted, map[string]string{"id": "m"}, "")
		if err := s.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		seen, _, top, err := p.readSeqs(ctx, "default", "t1", run)
		if err != nil {
			t.Fatal(err)
		}
		stored, messages, live := 2, uint64(1), 51
		if resumable {
			stored, messages, live = 53, 51, 0
		}
		if len(seen) != stored || top != uint64(stored) {
			t.Fatalf("resumable %v: %d events stored (top seq %d), want %d", resumable, len(seen), top, stored)
		}
		st, err := js.Stream(ctx, names.EventsStream())
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(names.EventSubject("default", "t1", run, protocol.KindMessages)))
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Subjects[names.EventSubject("default", "t1", run, protocol.KindMessages)] != messages {
			t.Fatalf("resumable %v: messages stored %v, want %d", resumable, info.State.Subjects, messages)
		}
		for i := range live {
			m, err := liveSub.NextMsg(10 * time.Second)
			if err != nil {
				t.Fatalf("resumable %v: live event %d: %v", resumable, i, err)
			}
			var ev protocol.Event
			if err := json.Unmarshal(m.Data, &ev); err != nil || !ev.Live || ev.V != 2 || ev.After != 1 || ev.Index != uint64(i+1) {
				t.Fatalf("live event %d: %s", i, m.Data)
			}
		}
		if m, err := liveSub.NextMsg(300 * time.Millisecond); err == nil {
			t.Fatalf("resumable %v: a live event more: %s", resumable, m.Data)
		}
	}
}

// A delta's data is written by hand: exactly what encoding/json writes.
func TestAppendDeltaIsEncodingJSON(t *testing.T) {
	for _, d := range []protocol.DeltaData{
		{MessageID: "msg_1", Delta: "plain text "},
		{MessageID: "m", Delta: "héllo \"quoted\" <b>&\n\t\u2028\x01"},
		{MessageID: "", Delta: ""},
	} {
		want, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendDelta(nil, &d); string(got) != string(want) {
			t.Errorf("appendDelta %s, want %s", got, want)
		}
	}
}

// FuzzEnvelope: whatever the strings and numbers, the hand-written
// envelope is valid JSON that decodes back into the event, stored or
// live, at version 2.
func FuzzEnvelope(f *testing.F) {
	f.Add("message.delta", "r1", "t1", "default", uint64(9), uint64(3), 2, true, `{"message_id":"m","delta":"x"}`)
	f.Add("run.started", "r\"1", "<t>", "a\\b", uint64(1), uint64(0), 1, false, `{"attempt":1}`)
	f.Add("\u2028é\x00", "", "", "", uint64(1<<63), uint64(1<<40), -1, false, ``)
	f.Fuzz(func(t *testing.T, typ, run, thread, tenant string, seq, index uint64, attempt int, live bool, data string) {
		if data != "" && !json.Valid([]byte(data)) {
			return // the data is JSON already, as Stream.Emit hands it
		}
		want := protocol.Event{Type: typ, RunID: run, ThreadID: thread, Tenant: tenant, Attempt: attempt,
			Time: time.Date(2026, 12, 1, 1, 2, 3, 4, time.UTC), Data: json.RawMessage(data)}
		if live {
			want.Live, want.After, want.Index = true, seq, index
		} else {
			want.Seq = seq
		}
		b := AppendEnvelope(nil, &want)
		if !json.Valid(b) {
			t.Fatalf("invalid JSON: %q", b)
		}
		var got protocol.Event
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		// encoding/json replaces invalid UTF-8, as any reader does.
		norm := func(s string) string { return string([]rune(s)) }
		if got.V != protocol.EnvelopeVersion || got.Type != norm(typ) || got.RunID != norm(run) || got.ThreadID != norm(thread) ||
			got.Tenant != norm(tenant) || got.Attempt != attempt || got.Live != live || got.Seq != want.Seq || got.After != want.After ||
			got.Index != want.Index || !got.Time.Equal(want.Time) {
			t.Fatalf("got %+v\nwant %+v\nfrom %s", got, want, b)
		}
		if data != "" && !jsonEqual(got.Data, want.Data) {
			t.Fatalf("data %s, want %s", got.Data, want.Data)
		}
	})
}
