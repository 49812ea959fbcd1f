package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/testdeploy"
	"github.com/natsagent/natsagent/internal/tools"
	"github.com/natsagent/natsagent/internal/worker"
)

// env is a real embedded JetStream server with natsagent provisioned, a
// worker running a scripted model on its own connection, and the gateway
// behind an httptest server.
type env struct {
	t        *testing.T
	srv      *natstest.Server
	nc       *nats.Conn // the gateway's connection
	js       jetstream.JetStream
	settings bus.Settings
	stores   *kv.Stores
	gw       *Server
	http     *httptest.Server
}

func newEnv(t *testing.T, m model.Model) *env {
	t.Helper()
	return newEnvWith(t, m, nil)
}

// newEnvWith is newEnv with a hook that adjusts the gateway before it
// serves.
func newEnvWith(t *testing.T, m model.Model, adjust func(*Server)) *env {
	t.Helper()
	// A long ack wait: no test here needs a redelivery, and a 2 s one can
	// redeliver a healthy run on a loaded machine (a second run.started,
	// attempt 2), which the tests that read a run's events do not expect.
	return newEnvSettings(t, m, bus.Settings{AckWait: 30 * time.Second, MaxDeliver: 5}, adjust)
}

// newEnvSettings is newEnvWith on a deployment provisioned with settings.
func newEnvSettings(t *testing.T, m model.Model, settings bus.Settings, adjust func(*Server)) *env {
	t.Helper()
	d := testdeploy.Start(t, settings)
	srv, nc, js, settings, stores := d.Server, d.NC, d.JS, d.Settings, d.Stores
	gw, err := New(context.Background(), nc, Config{Settings: settings, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if adjust != nil {
		adjust(gw)
	}
	hs := httptest.NewServer(gw.Handler())
	t.Cleanup(hs.Close)
	e := &env{t: t, srv: srv, nc: nc, js: js, settings: settings, stores: stores, gw: gw, http: hs}
	if m != nil {
		e.startWorker(m)
	}
	return e
}

// startWorker starts a worker with the chatbot profile on its own
// connection; it stops when the test ends.
func (e *env) startWorker(m model.Model) {
	e.t.Helper()
	nc, err := nats.Connect(e.srv.URL(), nats.MaxReconnects(-1))
	if err != nil {
		e.t.Fatal(err)
	}
	agents, err := agent.NewAgents(m, tools.NewRegistry(), agent.Chatbot())
	if err != nil {
		e.t.Fatal(err)
	}
	w, err := worker.New(context.Background(), nc, worker.Config{
		Settings: e.settings, Concurrency: 4, Agents: agents, Logger: zaptest.NewLogger(e.t),
		WaitPoll: 200 * time.Millisecond, ShutdownGrace: 5 * time.Second,
	})
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	e.t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			e.t.Error("worker did not stop")
		}
		nc.Close()
	})
}

// response is a decoded HTTP answer.
type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) decode(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decode %s: %v", r.body, err)
	}
}

func (r response) apiError(t *testing.T) protocol.ErrorBody {
	t.Helper()
	var e protocol.ErrorReply
	r.decode(t, &e)
	if e.Error.Code == "" {
		t.Fatalf("no error code in %s", r.body)
	}
	return e.Error
}

// do sends a request; body is JSON-encoded unless it is a string, sent
// as is.
func (e *env) do(method, path string, body any, headers ...string) response {
	e.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			e.t.Fatal(err)
		}
		rd = bytes.NewReader(data)
	}
	// A gateway that never answers fails the test, not go test's
	// 30-minute timeout.
	ctx, cancel := context.WithTimeout(context.Background(), 2*natstest.Patience)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, e.http.URL+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := e.http.Client().Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: data}
}

// expect fails the test unless r has the status.
func (r response) expect(t *testing.T, status int) response {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d: %s", r.status, status, r.body)
	}
	return r
}

// run is what the tests read of a run record.
func (r response) run(t *testing.T) protocol.Run {
	t.Helper()
	var rec protocol.Run
	r.decode(t, &rec)
	return rec
}

// sseEvent is one parsed SSE frame.
type sseEvent struct {
	id    string
	event string
	data  string
	env   protocol.Event
}

// stream is an SSE response being read.
type stream struct {
	t      *testing.T
	resp   *http.Response
	cancel context.CancelFunc
	events chan sseEvent
	done   chan struct{}

	mu       sync.Mutex
	comments int
	err      error
}

// openStream sends a request answered with SSE and parses its frames in
// the background. It asks for natsagent's own events, as a native client
// does (stream_mode natsagent), unless the request names a stream mode:
// openLangGraphStream reads the translated modes.
func (e *env) openStream(method, path string, body any, headers ...string) *stream {
	e.t.Helper()
	if m, ok := body.(map[string]any); ok {
		if _, set := m["stream_mode"]; !set {
			body = with(m, "stream_mode", "natsagent")
		}
	}
	if method == http.MethodGet && !strings.Contains(path, "stream_mode=") {
		sep := "?"
		if strings.Contains(path, "?") {
			sep = "&"
		}
		path += sep + "stream_mode=natsagent"
	}
	return e.openLangGraphStream(method, path, body, headers...)
}

// openLangGraphStream is openStream with the request as given: without a
// stream mode, the gateway streams LangGraph's values.
func (e *env) openLangGraphStream(method, path string, body any, headers ...string) *stream {
	e.t.Helper()
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			e.t.Fatal(err)
		}
		rd = bytes.NewReader(data)
	}
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, method, e.http.URL+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := e.http.Client().Do(req)
	if err != nil {
		cancel()
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	s := &stream{t: e.t, resp: resp, cancel: cancel, events: make(chan sseEvent, 10000), done: make(chan struct{})}
	e.t.Cleanup(s.close)
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(resp.Body)
		e.t.Fatalf("%s %s: status %d: %s", method, path, resp.StatusCode, data)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		e.t.Fatalf("Content-Type %q, want text/event-stream", ct)
	}
	go s.read()
	return s
}

func (s *stream) read() {
	defer close(s.done)
	defer close(s.events)
	sc := bufio.NewScanner(s.resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var cur sseEvent
	var data []string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if len(data) == 0 {
				continue
			}
			cur.data = strings.Join(data, "\n")
			if !json.Valid([]byte(cur.data)) {
				s.fail(fmt.Errorf("data of %q is not JSON: %s", cur.event, cur.data))
				return
			}
			// A LangGraph part (a messages tuple is a list) is no envelope.
			_ = json.Unmarshal([]byte(cur.data), &cur.env)
			s.events <- cur
			cur, data = sseEvent{}, nil
		case strings.HasPrefix(line, ":"):
			s.mu.Lock()
			s.comments++
			s.mu.Unlock()
		case strings.HasPrefix(line, "id: "):
			cur.id = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "event: "):
			cur.event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			data = append(data, strings.TrimPrefix(line, "data: "))
		default:
			s.fail(io.ErrUnexpectedEOF)
			return
		}
	}
	if len(data) > 0 {
		s.fail(io.ErrUnexpectedEOF) // a frame without its blank line
	}
}

func (s *stream) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.err = err
	}
}

// next returns the next event, failing the test after timeout.
func (s *stream) next(timeout time.Duration) (sseEvent, bool) {
	s.t.Helper()
	// The timeout says when an event is overdue, not how fast it must
	// come: no wait gives up before testdeploy.MinWait.
	timeout = max(timeout, testdeploy.MinWait)
	select {
	case ev, ok := <-s.events:
		return ev, ok
	case <-time.After(timeout):
		s.t.Fatalf("no event in %s", timeout)
		return sseEvent{}, false
	}
}

// take reads n events.
func (s *stream) take(n int) []sseEvent {
	s.t.Helper()
	var out []sseEvent
	for range n {
		ev, ok := s.next(10 * time.Second)
		if !ok {
			s.t.Fatalf("stream ended after %d events, want %d", len(out), n)
		}
		out = append(out, ev)
	}
	return out
}

// rest reads events until the server ends the stream.
func (s *stream) rest(timeout time.Duration) []sseEvent {
	s.t.Helper()
	timeout = max(timeout, testdeploy.MinWait)
	var out []sseEvent
	deadline := time.After(timeout)
	for {
		select {
		case ev, ok := <-s.events:
			if !ok {
				s.mu.Lock()
				err := s.err
				s.mu.Unlock()
				if err != nil {
					s.t.Fatalf("malformed SSE: %v", err)
				}
				return out
			}
			out = append(out, ev)
		case <-deadline:
			s.t.Fatalf("stream did not end in %s; got %d events: %v", timeout, len(out), types(out))
		}
	}
}

// close disconnects like a client that goes away.
func (s *stream) close() {
	s.cancel()
	s.resp.Body.Close()
	<-s.done
}

func types(evs []sseEvent) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = ev.event
	}
	return out
}

// storedOnly keeps the events with an SSE id: the stored ones (a live
// event, a token delta, has none).
func storedOnly(evs []sseEvent) []sseEvent {
	var out []sseEvent
	for _, ev := range evs {
		if ev.id != "" {
			out = append(out, ev)
		}
	}
	return out
}

// lastID is the id an EventSource resumes with: the last one it got.
func lastID(evs []sseEvent) string {
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].id != "" {
			return evs[i].id
		}
	}
	return ""
}

func ids(evs []sseEvent) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = ev.id
	}
	return out
}

// finished decodes the data of a run.finished event.
func finished(t *testing.T, ev sseEvent) protocol.FinishedData {
	t.Helper()
	if ev.event != protocol.EventRunFinished {
		t.Fatalf("event %s, want run.finished", ev.event)
	}
	var d protocol.FinishedData
	if err := json.Unmarshal(ev.env.Data, &d); err != nil {
		t.Fatal(err)
	}
	return d
}

// textModel answers every call with text streamed in pieces.
func textModel(text string, pieces int, pieceDelay time.Duration) *model.Scripted {
	return model.NewScripted(func(int, *model.Request) model.Reply {
		return model.Reply{Text: text, Pieces: pieces, PieceDelay: pieceDelay}
	})
}

// echoModel answers with the last user message.
func echoModel() *model.Scripted {
	return model.NewScripted(func(_ int, req *model.Request) model.Reply {
		return model.Reply{Text: "echo: " + req.Messages[len(req.Messages)-1].Content}
	})
}

// input is a run body with one user message.
func input(text string) map[string]any {
	return map[string]any{"input": map[string]any{"messages": []map[string]any{{"role": "user", "content": text}}}}
}

// with returns body with more fields.
func with(body map[string]any, kv ...any) map[string]any {
	out := make(map[string]any, len(body)+len(kv)/2)
	for k, v := range body {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i].(string)] = kv[i+1]
	}
	return out
}

// noConsumersLeft waits until the events stream has no consumer: every
// SSE stream and wait stopped and deleted its own.
func (e *env) noConsumersLeft() {
	e.t.Helper()
	st, err := e.js.Stream(context.Background(), e.settings.Names.EventsStream())
	if err != nil {
		e.t.Fatal(err)
	}
	testdeploy.WaitFor(e.t, 5*time.Second, "event consumers deleted", func() bool {
		info, err := st.Info(context.Background())
		if err != nil {
			e.t.Fatal(err)
		}
		return info.State.Consumers == 0
	})
}
