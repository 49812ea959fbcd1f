package store

import (
	"context"
	"slices"
	"testing"
)

// LoadedTenants lists the tenants s's index holds, sorted.
func LoadedTenants(s *Store) []string {
	s.ix.mu.Lock()
	defer s.ix.mu.Unlock()
	var out []string
	for e := s.ix.lru.Front(); e != nil; e = e.Next() {
		out = append(out, e.Value.(*tenantIndex).name)
	}
	slices.Sort(out)
	return out
}

// SetHook makes s's index call fn as a tenant loads ("registered" before
// its read of the bucket, "read" after it, before the merge, with the
// tenant), as its watch delivers an entry ("apply", with the key), as a
// removal notice arrives ("notice", with its filter) and as a removal
// mark without its notice drops a tenant ("missed", with the tenant; fn
// must not call s then).
func SetHook(s *Store, fn func(stage, name string)) { s.ix.hook.Store(&fn) }

// CatchUp waits until s's index applied every write the bucket holds.
func CatchUp(ctx context.Context, s *Store) error { return s.ix.catchUp(ctx) }

// Evict drops tenant from s's index, as an eviction does.
func Evict(s *Store, tenant string) {
	s.ix.mu.Lock()
	defer s.ix.mu.Unlock()
	if t := s.ix.tenants[tenant]; t != nil && t.load == nil {
		s.ix.drop(t)
	}
}

// MissNotices makes s's index miss every removal notice from now on, as
// one disconnected, or dropping messages as a slow consumer, misses them.
func MissNotices(t testing.TB, s *Store) {
	t.Helper()
	if err := s.ix.notices.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
}
