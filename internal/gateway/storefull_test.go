package gateway

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/protocol"
)

// fill sets a stream's max bytes to 1 with discard new, so it refuses
// every write as a full store does ("maximum bytes exceeded"), and returns
// a function that restores it.
func (e *env) fill(stream string) func() {
	e.t.Helper()
	ctx := context.Background()
	st, err := e.js.Stream(ctx, stream)
	if err != nil {
		e.t.Fatal(err)
	}
	open := st.CachedInfo().Config
	full := open
	full.MaxBytes, full.Discard = 1, jetstream.DiscardNew
	if _, err := e.js.UpdateStream(ctx, full); err != nil {
		e.t.Fatal(err)
	}
	return func() {
		if _, err := e.js.UpdateStream(ctx, open); err != nil {
			e.t.Fatal(err)
		}
	}
}

// expectStoreFull checks a 507 store_full answer that names store and
// says when to try again.
func expectStoreFull(t *testing.T, r response, store string) {
	t.Helper()
	er := r.expect(t, http.StatusInsufficientStorage).apiError(t)
	if er.Code != protocol.CodeStoreFull || !strings.Contains(er.Message, store) || !strings.Contains(er.Message, "maximum bytes exceeded") {
		t.Fatalf("answer %+v, want code store_full naming %s and the store's message", er, store)
	}
	if r.header.Get("Retry-After") == "" {
		t.Fatal("a store_full answer without Retry-After")
	}
}

// Every route that writes answers 507 store_full, naming the stream or
// bucket that had no room, instead of a 500; once there is room again the
// same requests succeed.
func TestStoreFullAnswers507(t *testing.T) {
	e := newEnv(t, textModel("ok", 1, 0))
	names := e.settings.Names

	reopen := e.fill("KV_" + names.ThreadsBucket())
	expectStoreFull(t, e.do("POST", "/threads", map[string]any{"thread_id": "t1"}), names.ThreadsBucket())
	reopen()
	e.do("POST", "/threads", map[string]any{"thread_id": "t1"}).expect(t, http.StatusOK)

	reopen = e.fill(names.RunsStream())
	expectStoreFull(t, e.do("POST", "/threads/t1/runs", with(input("hi"), "run_id", "r1")), names.RunsStream())
	reopen()
	e.do("POST", "/threads/t1/runs/wait?format=natsagent", with(input("hi"), "run_id", "r1")).expect(t, http.StatusOK)
}
