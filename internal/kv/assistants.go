package kv

import (
	"context"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/protocol"
)

// Assistants stores the assistants users create, in their own bucket:
// the current version under "<tenant>.<assistant>" and every version
// under "<tenant>.<assistant>.v.<n>". Keys start with the tenant, so a
// tenant's listing reads its own keys only.
type Assistants struct {
	kv jetstream.KeyValue
	js jetstream.JetStream
	// skips reports the records that do not decode (Observe).
	skips *Skips
}

// OpenAssistants binds the assistants store to its bucket, which must
// exist (bus.Provision of this version).
func OpenAssistants(ctx context.Context, js jetstream.JetStream, names bus.Names) (*Assistants, error) {
	b, err := js.KeyValue(ctx, names.AssistantsBucket())
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w (provision the deployment with this version first)", names.AssistantsBucket(), err)
	}
	return &Assistants{kv: b, js: js}, nil
}

func versionKey(tenant, id string, v int) string {
	return bus.Key(tenant, id, "v", strconv.Itoa(v))
}

// Get reads the current version of an assistant.
func (s *Assistants) Get(ctx context.Context, tenant, id string) (*protocol.Assistant, uint64, error) {
	return get[protocol.Assistant](ctx, s.js, s.kv, bus.Key(tenant, id))
}

// Version reads one version of an assistant.
func (s *Assistants) Version(ctx context.Context, tenant, id string, v int) (*protocol.Assistant, error) {
	a, _, err := get[protocol.Assistant](ctx, s.js, s.kv, versionKey(tenant, id, v))
	return a, err
}

// Create stores a new assistant as its version 1; ErrExists if the id is
// taken.
func (s *Assistants) Create(ctx context.Context, a *protocol.Assistant) error {
	a.Version, a.LatestVersion = 1, 1
	if _, err := put(ctx, s.js, s.kv, bus.Key(a.Tenant, a.AssistantID), a, 0); err != nil {
		return err
	}
	_, err := put(ctx, s.js, s.kv, versionKey(a.Tenant, a.AssistantID, 1), a, 0)
	return err
}

// Update writes next as a new version (LatestVersion+1 of the record
// read at rev) and makes it current, with a compare-and-set on the
// current record. The version is written first: a lost race leaves an
// unused version key that the winner's write replaces.
func (s *Assistants) Update(ctx context.Context, next *protocol.Assistant, rev uint64) error {
	next.LatestVersion++
	next.Version = next.LatestVersion
	if _, err := s.putVersion(ctx, next); err != nil {
		return err
	}
	_, err := put(ctx, s.js, s.kv, bus.Key(next.Tenant, next.AssistantID), next, rev)
	return err
}

func (s *Assistants) putVersion(ctx context.Context, a *protocol.Assistant) (uint64, error) {
	data, err := encode(a)
	if err != nil {
		return 0, err
	}
	ctx, cancel := bound(ctx)
	defer cancel()
	n, err := s.kv.Put(ctx, versionKey(a.Tenant, a.AssistantID, a.Version), data)
	return n, bus.MarkStoreFull(s.kv.Bucket(), err)
}

// SetCurrent makes version v current, with a compare-and-set on the
// record read at rev.
func (s *Assistants) SetCurrent(ctx context.Context, cur *protocol.Assistant, rev uint64, v int) (*protocol.Assistant, error) {
	a, err := s.Version(ctx, cur.Tenant, cur.AssistantID, v)
	if err != nil {
		return nil, err
	}
	a.LatestVersion = cur.LatestVersion
	if _, err := put(ctx, s.js, s.kv, bus.Key(cur.Tenant, cur.AssistantID), a, rev); err != nil {
		return nil, err
	}
	return a, nil
}

// Versions lists an assistant's versions, newest first.
func (s *Assistants) Versions(ctx context.Context, tenant, id string) ([]*protocol.Assistant, error) {
	out, err := s.watch(ctx, bus.Key(tenant, id, "v", "*"))
	if err != nil {
		return nil, err
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	// Keys arrive in write order; a version rewritten after a lost race
	// may be out of place.
	sortVersions(out)
	return out, nil
}

func sortVersions(as []*protocol.Assistant) {
	for i := 1; i < len(as); i++ {
		for j := i; j > 0 && as[j].Version > as[j-1].Version; j-- {
			as[j], as[j-1] = as[j-1], as[j]
		}
	}
}

// List returns the current version of every assistant of a tenant.
func (s *Assistants) List(ctx context.Context, tenant string) ([]*protocol.Assistant, error) {
	return s.watch(ctx, bus.Key(tenant, "*"))
}

func (s *Assistants) watch(ctx context.Context, filter string) ([]*protocol.Assistant, error) {
	return List[protocol.Assistant](ctx, s.kv, filter, nil, s.skips)
}

// Delete removes an assistant and its versions with subject purges of the
// bucket's stream: a KV purge leaves a marker naming the key, which this
// bucket would keep for ever (it has no marker TTL).
func (s *Assistants) Delete(ctx context.Context, tenant, id string) error {
	if !protocol.ValidToken(tenant) || !protocol.ValidToken(id) {
		return ErrNotFound // never a wildcard in a purge's filter
	}
	ctx, cancel := bound(ctx)
	defer cancel()
	bucket := s.kv.Bucket()
	st, err := s.js.Stream(ctx, "KV_"+bucket)
	if err != nil {
		return err
	}
	for _, k := range []string{bus.Key(tenant, id), bus.Key(tenant, id, ">")} {
		if err := st.Purge(ctx, jetstream.WithPurgeSubject("$KV."+bucket+"."+k)); err != nil {
			return err
		}
	}
	return nil
}
