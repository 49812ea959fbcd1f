package intake_test

import (
	"context"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/intake"
	"github.com/natsagent/natsagent/internal/limits"
)

// A NATS client meets the tenant's limits as an HTTP client does: a bound
// over the tenant's maximum is 400, the runs over runs_per_minute 429, and
// another tenant is not affected.
func TestSubmitAppliesTheTenantsLimits(t *testing.T) {
	e := setup(t, intake.Hooks{}, &limits.Policy{Tenants: map[string]limits.Tenant{
		"acme": {RunsPerMinute: 2, MaxRunTime: time.Hour},
	}})
	ctx := context.Background()
	alice := func(tenant string) []string { return []string{intake.HeaderRequestInfo, info(tenant, "alice", "")} }

	refusal(t, e.send("acme", "h1", `{"run_id":"r0","thread_id":"h1",`+hi+`,"config":{"timeout_seconds":7200}}`, alice("acme")...),
		400, intake.ErrCodeInvalid, "config.timeout_seconds")
	// Five submissions within two calendar minutes at most: at most four
	// pass a limit of two a minute.
	refused := 0
	for _, run := range []string{"r1", "r2", "r3", "r4", "r5"} {
		m := e.send("acme", "h1", `{"run_id":"`+run+`","thread_id":"h1",`+hi+`}`, alice("acme")...)
		if m.Header.Get("Nats-Service-Error-Code") == "" {
			ack(t, m)
			continue
		}
		refusal(t, m, 429, intake.ErrCodeRateLimited, "runs_per_minute")
		if _, _, err := e.stores.Runs.Get(ctx, "acme", run); err == nil {
			t.Fatalf("the refused run %s has a record", run)
		}
		refused++
	}
	if refused == 0 {
		t.Fatal("five runs in at most two minutes passed a limit of two a minute")
	}
	for i := range 3 {
		run := []string{"g1", "g2", "g3"}[i]
		ack(t, e.send("globex", "h1", `{"run_id":"`+run+`","thread_id":"h1",`+hi+`}`, alice("globex")...))
	}
}
