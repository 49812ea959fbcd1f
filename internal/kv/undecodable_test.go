package kv

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/metrics/prom"
	"github.com/natsagent/natsagent/internal/protocol"
)

// A thread record that does not decode (corrupted, or written by a newer
// version) is left out of the tenant's listing and search, which still
// answer with the others, and it does not vanish without a trace: each
// skip counts in natsagent_records_undecodable_total{bucket}, and the
// first is logged, with the bucket and the key but not the value, once
// per key however often it is skipped.
func TestUndecodableThreadRecordsAreCountedAndLoggedOnce(t *testing.T) {
	resetUndecodableLog(t)
	s := openStores(t)
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	rec, err := prom.New(prom.Options{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.DebugLevel)
	s.Observe(zap.New(core), rec)

	for _, id := range []string{"t1", "t2"} {
		if _, err := s.Threads.CreateNew(ctx, &protocol.Thread{ThreadID: id, Tenant: "default", Status: protocol.ThreadIdle, CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	const secret = "SECRET-VALUE"
	bad := map[string]string{
		"default.bad":   `{"thread_id": 12, "x":"` + secret + `"}`,          // a field of another type
		"default.empty": `{"x":"` + secret + `"}`,                           // no thread at all
		"default.time":  `{"thread_id":"t3","created_at":"` + secret + `"}`, // time.Time's error quotes it
	}
	for key, value := range bad {
		if _, err := s.Threads.kv.PutString(ctx, key, value); err != nil {
			t.Fatal(err)
		}
	}
	listings := map[string]func() ([]string, error){
		"List": func() ([]string, error) {
			ths, err := s.Threads.List(ctx, "default")
			var ids []string
			for _, th := range ths {
				ids = append(ids, th.ThreadID)
			}
			return ids, err
		},
		"Updated": func() ([]string, error) {
			var ids []string
			_, err := s.Threads.Updated(ctx, "default", true, 10, func(th *protocol.Thread, _ uint64) { ids = append(ids, th.ThreadID) }, func() bool { return false })
			return ids, err
		},
	}
	want := float64(0)
	for round := range 2 {
		for name, listing := range listings {
			ids, err := listing()
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			slices.Sort(ids)
			if strings.Join(ids, " ") != "t1 t2" {
				t.Fatalf("round %d, %s answered %v, want t1 t2", round, name, ids)
			}
			want += 3
			if got := undecodableCount(t, reg, s.Threads.bucket); got != want {
				t.Fatalf("round %d, after %s: %v records counted undecodable, want %v", round, name, got, want)
			}
		}
	}
	entries := logs.All()
	var keys []string
	for _, e := range entries {
		fields := e.ContextMap()
		if fields["bucket"] != s.Threads.bucket {
			t.Fatalf("log line without the bucket: %q %v", e.Message, fields)
		}
		keys = append(keys, fields["key"].(string))
		for _, f := range fields {
			if strings.Contains(toString(f), secret) {
				t.Fatalf("the log holds the record's value: %q %v", e.Message, fields)
			}
		}
	}
	slices.Sort(keys)
	if strings.Join(keys, " ") != "default.bad default.empty default.time" {
		t.Fatalf("logged keys %v, want each undecodable key once", keys)
	}
}

// undecodableCount reads natsagent_records_undecodable_total{bucket}.
func undecodableCount(t *testing.T, reg *prometheus.Registry, bucket string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "natsagent_records_undecodable_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "bucket" && l.GetValue() == bucket {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

func toString(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	return ""
}

// resetUndecodableLog gives the test an empty memory of logged keys.
func resetUndecodableLog(t *testing.T) {
	t.Helper()
	undecodable.mu.Lock()
	defer undecodable.mu.Unlock()
	clear(undecodable.logged)
	undecodable.minute, undecodable.lines = time.Time{}, 0
}

// An assistant record that does not decode is left out of the tenant's
// listing and of the assistant's versions, which still answer with the
// others, and counted in natsagent_records_undecodable_total with the
// assistants bucket, as runs and threads are.
func TestUndecodableAssistantsAreCounted(t *testing.T) {
	resetUndecodableLog(t)
	s := openStores(t)
	ctx := context.Background()
	js, names := s.Runs.js, bus.DefaultNames()
	as, err := OpenAssistants(ctx, js, names)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	rec, err := prom.New(prom.Options{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.DebugLevel)
	as.Observe(zap.New(core), rec)

	for _, id := range []string{"a1", "a2"} {
		if err := as.Create(ctx, &protocol.Assistant{AssistantID: id, GraphID: "chatbot", Tenant: "default"}); err != nil {
			t.Fatal(err)
		}
	}
	for _, key := range []string{"default.bad", "default.a1.v.2"} {
		if _, err := as.kv.PutString(ctx, key, `{"version":"SECRET-VALUE"}`); err != nil {
			t.Fatal(err)
		}
	}
	list, err := as.List(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, a := range list {
		ids = append(ids, a.AssistantID)
	}
	slices.Sort(ids)
	if strings.Join(ids, " ") != "a1 a2" {
		t.Fatalf("List answered %v, want a1 a2", ids)
	}
	if got := undecodableCount(t, reg, names.AssistantsBucket()); got != 1 {
		t.Fatalf("after List: %v records counted undecodable, want 1", got)
	}
	versions, err := as.Versions(ctx, "default", "a1")
	if err != nil {
		t.Fatal(err)
	}
	if len(versions) != 1 || versions[0].Version != 1 {
		t.Fatalf("Versions answered %d versions, want version 1 alone", len(versions))
	}
	if got := undecodableCount(t, reg, names.AssistantsBucket()); got != 2 {
		t.Fatalf("after Versions: %v records counted undecodable, want 2", got)
	}
	if n := logs.FilterField(zap.String("bucket", names.AssistantsBucket())).Len(); n != 2 {
		t.Fatalf("%d log lines name the assistants bucket, want one per undecodable key", n)
	}
}
