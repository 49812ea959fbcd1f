package limits

import (
	"context"
	"errors"
	"testing"
	"time"
)

// At max_event_bytes a tenant's new runs are refused until its counted
// events are older than the events' max age (24 h by default); other
// tenants are not affected.
func TestEventQuotaRefusesNewRunsUntilEventsExpire(t *testing.T) {
	l, _ := open(t, Policy{Tenants: map[string]Tenant{"acme": {MaxEventBytes: 1000}}})
	ctx := context.Background()
	now := time.Date(2026, 12, 1, 10, 30, 0, 0, time.UTC)
	l.now = func() time.Time { return now }
	if err := l.AddEventBytes(ctx, "acme", 600); err != nil {
		t.Fatal(err)
	}
	if err := l.Admit(ctx, "acme"); err != nil {
		t.Fatalf("under the quota: %v", err)
	}
	now = now.Add(2 * time.Hour)
	if err := l.AddEventBytes(ctx, "acme", 400); err != nil {
		t.Fatal(err)
	}
	err := l.Admit(ctx, "acme")
	var qe *QuotaError
	if !errors.As(err, &qe) || !errors.Is(err, ErrQuota) || qe.Used != 1000 || qe.Limit != 1000 {
		t.Fatalf("at the quota: %v", err)
	}
	if err := l.Admit(ctx, "globex"); err != nil {
		t.Fatalf("another tenant: %v", err)
	}
	// The first hour's events expire from the stream after 24 h.
	now = now.Add(24 * time.Hour)
	if used, err := l.EventBytes(ctx, "acme"); err != nil || used != 400 {
		t.Fatalf("after the first hour expired: %d %v, want 400", used, err)
	}
	if err := l.Admit(ctx, "acme"); err != nil {
		t.Fatalf("after older events expired: %v", err)
	}
}
