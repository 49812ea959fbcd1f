package gateway

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/policy"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/testdeploy"
)

// benchThreads is how many threads the benchmarks below write
// (NATSAGENT_BENCH_THREADS overrides 100,000).
func benchThreads() int {
	if n, err := strconv.Atoi(os.Getenv("NATSAGENT_BENCH_THREADS")); err == nil && n > 0 {
		return n
	}
	return 100_000
}

// benchDeployment starts a deployment holding benchThreads threads in
// tenant "big" (metadata user u0..u9, a tenth each), written one after
// the other as workers write them.
func benchDeployment(b *testing.B) *testdeploy.Deployment {
	d := testdeploy.Start(b, bus.Settings{})
	start := time.Now()
	writeThreads(b, d.JS, d.Settings.Names.ThreadsBucket(), "big", "t", benchThreads())
	b.Logf("wrote %d threads in %v", benchThreads(), time.Since(start))
	return d
}

// benchSearch measures POST body to path on gateway gw (served by hs)
// and reports its p99 and p50, the thread records it read and the
// messages the gateway sent the server (its requests) per search. With
// no headers it searches tenant "big" unauthenticated.
func benchSearch(b *testing.B, gw *Server, hs *httptest.Server, path, body string, headers ...string) {
	search := func() time.Duration {
		start := time.Now()
		req, _ := http.NewRequest("POST", hs.URL+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if len(headers) == 0 {
			req.Header.Set("X-Tenant", "big")
		}
		for i := 0; i+1 < len(headers); i += 2 {
			req.Header.Set(headers[i], headers[i+1])
		}
		resp, err := hs.Client().Do(req)
		if err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("status %d", resp.StatusCode)
		}
		return time.Since(start)
	}
	var took []time.Duration
	read0, sent0 := gw.stores.Threads.RecordsRead(), gw.nc.Stats().OutMsgs
	b.ResetTimer()
	for b.Loop() {
		took = append(took, search())
	}
	b.StopTimer()
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)*99/100].Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(gw.stores.Threads.RecordsRead()-read0)/float64(len(took)), "records/op")
	b.ReportMetric(float64(gw.nc.Stats().OutMsgs-sent0)/float64(len(took)), "calls/op")
}

// benchOwner is the API key of the user whose own threads the owner
// benchmarks search: one thread in 5,000 of tenant "owned" is theirs.
const benchOwner = "alice-0123456789-bench-key"

// withOwners makes gw authenticate benchOwner as user alice of tenant
// "owned", a member who may see only their own threads.
func withOwners(b *testing.B, gw *Server) {
	pol, err := policy.New(config.Policy{DefaultRoles: []string{"member"}, Roles: map[string]config.Role{
		"member": {Agents: []string{"chatbot"}, Tools: config.ToolRule{Allow: []string{"*"}}},
	}})
	if err != nil {
		b.Fatal(err)
	}
	a, err := newAuthenticator([]APIKey{{Name: "alice", Tenant: "owned", SHA256: sha256.Sum256([]byte(benchOwner))}})
	if err != nil {
		b.Fatal(err)
	}
	gw.auth, gw.cfg.Policy = a, pol
}

// BenchmarkThreadsSearch: threads.search and threads.count with
// 100,000 threads in the tenant, one in a hundred interrupted and one in
// a hundred in error, one sub-benchmark per sort order (limit 10, a
// metadata filter matching a tenth, as Agent Chat UI's history query),
// per status filter and per count. updated_at reads back from the newest
// writes of the threads bucket, created_at reads the creation index from
// either end, thread_id and status orders list the creation and status
// indexes' subjects and read the page's records, a status filter reads
// its candidates, a count without filters, by status or by scalar
// metadata lists subjects.
func BenchmarkThreadsSearch(b *testing.B) {
	d := benchDeployment(b)
	ctx := context.Background()
	start := time.Now()
	for i := 7; i < benchThreads(); i += 50 {
		st := protocol.ThreadInterrupted
		if i%100 == 57 {
			st = protocol.ThreadError
		}
		if _, _, err := d.Stores.Threads.Mutate(ctx, "big", fmt.Sprintf("t%05d", i), func(t *protocol.Thread) error {
			t.Status = st
			return nil
		}); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("set %d statuses in %v", benchThreads()/50, time.Since(start))
	gw, err := New(ctx, d.NC, Config{Settings: d.Settings, Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	hs := httptest.NewServer(gw.Handler())
	defer hs.Close()
	// The first search by status checks the status index once per
	// process (and builds it on a deployment older than it).
	start = time.Now()
	req, _ := http.NewRequest("POST", hs.URL+"/threads/count", strings.NewReader(`{"status": "idle"}`))
	req.Header.Set("X-Tenant", "big")
	resp, err := hs.Client().Do(req)
	if err != nil {
		b.Fatal(err)
	}
	resp.Body.Close()
	b.Logf("first count by status %v", time.Since(start))
	for _, c := range []struct{ name, path, body string }{
		{"updated_at-desc", "/threads/search", `{"limit": 10, "metadata": {"user": "u3"}, "sort_by": "updated_at", "sort_order": "desc"}`},
		{"updated_at-asc", "/threads/search", `{"limit": 10, "metadata": {"user": "u3"}, "sort_by": "updated_at", "sort_order": "asc"}`},
		{"created_at-desc", "/threads/search", `{"limit": 10, "metadata": {"user": "u3"}, "sort_by": "created_at", "sort_order": "desc"}`},
		{"created_at-asc", "/threads/search", `{"limit": 10, "metadata": {"user": "u3"}, "sort_by": "created_at", "sort_order": "asc"}`},
		{"thread_id-asc", "/threads/search", `{"limit": 10, "metadata": {"user": "u3"}, "sort_by": "thread_id", "sort_order": "asc"}`},
		{"thread_id-desc-unfiltered", "/threads/search", `{"limit": 10, "sort_by": "thread_id", "sort_order": "desc"}`},
		{"status-desc", "/threads/search", `{"limit": 10, "metadata": {"user": "u3"}, "sort_by": "status", "sort_order": "desc"}`},
		{"status-asc", "/threads/search", `{"limit": 10, "metadata": {"user": "u3"}, "sort_by": "status", "sort_order": "asc"}`},
		{"filter-interrupted", "/threads/search", `{"limit": 10, "status": "interrupted"}`},
		{"filter-error-metadata", "/threads/search", `{"limit": 10, "status": "error", "metadata": {"user": "u7"}}`},
		{"filter-idle", "/threads/search", `{"limit": 10, "status": "idle", "metadata": {"user": "u3"}}`},
		{"count-interrupted", "/threads/count", `{"status": "interrupted"}`},
		{"count-idle", "/threads/count", `{"status": "idle"}`},
		{"count", "/threads/count", `{}`},
		{"count-metadata", "/threads/count", `{"metadata": {"user": "u3"}}`},
		{"count-metadata-status", "/threads/count", `{"metadata": {"user": "u7"}, "status": "error"}`},
	} {
		b.Run(c.name, func(b *testing.B) { benchSearch(b, gw, hs, c.path, c.body) })
	}
}

// BenchmarkThreadsSearchOwn: the searches of a user who may see only
// their own threads, in a tenant of 100,000 threads of which one in
// 5,000 (20) are theirs and the others another user's: by updated_at
// both ways (the threads they may see, read by key, sorted by their last
// write), by created_at and a count.
func BenchmarkThreadsSearchOwn(b *testing.B) {
	d := testdeploy.Start(b, bus.Settings{})
	start := time.Now()
	writeThreadsOf(b, d.JS, d.Settings.Names.ThreadsBucket(), "owned", "o", benchThreads(), func(i int) string {
		if i%5000 == 17 {
			return "alice"
		}
		return "other"
	})
	b.Logf("wrote %d threads in %v", benchThreads(), time.Since(start))
	gw, err := New(context.Background(), d.NC, Config{Settings: d.Settings, Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	withOwners(b, gw)
	hs := httptest.NewServer(gw.Handler())
	defer hs.Close()
	owner := []string{"X-API-Key", benchOwner}
	for _, c := range []struct{ name, path, body string }{
		{"updated_at-desc", "/threads/search", `{"limit": 10}`},
		{"updated_at-asc", "/threads/search", `{"limit": 10, "sort_order": "asc"}`},
		{"created_at-desc", "/threads/search", `{"limit": 10, "sort_by": "created_at"}`},
		{"count", "/threads/count", `{}`},
	} {
		b.Run(c.name, func(b *testing.B) { benchSearch(b, gw, hs, c.path, c.body, owner...) })
	}
}

// BenchmarkGatewayStart: a gateway starting on a deployment with 100,000
// threads (it reads none of them) until it answers its first search.
func BenchmarkGatewayStart(b *testing.B) {
	d := benchDeployment(b)
	ctx := context.Background()
	var took []time.Duration
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		gw, err := New(ctx, d.NC, Config{Settings: d.Settings, Logger: zap.NewNop()})
		if err != nil {
			b.Fatal(err)
		}
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("POST", "/threads/search", strings.NewReader(`{"limit": 10}`))
		req.Header.Set("X-Tenant", "big")
		gw.Handler().ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			b.Fatalf("status %d", rec.Code)
		}
		took = append(took, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
}
