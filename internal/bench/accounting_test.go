package bench

import (
	"context"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/natstest"
)

// TestStoredCounting makes known writes with plain JetStream calls on a
// real server and checks the meter counts exactly the messages stored,
// per asset, whatever retention keeps of them, and nothing of another
// deployment.
func TestStoredCounting(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const prefix = "acct-x"
	runs, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ACCT-X_RUNS", Subjects: []string{"acct-x.runs.>"}, Retention: jetstream.WorkQueuePolicy})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ACCT-X_EVENTS", Subjects: []string{"acct-x.events.>"}}); err != nil {
		t.Fatal(err)
	}
	threads, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "acct-x_threads", History: 1})
	if err != nil {
		t.Fatal(err)
	}
	files, err := js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: "acct-x_files"})
	if err != nil {
		t.Fatal(err)
	}
	// Another deployment whose prefix starts like this one's.
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ACCT-XY_RUNS", Subjects: []string{"acct-xy.runs.>"}}); err != nil {
		t.Fatal(err)
	}
	// Written before the window: not counted.
	if _, err := js.Publish(ctx, "acct-x.events.before", nil); err != nil {
		t.Fatal(err)
	}

	m, err := startMeter(ctx, js, prefix)
	if err != nil {
		t.Fatal(err)
	}
	// 3 requests, 2 of them consumed and acked (removed, still stored once).
	for i := range 3 {
		msg := nats.NewMsg("acct-x.runs.t.h")
		msg.Header.Set(nats.MsgIdHdr, "r"+string(rune('0'+i)))
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}
	// A retry of the first: deduplicated, nothing stored.
	dup := nats.NewMsg("acct-x.runs.t.h")
	dup.Header.Set(nats.MsgIdHdr, "r0")
	if ack, err := js.PublishMsg(ctx, dup); err != nil || !ack.Duplicate {
		t.Fatalf("duplicate publish: %+v %v", ack, err)
	}
	cons, err := runs.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "w", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(2)
	if err != nil {
		t.Fatal(err)
	}
	for msg := range batch.Messages() {
		if err := msg.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// 5 events, 4 of them async.
	for range 4 {
		if _, err := js.PublishAsync("acct-x.events.e", []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	natstest.Recv(t, js.PublishAsyncComplete(), "the stream's acks of 4 events")
	if _, err := js.Publish(ctx, "acct-x.events.e", []byte("x")); err != nil {
		t.Fatal(err)
	}
	// 4 revisions of one key (history 1 keeps one) and a delete marker.
	for range 4 {
		if _, err := threads.Put(ctx, "t.h", []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	if err := threads.Delete(ctx, "t.h"); err != nil {
		t.Fatal(err)
	}
	// A small object: one chunk and its metadata.
	if _, err := files.PutBytes(ctx, "f", []byte("hello")); err != nil {
		t.Fatal(err)
	}
	// The other deployment's writes are not this one's.
	for range 7 {
		if _, err := js.Publish(ctx, "acct-xy.runs.t.h", nil); err != nil {
			t.Fatal(err)
		}
	}
	c, err := m.stop(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]uint64{"runs_stream": 3, "events": 5, "kv_threads": 5, "obj_files": 2}
	if !maps.Equal(c.stored, want) {
		t.Errorf("stored %v, want %v", c.stored, want)
	}
	if c.total() != 15 {
		t.Errorf("total %d, want 15", c.total())
	}
	rows := c.rows("x", "test", "run", 5)
	stored := rows[len(rows)-1]
	if stored.Key != "x.stored_per_run" || stored.Value != 3 || stored.Breakdown["events"] != 1 || stored.Breakdown["runs_stream"] != 0.6 {
		t.Errorf("stored row %+v", stored)
	}
	if !strings.Contains(stored.Metric, "kv_threads 1.00") {
		t.Errorf("stored row's metric has no breakdown: %q", stored.Metric)
	}
}

func TestAssetOf(t *testing.T) {
	for stream, want := range map[string]string{
		"BENCHAB-BURST64_RUNS":        "runs_stream",
		"BENCHAB-BURST64_EVENTS":      "events",
		"BENCHAB-BURST64_DLQ":         "dlq",
		"KV_benchab-burst64_runs":     "kv_runs",
		"KV_benchab-burst64_usage":    "kv_usage",
		"OBJ_benchab-burst64_files":   "obj_files",
		"BENCHAB-BURST6_RUNS":         "",
		"KV_benchab-burst640_threads": "",
		"BENCHAB_BASELINE_BURST":      "",
	} {
		if got := assetOf("benchab-burst64", stream); got != want {
			t.Errorf("assetOf(%s) = %q, want %q", stream, got, want)
		}
	}
}

// A window some of whose runs did not finish reports no per-run figure:
// their writes would count against the finished runs.
func TestRowsForUnfinished(t *testing.T) {
	c := cost{counted: true, cpu: time.Second, cpuOK: true, stored: map[string]uint64{"events": 70, "runs_stream": 20}}
	s := &scenarioRun{name: "x"}
	if rows := c.rowsFor(s, outcome{submitted: 20, finished: 10, lost: 10}, "x", "c=1", "run", 10); rows != nil || len(s.notes) != 1 {
		t.Errorf("unfinished runs: rows %+v, notes %q", rows, s.notes)
	}
	rows := c.rowsFor(s, outcome{submitted: 10, finished: 10}, "x", "c=1", "run", 10)
	if len(rows) != 2 || rows[0].Key != "x.cpu_per_run" || rows[0].Value != 100_000 || rows[1].Value != 9 {
		t.Errorf("rows %+v", rows)
	}
	if rows := (cost{}).rowsFor(s, outcome{submitted: 10, finished: 10}, "x", "c=1", "run", 10); rows != nil {
		t.Errorf("rows of an uncounted window: %+v", rows)
	}
}
