package limits

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/natsagent/natsagent/internal/files"
)

// ErrQuota matches every refusal over a storage quota (files or events)
// with errors.Is.
var ErrQuota = files.ErrQuota

// QuotaError refuses a new run of a tenant whose stored events are at
// its max_event_bytes.
type QuotaError struct {
	Tenant      string
	Used, Limit int64
	Window      time.Duration
}

func (e *QuotaError) Error() string {
	return fmt.Sprintf("tenant %s's runs stored %d bytes of events in the last %s, at its quota of %d bytes (limits max_event_bytes): new runs are refused until older events expire, or ask the operator to raise the quota",
		e.Tenant, e.Used, e.Window, e.Limit)
}

// Is lets errors.Is(err, ErrQuota) match a QuotaError.
func (e *QuotaError) Is(target error) bool { return target == ErrQuota }

// eventHours is a tenant's stored event bytes per hour (unix hour), under
// key "events.<tenant>". Hours older than the events' max age are pruned
// on every write: the stream has dropped those events by then.
type eventHours struct {
	Hours map[string]int64 `json:"hours"`
}

// AddEventBytes counts n bytes of events a run of tenant stored; workers
// call it when a run ends. Nothing is counted without a quota.
func (l *Limiter) AddEventBytes(ctx context.Context, tenant string, n int64) error {
	if n <= 0 || l.policy.For(tenant).MaxEventBytes <= 0 {
		return nil
	}
	return update(ctx, l, "events."+tenant, "count the event bytes of tenant "+tenant, func(h *eventHours) (bool, error) {
		now := l.now()
		l.prune(h, now)
		h.Hours[strconv.FormatInt(now.Unix()/3600, 10)] += n
		return true, nil
	})
}

// EventBytes is tenant's counted event bytes within the events' max age.
func (l *Limiter) EventBytes(ctx context.Context, tenant string) (int64, error) {
	h, _, err := load[eventHours](ctx, l, "events."+tenant)
	if err != nil {
		return 0, err
	}
	l.prune(&h, l.now())
	var sum int64
	for _, n := range h.Hours {
		sum += n
	}
	return sum, nil
}

// checkEvents refuses a new run of a tenant at its event quota.
func (l *Limiter) checkEvents(ctx context.Context, tenant string) error {
	limit := l.policy.For(tenant).MaxEventBytes
	if limit <= 0 {
		return nil
	}
	used, err := l.EventBytes(ctx, tenant)
	if err != nil {
		return err
	}
	if used >= limit {
		return &QuotaError{Tenant: tenant, Used: used, Limit: limit, Window: l.eventsMaxAge}
	}
	return nil
}

// prune drops hours that ended before the window: an hour counts until
// all of it is older than the events' max age, so the count may run up to
// an hour's worth over what the stream still holds, never under.
func (l *Limiter) prune(h *eventHours, now time.Time) {
	if h.Hours == nil {
		h.Hours = make(map[string]int64)
	}
	oldest := now.Add(-l.eventsMaxAge).Unix()/3600 - 1
	for k := range h.Hours {
		if hour, err := strconv.ParseInt(k, 10, 64); err != nil || hour <= oldest {
			delete(h.Hours, k)
		}
	}
}
