package bus_test

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
)

// The hand reader reads every ack the way encoding/json (what nats.go
// uses) reads it, including those it hands over to encoding/json.
func TestParsePubAckReadsWhatEncodingJSONReads(t *testing.T) {
	for _, data := range []string{
		`{"stream":"KV_agent_threads","seq":42}`,
		`{"stream":"AGENT_EVENTS","seq":18446744073709551615}`,
		`{"stream":"AGENT_RUNS","seq":7,"duplicate":true}`,
		`{"stream":"AGENT_RUNS","seq":7,"duplicate": true}`,
		`{"stream":"AGENT_RUNS","seq":7,"duplicate":false}`,
		`{"stream":"S","domain":"hub","seq":3}`,
		`{"stream":"S","seq":3,"val":"12"}`,
		`{"stream": "S", "seq": 9 }`,
		`{"seq":5,"stream":"S"}`,
		`{"stream":"we\"ird","seq":1}`,
		`{"stream":"S","seq":1,"batch":"b","count":2}`,
	} {
		got, err := bus.ParsePubAck([]byte(data))
		if err != nil {
			t.Errorf("%s: %v", data, err)
			continue
		}
		var want jetstream.PubAck
		if err := json.Unmarshal([]byte(data), &want); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: read %+v, encoding/json reads %+v", data, got, want)
		}
	}
	for data, code := range map[string]jetstream.ErrorCode{
		`{"type":"io.nats.jetstream.api.v1.pub_ack_response","error":{"code":400,"err_code":10071,"description":"wrong last sequence: 4"}}`: 10071,
		`{"error":{"code":503,"err_code":10077,"description":"maximum bytes exceeded"},"stream":"S","seq":0}`:                               10077,
	} {
		_, err := bus.ParsePubAck([]byte(data))
		var apiErr *jetstream.APIError
		if !errors.As(err, &apiErr) || apiErr.ErrorCode != code {
			t.Errorf("%s: got %v, want API error %d", data, err, code)
		}
	}
	for _, data := range []string{``, `{}`, `{"seq":1}`, `{"stream":"","seq":1}`, `not json`, `{"stream":"S","seq":-1}`} {
		if _, err := bus.ParsePubAck([]byte(data)); !errors.Is(err, jetstream.ErrInvalidJSAck) {
			t.Errorf("%q: got %v, want ErrInvalidJSAck", data, err)
		}
	}
}

// RequestAck answers as js.PublishMsg does: the sequence, a duplicate, a
// refused expectation as an API error, no stream, and no answer in time.
func TestRequestAckAnswersAsPublishMsg(t *testing.T) {
	js := startSmall(t, 64<<20)
	nc := js.Conn()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
		t.Fatal(err)
	}
	msg := func(subject, id string) *nats.Msg {
		m := nats.NewMsg(subject)
		m.Data = []byte("x")
		if id != "" {
			m.Header.Set(jetstream.MsgIDHeader, id)
		}
		return m
	}
	for i, want := range []jetstream.PubAck{{Stream: "S", Sequence: 1}, {Stream: "S", Sequence: 1, Duplicate: true}} {
		ack, err := bus.RequestAck(ctx, nc, msg("s.a", "one"))
		if err != nil || ack != want {
			t.Fatalf("publish %d: %+v, %v; want %+v", i, ack, err, want)
		}
	}
	m := msg("s.a", "")
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "7")
	_, err := bus.RequestAck(ctx, nc, m)
	if !errors.Is(err, jetstream.ErrKeyExists) { // 10071, as nats.go's error says it
		t.Fatalf("wrong expected sequence: %v, want API error 10071", err)
	}
	m = msg("s.a", "")
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "1")
	if ack, err := bus.RequestAck(ctx, nc, m); err != nil || ack.Sequence != 2 {
		t.Fatalf("right expected sequence: %+v, %v", ack, err)
	}
	if _, err := bus.RequestAck(ctx, nc, msg("nostream", "")); !errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Fatalf("no stream: %v, want ErrNoStreamResponse", err)
	}

	// A responder that never answers: the wait ends with the context's
	// deadline and says so, as a transient error.
	sub, err := nc.SubscribeSync("silent")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	short, cancelShort := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancelShort()
	_, err = bus.RequestAck(short, nc, msg("silent", ""))
	if !errors.Is(err, context.DeadlineExceeded) || !bus.Transient(err) {
		t.Fatalf("no answer: %v, want a transient deadline error", err)
	}
	done, cancelDone := context.WithCancel(ctx)
	cancelDone()
	if _, err := bus.RequestAck(done, nc, msg("s.b", "")); !errors.Is(err, context.Canceled) {
		t.Fatalf("ended context: %v, want context.Canceled", err)
	}
	if n, err := js.Stream(ctx, "S"); err != nil || n.CachedInfo().State.Msgs != 2 {
		t.Fatalf("stream holds %+v (%v), want 2 messages: nothing sent with an ended context", n.CachedInfo().State, err)
	}
}

// The direct gets read what Stream.GetMsg and GetLastMsgForSubject read,
// and say when a stream does not answer direct gets.
func TestDirectGetReadsWhatTheStreamAPIReads(t *testing.T) {
	js := startSmall(t, 64<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "D", Subjects: []string{"d.>"}, AllowDirect: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, subj := range []string{"d.a", "d.b", "d.a", "d.b"} {
		m := nats.NewMsg(subj)
		m.Data = []byte("data of " + subj)
		m.Header.Set("X-Test", subj)
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	same := func(what string, got *jetstream.RawStreamMsg, want *jetstream.RawStreamMsg) {
		t.Helper()
		if got.Subject != want.Subject || got.Sequence != want.Sequence || string(got.Data) != string(want.Data) ||
			got.Header.Get("X-Test") != want.Header.Get("X-Test") || !got.Time.Equal(want.Time) {
			t.Fatalf("%s: read %+v, the stream API reads %+v", what, got, want)
		}
	}
	got, err := bus.DirectGetLast(ctx, js, "D", "d.a")
	if err != nil {
		t.Fatal(err)
	}
	want, _ := st.GetLastMsgForSubject(ctx, "d.a")
	same("last of d.a", got, want)
	if got.Sequence != 3 {
		t.Fatalf("last of d.a is seq %d, want 3", got.Sequence)
	}
	for _, from := range []uint64{0, 1, 2, 3} {
		got, err := bus.DirectGetNext(ctx, js, "D", "d.b", from)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := st.GetMsg(ctx, from, jetstream.WithGetMsgSubject("d.b"))
		same("next d.b", got, want)
	}
	if _, err := bus.DirectGetNext(ctx, js, "D", "d.b", 5); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("past the last: %v, want ErrMsgNotFound", err)
	}
	if _, err := bus.DirectGetLast(ctx, js, "D", "d.none"); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("no such subject: %v, want ErrMsgNotFound", err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "N", Subjects: []string{"n.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := bus.DirectGetLast(ctx, js, "N", "n.a"); !errors.Is(err, bus.ErrNoDirectGet) {
		t.Fatalf("stream without direct gets: %v, want ErrNoDirectGet", err)
	}
}

// BenchmarkRequestAck publishes to a stream under a run's kind of context
// (cancellable, with a deadline).
func BenchmarkRequestAck(b *testing.B) {
	js := startSmall(b, 64<<20)
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "B", Subjects: []string{"b.>"}}); err != nil {
		b.Fatal(err)
	}
	m := &nats.Msg{Subject: "b.x", Data: []byte("x")}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := bus.RequestAck(ctx, js.Conn(), m); err != nil {
			b.Fatal(err)
		}
	}
}
