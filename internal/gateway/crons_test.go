package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/crons"
	"github.com/natsagent/natsagent/internal/jobs"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/submit"
)

// startCronWorker runs a job runner that takes cron ticks (and delayed
// runs), as a worker process does, on its own connection.
func (e *env) startCronWorker() {
	e.t.Helper()
	nc, err := nats.Connect(e.srv.URL(), nats.MaxReconnects(-1))
	if err != nil {
		e.t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithCancel(context.Background())
	log := zaptest.NewLogger(e.t)
	q, err := submit.NewQueue(ctx, js, e.settings.Names, e.stores, "scheduler", log)
	if err != nil {
		e.t.Fatal(err)
	}
	store, err := crons.Open(ctx, js, e.settings.Names)
	if err != nil {
		e.t.Fatal(err)
	}
	runner, err := jobs.NewRunner(ctx, js, jobs.Config{
		Settings: e.settings,
		Handlers: map[string]jobs.Handler{
			submit.DelayedJobKind: q.DelayedHandler(0, log),
			crons.JobKind:         (&crons.Ticker{Store: store, Queue: q, Log: log}).Handle,
		},
		Backoff: func(int) time.Duration { return 200 * time.Millisecond },
		Logger:  log,
	})
	if err != nil {
		e.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = runner.Run(ctx); close(done) }()
	e.t.Cleanup(func() { cancel(); natstest.Recv(e.t, done, "the cron runner to stop"); nc.Close() })
}

// secondGateway serves the same deployment from another connection.
func (e *env) secondGateway() *env {
	e.t.Helper()
	nc, err := nats.Connect(e.srv.URL(), nats.MaxReconnects(-1))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(nc.Close)
	gw, err := New(context.Background(), nc, Config{Settings: e.settings, Logger: zaptest.NewLogger(e.t)})
	if err != nil {
		e.t.Fatal(err)
	}
	hs := httptest.NewServer(gw.Handler())
	e.t.Cleanup(hs.Close)
	other := *e
	other.nc, other.gw, other.http = nc, gw, hs
	return &other
}

// cronTicks returns the ticks of a cron that have a run, by tick, and
// fails if a tick's thread holds other than one run (a doubled tick).
func (e *env) cronTicks(tenant, cronID string, stateless bool, thread string) map[int64]int {
	e.t.Helper()
	ctx := context.Background()
	out := map[int64]int{}
	prefix := "cron-" + cronID + "-"
	add := func(run string) {
		tick, err := strconv.ParseInt(strings.TrimPrefix(run, prefix), 10, 64)
		if err != nil {
			e.t.Fatalf("run %s is not a tick of cron %s", run, cronID)
		}
		out[tick]++
	}
	if !stateless {
		ids, err := e.stores.Threads.RunIDs(ctx, tenant, thread)
		if err != nil {
			e.t.Fatal(err)
		}
		for _, id := range ids {
			if strings.HasPrefix(id, prefix) {
				add(id)
			}
		}
		return out
	}
	ths, err := e.stores.Threads.List(ctx, tenant)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, th := range ths {
		if !strings.HasPrefix(th.ThreadID, prefix) {
			continue
		}
		ids, err := e.stores.Threads.RunIDs(ctx, tenant, th.ThreadID)
		if err != nil {
			e.t.Fatal(err)
		}
		for _, id := range ids {
			if id != th.ThreadID {
				e.t.Fatalf("tick thread %s holds run %s", th.ThreadID, id)
			}
			add(id)
		}
		if len(ids) == 0 {
			// Indexed just after the record: count the record.
			if _, _, err := e.stores.Runs.Get(ctx, tenant, th.ThreadID); err == nil {
				add(th.ThreadID)
			}
		}
	}
	return out
}

func waitFor(t *testing.T, what string, timeout time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func noDoubles(t *testing.T, ticks map[int64]int) {
	t.Helper()
	for tick, n := range ticks {
		if n != 1 {
			t.Fatalf("tick %d started %d runs", tick, n)
		}
	}
}

// A stateless cron on a one-second schedule, served by two gateways and
// taken by two job runners, starts one run per tick on a new thread each;
// a tick fired twice starts one run; deleting the cron stops it.
func TestCronFiresOncePerTickAcrossProcesses(t *testing.T) {
	e := newEnv(t, echoModel())
	e.startCronWorker()
	e.startCronWorker()
	e2 := e.secondGateway()

	var c crons.Cron
	e.do("POST", "/runs/crons", with(input("tick"), "schedule", "* * * * * *", "metadata", map[string]any{"team": "a"})).
		expect(t, http.StatusOK).decode(t, &c)
	if c.CronID == "" || c.ThreadID != nil || !c.Enabled || c.NextRunDate == nil || c.AssistantID != "chatbot" {
		t.Fatalf("created %+v", c)
	}
	var got crons.Cron
	e2.do("GET", "/runs/crons/"+c.CronID, nil).expect(t, http.StatusOK).decode(t, &got)
	if got.Schedule != "* * * * * *" || got.Payload["input"] == nil {
		t.Fatalf("the other gateway reads %+v", got)
	}

	waitFor(t, "5 ticks", 60*time.Second, func() bool { return len(e.cronTicks(protocol.DefaultTenant, c.CronID, true, "")) >= 5 })
	ticks := e.cronTicks(protocol.DefaultTenant, c.CronID, true, "")
	noDoubles(t, ticks)

	// Fire the current tick a second time, as a leader change between
	// firing and storing it could (the server fires this second too): it
	// starts no second run.
	var some int64
	for tick := range ticks {
		some = tick
	}
	ctx := context.Background()
	m := nats.NewMsg(e.settings.Names.JobSubject(crons.JobKind, protocol.DefaultTenant, c.CronID))
	m.Header.Set(jobs.HeaderJobID, "again")
	m.Data = []byte("{}")
	if _, err := e.js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	_ = some
	// A run that ends leaves its thread: every tick ran to completion.
	waitFor(t, "a tick's run to finish", 30*time.Second, func() bool {
		rec, _, err := e.stores.Runs.Get(ctx, protocol.DefaultTenant, crons.TickRunID(c.CronID, time.Unix(some, 0)))
		return err == nil && rec.Status == protocol.StatusSuccess
	})

	e2.do("DELETE", "/runs/crons/"+c.CronID, nil).expect(t, http.StatusNoContent)
	e.do("GET", "/runs/crons/"+c.CronID, nil).expect(t, http.StatusNotFound)
	// Ticks fired before the deletion may still be in the jobs stream or
	// in a handler: wait for it to drain.
	waitFor(t, "the jobs stream to drain", 30*time.Second, func() bool { return jobsIdle(t, e) })
	after := len(e.cronTicks(protocol.DefaultTenant, c.CronID, true, ""))
	time.Sleep(3 * time.Second)
	final := e.cronTicks(protocol.DefaultTenant, c.CronID, true, "")
	noDoubles(t, final)
	if len(final) != after {
		t.Fatalf("the deleted cron went on: %d ticks, then %d", after, len(final))
	}
	if n := scheduleMsgs(t, e, protocol.DefaultTenant, c.CronID); n != 0 {
		t.Fatalf("the deleted cron keeps %d schedule messages", n)
	}
}

func jobsIdle(t *testing.T, e *env) bool {
	t.Helper()
	c, err := e.js.Consumer(context.Background(), e.settings.Names.JobsStream(), bus.JobsConsumer)
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.NumPending == 0 && info.NumAckPending == 0
}

func scheduleMsgs(t *testing.T, e *env, tenant, cron string) uint64 {
	t.Helper()
	st, err := e.js.Stream(context.Background(), e.settings.Names.JobsStream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(context.Background(), jetstream.WithSubjectFilter(e.settings.Names.JobScheduleSubject(crons.JobKind, tenant, cron)))
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, c := range info.State.Subjects {
		n += c
	}
	return n
}

// A cron on a thread runs there; its end_time stops it and purges its
// schedule.
func TestCronOnThreadStopsAtEndTime(t *testing.T) {
	e := newEnv(t, echoModel())
	e.startCronWorker()
	e.do("POST", "/threads", map[string]any{"thread_id": "ct1"}).expect(t, http.StatusOK)
	e.do("POST", "/threads/nope/runs/crons", with(input("x"), "schedule", "* * * * * *")).expect(t, http.StatusNotFound)
	end := time.Now().Add(3 * time.Second).UTC()
	var c crons.Cron
	e.do("POST", "/threads/ct1/runs/crons", with(input("tick"), "schedule", "* * * * * *", "multitask_strategy", "enqueue",
		"end_time", end.Format(time.RFC3339Nano))).expect(t, http.StatusOK).decode(t, &c)
	if c.ThreadID == nil || *c.ThreadID != "ct1" || c.EndTime == nil {
		t.Fatalf("created %+v", c)
	}
	waitFor(t, "the schedule to be purged after end_time", 30*time.Second, func() bool {
		return time.Now().After(end.Add(2*time.Second)) && scheduleMsgs(t, e, protocol.DefaultTenant, c.CronID) == 0
	})
	ticks := e.cronTicks(protocol.DefaultTenant, c.CronID, false, "ct1")
	if len(ticks) == 0 {
		t.Fatal("no tick ran before end_time")
	}
	noDoubles(t, ticks)
	for tick := range ticks {
		if time.Unix(tick, 0).After(end) {
			t.Fatalf("tick %s ran after end_time %s", time.Unix(tick, 0), end)
		}
	}
	var after crons.Cron
	e.do("GET", "/runs/crons/"+c.CronID, nil).expect(t, http.StatusOK).decode(t, &after)
	if after.NextRunDate != nil {
		t.Fatalf("a cron past its end_time has next_run_date %s", after.NextRunDate)
	}
}

// Search and count filter by assistant, thread, enabled and metadata,
// page and sort; a tenant sees, patches and deletes only its own crons;
// bad schedules and run options are refused by name.
func TestCronSearchCountPatchAndTenants(t *testing.T) {
	e := newEnv(t, nil)
	e.do("POST", "/threads", map[string]any{"thread_id": "st1"}).expect(t, http.StatusOK)
	var a, b, d crons.Cron
	e.do("POST", "/runs/crons", with(input("a"), "schedule", "0 9 * * *", "metadata", map[string]any{"k": "1"})).expect(t, http.StatusOK).decode(t, &a)
	e.do("POST", "/threads/st1/runs/crons", with(input("b"), "schedule", "*/5 * * * *", "timezone", "Europe/Paris", "enabled", false)).expect(t, http.StatusOK).decode(t, &b)
	e.do("POST", "/runs/crons", with(input("d"), "schedule", "0 0 1 1 *"), "X-Tenant", "other").expect(t, http.StatusOK).decode(t, &d)
	if b.Enabled || b.NextRunDate != nil || b.Timezone == nil || *b.Timezone != "Europe/Paris" {
		t.Fatalf("disabled cron %+v", b)
	}
	if a.NextRunDate == nil || a.NextRunDate.Hour() != 9 || a.NextRunDate.Minute() != 0 {
		t.Fatalf("next_run_date of 0 9 * * * is %v", a.NextRunDate)
	}

	search := func(body map[string]any, headers ...string) []crons.Cron {
		var out []crons.Cron
		e.do("POST", "/runs/crons/search", body, headers...).expect(t, http.StatusOK).decode(t, &out)
		return out
	}
	count := func(body map[string]any, headers ...string) int {
		var n int
		e.do("POST", "/runs/crons/count", body, headers...).expect(t, http.StatusOK).decode(t, &n)
		return n
	}
	if got := search(map[string]any{}); len(got) != 2 {
		t.Fatalf("search: %d crons", len(got))
	}
	if got := search(map[string]any{"thread_id": "st1"}); len(got) != 1 || got[0].CronID != b.CronID {
		t.Fatalf("by thread: %+v", got)
	}
	if got := search(map[string]any{"metadata": map[string]any{"k": "1"}}); len(got) != 1 || got[0].CronID != a.CronID {
		t.Fatalf("by metadata: %+v", got)
	}
	if got := search(map[string]any{"enabled": false}); len(got) != 1 || got[0].CronID != b.CronID {
		t.Fatalf("by enabled: %+v", got)
	}
	if got := search(map[string]any{"sort_by": "created_at", "sort_order": "asc", "limit": 1, "offset": 1}); len(got) != 1 || got[0].CronID != b.CronID {
		t.Fatalf("paged: %+v", got)
	}
	if n := count(map[string]any{"assistant_id": "chatbot"}); n != 2 {
		t.Fatalf("count: %d", n)
	}
	if n := count(map[string]any{"metadata": map[string]any{"k": "2"}}); n != 0 {
		t.Fatalf("count by other metadata: %d", n)
	}
	// The other tenant sees only its own.
	if got := search(map[string]any{}, "X-Tenant", "other"); len(got) != 1 || got[0].CronID != d.CronID {
		t.Fatalf("other tenant: %+v", got)
	}
	e.do("GET", "/runs/crons/"+a.CronID, nil, "X-Tenant", "other").expect(t, http.StatusNotFound)
	e.do("PATCH", "/runs/crons/"+a.CronID, map[string]any{"enabled": false}, "X-Tenant", "other").expect(t, http.StatusNotFound)
	e.do("DELETE", "/runs/crons/"+a.CronID, nil, "X-Tenant", "other").expect(t, http.StatusNotFound)

	// Patch: schedule, end_time and input change; the schedule follows.
	var p crons.Cron
	e.do("PATCH", "/runs/crons/"+a.CronID, map[string]any{"schedule": "30 10 * * *", "input": input("changed")["input"]}).
		expect(t, http.StatusOK).decode(t, &p)
	if p.Schedule != "30 10 * * *" || p.NextRunDate == nil || p.NextRunDate.Minute() != 30 || !p.UpdatedAt.After(a.UpdatedAt) {
		t.Fatalf("patched %+v", p)
	}
	if n := scheduleMsgs(t, e, protocol.DefaultTenant, a.CronID); n != 1 {
		t.Fatalf("a patched cron has %d schedule messages", n)
	}
	e.do("PATCH", "/runs/crons/"+a.CronID, map[string]any{"enabled": false}).expect(t, http.StatusOK)
	if n := scheduleMsgs(t, e, protocol.DefaultTenant, a.CronID); n != 0 {
		t.Fatalf("a disabled cron has %d schedule messages", n)
	}

	for field, body := range map[string]map[string]any{
		"schedule":         with(input("x"), "schedule", "61 * * * *"),
		"timezone":         with(input("x"), "schedule", "* * * * *", "timezone", "Mars/Base"),
		"run_id":           with(input("x"), "schedule", "* * * * *", "run_id", "r1"),
		"after_seconds":    with(input("x"), "schedule", "* * * * *", "after_seconds", 3),
		"on_run_completed": with(input("x"), "schedule", "* * * * *", "on_run_completed", "delete"),
		"bogus":            with(input("x"), "schedule", "* * * * *", "bogus", 1),
	} {
		err := e.do("POST", "/runs/crons", body).expect(t, http.StatusBadRequest).apiError(t)
		if err.Field != field {
			t.Errorf("%s: field %q: %s", field, err.Field, err.Message)
		}
	}
	e.do("POST", "/runs/crons", map[string]any{"input": input("x")["input"]}).expect(t, http.StatusBadRequest)
}

// TestLangGraphSDKCrons runs the official LangGraph JS SDK's crons client
// against the gateway (testdata/langgraph-sdk/crons.mjs). It skips as
// TestLangGraphSDK does.
func TestLangGraphSDKCrons(t *testing.T) {
	e := newEnv(t, sdkModel())
	e.startCronWorker()
	runSDKScript(t, e, "crons.mjs", 5)
}

// TestCronCapPerTenant: a tenant has at most MaxCronsPerTenant crons; a
// create past it is a 409 naming the setting, other tenants are not
// affected, a deletion makes room, and creates racing for the last slots
// leave the tenant at the cap, never past it.
func TestCronCapPerTenant(t *testing.T) {
	e := newEnvWith(t, nil, func(s *Server) { s.cfg.MaxCronsPerTenant = 3 })
	create := func(tenant string) response {
		return e.do("POST", "/runs/crons", with(input("x"), "schedule", "0 9 * * *", "enabled", false), "X-Tenant", tenant)
	}
	count := func(tenant string) int {
		t.Helper()
		var n int
		e.do("POST", "/runs/crons/count", map[string]any{}, "X-Tenant", tenant).expect(t, http.StatusOK).decode(t, &n)
		return n
	}
	var first crons.Cron
	create("capped").expect(t, http.StatusOK).decode(t, &first)
	create("capped").expect(t, http.StatusOK)
	create("capped").expect(t, http.StatusOK)
	er := create("capped").expect(t, http.StatusConflict).apiError(t)
	if !strings.Contains(er.Message, "crons.max_per_tenant") || er.Field != "cron" {
		t.Fatalf("the refusal does not say what to do: %+v", er)
	}
	if n := count("capped"); n != 3 {
		t.Fatalf("tenant capped has %d crons after a refused create", n)
	}
	create("free").expect(t, http.StatusOK)
	e.do("DELETE", "/runs/crons/"+first.CronID, nil, "X-Tenant", "capped").expect(t, http.StatusNoContent)
	create("capped").expect(t, http.StatusOK)

	// Eight creates race for a fresh tenant's three slots.
	results := make(chan int, 8)
	for range 8 {
		go func() {
			resp, err := e.http.Client().Post(e.http.URL+"/runs/crons", "application/json",
				strings.NewReader(`{"schedule": "0 9 * * *", "enabled": false, "input": {"messages": [{"role": "user", "content": "x"}]}}`))
			if err != nil {
				results <- 0
				return
			}
			resp.Body.Close()
			results <- resp.StatusCode
		}()
	}
	ok := 0
	for range 8 {
		switch code := <-results; code {
		case http.StatusOK:
			ok++
		case http.StatusConflict:
		default:
			t.Fatalf("a racing create answered %d", code)
		}
	}
	if n := count("default"); ok < 1 || ok > 3 || n != ok {
		t.Fatalf("racing creates: %d succeeded, the tenant holds %d crons (cap 3)", ok, n)
	}
}

// Deleting a cron or an assistant leaves nothing in its bucket, not even
// a purge marker naming its key: those buckets keep markers for ever, so
// every cron or assistant ever deleted would stay as one.
func TestDeletedCronsAndAssistantsLeaveNoMarker(t *testing.T) {
	e := newEnv(t, nil)
	var c crons.Cron
	e.do("POST", "/runs/crons", with(input("a"), "schedule", "0 9 * * *")).expect(t, http.StatusOK).decode(t, &c)
	var a assistantView
	e.do("POST", "/assistants", map[string]any{"graph_id": "chatbot"}).expect(t, http.StatusOK).decode(t, &a)
	e.do("PATCH", "/assistants/"+a.AssistantID, map[string]any{"metadata": map[string]any{"v": 2}}).expect(t, http.StatusOK)
	e.do("DELETE", "/runs/crons/"+c.CronID, nil).expect(t, http.StatusNoContent)
	e.do("DELETE", "/assistants/"+a.AssistantID, nil).expect(t, http.StatusNoContent)
	names := e.settings.Names
	for bucket, id := range map[string]string{names.CronsBucket(): c.CronID, names.AssistantsBucket(): a.AssistantID} {
		st, err := e.js.Stream(context.Background(), "KV_"+bucket)
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(context.Background(), jetstream.WithSubjectFilter(">"))
		if err != nil {
			t.Fatal(err)
		}
		for subject := range info.State.Subjects {
			if strings.Contains(subject, id) {
				t.Errorf("%s keeps %s after the delete", bucket, subject)
			}
		}
	}
}
