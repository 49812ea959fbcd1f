package erase_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/compact"
	"github.com/natsagent/natsagent/internal/erase"
	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/jobs"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/limits"
	"github.com/natsagent/natsagent/internal/memory"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
)

// env is one deployment on an embedded JetStream server, with nothing
// running on it: every store is seeded and checked directly.
type env struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	names  bus.Names
	stores *kv.Stores
	mem    *memory.Store
	obj    jetstream.ObjectStore
	index  jetstream.KeyValue
	eraser *erase.Eraser
}

func setup(t *testing.T) *env {
	t.Helper()
	srv := natstest.Start(t)
	nc := srv.Connect()
	natstest.Provision(t, nc, bus.Settings{})
	ctx := context.Background()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	names := bus.DefaultNames()
	stores, err := kv.Open(ctx, js, names)
	if err != nil {
		t.Fatal(err)
	}
	mem, err := memory.Open(ctx, js, memory.Config{Names: names})
	if err != nil {
		t.Fatal(err)
	}
	obj, err := js.ObjectStore(ctx, names.FilesBucket())
	if err != nil {
		t.Fatal(err)
	}
	index, err := js.KeyValue(ctx, names.ThreadsBucket())
	if err != nil {
		t.Fatal(err)
	}
	e, err := erase.New(ctx, erase.Config{NC: nc, JS: js, Names: names, Stores: stores, Settle: 10 * time.Millisecond, StopWait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return &env{nc: nc, js: js, names: names, stores: stores, mem: mem, obj: obj, index: index, eraser: e}
}

// marker is written into every piece of a seeded thread's content, so a
// scan of the raw streams finds any of it left behind.
func marker(tenant, thread string) string { return "SECRET-" + tenant + "-" + thread }

// seed gives a thread data in every store a thread can have: the record
// and its run index, two finished runs, checkpoints, usage, events, a
// queued request, a dead letter, memory (a cursor and jobs, scheduled,
// due and dead-lettered), a compaction job, and files (one removed, whose
// meta record remains).
func (e *env) seed(t *testing.T, tenant, thread, owner string) {
	t.Helper()
	ctx := context.Background()
	mark := marker(tenant, thread)
	now := time.Now().UTC()
	th := &protocol.Thread{ThreadID: thread, Tenant: tenant, CreatedAt: now, UpdatedAt: now, Status: protocol.ThreadIdle, Owner: owner,
		Title: mark, Head: "e1-2", Epoch: 1, LastRunID: thread + "-r2"}
	if _, err := e.stores.Threads.Put(ctx, th, 0); err != nil {
		t.Fatal(err)
	}
	for i, run := range []string{thread + "-r1", thread + "-r2"} {
		fin := now
		rec := &protocol.Run{RunID: run, ThreadID: thread, Tenant: tenant, Agent: "chatbot", Status: protocol.StatusSuccess,
			CreatedAt: now, FinishedAt: &fin, Error: mark}
		if _, err := e.stores.Runs.Create(ctx, rec); err != nil {
			t.Fatal(err)
		}
		if err := e.stores.Threads.IndexRun(ctx, tenant, thread, run, now); err != nil {
			t.Fatal(err)
		}
		d := &kv.Delta{ID: kv.CheckpointID(1, i+1), RunID: run, Step: i + 1, Time: now,
			Update: state.Update{Values: map[string]json.RawMessage{"note": json.RawMessage(`"` + mark + `"`)}}}
		if i > 0 {
			d.Parent = kv.CheckpointID(1, i)
		}
		if _, err := e.stores.Checkpoints.Put(ctx, tenant, thread, d); err != nil {
			t.Fatal(err)
		}
		e.put(t, e.names.UsageBucket(), bus.Key(tenant, "run", run), `{"note":"`+mark+`"}`)
		for _, kind := range []string{protocol.KindLifecycle, protocol.KindMessages} {
			e.publish(t, e.names.EventSubject(tenant, thread, run, kind), nil,
				fmt.Sprintf(`{"type":"x","run_id":%q,"thread_id":%q,"tenant":%q,"data":%q}`, run, thread, tenant, mark))
		}
	}
	e.put(t, e.names.UsageBucket(), bus.Key(tenant, "thread", thread), `{"note":"`+mark+`"}`)
	// A queued request no worker took yet, and a dead letter.
	req := fmt.Sprintf(`{"run_id":%q,"thread_id":%q,"tenant":%q,"input":{"messages":[{"role":"user","content":%q}]}}`, thread+"-r3", thread, tenant, mark)
	e.publish(t, e.names.RunSubject(tenant, thread), nats.Header{"Nats-Msg-Id": []string{tenant + "." + thread + "-r3"}}, req)
	e.publish(t, e.names.DLQSubject(tenant, thread), nil, req)
	// Memory: the thread's cursor, its memory jobs (scheduled, due,
	// dead-lettered), and the owner's notes (which are the user's, not
	// the thread's).
	if err := e.mem.SetCursor(ctx, tenant, owner, thread, memory.Cursor{MessageID: mark}, 0); err != nil {
		t.Fatal(err)
	}
	if err := e.mem.EnqueueMemoryJob(ctx, middleware.MemoryJob{Tenant: tenant, User: owner, Thread: thread, Agent: mark, Debounce: time.Hour}); err != nil {
		t.Fatal(err)
	}
	payload := fmt.Sprintf(`{"tenant":%q,"user":%q,"thread":%q,"agent":%q}`, tenant, owner, thread, mark)
	if _, err := jobs.Enqueue(ctx, e.js, e.names, jobs.Spec{Kind: memory.JobKind, Tokens: []string{tenant, owner}, Key: thread, ID: mark + "-due", Data: []byte(payload)}); err != nil {
		t.Fatal(err)
	}
	e.publish(t, e.names.DLQJobSubject(memory.JobKind), nil, payload)
	if _, err := compact.Enqueue(ctx, e.js, e.names, compact.Request{JobID: thread + "-c1", Tenant: tenant, ThreadID: thread, Agent: "chatbot"}); err != nil {
		t.Fatal(err)
	}
	// Files: two written, one removed again.
	wd := files.NewObjectStore(e.obj, e.index, tenant, thread)
	for _, p := range []string{"/notes.md", "/dir/removed.txt"} {
		if err := wd.Write(ctx, p, []byte(mark+" in "+p)); err != nil {
			t.Fatal(err)
		}
	}
	if err := wd.Remove(ctx, "/dir/removed.txt"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-e.js.PublishAsyncComplete():
	case <-time.After(natstest.Patience):
		t.Fatal("run index writes not acknowledged")
	}
}

func (e *env) put(t *testing.T, bucket, key, value string) {
	t.Helper()
	b, err := e.js.KeyValue(context.Background(), bucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.PutString(context.Background(), key, value); err != nil {
		t.Fatal(err)
	}
}

func (e *env) publish(t *testing.T, subject string, h nats.Header, data string) {
	t.Helper()
	m := nats.NewMsg(subject)
	for k, v := range h {
		m.Header[k] = v
	}
	m.Data = []byte(data)
	if _, err := e.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatalf("publish %s: %v", subject, err)
	}
}

// leftovers reads every message of every stream of the account and
// returns those that belong to tenant's thread: its marker in the data or
// a decoded object name, or its keys in the subject.
func (e *env) leftovers(t *testing.T, tenant, thread string) []string {
	t.Helper()
	ctx := context.Background()
	mark := []byte(marker(tenant, thread))
	keys := []string{"." + tenant + "." + thread, "." + tenant + "." + thread + "-r", "." + tenant + ".run." + thread + "-r",
		"." + tenant + ".thread." + thread, "." + tenant + ".bob.cursor." + thread, "." + tenant + ".alice.cursor." + thread}
	var found []string
	for name := range e.js.StreamNames(ctx).Name() {
		st, err := e.js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		for seq := uint64(1); ; {
			m, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(">"))
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				break
			}
			if err != nil {
				t.Fatalf("read %s: %v", name, err)
			}
			seq = m.Sequence + 1
			what := name + " " + m.Subject
			if bytes.Contains(m.Data, mark) {
				found = append(found, what+": content")
				continue
			}
			for _, k := range keys {
				if strings.HasSuffix(m.Subject, k) || strings.Contains(m.Subject, k+".") {
					found = append(found, what+": key")
				}
			}
			if i := strings.Index(m.Subject, ".M."); strings.HasPrefix(m.Subject, "$O.") && i > 0 {
				if n, err := base64.URLEncoding.DecodeString(m.Subject[i+3:]); err == nil && strings.HasPrefix(string(n), tenant+"/"+thread+"/") {
					found = append(found, what+": object "+string(n))
				}
			}
		}
	}
	return found
}

// The thread's data is gone from every stream, bucket and object store,
// old revisions and delete markers included; the same-named thread of
// another tenant and another thread of the tenant keep all of theirs.
func TestDeleteThreadLeavesNothing(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	e.seed(t, "acme", "h1", "alice")
	e.seed(t, "acme", "h2", "alice")
	e.seed(t, "globex", "h1", "alice")
	if got := e.leftovers(t, "acme", "h1"); len(got) < 15 {
		t.Fatalf("the seed left only %d traces of acme/h1, the scan sees too little: %v", len(got), got)
	}
	before2, beforeG := len(e.leftovers(t, "acme", "h2")), len(e.leftovers(t, "globex", "h1"))

	if err := e.eraser.DeleteThread(ctx, "acme", "h1", erase.ThreadOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := e.leftovers(t, "acme", "h1"); len(got) > 0 {
		t.Fatalf("after the deletion, acme/h1 left:\n%s", strings.Join(got, "\n"))
	}
	// Every read API answers not found.
	if _, _, err := e.stores.Threads.Get(ctx, "acme", "h1"); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("thread record: %v", err)
	}
	for _, run := range []string{"h1-r1", "h1-r2"} {
		if _, _, err := e.stores.Runs.Get(ctx, "acme", run); !errors.Is(err, kv.ErrNotFound) {
			t.Fatalf("run %s: %v", run, err)
		}
		runs, _ := e.js.KeyValue(ctx, e.names.RunsBucket())
		if _, err := runs.History(ctx, bus.Key("acme", run)); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatalf("history of run %s: %v (want no revision at all)", run, err)
		}
	}
	if ids, err := e.stores.Threads.RunIDs(ctx, "acme", "h1"); err != nil || len(ids) != 0 {
		t.Fatalf("run index: %v %v", ids, err)
	}
	if list, err := files.NewObjectStore(e.obj, e.index, "acme", "h1").List(ctx, "/"); err == nil && len(list) > 0 {
		t.Fatalf("workdir lists %v", list)
	}
	if _, err := e.obj.GetInfo(ctx, "acme/h1/notes.md", jetstream.GetObjectInfoShowDeleted()); !errors.Is(err, jetstream.ErrObjectNotFound) {
		t.Fatalf("object info: %v", err)
	}
	threads, err := e.stores.Threads.List(ctx, "acme")
	if err != nil || len(threads) != 1 || threads[0].ThreadID != "h2" {
		t.Fatalf("acme's threads after the deletion: %v %v", threads, err)
	}
	// The others are untouched.
	if n := len(e.leftovers(t, "acme", "h2")); n != before2 {
		t.Fatalf("acme/h2 had %d traces, now %d", before2, n)
	}
	if n := len(e.leftovers(t, "globex", "h1")); n != beforeG {
		t.Fatalf("globex/h1 had %d traces, now %d", beforeG, n)
	}
	if _, _, err := e.stores.Threads.Get(ctx, "globex", "h1"); err != nil {
		t.Fatalf("globex's h1: %v", err)
	}
	if data, err := files.NewObjectStore(e.obj, e.index, "globex", "h1").Read(ctx, "/notes.md"); err != nil || !bytes.Contains(data, []byte(marker("globex", "h1"))) {
		t.Fatalf("globex's h1 file: %q %v", data, err)
	}
	// A second deletion finds nothing.
	if err := e.eraser.DeleteThread(ctx, "acme", "h1", erase.ThreadOptions{}); !errors.Is(err, erase.ErrNotFound) {
		t.Fatalf("second deletion: %v, want not found", err)
	}
}

// A thread with an active run is refused busy, and stays as it was; a
// deletion cut short leaves the thread marked deleting, and the next one
// finishes it.
func TestDeleteThreadBusyAndResumed(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	e.seed(t, "acme", "h1", "alice")
	// A run holds the lease.
	_, _, err := e.stores.Threads.Mutate(ctx, "acme", "h1", func(th *protocol.Thread) error {
		th.Status = protocol.ThreadBusy
		th.Lease = &protocol.Lease{RunID: "h1-r9", Worker: "w1", Epoch: 2, AcquiredAt: time.Now(), RenewedAt: time.Now()}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	err = e.eraser.DeleteThread(ctx, "acme", "h1", erase.ThreadOptions{})
	var be *erase.BusyError
	if !errors.As(err, &be) || be.RunID != "h1-r9" || !errors.Is(err, erase.ErrBusy) {
		t.Fatalf("delete of a busy thread: %v, want busy with h1-r9", err)
	}
	th, _, err := e.stores.Threads.Get(ctx, "acme", "h1")
	if err != nil || th.Status != protocol.ThreadBusy {
		t.Fatalf("refused deletion changed the thread: %+v %v", th, err)
	}
	// A pending run (no lease) is active too.
	_, _, err = e.stores.Threads.Mutate(ctx, "acme", "h1", func(th *protocol.Thread) error {
		th.Status, th.Lease = protocol.ThreadIdle, nil
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.stores.Runs.Create(ctx, &protocol.Run{RunID: "h1-r4", ThreadID: "h1", Tenant: "acme", Status: protocol.StatusPending, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := e.eraser.DeleteThread(ctx, "acme", "h1", erase.ThreadOptions{}); !errors.Is(err, erase.ErrBusy) {
		t.Fatalf("delete with a pending run: %v, want busy", err)
	}
	// With cancel, a pending run is dropped with the thread (no worker
	// answers the cancel here: a pending run needs none).
	// First, a deletion that stops half way: the mark stays, and runs
	// releasing the thread do not clear it.
	next := *th
	next.Status, next.Lease = protocol.ThreadDeleting, nil
	_, rev, _ := e.stores.Threads.Get(ctx, "acme", "h1")
	if _, err := e.stores.Threads.Put(ctx, &next, rev); err != nil {
		t.Fatal(err)
	}
	got, _, err := e.stores.Threads.Mutate(ctx, "acme", "h1", func(th *protocol.Thread) error {
		th.Status = protocol.ThreadIdle // what a run ending would write
		return nil
	})
	if err != nil || got.Status != protocol.ThreadDeleting {
		t.Fatalf("a writer reopened a thread being deleted: %+v %v", got, err)
	}
	// Marked deleting: a second deletion goes on without cancel.
	if err := e.eraser.DeleteThread(ctx, "acme", "h1", erase.ThreadOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := e.leftovers(t, "acme", "h1"); len(got) > 0 {
		t.Fatalf("acme/h1 left:\n%s", strings.Join(got, "\n"))
	}
	if _, _, err := e.stores.Runs.Get(ctx, "acme", "h1-r4"); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("pending run record: %v", err)
	}
}

// Ids that are not tokens never reach a subject filter: "*" or ">" would
// purge other threads' data.
func TestDeleteRefusesWildcardIDs(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	e.seed(t, "acme", "h1", "alice")
	before := len(e.leftovers(t, "acme", "h1"))
	for _, id := range []string{"*", ">", "h1.>", "h1.*", "", "a b", "h1\x00"} {
		if err := e.eraser.DeleteThread(ctx, "acme", id, erase.ThreadOptions{Cancel: true}); !errors.Is(err, erase.ErrInvalid) {
			t.Errorf("DeleteThread(%q): %v, want invalid", id, err)
		}
		if err := e.eraser.DeleteThread(ctx, id, "h1", erase.ThreadOptions{}); !errors.Is(err, erase.ErrInvalid) {
			t.Errorf("DeleteThread(tenant %q): %v, want invalid", id, err)
		}
		if err := e.eraser.DeleteRun(ctx, "acme", "h1", id); !errors.Is(err, erase.ErrInvalid) {
			t.Errorf("DeleteRun(%q): %v, want invalid", id, err)
		}
		if _, err := e.eraser.EraseUser(ctx, "acme", id, erase.ThreadOptions{}); !errors.Is(err, erase.ErrInvalid) {
			t.Errorf("EraseUser(%q): %v, want invalid", id, err)
		}
	}
	if n := len(e.leftovers(t, "acme", "h1")); n != before {
		t.Fatalf("acme/h1 had %d traces, now %d", before, n)
	}
}

// A finished run goes with its events, usage, index entry and dead
// letters; the thread and its other run stay; an active run is refused.
func TestDeleteRun(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	e.seed(t, "acme", "h1", "alice")
	if err := e.eraser.DeleteRun(ctx, "acme", "h2", "h1-r1"); !errors.Is(err, erase.ErrNotFound) {
		t.Fatalf("run of another thread: %v, want not found", err)
	}
	if err := e.eraser.DeleteRun(ctx, "acme", "h1", "h1-r2"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.stores.Runs.Get(ctx, "acme", "h1-r2"); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("run record: %v", err)
	}
	events, _ := e.js.Stream(ctx, e.names.EventsStream())
	if _, err := events.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(e.names.RunEvents("acme", "h1", "h1-r2"))); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("events of the deleted run: %v", err)
	}
	if _, err := events.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(e.names.RunEvents("acme", "h1", "h1-r1"))); err != nil {
		t.Fatalf("events of the other run: %v", err)
	}
	ids, _ := e.stores.Threads.RunIDs(ctx, "acme", "h1")
	if len(ids) != 1 || ids[0] != "h1-r1" {
		t.Fatalf("run index: %v", ids)
	}
	th, _, err := e.stores.Threads.Get(ctx, "acme", "h1")
	if err != nil || th.LastRunID != "" || th.Head == "" {
		t.Fatalf("thread after deleting its last run: %+v %v", th, err)
	}
	if _, err := e.stores.Runs.Create(ctx, &protocol.Run{RunID: "h1-r5", ThreadID: "h1", Tenant: "acme", Status: protocol.StatusRunning, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := e.eraser.DeleteRun(ctx, "acme", "h1", "h1-r5"); !errors.Is(err, erase.ErrBusy) {
		t.Fatalf("running run: %v, want busy", err)
	}
}

// Erasing a user removes the threads they own and their memory; another
// user's thread and memory, and an unowned thread, stay.
func TestEraseUser(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	e.seed(t, "acme", "h1", "alice")
	e.seed(t, "acme", "h2", "alice")
	e.seed(t, "acme", "h3", "bob")
	e.seed(t, "globex", "h4", "alice")
	for _, u := range []string{"alice", "bob"} {
		if _, err := e.mem.AppendNote(ctx, "acme", u, "SECRET-note-of-"+u); err != nil {
			t.Fatal(err)
		}
		if _, err := e.mem.MergeFacts(ctx, "acme", u, []memory.Fact{{Content: "SECRET-fact-of-" + u, Confidence: 0.9}}, memory.MergeOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	out, err := e.eraser.EraseUser(ctx, "acme", "alice", erase.ThreadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(out.Threads, ",") != "h1,h2" && strings.Join(out.Threads, ",") != "h2,h1" {
		t.Fatalf("erased threads %v, want h1 and h2", out.Threads)
	}
	for _, h := range []string{"h1", "h2"} {
		if got := e.leftovers(t, "acme", h); len(got) > 0 {
			t.Fatalf("acme/%s left:\n%s", h, strings.Join(got, "\n"))
		}
	}
	if notes, err := e.mem.Notes(ctx, "acme", "alice"); err != nil || notes != "" {
		t.Fatalf("alice's notes: %q %v", notes, err)
	}
	if facts, err := e.mem.Facts(ctx, "acme", "alice"); err != nil || len(facts) != 0 {
		t.Fatalf("alice's facts: %v %v", facts, err)
	}
	memKV, _ := e.js.KeyValue(ctx, e.names.MemoryBucket())
	if keys, err := memKV.ListKeysFiltered(ctx, "acme.alice.>"); err == nil {
		for k := range keys.Keys() {
			t.Fatalf("memory key %s left", k)
		}
	}
	jobsStream, _ := e.js.Stream(ctx, e.names.JobsStream())
	if m, err := jobsStream.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(e.names.JobSubject(memory.JobKind, "acme", "alice"))); err == nil {
		t.Fatalf("alice's memory job left: %s", m.Data)
	}
	if notes, err := e.mem.Notes(ctx, "acme", "bob"); err != nil || !strings.Contains(notes, "SECRET-note-of-bob") {
		t.Fatalf("bob's notes: %q %v", notes, err)
	}
	for _, c := range [][2]string{{"acme", "h3"}, {"globex", "h4"}} {
		if _, _, err := e.stores.Threads.Get(ctx, c[0], c[1]); err != nil {
			t.Fatalf("%s/%s: %v", c[0], c[1], err)
		}
	}
}

// Without cancel, one busy thread of the user refuses the erasure before
// anything is touched.
func TestEraseUserBusyTouchesNothing(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	e.seed(t, "acme", "h1", "alice")
	e.seed(t, "acme", "h2", "alice")
	_, _, err := e.stores.Threads.Mutate(ctx, "acme", "h2", func(th *protocol.Thread) error {
		th.Status = protocol.ThreadBusy
		th.Lease = &protocol.Lease{RunID: "h2-r9", Worker: "w1", Epoch: 2, AcquiredAt: time.Now(), RenewedAt: time.Now()}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	before := len(e.leftovers(t, "acme", "h1"))
	if _, err := e.eraser.EraseUser(ctx, "acme", "alice", erase.ThreadOptions{}); !errors.Is(err, erase.ErrBusy) {
		t.Fatalf("erase with a busy thread: %v, want busy", err)
	}
	th, _, err := e.stores.Threads.Get(ctx, "acme", "h1")
	if err != nil || th.Status != protocol.ThreadIdle {
		t.Fatalf("h1 after the refused erasure: %+v %v", th, err)
	}
	if n := len(e.leftovers(t, "acme", "h1")); n != before {
		t.Fatalf("h1 had %d traces, now %d", before, n)
	}
}

// A thread's subagent threads (metadata parent_thread_id) go with it;
// DeleteThreads skips a thread that does not exist.
func TestDeleteThreadTakesItsSubagentThreads(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	e.seed(t, "acme", "lead", "alice")
	e.seed(t, "acme", "child", "alice")
	e.seed(t, "acme", "other", "alice")
	_, _, err := e.stores.Threads.Mutate(ctx, "acme", "child", func(th *protocol.Thread) error {
		th.Metadata = map[string]any{"parent_thread_id": "lead", "subagent": "researcher"}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	deleted, err := e.eraser.DeleteThreads(ctx, "acme", []string{"nope", "lead"}, erase.ThreadOptions{})
	if err != nil || len(deleted) != 1 || deleted[0] != "lead" {
		t.Fatalf("DeleteThreads: %v %v", deleted, err)
	}
	for _, h := range []string{"lead", "child"} {
		if got := e.leftovers(t, "acme", h); len(got) > 0 {
			t.Fatalf("acme/%s left:\n%s", h, strings.Join(got, "\n"))
		}
	}
	if _, _, err := e.stores.Threads.Get(ctx, "acme", "other"); err != nil {
		t.Fatalf("another thread: %v", err)
	}
}

// Deleting a thread through workdirs opened with the tenants' quotas (as
// the gateway and the workers open them) gives the tenant its file bytes
// back.
func TestDeleteThreadReturnsFileQuota(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	lim, err := limits.Open(ctx, e.js, bus.Settings{Names: e.names}, limits.Policy{Default: limits.Tenant{MaxFileBytes: 1 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	open := func(tenant, thread string) files.Workdir {
		return lim.Files(files.NewObjectStore(e.obj, e.index, tenant, thread), tenant)
	}
	for _, h := range []string{"h1", "h2"} {
		if _, _, err := e.stores.Threads.Mutate(ctx, "acme", h, func(*protocol.Thread) error { return nil }); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{"/big.bin", "/dir/" + marker("acme", h)} {
			if err := open("acme", h).Write(ctx, p, bytes.Repeat([]byte("x"), 500)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n, err := lim.FileBytes(ctx, "acme"); err != nil || n != 2000 {
		t.Fatalf("counted %d bytes (%v), want 2000", n, err)
	}
	eraser, err := erase.New(ctx, erase.Config{NC: e.nc, JS: e.js, Names: e.names, Stores: e.stores, Files: open, Settle: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := eraser.DeleteThread(ctx, "acme", "h1", erase.ThreadOptions{}); err != nil {
		t.Fatal(err)
	}
	if n, err := lim.FileBytes(ctx, "acme"); err != nil || n != 1000 {
		t.Fatalf("counted %d bytes (%v) after the deletion, want h2's 1000", n, err)
	}
	if got := e.leftovers(t, "acme", "h1"); len(got) > 0 {
		t.Fatalf("acme/h1 left:\n%s", strings.Join(got, "\n"))
	}
}
