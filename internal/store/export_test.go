package store

import (
	"context"
	"slices"
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
// tenant) and as its watch delivers an entry ("apply", with the key).
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
