// Package natsagenttest runs natsagent inside a test, as rivertest does for
// river: one call starts an embedded JetStream server, an in-process
// worker serving your agents, tools and middleware, and a scripted
// OpenAI-compatible model on loopback that checks every transcript it is
// sent as strictly as the pickiest real provider; helpers submit runs and
// assert on their events and final records. Nothing leaves the machine and
// everything stops when the test ends.
package natsagenttest

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsagent/natsagent"
	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/model/openaitest"
	"github.com/natsagent/natsagent/internal/testdeploy"
)

// Reply is one scripted model answer: text, tool calls, or an error.
type Reply = openaitest.Reply

// Usage is the token usage a scripted reply reports.
type Usage = openaitest.Usage

// ModelRequest is a request the scripted model received.
type ModelRequest = openaitest.Request

// Text is a reply that answers s.
func Text(s string) Reply { return openaitest.Text(s) }

// ToolCall is a reply that calls the tool name with args (JSON).
func ToolCall(name, args string) Reply { return openaitest.ToolCall(name, args) }

// ModelError is a reply that fails with an HTTP status and message, as a
// provider does.
func ModelError(status int, message string) Reply { return openaitest.Error(status, message) }

// Timeout bounds every wait of the helpers; generous, so a loaded CI
// machine does not fail a correct test.
const Timeout = 2 * time.Minute

// Deployment is a running natsagent: server, worker and model.
type Deployment struct {
	t testing.TB
	// Conn is a connection to the embedded server.
	Conn *nats.Conn
	// Client is a client of the default tenant.
	Client *natsagent.Client
	model  *openaitest.Server
}

// Start starts a deployment whose worker runs with cfg. Unless cfg.Model
// is set, the model is scripted: it answers the requests in order with
// replies, fails the test on a request beyond them, and every request must
// pass the strict transcript validator (a violation fails the test when it
// ends). The scripted model serves every model name.
func Start(t testing.TB, cfg natsagent.Config, replies ...Reply) *Deployment {
	t.Helper()
	return StartWith(t, cfg, openaitest.Script(t, replies...))
}

// StartWith is Start with a model that answers each request with
// handler's reply (for replies that depend on the request).
func StartWith(t testing.TB, cfg natsagent.Config, handler func(*ModelRequest) Reply) *Deployment {
	t.Helper()
	dep := testdeploy.Start(t, bus.Settings{})
	d := &Deployment{t: t, Conn: dep.NC}
	if cfg.Model == nil {
		d.model = openaitest.NewServer(t, handler)
		m, err := model.NewOpenAI(model.OpenAIConfig{BaseURL: d.model.URL(), APIKey: "test", Model: "test"})
		if err != nil {
			t.Fatal(err)
		}
		cfg.Model = m
		t.Cleanup(func() {
			if v := d.model.Violations(); len(v) > 0 {
				t.Errorf("natsagenttest: the model was sent invalid transcripts:\n%s", strings.Join(v, "\n"))
			}
		})
	}
	if cfg.ShutdownGrace == 0 {
		cfg.ShutdownGrace = 5 * time.Second
	}
	w, err := natsagent.NewWorker(dep.NC, cfg)
	if err != nil {
		t.Fatalf("natsagenttest: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("natsagenttest: worker: %v", err)
			}
		case <-time.After(Timeout):
			t.Errorf("natsagenttest: the worker did not stop within %s", Timeout)
		}
	})
	c, err := natsagent.NewClient(dep.NC, nil)
	if err != nil {
		t.Fatal(err)
	}
	d.Client = c
	return d
}

// ModelRequests returns the requests the scripted model received, in
// order (nil with a model of your own).
func (d *Deployment) ModelRequests() []ModelRequest {
	if d.model == nil {
		return nil
	}
	return d.model.Requests()
}

// Result is a finished run: its final record and its events.
type Result struct {
	Run    *natsagent.Run
	Events []natsagent.Event
}

// Output is the text of the run's final assistant message.
func (r *Result) Output() string {
	if r.Run.Output == nil {
		return ""
	}
	return r.Run.Output.Content
}

// EventTypes lists the types of the events, in order.
func (r *Result) EventTypes() []string {
	out := make([]string, len(r.Events))
	for i, e := range r.Events {
		out[i] = e.Type
	}
	return out
}

// Ask submits text on thread to the agent (the default when ""), waits
// for the run to end and returns it with its events. It fails the test on
// an error or after Timeout.
func (d *Deployment) Ask(thread, agent, text string) *Result {
	d.t.Helper()
	return d.Submit(natsagent.RunRequest{ThreadID: thread, Agent: agent, Input: natsagent.UserInput(text)})
}

// Submit submits req, follows the run to its run.finished and returns it
// with its events.
func (d *Deployment) Submit(req natsagent.RunRequest) *Result {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	sub, err := d.Client.Submit(ctx, req)
	if err != nil {
		d.t.Fatalf("natsagenttest: submit: %v", err)
	}
	evs, err := d.Client.Follow(ctx, sub.ThreadID, sub.RunID, nil)
	if err != nil {
		d.t.Fatalf("natsagenttest: follow: %v", err)
	}
	defer evs.Close()
	res := &Result{}
	for {
		ev, err := evs.Next(ctx)
		if err != nil {
			d.t.Fatalf("natsagenttest: run %s did not finish within %s (events so far: %v): %v", sub.RunID, Timeout, res.EventTypes(), err)
		}
		res.Events = append(res.Events, *ev)
		if ev.Type == natsagent.EventRunFinished {
			break
		}
	}
	run, err := d.Client.Wait(ctx, sub.ThreadID, sub.RunID)
	if err != nil {
		d.t.Fatalf("natsagenttest: read run %s: %v", sub.RunID, err)
	}
	res.Run = run
	return res
}

// RequireStatus fails the test unless the run ended with status.
func RequireStatus(t testing.TB, r *Result, status natsagent.Status) {
	t.Helper()
	if r.Run.Status != status {
		t.Fatalf("run %s ended %s (error %q, stop reason %q), want %s; events %v",
			r.Run.RunID, r.Run.Status, r.Run.Error, r.Run.StopReason, status, r.EventTypes())
	}
}

// RequireEvent returns the first event of type typ, failing the test when
// the run emitted none.
func RequireEvent(t testing.TB, r *Result, typ string) *natsagent.Event {
	t.Helper()
	i := slices.IndexFunc(r.Events, func(e natsagent.Event) bool { return e.Type == typ })
	if i < 0 {
		t.Fatalf("run %s emitted no %s event; events %v", r.Run.RunID, typ, r.EventTypes())
	}
	return &r.Events[i]
}

// RequireNoEvent fails the test when the run emitted an event of type typ.
func RequireNoEvent(t testing.TB, r *Result, typ string) {
	t.Helper()
	if slices.ContainsFunc(r.Events, func(e natsagent.Event) bool { return e.Type == typ }) {
		t.Fatalf("run %s emitted a %s event; events %v", r.Run.RunID, typ, r.EventTypes())
	}
}
