// Package store owns the LangGraph store of a deployment: JSON items
// under a namespace (a list of labels) and a key, per tenant, in the store
// bucket, with per-item TTLs and, when an embeddings model is configured,
// vectors for semantic search. The gateway serves it as LangGraph's
// /store API and the memory middleware keeps a user's notes and facts in
// it (namespace ["memories", <user>]). It decides nothing about who may
// read what (the gateway does, UserScoped says which namespaces belong to
// a user) and must not touch any other bucket.
//
// Keys: <tenant>.<label>...<label>.<key>, each label and the key encoded
// by EncodeLabel, so a key's last token is always the item's key and the
// tokens between the tenant and it are its namespace.
package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
)

// Errors callers test with errors.Is.
var (
	ErrNotFound = errors.New("store item not found")
	// ErrConflict means the item changed since it was read (PutAt).
	ErrConflict = errors.New("store item changed concurrently")
	// ErrInvalid wraps every refused namespace, key, value or option.
	ErrInvalid = errors.New("invalid store request")
)

// Config configures a Store. Zero values take defaults.
type Config struct {
	Names bus.Names
	// Embedder, when set, makes items carry vectors of their indexed
	// fields and lets Search rank by a query's meaning; nil: a query is a
	// substring match.
	Embedder model.Embedder
	// IndexFields are the fields embedded when a put does not say
	// (LangGraph's index.fields; default ["$"], the whole value).
	IndexFields []string
}

// Store is the LangGraph store of every tenant of a deployment. It is
// safe for concurrent use.
type Store struct {
	cfg    Config
	js     jetstream.JetStream
	kv     jetstream.KeyValue
	stream jetstream.Stream
	bucket string
	ix     *index // nil: searches read the bucket (Index)
}

// Open binds a store to the store bucket, which must exist
// (bus.Provision).
func Open(ctx context.Context, js jetstream.JetStream, cfg Config) (*Store, error) {
	if cfg.Names.Prefix == "" {
		cfg.Names = bus.DefaultNames()
	}
	if len(cfg.IndexFields) == 0 {
		cfg.IndexFields = []string{"$"}
	}
	bucket := cfg.Names.StoreBucket()
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w (provision the deployment with this version first)", bucket, err)
	}
	st, err := js.Stream(ctx, "KV_"+bucket)
	if err != nil {
		return nil, fmt.Errorf("open stream KV_%s: %w", bucket, err)
	}
	return &Store{cfg: cfg, js: js, kv: kv, stream: st, bucket: bucket}, nil
}

// Semantic reports whether the store ranks queries by meaning.
func (s *Store) Semantic() bool { return s.cfg.Embedder != nil }

// Item is one stored item. Value keeps numbers exact (json.Number).
type Item struct {
	Namespace []string       `json:"namespace"`
	Key       string         `json:"key"`
	Value     map[string]any `json:"value"`
	CreatedAt time.Time      `json:"created_at"`
	UpdatedAt time.Time      `json:"updated_at"`
	// TTL is the item's time to live, renewed by reads that refresh it;
	// zero: the item stays.
	TTL       time.Duration `json:"ttl,omitempty"`
	ExpiresAt *time.Time    `json:"expires_at,omitempty"`
	// Vectors are the unit-length embeddings of the indexed fields.
	Vectors []Vector `json:"vectors,omitempty"`
}

// Vector is the embedding of one field of an item's value.
type Vector struct {
	Field string `json:"field"`
	// V is the vector as little-endian float32s (base64 in JSON, a third
	// of the size of a JSON array of numbers).
	V []byte `json:"v"`
}

// opTimeout bounds one request to the bucket.
const opTimeout = 5 * time.Second

// Get reads an item and its revision; ErrNotFound when there is none or
// it expired.
func (s *Store) Get(ctx context.Context, tenant string, namespace []string, key string) (*Item, uint64, error) {
	k, err := ItemKey(tenant, namespace, key)
	if err != nil {
		return nil, 0, err
	}
	return s.get(ctx, k)
}

func (s *Store) get(ctx context.Context, k string) (*Item, uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	e, err := s.kv.Get(ctx, k)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, ErrNotFound
	}
	if err != nil {
		return nil, 0, fmt.Errorf("read %s: %w", k, err)
	}
	it, err := decodeItem(e.Value())
	if err != nil {
		return nil, 0, fmt.Errorf("decode %s: %w", k, err)
	}
	if it.expired(time.Now()) {
		return nil, 0, ErrNotFound
	}
	return it, e.Revision(), nil
}

// decodeItem decodes a stored item, its value's numbers exact. The item
// is unmarshalled whole and only its value through a json.Decoder (which
// UseNumber needs): a Decoder over the whole item would grow its buffer
// again and again through the vectors, allocating several times their
// size.
func decodeItem(data []byte) (*Item, error) {
	var w struct {
		Item
		Value json.RawMessage `json:"value"`
	}
	if err := json.Unmarshal(data, &w); err != nil {
		return nil, err
	}
	it := w.Item
	if len(w.Value) > 0 {
		dec := json.NewDecoder(bytes.NewReader(w.Value))
		dec.UseNumber()
		if err := dec.Decode(&it.Value); err != nil {
			return nil, err
		}
	}
	return &it, nil
}

// expired reports whether the item's TTL ran out: the server removes it
// within about a second, a read in between must not see it.
func (it *Item) expired(now time.Time) bool {
	return it.ExpiresAt != nil && !now.Before(*it.ExpiresAt)
}

// PutOptions are the options of Put and PutAt.
type PutOptions struct {
	// TTL expires the item that long after this write (and after each
	// read that refreshes it); zero keeps it.
	TTL time.Duration
	// Index names the fields embedded for semantic search: nil takes
	// Config.IndexFields, an empty non-nil slice embeds none (LangGraph's
	// index=false). "$" is the whole value; "a.b" a nested field.
	Index []string
}

// MaxTTL bounds an item's TTL.
const MaxTTL = 10 * 365 * 24 * time.Hour

// Put writes an item, creating it or replacing its value (its created_at
// stays), and returns what was stored.
func (s *Store) Put(ctx context.Context, tenant string, namespace []string, key string, value map[string]any, opts PutOptions) (*Item, error) {
	k, err := ItemKey(tenant, namespace, key)
	if err != nil {
		return nil, err
	}
	if err := checkTTL(opts.TTL); err != nil {
		return nil, err
	}
	vectors, err := s.vectors(ctx, value, opts.Index)
	if err != nil {
		return nil, err
	}
	for range 20 {
		cur, rev, err := s.get(ctx, k)
		if err != nil && !errors.Is(err, ErrNotFound) {
			return nil, err
		}
		it := newItem(namespace, key, value, cur, opts.TTL)
		it.Vectors = vectors
		if err := s.write(ctx, k, it, rev); !errors.Is(err, ErrConflict) {
			return it, err
		}
	}
	return nil, fmt.Errorf("store: item %s kept changing; try again", k)
}

// PutAt writes an item over revision rev (0: it must not exist), as a
// compare-and-set; ErrConflict when it changed. The memory store writes
// through it.
func (s *Store) PutAt(ctx context.Context, tenant string, namespace []string, key string, value map[string]any, rev uint64, opts PutOptions) (*Item, error) {
	k, err := ItemKey(tenant, namespace, key)
	if err != nil {
		return nil, err
	}
	if err := checkTTL(opts.TTL); err != nil {
		return nil, err
	}
	vectors, err := s.vectors(ctx, value, opts.Index)
	if err != nil {
		return nil, err
	}
	var cur *Item
	if rev > 0 {
		if cur, _, err = s.get(ctx, k); err != nil && !errors.Is(err, ErrNotFound) {
			return nil, err
		}
	}
	it := newItem(namespace, key, value, cur, opts.TTL)
	it.Vectors = vectors
	return it, s.write(ctx, k, it, rev)
}

func checkTTL(ttl time.Duration) error {
	if ttl < 0 || ttl > MaxTTL {
		return fmt.Errorf("%w: ttl %s is not between 0 and %s", ErrInvalid, ttl, MaxTTL)
	}
	if ttl > 0 && ttl < time.Second {
		return fmt.Errorf("%w: ttl %s is shorter than a second, the shortest NATS keeps a message", ErrInvalid, ttl)
	}
	return nil
}

func newItem(namespace []string, key string, value map[string]any, cur *Item, ttl time.Duration) *Item {
	now := time.Now().UTC()
	if value == nil {
		value = map[string]any{}
	}
	it := &Item{Namespace: append([]string{}, namespace...), Key: key, Value: value, CreatedAt: now, UpdatedAt: now, TTL: ttl}
	if cur != nil {
		it.CreatedAt = cur.CreatedAt
	}
	if ttl > 0 {
		exp := now.Add(ttl)
		it.ExpiresAt = &exp
	}
	return it
}

// write stores it at key k over revision rev (0: create), with its TTL
// as the message's (the server removes the key when it runs out).
func (s *Store) write(ctx context.Context, k string, it *Item, rev uint64) error {
	data, err := json.Marshal(it)
	if err != nil {
		return err
	}
	// A NATS message carries an item: its value, dates and vectors.
	if limit := s.js.Conn().MaxPayload(); limit > 0 && int64(len(data)) > limit-1024 {
		return fmt.Errorf("%w: the item takes %d bytes with its vectors, more than a NATS message carries (%d)", ErrInvalid, len(data), limit-1024)
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if rev == 0 {
		var opts []jetstream.KVCreateOpt
		if it.TTL > 0 {
			opts = append(opts, jetstream.KeyTTL(it.TTL))
		}
		_, err := s.kv.Create(ctx, k, data, opts...)
		if errors.Is(err, jetstream.ErrKeyExists) {
			return ErrConflict
		}
		return bus.MarkStoreFull(s.bucket, err)
	}
	popts := []jetstream.PublishOpt{jetstream.WithExpectLastSequencePerSubject(rev)}
	if it.TTL > 0 {
		popts = append(popts, jetstream.WithMsgTTL(it.TTL))
	}
	_, err = s.js.PublishMsg(ctx, &nats.Msg{Subject: "$KV." + s.bucket + "." + k, Data: data}, popts...)
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == 10164) {
		return ErrConflict
	}
	return bus.MarkStoreFull(s.bucket, err)
}

// refresh renews an item's TTL after a read (LangGraph's refresh_ttl).
// A write in between wins: it set its own expiry.
func (s *Store) refresh(ctx context.Context, tenant string, it *Item, rev uint64) {
	if it.TTL <= 0 {
		return
	}
	k, err := ItemKey(tenant, it.Namespace, it.Key)
	if err != nil {
		return
	}
	next := *it
	exp := time.Now().UTC().Add(it.TTL)
	next.ExpiresAt = &exp
	if s.write(ctx, k, &next, rev) == nil {
		it.ExpiresAt = &exp
	}
}

// GetRefresh is Get, renewing the item's TTL when refresh is set.
func (s *Store) GetRefresh(ctx context.Context, tenant string, namespace []string, key string, refresh bool) (*Item, error) {
	it, rev, err := s.Get(ctx, tenant, namespace, key)
	if err == nil && refresh {
		s.refresh(ctx, tenant, it, rev)
	}
	return it, err
}

// Delete removes an item with a subject purge of the bucket's stream,
// which leaves no marker naming the key. Deleting what is not there is
// no error.
func (s *Store) Delete(ctx context.Context, tenant string, namespace []string, key string) error {
	k, err := ItemKey(tenant, namespace, key)
	if err != nil {
		return err
	}
	return s.purge(ctx, k)
}

// PurgePrefix removes every item of tenant under namespace prefix (erasure
// of a user's namespaces, of a tenant with an empty prefix), leaving no
// marker.
func (s *Store) PurgePrefix(ctx context.Context, tenant string, prefix []string) error {
	f, err := prefixFilter(tenant, prefix)
	if err != nil {
		return err
	}
	return s.purge(ctx, f)
}

// Subject is the stream subject that holds every item of tenant under
// namespace prefix, for a caller that purges streams itself (erasure).
func Subject(names bus.Names, tenant string, prefix []string) (string, error) {
	f, err := prefixFilter(tenant, prefix)
	if err != nil {
		return "", err
	}
	return "$KV." + names.StoreBucket() + "." + f, nil
}

// prefixFilter is the key filter of every item of tenant whose namespace
// starts with prefix.
func prefixFilter(tenant string, prefix []string) (string, error) {
	if !protocol.ValidToken(tenant) {
		return "", fmt.Errorf("%w: tenant %q is not valid", ErrInvalid, tenant)
	}
	if err := CheckNamespace(prefix); err != nil {
		return "", err
	}
	tokens := []string{tenant}
	for _, l := range prefix {
		tokens = append(tokens, EncodeLabel(l))
	}
	return bus.Key(append(tokens, ">")...), nil
}
