package submit_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/events"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/submit"
	"github.com/natsagent/natsagent/internal/testdeploy"
)

type env struct {
	q    *submit.Queue
	runs jetstream.Stream
	nc   *nats.Conn
}

func setup(t *testing.T) *env {
	t.Helper()
	d := testdeploy.Start(t, bus.Settings{})
	ctx, nc, js, settings, stores := context.Background(), d.NC, d.JS, d.Settings, d.Stores
	pub, err := events.NewPublisher(ctx, js, settings.Names, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	runs, err := js.Stream(ctx, settings.Names.RunsStream())
	if err != nil {
		t.Fatal(err)
	}
	return &env{q: &submit.Queue{JS: js, Names: settings.Names, Stores: stores, Events: pub, Submitter: "test"}, runs: runs, nc: nc}
}

func request(run, text string) (*protocol.RunRequest, []byte) {
	req := &protocol.RunRequest{RunID: run, ThreadID: "th1", Tenant: "acme", Agent: "chatbot",
		Input: &protocol.Input{Messages: []model.Message{{Role: model.RoleUser, Content: text}}}}
	req.Normalize()
	data, _ := json.Marshal(req)
	return req, data
}

func TestEnqueueWritesRequestEventRecordAndIndexOnce(t *testing.T) {
	e := setup(t)
	ctx := context.Background()

	// A sampled span in ctx: its trace context travels in the request.
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(ctx) })
	spanCtx, span := tp.Tracer("test").Start(ctx, "submit")
	defer span.End()

	req, data := request("r1", "hello")
	got, err := e.q.Enqueue(spanCtx, req, data)
	if err != nil {
		t.Fatal(err)
	}
	if got.Ack.Duplicate || got.Record.Status != protocol.StatusPending || got.Record.Seq != 1 || got.Record.MsgSeq != got.Ack.Sequence {
		t.Fatalf("first enqueue: ack %+v record %+v", got.Ack, got.Record)
	}
	msg, err := e.runs.GetMsg(ctx, got.Ack.Sequence)
	if err != nil {
		t.Fatal(err)
	}
	if msg.Subject != "agent.runs.acme.th1" || msg.Header.Get(jetstream.MsgIDHeader) != "r1" ||
		msg.Header.Get(protocol.HeaderSubmitter) != "test" || !strings.Contains(msg.Header.Get("traceparent"), span.SpanContext().TraceID().String()) {
		t.Fatalf("stored request: subject %s headers %v", msg.Subject, msg.Header)
	}
	if n, err := e.q.Events.LastSeq(ctx, "acme", "th1", "r1"); err != nil || n != 1 {
		t.Fatalf("run.queued: last seq %d, %v; want 1", n, err)
	}
	ids, err := e.q.Stores.Threads.RunIDs(ctx, "acme", "th1")
	if err != nil || len(ids) != 1 || ids[0] != "r1" {
		t.Fatalf("thread index %v, %v", ids, err)
	}

	// The same run sent again (a client retry, or a resend after a
	// leader election): one request, one run.queued, the record as it was.
	again, err := e.q.Enqueue(ctx, req, data)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Ack.Duplicate || again.Ack.Sequence != got.Ack.Sequence || again.Record.CreatedAt != got.Record.CreatedAt {
		t.Fatalf("second enqueue: ack %+v record %+v", again.Ack, again.Record)
	}
	info, err := e.runs.Info(ctx)
	if err != nil || info.State.Msgs != 1 {
		t.Fatalf("runs stream holds %d requests (%v), want 1", info.State.Msgs, err)
	}
	if n, _ := e.q.Events.LastSeq(ctx, "acme", "th1", "r1"); n != 1 {
		t.Fatalf("run.queued stored again: last seq %d", n)
	}
}

// A worker can take the request and create the record between the
// publish and the create: its record stands, not a pending one over it.
func TestEnqueueKeepsTheRecordAWorkerCreatedFirst(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	req, data := request("r2", "hello")
	running := kv.NewRun(req, 1, time.Now().UTC())
	running.Status, running.Attempt, running.Worker = protocol.StatusRunning, 1, "w1"
	if _, err := e.q.Stores.Runs.Create(ctx, running); err != nil {
		t.Fatal(err)
	}
	got, err := e.q.Enqueue(ctx, req, data)
	if err != nil {
		t.Fatal(err)
	}
	if got.Record.Status != protocol.StatusRunning || got.Record.Worker != "w1" {
		t.Fatalf("record %+v, want the worker's running one", got.Record)
	}
}

func TestEnqueueNamesAnOversizedRequest(t *testing.T) {
	e := setup(t)
	req, _ := request("r3", "hello")
	big := make([]byte, e.nc.MaxPayload()+1)
	_, err := e.q.Enqueue(context.Background(), req, big)
	if !errors.Is(err, submit.ErrMaxPayload) {
		t.Fatalf("error %v, want ErrMaxPayload", err)
	}
}
