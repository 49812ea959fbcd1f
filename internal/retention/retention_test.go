package retention

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/erase"
	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/jobs"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
)

// eventually bounds waits for what must happen, not how fast.
const eventually = 30 * time.Second

type env struct {
	t      *testing.T
	srv    *natstest.Server
	js     jetstream.JetStream
	names  bus.Names
	stores *kv.Stores
	ctx    context.Context
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := newEnvB(t)
	e.t = t
	return e
}

func newEnvB(t testing.TB) *env {
	t.Helper()
	srv := natstest.Start(t)
	nc := srv.Connect()
	settings := bus.Settings{AckWait: time.Second}.WithDefaults()
	natstest.Provision(t, nc, settings)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	stores, err := kv.Open(ctx, js, settings.Names)
	if err != nil {
		t.Fatal(err)
	}
	return &env{srv: srv, js: js, names: settings.Names, stores: stores, ctx: ctx}
}

// sweeper builds a sweeper over the env; now nil is the real clock.
func (e *env) sweeper(p Policy, now func() time.Time, eraser ThreadEraser) *Sweeper {
	store, err := e.js.ObjectStore(e.ctx, e.names.FilesBucket())
	if err != nil {
		e.t.Fatal(err)
	}
	index, err := e.js.KeyValue(e.ctx, e.names.ThreadsBucket())
	if err != nil {
		e.t.Fatal(err)
	}
	return New(Config{JS: e.js, Names: e.names, Stores: e.stores, Policy: p, Now: now, Eraser: eraser,
		Workdirs: func(tenant, thread string) files.Workdir { return files.NewObjectStore(store, index, tenant, thread) },
		Logger:   zaptest.NewLogger(e.t)})
}

func (e *env) sweep(s *Sweeper, tenant string) Report {
	e.t.Helper()
	rep, err := s.Sweep(e.ctx, tenant)
	if err != nil {
		e.t.Fatalf("sweep %s: %v", tenant, err)
	}
	return rep
}

// divide returns a time after everything stored so far and before
// everything stored after it.
func divide() time.Time {
	time.Sleep(30 * time.Millisecond)
	mid := time.Now()
	time.Sleep(30 * time.Millisecond)
	return mid
}

func at(t time.Time) func() time.Time { return func() time.Time { return t } }

func (e *env) publish(subject string, n int) {
	e.t.Helper()
	for i := range n {
		if _, err := e.js.Publish(e.ctx, subject, fmt.Appendf(nil, "%d", i)); err != nil {
			e.t.Fatal(err)
		}
	}
}

// count is the number of messages of a stream matching filter.
func (e *env) count(stream, filter string) uint64 {
	e.t.Helper()
	st, err := e.js.Stream(e.ctx, stream)
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := st.Info(e.ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		e.t.Fatal(err)
	}
	var n uint64
	for _, c := range info.State.Subjects {
		n += c
	}
	return n
}

// exists reports whether a bucket holds a live key.
func (e *env) exists(bucket, key string) bool {
	e.t.Helper()
	store, err := e.js.KeyValue(e.ctx, bucket)
	if err != nil {
		e.t.Fatal(err)
	}
	_, err = store.Get(e.ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return true
}

func (e *env) put(bucket, key string, v any) {
	e.t.Helper()
	store, err := e.js.KeyValue(e.ctx, bucket)
	if err != nil {
		e.t.Fatal(err)
	}
	data, _ := json.Marshal(v)
	if _, err := store.Put(e.ctx, key, data); err != nil {
		e.t.Fatal(err)
	}
}

func TestEventsAndDeadLettersOlderThanTheTenantsAgeGo(t *testing.T) {
	e := newEnv(t)
	n := e.names
	// Both sides of the cutoff, for two tenants; globex keeps forever.
	e.publish(n.EventSubject("acme", "h1", "r1", "lifecycle"), 3)
	e.publish(n.EventSubject("globex", "h1", "r1", "lifecycle"), 3)
	e.publish(n.DLQSubject("acme", "h1"), 2)
	e.publish(n.DLQSubject("globex", "h1"), 2)
	e.publish(n.DLQJobSubject("memory"), 1)
	mid := divide()
	e.publish(n.EventSubject("acme", "h2", "r2", "messages"), 2)
	e.publish(n.EventSubject("globex", "h2", "r2", "messages"), 2)
	e.publish(n.DLQSubject("acme", "h2"), 1)

	p := Policy{Tenants: map[string]Rules{"acme": {Events: time.Hour, DLQ: 2 * time.Hour}}}
	rep := e.sweep(e.sweeper(p, at(mid.Add(time.Hour)), nil), "acme")
	if rep.Events != 3 {
		t.Errorf("events purged %d, want 3", rep.Events)
	}
	// The dead-letter age is 2h: the same clock leaves every dead letter.
	if rep.DLQ != 0 {
		t.Errorf("dead letters purged %d, want 0", rep.DLQ)
	}
	if got := e.count(n.EventsStream(), "agent.events.acme.h1.>"); got != 0 {
		t.Errorf("acme's old events left: %d", got)
	}
	if got := e.count(n.EventsStream(), "agent.events.acme.h2.>"); got != 2 {
		t.Errorf("acme's young events: %d, want 2", got)
	}
	if got := e.count(n.EventsStream(), "agent.events.globex.>"); got != 5 {
		t.Errorf("globex's events: %d, want 5", got)
	}

	// An hour later every acme event is over its age, and the old dead
	// letters are over theirs.
	rep = e.sweep(e.sweeper(p, at(mid.Add(2*time.Hour)), nil), "acme")
	if rep.DLQ != 2 || rep.Events != 2 {
		t.Errorf("second sweep: %+v, want 2 dead letters and 2 events", rep)
	}
	if got := e.count(n.DLQStream(), "agent.dlq.runs.acme.>"); got != 1 {
		t.Errorf("acme's dead letters left: %d, want the young one", got)
	}
	if got := e.count(n.DLQStream(), "agent.dlq.>"); got != 1+2+1 {
		t.Errorf("dead letters left: %d, want acme's young one, globex's two and the job's", got)
	}
	if got := e.count(n.EventsStream(), "agent.events.>"); got != 5 {
		t.Errorf("events left: %d, want globex's 5", got)
	}
}

func finishedRun(tenant, thread, run string, status protocol.Status, finished time.Time) *protocol.Run {
	r := &protocol.Run{RunID: run, ThreadID: thread, Tenant: tenant, Agent: "chatbot", Status: status, CreatedAt: finished.Add(-time.Minute)}
	if status.Terminal() {
		r.FinishedAt = &finished
	}
	return r
}

func TestFinishedRunsOlderThanTheTenantsAgeGo(t *testing.T) {
	e := newEnv(t)
	now := time.Now()
	runs := []*protocol.Run{
		finishedRun("acme", "h1", "old", protocol.StatusSuccess, now.Add(-2*time.Hour)),
		finishedRun("acme", "h1", "young", protocol.StatusError, now.Add(-50*time.Minute)),
		finishedRun("acme", "h1", "running", protocol.StatusRunning, now.Add(-3*time.Hour)),
		finishedRun("globex", "h1", "old", protocol.StatusSuccess, now.Add(-2*time.Hour)),
	}
	for _, r := range runs {
		if _, err := e.stores.Runs.Create(e.ctx, r); err != nil {
			t.Fatal(err)
		}
		e.put(e.names.ThreadsBucket(), bus.Key(r.Tenant, r.ThreadID, "run", r.RunID), map[string]any{"created_at": r.CreatedAt})
	}
	// Two tenants, two ages: acme 1h, globex 3h.
	p := Policy{Default: Rules{Runs: 3 * time.Hour}, Tenants: map[string]Rules{"acme": {Runs: time.Hour}}}
	s := e.sweeper(p, nil, nil)
	if rep := e.sweep(s, "acme"); rep.Runs != 1 {
		t.Errorf("acme: %d runs removed, want 1", rep.Runs)
	}
	if rep := e.sweep(s, "globex"); rep.Runs != 0 {
		t.Errorf("globex: %d runs removed, want 0", rep.Runs)
	}
	want := map[string]bool{"acme.old": false, "acme.young": true, "acme.running": true, "globex.old": true}
	for key, live := range want {
		if got := e.exists(e.names.RunsBucket(), key); got != live {
			t.Errorf("run %s exists: %v, want %v", key, got, live)
		}
	}
	if e.exists(e.names.ThreadsBucket(), "acme.h1.run.old") || !e.exists(e.names.ThreadsBucket(), "acme.h1.run.young") {
		t.Error("the thread's run index does not follow the runs")
	}
	ids, err := e.stores.Threads.RunIDs(e.ctx, "acme", "h1")
	if err != nil || len(ids) != 2 {
		t.Errorf("acme h1 lists runs %v (%v), want young and running", ids, err)
	}
}

func TestUsageOlderThanTheTenantsAgeGoes(t *testing.T) {
	e := newEnv(t)
	now := time.Now().UTC()
	b := e.names.UsageBucket()
	e.put(b, "acme.run.old", protocol.RunUsage{RunID: "old", ThreadID: "h1", Tenant: "acme", UpdatedAt: now.Add(-48 * time.Hour)})
	e.put(b, "acme.thread.h1", protocol.ThreadUsage{ThreadID: "h1", Tenant: "acme", UpdatedAt: now.Add(-48 * time.Hour)})
	e.put(b, "acme.run.young", protocol.RunUsage{RunID: "young", ThreadID: "h2", Tenant: "acme", UpdatedAt: now.Add(-time.Hour)})
	e.put(b, "acme.thread.h2", protocol.ThreadUsage{ThreadID: "h2", Tenant: "acme", UpdatedAt: now.Add(-time.Hour)})
	e.put(b, "globex.run.old", protocol.RunUsage{RunID: "old", ThreadID: "h1", Tenant: "globex", UpdatedAt: now.Add(-48 * time.Hour)})
	p := Policy{Tenants: map[string]Rules{"acme": {Usage: 24 * time.Hour}}}
	if rep := e.sweep(e.sweeper(p, nil, nil), "acme"); rep.Usage != 2 {
		t.Errorf("usage removed %d, want 2", rep.Usage)
	}
	for key, live := range map[string]bool{"acme.run.old": false, "acme.thread.h1": false, "acme.run.young": true, "acme.thread.h2": true, "globex.run.old": true} {
		if got := e.exists(b, key); got != live {
			t.Errorf("usage %s exists: %v, want %v", key, got, live)
		}
	}
	// The thread's next run starts its totals again.
	if err := e.stores.Usage.Record(e.ctx, &protocol.RunUsage{RunID: "next", ThreadID: "h1", Tenant: "acme"}); err != nil {
		t.Fatalf("usage after its removal: %v", err)
	}
	if !e.exists(b, "acme.thread.h1") {
		t.Error("a removed thread total is not written again")
	}
}

func TestFilesNotWrittenForTheTenantsAgeGo(t *testing.T) {
	e := newEnv(t)
	for _, tenant := range []string{"acme", "globex"} {
		if _, err := e.stores.Threads.Put(e.ctx, &protocol.Thread{ThreadID: "h1", Tenant: tenant}, 0); err != nil {
			t.Fatal(err)
		}
	}
	s := e.sweeper(Policy{Tenants: map[string]Rules{"acme": {Files: time.Hour}}}, nil, nil)
	w := s.cfg.Workdirs("acme", "h1")
	g := s.cfg.Workdirs("globex", "h1")
	for _, p := range []string{"/old.txt", "/dir/old.md"} {
		if err := w.Write(e.ctx, p, []byte("old")); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.Write(e.ctx, "/old.txt", []byte("old")); err != nil {
		t.Fatal(err)
	}
	mid := divide()
	if err := w.Write(e.ctx, "/young.txt", []byte("young")); err != nil {
		t.Fatal(err)
	}
	s.cfg.Now = at(mid.Add(time.Hour))
	if rep := e.sweep(s, "acme"); rep.Files != 2 || rep.Content != 1 {
		t.Errorf("files removed %d, content %d, want 2 and 1 (both held the same)", rep.Files, rep.Content)
	}
	var left []string
	if err := w.Walk(e.ctx, "/", func(i files.Info) error { left = append(left, i.Path); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[0] != "/young.txt" {
		t.Errorf("acme's files left %v, want /young.txt", left)
	}
	if _, err := g.Read(e.ctx, "/old.txt"); err != nil {
		t.Errorf("globex's file: %v", err)
	}
	store, _ := e.js.ObjectStore(e.ctx, e.names.FilesBucket())
	if _, err := store.GetInfo(e.ctx, files.ContentObject("acme", "h1", files.ContentHash([]byte("old")))); !errors.Is(err, jetstream.ErrObjectNotFound) {
		t.Errorf("the removed files' content: %v", err)
	}
}

// Workdir content no file and no checkpoint names is collected once it
// is older than ContentGrace; content a checkpoint names stays (the files
// at that checkpoint), as does all content of a thread a run holds.
func TestUnnamedWorkdirContentIsCollected(t *testing.T) {
	e := newEnv(t)
	for _, th := range []*protocol.Thread{
		{ThreadID: "h1", Tenant: "acme"},
		{ThreadID: "busy", Tenant: "acme", Lease: &protocol.Lease{RunID: "r1", Epoch: 1}},
	} {
		if _, err := e.stores.Threads.Put(e.ctx, th, 0); err != nil {
			t.Fatal(err)
		}
	}
	s := e.sweeper(Policy{Tenants: map[string]Rules{"acme": {Checkpoints: 100}}}, nil, nil)
	w, busy := s.cfg.Workdirs("acme", "h1"), s.cfg.Workdirs("acme", "busy")
	for _, c := range []string{"checkpointed", "overwritten", "current"} {
		if err := w.Write(e.ctx, "/a.txt", []byte(c)); err != nil {
			t.Fatal(err)
		}
		if err := busy.Write(e.ctx, "/a.txt", []byte(c)); err != nil {
			t.Fatal(err)
		}
	}
	hash := func(s string) string { return files.ContentHash([]byte(s)) }
	d := &kv.Delta{ID: "e1-1", RunID: "r", Time: time.Now().UTC(), Files: []files.Change{{Path: "/a.txt", Hash: hash("checkpointed"), Size: 12}}}
	if _, err := e.stores.Checkpoints.Put(e.ctx, "acme", "h1", d); err != nil {
		t.Fatal(err)
	}
	if rep := e.sweep(s, "acme"); rep.Content != 0 {
		t.Fatalf("content younger than the grace collected: %d", rep.Content)
	}
	s.cfg.Now = at(time.Now().Add(ContentGrace + time.Minute))
	if rep := e.sweep(s, "acme"); rep.Content != 1 {
		t.Fatalf("content collected %d, want 1 (overwritten)", rep.Content)
	}
	store, _ := e.js.ObjectStore(e.ctx, e.names.FilesBucket())
	for thread, want := range map[string]map[string]bool{
		"h1":   {"checkpointed": true, "overwritten": false, "current": true},
		"busy": {"checkpointed": true, "overwritten": true, "current": true},
	} {
		for c, kept := range want {
			_, err := store.GetInfo(e.ctx, files.ContentObject("acme", thread, hash(c)))
			if kept != (err == nil) {
				t.Errorf("%s's %q: kept=%v, want %v (%v)", thread, c, err == nil, kept, err)
			}
		}
	}
}

// writeDelta stores a checkpoint delta adding one message.
func (e *env) writeDelta(tenant, thread, id, parent string) {
	e.t.Helper()
	d := &kv.Delta{ID: id, Parent: parent, RunID: "r", Time: time.Now().UTC(),
		Update: state.Update{Messages: []model.Message{{ID: id, Role: "user", Content: id}}}}
	if _, err := e.stores.Checkpoints.Put(e.ctx, tenant, thread, d); err != nil {
		e.t.Fatal(err)
	}
}

func TestCheckpointsOffTheHistoryBeyondTheNewestGo(t *testing.T) {
	e := newEnv(t)
	// h1's history is c1 <- c2 <- c3 (head); b1 <- b2 branch off c1, left
	// by a rollback. h2 has the same, but a run holds its lease.
	for _, thread := range []string{"h1", "h2"} {
		e.writeDelta("acme", thread, "c1", "")
		e.writeDelta("acme", thread, "c2", "c1")
		e.writeDelta("acme", thread, "b1", "c1")
		e.writeDelta("acme", thread, "b2", "b1")
		e.writeDelta("acme", thread, "c3", "c2")
		th := &protocol.Thread{ThreadID: thread, Tenant: "acme", Head: "c3"}
		if thread == "h2" {
			th.Lease = &protocol.Lease{RunID: "r9", Worker: "w", Epoch: 1}
		}
		if _, err := e.stores.Threads.Put(e.ctx, th, 0); err != nil {
			t.Fatal(err)
		}
	}
	// h3's head names a delta the sweep does not see: what its history
	// holds is unknown, so it keeps everything.
	for _, id := range []string{"x1", "x2", "x3", "x4"} {
		e.writeDelta("acme", "h3", id, "")
	}
	if _, err := e.stores.Threads.Put(e.ctx, &protocol.Thread{ThreadID: "h3", Tenant: "acme", Head: "missing"}, 0); err != nil {
		t.Fatal(err)
	}
	p := Policy{Tenants: map[string]Rules{"acme": {Checkpoints: 2}}}
	// Younger than the grace: nothing goes.
	if rep := e.sweep(e.sweeper(p, nil, nil), "acme"); rep.Checkpoints != 0 {
		t.Fatalf("checkpoints younger than %s removed: %d", CheckpointGrace, rep.Checkpoints)
	}
	later := at(time.Now().Add(CheckpointGrace + time.Minute))
	if rep := e.sweep(e.sweeper(p, later, nil), "acme"); rep.Checkpoints != 1 {
		t.Fatalf("checkpoints removed %d, want 1 (b1: off the history, not among the newest 2)", rep.Checkpoints)
	}
	b := e.names.CheckpointsBucket()
	for key, live := range map[string]bool{"acme.h1.b1": false, "acme.h1.b2": true, "acme.h1.c1": true, "acme.h1.c2": true, "acme.h1.c3": true, "acme.h2.b1": true, "acme.h3.x1": true} {
		if got := e.exists(b, key); got != live {
			t.Errorf("checkpoint %s exists: %v, want %v", key, got, live)
		}
	}
	st, chain, err := e.stores.Checkpoints.Load(e.ctx, "acme", "h1", "c3")
	if err != nil || len(chain) != 3 || len(st.Messages) != 3 {
		t.Fatalf("h1's state after the sweep: %v, %d deltas, %d messages", err, len(chain), len(st.Messages))
	}
}

// A branch time travel left behind (reached through a delta's replaced) is
// history: the sweep keeps it, and removes a rolled-back run's checkpoint.
func TestCheckpointsOfATimeTravelBranchStay(t *testing.T) {
	e := newEnv(t)
	// c1 <- c2 <- c3 was the history; a fork f1 on c1 replaced c3, and a
	// run added n1 after it. r1 (on c1) was rolled back.
	e.writeDelta("acme", "h1", "c1", "")
	e.writeDelta("acme", "h1", "c2", "c1")
	e.writeDelta("acme", "h1", "c3", "c2")
	e.writeDelta("acme", "h1", "r1", "c1")
	fork := &kv.Delta{ID: "f1", Parent: "c1", Replaced: "c3", Source: kv.SourceFork, Time: time.Now().UTC()}
	if _, err := e.stores.Checkpoints.Put(e.ctx, "acme", "h1", fork); err != nil {
		t.Fatal(err)
	}
	e.writeDelta("acme", "h1", "n1", "f1")
	if _, err := e.stores.Threads.Put(e.ctx, &protocol.Thread{ThreadID: "h1", Tenant: "acme", Head: "n1"}, 0); err != nil {
		t.Fatal(err)
	}
	later := at(time.Now().Add(CheckpointGrace + time.Minute))
	if rep := e.sweep(e.sweeper(Policy{Tenants: map[string]Rules{"acme": {Checkpoints: 1}}}, later, nil), "acme"); rep.Checkpoints != 1 {
		t.Fatalf("checkpoints removed %d, want 1 (r1)", rep.Checkpoints)
	}
	b := e.names.CheckpointsBucket()
	for _, id := range []string{"c1", "c2", "c3", "f1", "n1"} {
		if !e.exists(b, "acme.h1."+id) {
			t.Errorf("checkpoint %s of the history was removed", id)
		}
	}
	if e.exists(b, "acme.h1.r1") {
		t.Error("the rolled-back checkpoint r1 was kept")
	}
}

// eraser deletes threads' records, as internal/erase does (with the rest
// of each thread): it skips a thread already gone, and refuses the whole
// call, touching none, when one is busy (here: titled "taken").
type eraser struct {
	e       *env
	mu      sync.Mutex
	deleted []string
}

func (x *eraser) DeleteThreads(ctx context.Context, tenant string, threads []string) ([]string, error) {
	revs := map[string]uint64{}
	for _, thread := range threads {
		th, rev, err := x.e.stores.Threads.Get(ctx, tenant, thread)
		if errors.Is(err, kv.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if th.Lease != nil || th.Title == "taken" {
			return nil, &BusyError{Thread: thread, Err: errors.New("a run took it")}
		}
		revs[thread] = rev
	}
	store, err := x.e.js.KeyValue(ctx, x.e.names.ThreadsBucket())
	if err != nil {
		return nil, err
	}
	var deleted []string
	for _, thread := range threads {
		rev, ok := revs[thread]
		if !ok {
			continue
		}
		// Another sweep deleting it at once: gone, skipped.
		if err := store.Purge(ctx, bus.Key(tenant, thread), jetstream.LastRevision(rev)); err != nil {
			continue
		}
		deleted = append(deleted, thread)
	}
	x.mu.Lock()
	for _, thread := range deleted {
		x.deleted = append(x.deleted, tenant+"."+thread)
	}
	x.mu.Unlock()
	return deleted, nil
}

func TestThreadsIdleForTheTenantsAgeAreDeleted(t *testing.T) {
	e := newEnv(t)
	put := func(th *protocol.Thread) {
		th.UpdatedAt = time.Now().UTC()
		if _, err := e.stores.Threads.Put(e.ctx, th, 0); err != nil {
			t.Fatal(err)
		}
	}
	put(&protocol.Thread{ThreadID: "idle", Tenant: "acme"})
	put(&protocol.Thread{ThreadID: "idle2", Tenant: "acme"})
	put(&protocol.Thread{ThreadID: "leased", Tenant: "acme", Lease: &protocol.Lease{RunID: "r1", Worker: "w"}})
	put(&protocol.Thread{ThreadID: "queued", Tenant: "acme"})
	put(&protocol.Thread{ThreadID: "steered", Tenant: "acme", Preempt: []protocol.Preemption{{RunID: "r2", Strategy: "steer"}}})
	put(&protocol.Thread{ThreadID: "idle", Tenant: "globex"})
	// A run took this one after the sweep read it: the eraser refuses.
	put(&protocol.Thread{ThreadID: "taken", Tenant: "acme", Title: "taken"})
	if _, err := e.js.Publish(e.ctx, e.names.RunSubject("acme", "queued"), []byte("{}")); err != nil {
		t.Fatal(err)
	}
	mid := divide()
	put(&protocol.Thread{ThreadID: "young", Tenant: "acme"})

	x := &eraser{e: e}
	p := Policy{Tenants: map[string]Rules{"acme": {ThreadsIdle: 24 * time.Hour}}}
	var wg sync.WaitGroup
	reps := make([]Report, 2)
	for i := range reps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			if reps[i], err = e.sweeper(p, at(mid.Add(24*time.Hour)), x).Sweep(e.ctx, "acme"); err != nil {
				t.Errorf("sweep %d: %v", i, err)
			}
		}()
	}
	natstest.Wait(t, &wg, "the concurrent sweeps")
	if got := reps[0].Threads + reps[1].Threads; got != 2 {
		t.Errorf("threads deleted %d by two sweeps at once, want 2", got)
	}
	slices.Sort(x.deleted)
	if !slices.Equal(x.deleted, []string{"acme.idle", "acme.idle2"}) {
		t.Errorf("deleted %v, want acme.idle and acme.idle2", x.deleted)
	}
	for key, live := range map[string]bool{"acme.idle": false, "acme.idle2": false, "acme.taken": true, "acme.queued": true, "acme.leased": true, "acme.steered": true, "acme.young": true, "globex.idle": true} {
		if got := e.exists(e.names.ThreadsBucket(), key); got != live {
			t.Errorf("thread %s exists: %v, want %v", key, got, live)
		}
	}
	// Without an eraser the rule is skipped, not failed.
	if _, err := e.sweeper(p, at(mid.Add(48*time.Hour)), nil).Sweep(e.ctx, "acme"); err != nil {
		t.Errorf("sweep without an eraser: %v", err)
	}
}

// Two workers sweeping one tenant at once remove everything once and
// neither fails.
func TestTwoSweepsAtOnceRemoveEverythingOnce(t *testing.T) {
	e := newEnv(t)
	old := time.Now().Add(-2 * time.Hour)
	const n = 40
	for i := range n {
		r := finishedRun("acme", "h1", fmt.Sprintf("r%d", i), protocol.StatusSuccess, old)
		if _, err := e.stores.Runs.Create(e.ctx, r); err != nil {
			t.Fatal(err)
		}
		e.put(e.names.UsageBucket(), fmt.Sprintf("acme.run.r%d", i), protocol.RunUsage{RunID: r.RunID, ThreadID: "h1", Tenant: "acme", UpdatedAt: old})
	}
	e.publish(e.names.EventSubject("acme", "h1", "r1", "lifecycle"), n)
	p := Policy{Tenants: map[string]Rules{"acme": {Runs: time.Hour, Usage: time.Hour, Events: time.Hour}}}
	later := at(time.Now().Add(time.Hour))
	var wg sync.WaitGroup
	reps := make([]Report, 2)
	errs := make([]error, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reps[i], errs[i] = e.sweeper(p, later, nil).Sweep(e.ctx, "acme")
		}()
	}
	natstest.Wait(t, &wg, "the concurrent sweeps")
	for i, err := range errs {
		if err != nil {
			t.Errorf("sweep %d: %v", i, err)
		}
	}
	if got := reps[0].Runs + reps[1].Runs; got != n {
		t.Errorf("runs removed %d + %d, want %d in all", reps[0].Runs, reps[1].Runs, n)
	}
	if got := reps[0].Usage + reps[1].Usage; got != n {
		t.Errorf("usage removed %d + %d, want %d in all", reps[0].Usage, reps[1].Usage, n)
	}
	if got := reps[0].Events + reps[1].Events; got != n {
		t.Errorf("events purged %d + %d, want %d in all", reps[0].Events, reps[1].Events, n)
	}
	runs, err := e.stores.Runs.List(e.ctx, "acme", nil)
	if err != nil || len(runs) != 0 {
		t.Errorf("runs left: %d (%v)", len(runs), err)
	}
}

// The schedule plans a sweep per tenant through the jobs queue, and a
// second worker's start leaves the schedule as it is.
func TestScheduledSweepRunsThroughTheJobsQueue(t *testing.T) {
	e := newEnv(t)
	r := finishedRun("acme", "h1", "old", protocol.StatusSuccess, time.Now().Add(-2*time.Hour))
	if _, err := e.stores.Runs.Create(e.ctx, r); err != nil {
		t.Fatal(err)
	}
	if _, err := e.stores.Threads.Put(e.ctx, &protocol.Thread{ThreadID: "h1", Tenant: "acme"}, 0); err != nil {
		t.Fatal(err)
	}
	if err := Schedule(e.ctx, e.js, e.names, time.Second); err != nil {
		t.Fatal(err)
	}
	subject := e.names.JobScheduleSubject(JobKind, planToken)
	first, err := bus.GetMsgFromLeader(e.ctx, e.js, e.names.JobsStream(), bus.MsgQuery{LastBySubject: subject})
	if err != nil {
		t.Fatal(err)
	}
	if err := Schedule(e.ctx, e.js, e.names, time.Second); err != nil {
		t.Fatal(err)
	}
	again, err := bus.GetMsgFromLeader(e.ctx, e.js, e.names.JobsStream(), bus.MsgQuery{LastBySubject: subject})
	if err != nil || again.Sequence != first.Sequence {
		t.Fatalf("a second start rewrote the schedule: %d then %d (%v)", first.Sequence, again.Sequence, err)
	}

	// The default covers acme, found through its thread.
	s := e.sweeper(Policy{Interval: time.Second, Default: Rules{Runs: time.Hour}}, nil, nil)
	runner, err := jobs.NewRunner(e.ctx, e.js, jobs.Config{Settings: bus.Settings{AckWait: time.Second}, Handlers: map[string]jobs.Handler{JobKind: s.Handle},
		Logger: zaptest.NewLogger(t), ShutdownGrace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() { done <- runner.Run(ctx) }()
	defer func() { cancel(); natstest.Recv(t, done, "the job runner to stop") }()
	deadline := time.Now().Add(eventually)
	for e.exists(e.names.RunsBucket(), "acme.old") {
		if time.Now().After(deadline) {
			t.Fatal("the scheduled sweep did not remove the old run")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := Unschedule(e.ctx, e.js, e.names); err != nil {
		t.Fatal(err)
	}
	if _, err := bus.GetMsgFromLeader(e.ctx, e.js, e.names.JobsStream(), bus.MsgQuery{LastBySubject: subject}); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("the schedule after Unschedule: %v", err)
	}
}

// A sweep with more to remove than its job's time allows stops before the
// deadline without failing, and the next sweep goes on.
func TestASweepStopsAtItsBudgetAndTheNextGoesOn(t *testing.T) {
	e := newEnv(t)
	old := time.Now().Add(-2 * time.Hour)
	const n = 3000
	for i := range n {
		data, _ := json.Marshal(finishedRun("acme", "h1", fmt.Sprintf("r%d", i), protocol.StatusSuccess, old))
		if _, err := e.js.PublishAsync("$KV."+e.names.RunsBucket()+".acme.r"+fmt.Sprint(i), data); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-e.js.PublishAsyncComplete():
	case <-time.After(eventually):
		t.Fatal("seeding did not finish")
	}
	defer func(m time.Duration) { budgetMargin = m }(budgetMargin)
	budgetMargin = time.Second
	s := e.sweeper(Policy{Tenants: map[string]Rules{"acme": {Runs: time.Hour}}}, nil, nil)
	removed, stopped := 0, 0
	deadline := time.Now().Add(2 * time.Minute)
	for sweeps := 1; ; sweeps++ {
		ctx, cancel := context.WithTimeout(e.ctx, 3*time.Second)
		rep, err := s.Sweep(ctx, "acme")
		cancel()
		if err != nil {
			t.Fatalf("sweep %d: %v", sweeps, err)
		}
		removed += rep.Runs
		left, err := e.stores.Runs.List(e.ctx, "acme", nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(left) == 0 {
			break
		}
		stopped++
		// A removal in flight when the budget ran out may be done and not
		// counted: at most one per sweep.
		if lost := n - len(left) - removed; lost < 0 || lost > sweeps {
			t.Fatalf("after %d sweeps: %d removed and %d left of %d", sweeps, removed, len(left), n)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sweeps and %d runs left", sweeps, len(left))
		}
	}
	t.Logf("%d runs removed by %d sweeps, %d of them stopped at their budget", n, stopped+1, stopped)
}

// The server removes a finished run's record at its TTL and leaves its
// entry in the thread's run list: the sweep removes entries older than
// the age whose record is gone, and no other.
func TestRunListEntriesOfExpiredRunsGo(t *testing.T) {
	e := newEnv(t)
	running := finishedRun("acme", "h1", "running", protocol.StatusRunning, time.Now())
	if _, err := e.stores.Runs.Create(e.ctx, running); err != nil {
		t.Fatal(err)
	}
	b := e.names.ThreadsBucket()
	for _, run := range []string{"expired", "running"} {
		e.put(b, bus.Key("acme", "h1", "run", run), map[string]any{"created_at": time.Now()})
	}
	e.put(b, bus.Key("globex", "h1", "run", "expired"), map[string]any{"created_at": time.Now()})
	mid := divide()
	// Just submitted: its record may not be written yet.
	e.put(b, bus.Key("acme", "h1", "run", "submitted"), map[string]any{"created_at": time.Now()})

	p := Policy{Tenants: map[string]Rules{"acme": {Runs: time.Hour}}}
	e.sweep(e.sweeper(p, at(mid.Add(time.Hour)), nil), "acme")
	for key, live := range map[string]bool{"acme.h1.run.expired": false, "acme.h1.run.running": true, "acme.h1.run.submitted": true, "globex.h1.run.expired": true} {
		if got := e.exists(b, key); got != live {
			t.Errorf("run list entry %s exists: %v, want %v", key, got, live)
		}
	}
}

// Erase deletes idle threads wholly, as DELETE /threads does: the thread
// record, its runs, checkpoints and events go; a young thread and another
// tenant's thread of the same id stay.
func TestIdleThreadsAreErasedWholly(t *testing.T) {
	e := newEnv(t)
	n := e.names
	seed := func(tenant, thread string) {
		t.Helper()
		if _, err := e.stores.Threads.Put(e.ctx, &protocol.Thread{ThreadID: thread, Tenant: tenant, UpdatedAt: time.Now().UTC()}, 0); err != nil {
			t.Fatal(err)
		}
		run := thread + "-r1"
		if _, err := e.stores.Runs.Create(e.ctx, finishedRun(tenant, thread, run, protocol.StatusSuccess, time.Now().UTC())); err != nil {
			t.Fatal(err)
		}
		e.writeDelta(tenant, thread, "c1", "")
		e.publish(n.EventSubject(tenant, thread, run, protocol.KindLifecycle), 2)
	}
	seed("acme", "old")
	seed("globex", "old")
	mid := divide()
	seed("acme", "young")

	eraser, err := erase.New(e.ctx, erase.Config{JS: e.js, Names: n, Stores: e.stores, Settle: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	p := Policy{Tenants: map[string]Rules{"acme": {ThreadsIdle: time.Hour}}}
	rep := e.sweep(e.sweeper(p, at(mid.Add(time.Hour)), Erase(eraser)), "acme")
	if rep.Threads != 1 {
		t.Errorf("threads deleted: %d, want 1", rep.Threads)
	}
	for _, c := range []struct {
		tenant, thread string
		live           bool
	}{{"acme", "old", false}, {"acme", "young", true}, {"globex", "old", true}} {
		key := c.tenant + "." + c.thread
		if got := e.exists(n.ThreadsBucket(), key); got != c.live {
			t.Errorf("thread %s exists: %v, want %v", key, got, c.live)
		}
		if got := e.exists(n.RunsBucket(), key+"-r1"); got != c.live {
			t.Errorf("run %s-r1 exists: %v, want %v", key, got, c.live)
		}
		if got := e.exists(n.CheckpointsBucket(), key+".c1"); got != c.live {
			t.Errorf("checkpoint %s.c1 exists: %v, want %v", key, got, c.live)
		}
		want := uint64(0)
		if c.live {
			want = 2
		}
		if got := e.count(n.EventsStream(), n.ThreadEvents(c.tenant, c.thread)); got != want {
			t.Errorf("events of %s: %d, want %d", key, got, want)
		}
	}
}
