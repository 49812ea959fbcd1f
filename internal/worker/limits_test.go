package worker

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/limits"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/testdeploy"
)

func (h *harness) limiter(p limits.Policy) *limits.Limiter {
	h.t.Helper()
	l, err := limits.Open(context.Background(), h.js, h.settings, p)
	if err != nil {
		h.t.Fatal(err)
	}
	return l
}

// Tenant acme, limited to 2 running runs, submits 10 slow runs; tenant
// globex then submits one. globex's run starts while acme's wait, and
// acme never has more than 2 running, across two workers.
func TestTenantConcurrencyLimitIsFair(t *testing.T) {
	h := newHarness(t)
	lim := h.limiter(limits.Policy{Tenants: map[string]limits.Tenant{"acme": {MaxConcurrentRuns: 2}}})
	slow := textModel("one two three four five six seven eight nine ten", 10, 150*time.Millisecond) // 1.5 s a run
	for range 2 {
		h.startWorker(slow, func(c *Config) { c.Limits = lim; c.Concurrency = 4 })
	}
	var acme []*watcher
	for i := range 10 {
		req := request(fmt.Sprintf("a%d", i), fmt.Sprintf("ra%d", i), "hi")
		req.Tenant = "acme"
		acme = append(acme, h.watch("acme", req.ThreadID, req.RunID))
		h.submit(req)
	}
	time.Sleep(500 * time.Millisecond) // acme's first two run, the rest wait
	req := request("b1", "rb1", "hi")
	req.Tenant = "globex"
	wb := h.watch("globex", "b1", "rb1")
	submitted := time.Now()
	h.submit(req)
	if fin := wb.finished(t, 10*time.Second); fin.Status != protocol.StatusSuccess {
		t.Fatalf("globex's run ended %s: %s", fin.Status, fin.Error)
	}
	var globexStarted time.Time
	for _, ev := range wb.all() {
		if ev.Type == protocol.EventRunStarted {
			globexStarted = ev.Time
		}
	}
	if took := globexStarted.Sub(submitted); took <= 0 || took > 10*time.Second {
		t.Fatalf("globex's run started %s after submission behind acme's queue", took)
	}
	for i, w := range acme {
		if fin := w.finished(t, 30*time.Second); fin.Status != protocol.StatusSuccess {
			t.Fatalf("acme run %d ended %s: %s", i, fin.Status, fin.Error)
		}
	}
	// Fair: globex's run did not wait for acme's queue. Without the limit
	// acme's runs, submitted first, would take every slot, and the last
	// of them would start before globex's; with it, at least two of
	// acme's (five pairs of 1.5 s runs) start after globex's.
	after := 0
	for _, w := range acme {
		for _, ev := range w.all() {
			if ev.Type == protocol.EventRunStarted && ev.Time.After(globexStarted) {
				after++
				break
			}
		}
	}
	if after < 2 {
		t.Fatalf("only %d of acme's runs started after globex's: globex waited for acme's queue", after)
	}
	// The peak comes from the records' own start and finish times: a run
	// starts only after it took a slot, and gives its slot back only after
	// its record says it finished, so the intervals overlap at most twice.
	type edge struct {
		at    time.Time
		delta int
	}
	var edges []edge
	for i := range 10 {
		r := h.run("acme", fmt.Sprintf("ra%d", i))
		if r.StartedAt == nil || r.FinishedAt == nil {
			t.Fatalf("acme run %d has no start or finish time: %+v", i, r)
		}
		edges = append(edges, edge{*r.StartedAt, 1}, edge{*r.FinishedAt, -1})
	}
	slices.SortFunc(edges, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.delta - b.delta // a finish at the same instant as a start comes first
	})
	peak, n := 0, 0
	for _, e := range edges {
		n += e.delta
		peak = max(peak, n)
	}
	if peak != 2 {
		t.Fatalf("acme had %d runs running at once, limit 2", peak)
	}
	for i := range 10 {
		if r := h.run("acme", fmt.Sprintf("ra%d", i)); r.Attempt != 1 {
			t.Fatalf("acme run %d took %d deliveries-attempts: waiting for a slot must not spend any", i, r.Attempt)
		}
	}
	if left, err := lim.Running(context.Background(), "acme"); err != nil || len(left) != 0 {
		t.Fatalf("slots still held after every run ended: %v %v", left, err)
	}
	t.Logf("globex's run started %s after submission behind 10 of acme's, %d of acme's after it; acme peaked at %d running", globexStarted.Sub(submitted), after, peak)
}

// A request over its tenant's maximum run time is refused by the worker
// with the field and the maximum, whoever published it.
func TestTenantMaxRunTimeOverNATS(t *testing.T) {
	h := newHarness(t)
	lim := h.limiter(limits.Policy{Default: limits.Tenant{MaxRunTime: time.Hour, MaxSteps: 100}})
	h.startWorker(textModel("fine", 1, 0), func(c *Config) { c.Limits = lim })
	for i, c := range []struct {
		body, want string
	}{
		{`{"run_id":"r0","thread_id":"t0","config":{"timeout_seconds":9223372036854775807},"input":{"messages":[{"role":"user","content":"x"}]}}`, "config.timeout_seconds: 9223372036854775807 is out of range: use 1 to 604800 seconds"},
		{`{"run_id":"r1","thread_id":"t1","config":{"timeout_seconds":9300000000},"input":{"messages":[{"role":"user","content":"x"}]}}`, "config.timeout_seconds: 9300000000 is out of range: use 1 to 604800 seconds"},
		{`{"run_id":"r2","thread_id":"t2","config":{"timeout_seconds":3601},"input":{"messages":[{"role":"user","content":"x"}]}}`, "config.timeout_seconds: 3601 is over tenant default's maximum run time of 3600 seconds"},
		{`{"run_id":"r3","thread_id":"t3","config":{"max_steps":101},"input":{"messages":[{"role":"user","content":"x"}]}}`, "config.max_steps: 101 is over tenant default's maximum of 100 steps"},
	} {
		thread, run := fmt.Sprintf("t%d", i), fmt.Sprintf("r%d", i)
		w := h.watch("default", thread, run)
		h.publishRaw(h.names.RunSubject("default", thread), []byte(c.body), run)
		fin := w.finished(t, 10*time.Second)
		if fin.Status != protocol.StatusError || !strings.Contains(fin.Error, c.want) {
			t.Fatalf("%s: ended %s with %q, want an error with %q", c.body, fin.Status, fin.Error, c.want)
		}
	}
	w := h.watch("default", "t9", "r9")
	req := request("t9", "r9", "hi")
	req.Config.TimeoutSeconds = 3600
	h.submit(req)
	if fin := w.finished(t, 10*time.Second); fin.Status != protocol.StatusSuccess {
		t.Fatalf("a run within the limits ended %s: %s", fin.Status, fin.Error)
	}
}

// A finished run's event bytes are counted for its tenant's event quota,
// no more than the events stream holds for it.
func TestRunEventBytesAreCounted(t *testing.T) {
	h := newHarness(t)
	lim := h.limiter(limits.Policy{Tenants: map[string]limits.Tenant{"acme": {MaxEventBytes: 1 << 30}}})
	h.startWorker(textModel(strings.Repeat("word ", 200), 20, 0), func(c *Config) { c.Limits = lim })
	req := request("t1", "r1", "hi")
	req.Tenant = "acme"
	w := h.watch("acme", "t1", "r1")
	h.submit(req)
	if fin := w.finished(t, 10*time.Second); fin.Status != protocol.StatusSuccess {
		t.Fatalf("run ended %s: %s", fin.Status, fin.Error)
	}
	st, err := h.js.Stream(context.Background(), h.names.EventsStream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var counted int64
	testdeploy.WaitFor(t, 5*time.Second, "event bytes counted", func() bool {
		counted, err = lim.EventBytes(context.Background(), "acme")
		return err == nil && counted > 0
	})
	if counted < 1000 || uint64(counted) > info.State.Bytes {
		t.Fatalf("counted %d event bytes; the events stream holds %d bytes", counted, info.State.Bytes)
	}
	t.Logf("counted %d bytes for a run whose events stream holds %d bytes (with headers and overhead)", counted, info.State.Bytes)
}

// A slot held by a run whose worker died (its thread has no live lease)
// does not block the tenant for ever: the next run drops it and starts.
func TestDeadHoldersSlotIsFreed(t *testing.T) {
	h := newHarness(t)
	lim := h.limiter(limits.Policy{Tenants: map[string]limits.Tenant{"acme": {MaxConcurrentRuns: 1}}})
	kv, err := h.js.KeyValue(context.Background(), h.names.LimitsBucket())
	if err != nil {
		t.Fatal(err)
	}
	ghost := `{"runs":{"ghost":{"thread":"tg","worker":"w-dead","at":"2026-01-01T00:00:00Z"}}}`
	if _, err := kv.Create(context.Background(), "active.acme", []byte(ghost)); err != nil {
		t.Fatal(err)
	}
	h.startWorker(textModel("fine", 1, 0), func(c *Config) { c.Limits = lim })
	req := request("t1", "r1", "hi")
	req.Tenant = "acme"
	w := h.watch("acme", "t1", "r1")
	h.submit(req)
	if fin := w.finished(t, 10*time.Second); fin.Status != protocol.StatusSuccess {
		t.Fatalf("run ended %s: %s", fin.Status, fin.Error)
	}
	if left, err := lim.Running(context.Background(), "acme"); err != nil || len(left) != 0 {
		t.Fatalf("slots after the run: %v %v", left, err)
	}
}
