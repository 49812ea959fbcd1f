package events

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/testdeploy"
)

// feedEnv is an embedded JetStream server with the events stream, three
// events of run r1 and one of run r2 on the same thread, stored in that
// order r1, r2, r1, r1.
type feedEnv struct {
	nc    *nats.Conn
	js    jetstream.JetStream
	names bus.Names
	st    jetstream.Stream
	seqs  []uint64 // stream sequences of r1's events
}

func newFeedEnv(t *testing.T) *feedEnv {
	t.Helper()
	d := testdeploy.Start(t, bus.Settings{})
	nc, js, settings := d.NC, d.JS, d.Settings
	st, err := js.Stream(context.Background(), settings.Names.EventsStream())
	if err != nil {
		t.Fatal(err)
	}
	e := &feedEnv{nc: nc, js: js, names: settings.Names, st: st}
	e.publish(t, "r1", 1)
	e.publish(t, "r2", 1)
	e.publish(t, "r1", 2)
	e.publish(t, "r1", 3)
	return e
}

func (e *feedEnv) publish(t *testing.T, run string, seq uint64) {
	t.Helper()
	env := protocol.Event{Type: "custom.test", Seq: seq, RunID: run, ThreadID: "t1", Tenant: "default", Time: time.Now().UTC()}
	ack, err := e.js.Publish(context.Background(), e.names.EventSubject("default", "t1", run, protocol.KindCustom), AppendEnvelope(nil, &env))
	if err != nil {
		t.Fatal(err)
	}
	if run == "r1" {
		e.seqs = append(e.seqs, ack.Sequence)
	}
}

func (e *feedEnv) open(t *testing.T, cfg FeedConfig) *Feed {
	t.Helper()
	f, err := OpenFeed(context.Background(), e.js, e.names, e.names.RunEvents("default", "t1", "r1"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func (e *feedEnv) consumers(t *testing.T) int {
	t.Helper()
	info, err := e.st.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Consumers
}

// read returns the seqs of the events f delivers until it stays silent.
func read(t *testing.T, f *Feed) []uint64 {
	t.Helper()
	var got []uint64
	for {
		m, err := f.NextWithin(context.Background(), 200*time.Millisecond)
		if errors.Is(err, context.DeadlineExceeded) {
			return got
		}
		if err != nil {
			t.Fatal(err)
		}
		var env protocol.Event
		if err := json.Unmarshal(m.Data(), &env); err != nil {
			t.Fatal(err)
		}
		if env.RunID != "r1" {
			t.Fatalf("the feed of r1 delivered an event of %s", env.RunID)
		}
		got = append(got, env.Seq)
	}
}

func TestFeedStarts(t *testing.T) {
	e := newFeedEnv(t)
	m, err := e.st.GetMsg(context.Background(), e.seqs[1])
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		cfg  FeedConfig
		want []uint64
	}{
		{"from the first retained event", FeedConfig{}, []uint64{1, 2, 3}},
		{"after a stream sequence (Last-Event-ID)", FeedConfig{After: e.seqs[0]}, []uint64{2, 3}},
		{"since a time", FeedConfig{Since: m.Time}, []uint64{2, 3}},
		{"new events only", FeedConfig{NewOnly: true}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := e.open(t, c.cfg)
			defer f.Close()
			if got := read(t, f); !reflect.DeepEqual(got, c.want) {
				t.Fatalf("events %v, want %v", got, c.want)
			}
		})
	}

	// A new-only feed gets what is published after it opened.
	f := e.open(t, FeedConfig{NewOnly: true})
	defer f.Close()
	e.publish(t, "r1", 4)
	if got := read(t, f); !reflect.DeepEqual(got, []uint64{4}) {
		t.Fatalf("new-only feed got %v, want [4]", got)
	}

	if _, err := OpenFeed(context.Background(), e.js, e.names, "x", FeedConfig{NewOnly: true, After: 3}); !errors.Is(err, ErrFeedStart) {
		t.Fatalf("two starting points: %v, want ErrFeedStart", err)
	}
}

// Close deletes the feed's consumer: by the time it returns (the CLI's,
// which exits right after), or soon after with DeleteInBackground (the
// gateway's).
func TestFeedCloseDeletesItsConsumer(t *testing.T) {
	e := newFeedEnv(t)
	// The deletion is answered late, so a Close that did not wait for it
	// would return with the consumer still there. The feed's pulls are
	// not answered: it reads nothing here.
	slow := natstest.LossyAPI(t, e.nc, func(api string) bool {
		if strings.HasPrefix(api, "CONSUMER.DELETE.") {
			time.Sleep(300 * time.Millisecond)
		}
		return strings.HasPrefix(api, "CONSUMER.MSG.NEXT.")
	})
	f, err := OpenFeed(context.Background(), slow, e.names, e.names.RunEvents("default", "t1", "r1"), FeedConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if n := e.consumers(t); n != 1 {
		t.Fatalf("%d consumers on an open feed, want 1", n)
	}
	f.Close()
	if n := e.consumers(t); n != 0 {
		t.Fatalf("%d consumers after Close, want 0", n)
	}

	f = e.open(t, FeedConfig{DeleteInBackground: true})
	f.Close()
	deadline := time.Now().Add(5 * time.Second)
	for e.consumers(t) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the consumer outlived a background Close")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The synthetic run.finished of a run whose events expired is the one its
// worker stored, but for the time (the record's finished_at): the
// gateway's copy of it used to lack the attempt.
func TestFinishedEnvelope(t *testing.T) {
	created := time.Date(2026, 11, 30, 1, 0, 0, 0, time.UTC)
	finished := created.Add(90 * time.Second)
	rec := &protocol.Run{
		RunID: "r1", ThreadID: "t1", Tenant: "acme", Agent: "chatbot", Status: protocol.StatusError, Attempt: 2, Seq: 17,
		CreatedAt: created, FinishedAt: &finished, StopReason: protocol.StopLoopCapped, Error: "the loop repeated itself",
		Output: &model.Message{Role: model.RoleAssistant, Content: "partial answer"}, SupersededBy: "r9",
	}
	raw, err := FinishedEnvelope(rec)
	if err != nil {
		t.Fatal(err)
	}
	var got protocol.Event
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatalf("%v: %s", err, raw)
	}
	if got.Type != protocol.EventRunFinished || got.Seq != 17 || got.RunID != "r1" || got.ThreadID != "t1" || got.Tenant != "acme" ||
		got.Attempt != 2 || !got.Time.Equal(finished) {
		t.Fatalf("envelope %s", raw)
	}
	var data protocol.FinishedData
	if err := json.Unmarshal(got.Data, &data); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(data, FinishedData(rec)) {
		t.Fatalf("data %+v, want %+v", data, FinishedData(rec))
	}

	// The same as PublishFinished stores, the time aside.
	e := newFeedEnv(t)
	p, err := NewPublisher(context.Background(), e.js, e.names, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.PublishFinished(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	m, err := e.st.GetLastMsgForSubject(context.Background(), e.names.RunEvents("acme", "t1", "r1"))
	if err != nil {
		t.Fatal(err)
	}
	var stored protocol.Event
	if err := json.Unmarshal(m.Data, &stored); err != nil {
		t.Fatal(err)
	}
	if !jsonEqual(stored.Data, got.Data) {
		t.Fatalf("data %s, stored %s", got.Data, stored.Data)
	}
	stored.Time, stored.Data, got.Data = got.Time, nil, nil
	if !reflect.DeepEqual(got, stored) {
		t.Fatalf("synthetic %+v\nstored    %+v", got, stored)
	}

	// A record without finished_at is timed at its creation.
	rec.FinishedAt = nil
	if raw, err = FinishedEnvelope(rec); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &got); err != nil || !got.Time.Equal(created) {
		t.Fatalf("time %v (%v), want created_at %v", got.Time, err, created)
	}
}
