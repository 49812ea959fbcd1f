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
	if msg.Subject != "agent.runs.acme.th1" || msg.Header.Get(jetstream.MsgIDHeader) != "acme.r1" ||
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

// Run ids are unique per tenant: another tenant's request with the same
// run id does not make this one a duplicate.
func TestEnqueueSameRunIDInTwoTenants(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	req, data := request("r1", "hello")
	if _, err := e.q.Enqueue(ctx, req, data); err != nil {
		t.Fatal(err)
	}
	other := *req
	other.Tenant = "globex"
	data, _ = json.Marshal(&other)
	got, err := e.q.Enqueue(ctx, &other, data)
	if err != nil {
		t.Fatal(err)
	}
	if got.Ack.Duplicate {
		t.Fatalf("globex's r1 was taken for a duplicate of acme's r1: ack %+v", got.Ack)
	}
	msg, err := e.runs.GetMsg(ctx, got.Ack.Sequence)
	if err != nil || msg.Subject != "agent.runs.globex.th1" || msg.Header.Get(jetstream.MsgIDHeader) != "globex.r1" {
		t.Fatalf("stored request %+v, %v", msg, err)
	}
}

// A duplicate answer that points at another request (a message id written
// by a broken or hostile submitter, or the same run id on another thread)
// is an error, never a pending record for a run that will not run.
func TestEnqueueRefusesADuplicateOfAnotherRequest(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	js, err := jetstream.New(e.nc)
	if err != nil {
		t.Fatal(err)
	}
	forged := nats.NewMsg("agent.runs.acme.elsewhere")
	forged.Data = []byte(`{}`)
	forged.Header.Set(jetstream.MsgIDHeader, "globex.r1")
	if _, err := js.PublishMsg(ctx, forged); err != nil {
		t.Fatal(err)
	}
	req, data := request("r1", "hello")
	req.Tenant = "globex"
	data, _ = json.Marshal(req)
	_, err = e.q.Enqueue(ctx, req, data)
	if !errors.Is(err, submit.ErrRunIDTaken) || !strings.Contains(err.Error(), "r1") || strings.Contains(err.Error(), "acme") {
		t.Fatalf("error %v, want ErrRunIDTaken naming r1 and not acme's subject", err)
	}
	if _, _, err := e.q.Stores.Runs.Get(ctx, "globex", "r1"); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("a record of globex's r1 was created: %v", err)
	}

	// The same run id on another thread of the same tenant.
	first, data := request("r9", "hello")
	if _, err := e.q.Enqueue(ctx, first, data); err != nil {
		t.Fatal(err)
	}
	second := *first
	second.ThreadID = "th2"
	data, _ = json.Marshal(&second)
	if _, err := e.q.Enqueue(ctx, &second, data); !errors.Is(err, submit.ErrRunIDTaken) {
		t.Fatalf("same run id on another thread: %v, want ErrRunIDTaken", err)
	}
}

// A duplicate whose request was consumed answers with the run's record;
// one consumed without a record is an error.
func TestEnqueueDuplicateOfAConsumedRequest(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	req, data := request("r5", "hello")
	got, err := e.q.Enqueue(ctx, req, data)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.runs.DeleteMsg(ctx, got.Ack.Sequence); err != nil {
		t.Fatal(err)
	}
	again, err := e.q.Enqueue(ctx, req, data)
	if err != nil || !again.Ack.Duplicate || again.Record.RunID != "r5" {
		t.Fatalf("retry of a consumed request: %+v, %v", again, err)
	}
	js, err := jetstream.New(e.nc)
	if err != nil {
		t.Fatal(err)
	}
	bucket, err := js.KeyValue(ctx, "agent_runs")
	if err != nil {
		t.Fatal(err)
	}
	if err := bucket.Purge(ctx, "acme.r5"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.q.Enqueue(ctx, req, data); !errors.Is(err, submit.ErrRunIDTaken) {
		t.Fatalf("duplicate of a consumed request without a record: %v, want ErrRunIDTaken", err)
	}
}
