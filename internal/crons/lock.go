package crons

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Creating a cron under a per-tenant cap counts the tenant's crons and
// then writes one: two gateways doing both at once could each see room
// for the last one. Creates of a tenant therefore take turns on a lock:
// the key "<tenant>" of the crons bucket (one token, so no listing of
// "<tenant>.*" reads it), created by the holder and deleted when it is
// done. A holder that died leaves it behind: a lock older than
// lockStale is taken over with a compare-and-set, and no create holds it
// that long (each of its requests is bounded by opTimeout).

// lockStale is how old a lock may be before another create takes it.
const lockStale = 4 * opTimeout

// ErrBusy is returned when the tenant's lock stayed held until ctx ended.
var ErrBusy = errors.New("another cron of the tenant is being created")

// WithTenantLock runs fn while holding the tenant's create lock.
func (s *Store) WithTenantLock(ctx context.Context, tenant string, fn func() error) error {
	rev, err := s.lock(ctx, tenant)
	if err != nil {
		return err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		_ = s.kv.Delete(ctx, tenant, jetstream.LastRevision(rev))
	}()
	return fn()
}

func (s *Store) lock(ctx context.Context, tenant string) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*lockStale)
	defer cancel()
	pause := 5 * time.Millisecond
	for {
		now := []byte(strconv.FormatInt(time.Now().UnixNano(), 10))
		rev, err := s.kv.Create(ctx, tenant, now)
		if err == nil {
			return rev, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return 0, fmt.Errorf("lock the tenant's crons: %w", err)
		}
		if e, err := s.kv.Get(ctx, tenant); err == nil {
			at, _ := strconv.ParseInt(string(e.Value()), 10, 64)
			if time.Since(time.Unix(0, at)) > lockStale {
				if rev, err := s.kv.Update(ctx, tenant, now, e.Revision()); err == nil {
					return rev, nil
				}
			}
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return 0, ErrBusy
		case <-t.C:
		}
		pause = min(2*pause, 200*time.Millisecond)
	}
}
