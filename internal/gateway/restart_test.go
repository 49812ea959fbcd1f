package gateway

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap/zaptest"

	"github.com/natsagent/natsagent/internal/protocol"
)

// startGateway runs one more gateway process's worth on the env's NATS
// server: its own connection, Server and HTTP listener. stop kills it the
// way a crash or a redeploy does: open streams are cut, nothing is
// flushed.
func (e *env) startGateway() (at *env, stop func()) {
	e.t.Helper()
	nc, err := nats.Connect(e.srv.URL())
	if err != nil {
		e.t.Fatal(err)
	}
	gw, err := New(context.Background(), nc, Config{Settings: e.settings, Logger: zaptest.NewLogger(e.t)})
	if err != nil {
		e.t.Fatal(err)
	}
	hs := httptest.NewServer(gw.Handler())
	at = &env{}
	*at = *e
	at.nc, at.gw, at.http = nc, gw, hs
	stop = func() {
		hs.CloseClientConnections()
		hs.Close()
		nc.Close()
	}
	e.t.Cleanup(stop)
	return at, stop
}

// drain collects the complete events a cut stream delivered before it
// ended.
func (s *stream) drain(timeout time.Duration) []sseEvent {
	s.t.Helper()
	var out []sseEvent
	deadline := time.After(timeout)
	for {
		select {
		case ev, ok := <-s.events:
			if !ok {
				return out
			}
			out = append(out, ev)
		case <-deadline:
			s.t.Fatalf("the cut stream did not end in %s", timeout)
		}
	}
}

// A client streaming a run loses its gateway twice (the process dies, a
// new one starts on the same NATS); each time it reconnects to the new
// gateway with Last-Event-ID and gets every later event exactly once,
// through run.finished.
func TestGatewayRestartDuringStream(t *testing.T) {
	e := newEnv(t, textModel(strings.TrimSpace(strings.Repeat("w ", 60)), 60, 30*time.Millisecond))
	first, stopFirst := e.startGateway()
	// Resumable: every delta is stored, so each comes exactly once too.
	first.do("POST", "/threads/t1/runs", with(input("hi"), "run_id", "r1", "stream_resumable", true)).expect(t, 200)

	var got []sseEvent
	s := first.openStream("GET", "/threads/t1/runs/r1/stream", nil)
	got = append(got, s.take(5)...)
	stopFirst()
	got = append(got, s.drain(5*time.Second)...)

	second, stopSecond := e.startGateway()
	if rec := second.do("GET", "/threads/t1/runs/r1", nil).run(t); rec.Status.Terminal() {
		t.Fatalf("run finished before the first reconnect (%s): the test must resume live", rec.Status)
	}
	s = second.openStream("GET", "/threads/t1/runs/r1/stream", nil, "Last-Event-ID", got[len(got)-1].id)
	got = append(got, s.take(10)...)
	stopSecond()
	got = append(got, s.drain(5*time.Second)...)

	third, _ := e.startGateway()
	if rec := third.do("GET", "/threads/t1/runs/r1", nil).run(t); rec.Status.Terminal() {
		t.Fatalf("run finished before the second reconnect (%s)", rec.Status)
	}
	got = append(got, third.openStream("GET", "/threads/t1/runs/r1/stream", nil, "Last-Event-ID", got[len(got)-1].id).rest(20*time.Second)...)

	all := third.openStream("GET", "/threads/t1/runs/r1/stream", nil).rest(5 * time.Second)
	if strings.Join(ids(got), ",") != strings.Join(ids(all), ",") {
		t.Fatalf("resumed ids %v\nwant      %v", ids(got), ids(all))
	}
	for i, ev := range got {
		if ev.env.Seq != uint64(i+1) {
			t.Fatalf("event %d has seq %d: a gap or a duplicate", i, ev.env.Seq)
		}
	}
	if fin := finished(t, got[len(got)-1]); fin.Status != protocol.StatusSuccess {
		t.Fatalf("run ended %+v", fin)
	}
}
