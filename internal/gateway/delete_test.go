package gateway

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/erase"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/protocol"
)

// After DELETE /threads/{id} every read path of the API (what the web
// console shows too) answers 404 for the thread and its runs, and the
// bucket keys are gone with their history.
func TestDeleteThreadOverHTTP(t *testing.T) {
	e := newEnvWith(t, nil, func(s *Server) { s.cfg.Files = objectStoreFiles(t, s.js, s.names) })
	e.startWorker(textModel("SECRET answer", 2, 0))
	r1 := e.do("POST", "/threads/d1/runs/wait?format=natsagent", input("hello")).expect(t, http.StatusOK).run(t)
	r2 := e.do("POST", "/threads/d1/runs/wait?format=natsagent", input("again")).expect(t, http.StatusOK).run(t)
	e.do("PUT", "/threads/d1/files/notes.md", "SECRET file").expect(t, http.StatusCreated)
	e.do("POST", "/threads/d2/runs/wait?format=natsagent", input("keep me")).expect(t, http.StatusOK)
	e.do("GET", "/threads/d1/files/notes.md", nil).expect(t, http.StatusOK)

	r := e.do("DELETE", "/threads/d1", nil).expect(t, http.StatusNoContent)
	if len(r.body) != 0 {
		t.Fatalf("204 with a body: %s", r.body)
	}
	// The workdir lists nothing, as for any thread without files.
	e.do("GET", "/threads/d1/files", nil).expect(t, http.StatusOK).decode(t, &[]any{})
	if r := e.do("GET", "/threads/d1/files", nil); strings.TrimSpace(string(r.body)) != "[]" {
		t.Errorf("the deleted thread's workdir lists %s", r.body)
	}
	paths := []string{"/threads/d1", "/threads/d1/state", "/threads/d1/history", "/threads/d1/runs", "/threads/d1/usage",
		"/threads/d1/files/notes.md"}
	for _, run := range []string{r1.RunID, r2.RunID} {
		p := "/threads/d1/runs/" + run
		paths = append(paths, p, p+"/usage", p+"/join?format=natsagent", p+"/stream")
	}
	// Each 404 asks the leader at most once per record: a missing record
	// is not a write in flight to wait for (kv.GetLatest's settle wait
	// cost 2 s an answer, some 20 reads).
	gets, err := e.nc.SubscribeSync("$JS.API.STREAM.MSG.GET.*")
	if err != nil {
		t.Fatal(err)
	}
	defer gets.Unsubscribe()
	recordGets := func() int {
		if err := e.nc.Flush(); err != nil {
			t.Fatal(err)
		}
		n := 0
		for {
			m, err := gets.NextMsg(0)
			if err != nil {
				return n
			}
			if s := strings.TrimPrefix(m.Subject, "$JS.API.STREAM.MSG.GET.KV_"); s == e.settings.Names.RunsBucket() || s == e.settings.Names.ThreadsBucket() {
				n++
			}
		}
	}
	for _, p := range paths {
		recordGets()
		r := e.do("GET", p, nil)
		if r.status != http.StatusNotFound {
			t.Errorf("GET %s after the deletion: %d %s", p, r.status, r.body)
		}
		if n := recordGets(); n > 2 {
			t.Errorf("GET %s after the deletion read the records' leader %d times, want 2 at most", p, n)
		}
		if strings.Contains(string(r.body), "SECRET") {
			t.Errorf("GET %s shows deleted content: %s", p, r.body)
		}
	}
	var list []protocol.Thread
	e.do("GET", "/threads", nil).expect(t, http.StatusOK).decode(t, &list)
	if len(list) != 1 || list[0].ThreadID != "d2" {
		t.Fatalf("threads after the deletion: %+v", list)
	}
	runs, _ := e.js.KeyValue(context.Background(), e.settings.Names.RunsBucket())
	for _, run := range []string{r1.RunID, r2.RunID} {
		if _, err := runs.History(context.Background(), "default."+run); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatalf("history of %s: %v", run, err)
		}
	}
	e.do("DELETE", "/threads/d1", nil).expect(t, http.StatusNotFound)
	// A new run on the id starts a new, empty thread.
	e.do("POST", "/threads/d1/runs/wait?format=natsagent", input("fresh")).expect(t, http.StatusOK)
	var st struct {
		Values struct {
			Messages []map[string]any `json:"messages"`
		} `json:"values"`
	}
	e.do("GET", "/threads/d1/state", nil).expect(t, http.StatusOK).decode(t, &st)
	if n := len(st.Values.Messages); n != 2 {
		t.Fatalf("the new thread d1 has %d messages, want 2 (its own run only)", n)
	}
}

// A thread with a running run is 409 busy; with ?cancel=true the run is
// cancelled and the thread deleted. A running run cannot be deleted on
// its own.
func TestDeleteBusyThread(t *testing.T) {
	// A long settle delay keeps the thread marked deleting while the test
	// submits to it, however slow the machine.
	e := newEnvWith(t, textModel(strings.Repeat("y ", 500), 500, 20*time.Millisecond), func(s *Server) {
		var err error
		s.eraser, err = erase.New(context.Background(), erase.Config{NC: s.nc, JS: s.js, Names: s.names, Stores: s.stores, Settle: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
	})
	rec := e.do("POST", "/threads/b1/runs", input("go")).expect(t, http.StatusOK).run(t)
	waitStatus(t, e, rec.RunID, protocol.StatusRunning)
	r := e.do("DELETE", "/threads/b1", nil).expect(t, http.StatusConflict)
	if er := r.apiError(t); er.Code != protocol.CodeBusy || !strings.Contains(er.Message, rec.RunID) {
		t.Fatalf("busy answer %+v", er)
	}
	e.do("DELETE", "/threads/b1/runs/"+rec.RunID, nil).expect(t, http.StatusConflict)
	e.do("DELETE", "/threads/b1?cancel=maybe", nil).expect(t, http.StatusBadRequest)
	// A run submitted while the thread is being deleted is refused.
	done := make(chan response, 1)
	go func() { done <- e.do("DELETE", "/threads/b1?cancel=true", nil) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		th, _, err := e.stores.Threads.Get(context.Background(), "default", "b1")
		if err == nil && th.Status == protocol.ThreadDeleting {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the thread was never marked deleting (%v)", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if r := e.do("POST", "/threads/b1/runs", input("sneak in")); r.status == http.StatusOK {
		t.Fatalf("a run was accepted on a thread being deleted: %s", r.body)
	}
	(<-done).expect(t, http.StatusNoContent)
	if _, _, err := e.stores.Runs.Get(context.Background(), "default", rec.RunID); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("the cancelled run's record: %v", err)
	}
	e.do("GET", "/threads/b1", nil).expect(t, http.StatusNotFound)
}

func waitStatus(t *testing.T, e *env, run string, want protocol.Status) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		rec, err := e.stores.FindRunView(context.Background(), "default", run)
		if err == nil && rec.Status == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s never %s (%+v, %v)", run, want, rec, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Deleting is allowed to whoever may use the thread: another user gets
// 404 and the thread stays; ids that are not tokens are 400; erasing a
// user takes a role with erase_users.
func TestDeleteIsOwned(t *testing.T) {
	e := newPolicyEnv(t)
	ctx := context.Background()
	rec := e.do("POST", "/threads/a1/runs/wait?format=natsagent", input("remember that I live in Lyon"), bearer(aliceKey)...).expect(t, http.StatusOK).run(t)
	e.do("POST", "/threads/a2/runs/wait?format=natsagent", input("hello"), bearer(aliceKey)...).expect(t, http.StatusOK)
	e.do("POST", "/threads/b1/runs/wait?format=natsagent", input("hello"), bearer(bobKey)...).expect(t, http.StatusOK)
	if notes, err := e.store.Notes(ctx, "acme", "alice"); err != nil || notes == "" {
		t.Fatalf("alice's notes before: %q %v", notes, err)
	}

	for _, p := range []string{"/threads/a1", "/threads/a1/runs/" + rec.RunID} {
		r := e.do("DELETE", p, nil, bearer(bobKey)...).expect(t, http.StatusNotFound)
		if er := r.apiError(t); strings.Contains(er.Message, "alice") {
			t.Errorf("DELETE %s tells the owner: %s", p, er.Message)
		}
	}
	for _, p := range []string{"/threads/a.1", "/threads/*", "/threads/%3E", "/threads/a1/runs/r.1", "/threads/a1/runs/*", "/users/al.ice", "/users/*"} {
		e.do("DELETE", p, nil, bearer(opsKey)...).expect(t, http.StatusBadRequest)
	}
	if _, _, err := e.stores.Threads.Get(ctx, "acme", "a1"); err != nil {
		t.Fatalf("alice's thread after the refused deletions: %v", err)
	}

	e.do("DELETE", "/users/alice", nil, bearer(aliceKey)...).expect(t, http.StatusForbidden)
	e.do("DELETE", "/users/alice", nil, bearer(bobKey)...).expect(t, http.StatusForbidden)
	var out struct {
		UserID  string   `json:"user_id"`
		Threads []string `json:"threads"`
	}
	e.do("DELETE", "/users/alice", nil, bearer(opsKey)...).expect(t, http.StatusOK).decode(t, &out)
	if out.UserID != "alice" || len(out.Threads) != 2 {
		t.Fatalf("erased %+v, want alice's two threads", out)
	}
	for _, h := range []string{"a1", "a2"} {
		e.do("GET", "/threads/"+h, nil, bearer(opsKey)...).expect(t, http.StatusNotFound)
	}
	if notes, err := e.store.Notes(ctx, "acme", "alice"); err != nil || notes != "" {
		t.Fatalf("alice's notes after: %q %v", notes, err)
	}
	e.do("GET", "/threads/b1", nil, bearer(bobKey)...).expect(t, http.StatusOK)
}

// Runs submitted without pause while their thread is deleted (with
// cancel): every run created before the deletion ended is gone, record
// and events; what exists afterwards is a new, whole thread (its state
// loads, it is not left deleting) made of runs created after.
func TestDeleteRacesSubmissions(t *testing.T) {
	e := newEnv(t, textModel(strings.Repeat("y ", 10), 10, 10*time.Millisecond))
	ctx := context.Background()
	type accepted struct {
		run     string
		created time.Time
	}
	var got []accepted
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			run := "race-" + strconv.Itoa(i)
			r := e.do("POST", "/threads/race/runs", with(input("go"), "run_id", run))
			if r.status == http.StatusOK {
				var rec protocol.Run
				r.decode(t, &rec)
				got = append(got, accepted{run, rec.CreatedAt})
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	waitRunning := time.Now().Add(30 * time.Second)
	for {
		th, _, err := e.stores.Threads.Get(ctx, "default", "race")
		if err == nil && th.Lease != nil {
			break
		}
		if time.Now().After(waitRunning) {
			t.Fatal("no run of the thread started")
		}
		time.Sleep(5 * time.Millisecond)
	}
	deleteStart := time.Now().UTC()
	e.do("DELETE", "/threads/race?cancel=true", nil).expect(t, http.StatusNoContent)
	time.Sleep(500 * time.Millisecond)
	close(stop)
	<-done

	// Wait for the runs submitted after the deletion to end.
	deadline := time.Now().Add(60 * time.Second)
	for {
		recs, err := e.stores.Runs.List(ctx, "default", func(r *protocol.Run) bool { return r.ThreadID == "race" && !r.Status.Terminal() })
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d runs of the new thread never ended", len(recs))
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The boundary is when the new thread was created, by the first run
	// submitted once the old record was gone (the 204 arrives a little
	// later); without a new thread, the end of the test.
	boundary := time.Now().UTC()
	th, _, err := e.stores.Threads.Get(ctx, "default", "race")
	switch {
	case errors.Is(err, kv.ErrNotFound):
	case err != nil:
		t.Fatal(err)
	default:
		if th.Status == protocol.ThreadDeleting || !th.CreatedAt.After(deleteStart) {
			t.Fatalf("the thread after the deletion is not a new one: %+v", th)
		}
		boundary = th.CreatedAt
		e.do("GET", "/threads/race/state", nil).expect(t, http.StatusOK)
	}
	var before, after int
	events, err := e.js.Stream(ctx, e.settings.Names.EventsStream())
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range got {
		if !a.created.Before(boundary) {
			after++
			continue
		}
		before++
		if _, _, err := e.stores.Runs.Get(ctx, "default", a.run); !errors.Is(err, kv.ErrNotFound) {
			t.Errorf("run %s, created before the deletion, still has a record (%v)", a.run, err)
		}
		if _, err := events.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(e.settings.Names.RunEvents("default", "race", a.run))); !errors.Is(err, jetstream.ErrMsgNotFound) {
			t.Errorf("run %s, created before the deletion, still has events (%v)", a.run, err)
		}
	}
	if before == 0 {
		t.Fatal("no run was accepted before the deletion: the test proves nothing")
	}
	recs, err := e.stores.Runs.List(ctx, "default", func(r *protocol.Run) bool { return r.ThreadID == "race" })
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if r.CreatedAt.Before(boundary) {
			t.Errorf("run %s (created %s, before the new thread %s) survived the deletion", r.RunID, r.CreatedAt, boundary)
		}
	}
	if ids, err := e.stores.Threads.RunIDs(ctx, "default", "race"); err != nil || len(ids) != len(recs) {
		t.Errorf("the new thread indexes %d runs, %d records name it (%v)", len(ids), len(recs), err)
	}
	t.Logf("%d runs accepted before the deletion, %d after", before, after)
}
