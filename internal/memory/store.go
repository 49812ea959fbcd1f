// Package memory owns what natsagent remembers about a user across
// threads: the notes (the user's MEMORY.md, written with the remember
// tool) and the facts distilled from their conversations, and the memory
// job that distils them. Store implements middleware.MemoryStore, so the
// memory middleware never sees NATS; every write is a compare-and-set. It
// must not touch runs, leases or checkpoints (the job only reads a
// thread's state).
//
// Notes and facts are items of the LangGraph store (internal/store), so
// people see and edit them through the store API and the SDK: namespace
// ["memories", <user>], key "notes" ({"content": "<the notes>"}) and key
// "facts" ({"facts": [...]}). The distillation cursors stay in the memory
// bucket: <tenant>.<user>.cursor.<thread>. Notes and facts written before
// the store existed (memory bucket, <tenant>.<user>.notes and .facts) are
// read when the user has no item yet, and moved: the first write creates
// the item and removes the old key.
package memory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/jobs"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/store"
)

// Fact is one fact about a user.
type Fact = middleware.MemoryFact

// JobKind is the kind of the memory job.
const JobKind = "memory"

// DefaultMaxNotesBytes bounds a user's notes.
const DefaultMaxNotesBytes = 8 << 10

// ErrConflict means a key changed since it was read.
var ErrConflict = errors.New("memory changed concurrently")

// Config configures a Store. Zero values take defaults.
type Config struct {
	Names bus.Names
	// MaxNotesBytes bounds a user's notes (default 8 KiB).
	MaxNotesBytes int
	// SettleDelay is added to the end of a debounce window before the job
	// runs, so the run that enqueued it has written its last checkpoint
	// (default 2s).
	SettleDelay time.Duration
}

// Store is the memory of every user of a deployment.
type Store struct {
	cfg   Config
	kv    jetstream.KeyValue
	js    jetstream.JetStream
	items *store.Store
}

var _ middleware.MemoryStore = (*Store)(nil)

// Open binds a store to the memory bucket, which must exist
// (bus.Provision).
func Open(ctx context.Context, js jetstream.JetStream, cfg Config) (*Store, error) {
	if cfg.Names.Prefix == "" {
		cfg.Names = bus.DefaultNames()
	}
	if cfg.MaxNotesBytes <= 0 {
		cfg.MaxNotesBytes = DefaultMaxNotesBytes
	}
	if cfg.SettleDelay <= 0 {
		cfg.SettleDelay = 2 * time.Second
	}
	kv, err := js.KeyValue(ctx, cfg.Names.MemoryBucket())
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", cfg.Names.MemoryBucket(), err)
	}
	items, err := store.Open(ctx, js, store.Config{Names: cfg.Names})
	if err != nil {
		return nil, err
	}
	return &Store{cfg: cfg, kv: kv, js: js, items: items}, nil
}

// Item keys of a user's memory in the store.
const (
	notesKey = "notes"
	factsKey = "facts"
)

// Namespace is the store namespace of a user's notes and facts.
func Namespace(user string) []string { return []string{store.MemoryNamespace, user} }

// item reads one of a user's memory items as its value and revision; a
// user with no item yet gets the legacy key's value (decoded by legacy)
// at revision 0, and moved reports that.
func (s *Store) item(ctx context.Context, tenant, user, key string, legacy func([]byte) (map[string]any, error)) (value map[string]any, rev uint64, moved bool, err error) {
	old, err := userKey(tenant, user, key)
	if err != nil {
		return nil, 0, false, err
	}
	it, rev, err := s.items.Get(ctx, tenant, Namespace(user), key)
	if err == nil {
		return it.Value, rev, false, nil
	}
	if !errors.Is(err, store.ErrNotFound) {
		return nil, 0, false, err
	}
	data, _, err := s.get(ctx, old)
	if err != nil || data == nil {
		return nil, 0, false, err
	}
	value, err = legacy(data)
	if err != nil {
		return nil, 0, false, fmt.Errorf("decode %s: %w", old, err)
	}
	return value, 0, true, nil
}

// putItem writes one of a user's memory items over rev (ErrConflict when
// it changed) and, when the value moved from the legacy key, removes that
// key.
func (s *Store) putItem(ctx context.Context, tenant, user, key string, value map[string]any, rev uint64, moved bool) error {
	_, err := s.items.PutAt(ctx, tenant, Namespace(user), key, value, rev, store.PutOptions{})
	if errors.Is(err, store.ErrConflict) {
		return ErrConflict
	}
	if err != nil || !moved {
		return err
	}
	old, _ := userKey(tenant, user, key)
	st, err := s.js.Stream(ctx, "KV_"+s.cfg.Names.MemoryBucket())
	if err != nil {
		return err
	}
	return st.Purge(ctx, jetstream.WithPurgeSubject("$KV."+s.cfg.Names.MemoryBucket()+"."+old))
}

func legacyNotes(data []byte) (map[string]any, error) {
	return map[string]any{"content": string(data)}, nil
}

func legacyFacts(data []byte) (map[string]any, error) {
	var v map[string]any
	err := json.Unmarshal(data, &v)
	return v, err
}

// notesOf is the text of a notes item's value.
func notesOf(value map[string]any) string {
	s, _ := value["content"].(string)
	return s
}

func userKey(tenant, user string, rest ...string) (string, error) {
	if !protocol.ValidToken(tenant) {
		return "", fmt.Errorf("memory: tenant %q is not valid", tenant)
	}
	if !protocol.ValidToken(user) {
		return "", fmt.Errorf("memory: user %q is not valid", user)
	}
	return bus.Key(append([]string{tenant, user}, rest...)...), nil
}

// opTimeout bounds one request to the memory bucket: reads and writes
// run under a run's context, whose deadline is the run's, and one lost
// with a NATS node would otherwise hold the run that long.
var opTimeout = 5 * time.Second

// get reads a key; a missing key is (nil, 0, nil).
func (s *Store) get(ctx context.Context, key string) ([]byte, uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	e, err := s.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("read %s: %w", key, err)
	}
	return e.Value(), e.Revision(), nil
}

// put creates (rev 0) or compare-and-sets a key; ErrConflict when it
// changed.
func (s *Store) put(ctx context.Context, key string, data []byte, rev uint64) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	var err error
	if rev == 0 {
		_, err = s.kv.Create(ctx, key, data)
	} else {
		_, err = s.kv.Update(ctx, key, data, rev)
	}
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return ErrConflict
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", key, err)
	}
	return nil
}

const maxCASAttempts = 20

// Notes returns the user's notes, "" when there are none.
func (s *Store) Notes(ctx context.Context, tenant, user string) (string, error) {
	value, _, _, err := s.item(ctx, tenant, user, notesKey, legacyNotes)
	return notesOf(value), err
}

// AppendNote appends note as one line ("- note") to the user's notes. A
// note already there (ignoring case and spacing) leaves them unchanged.
// Notes that would outgrow MaxNotesBytes are refused with
// middleware.ErrNotesFull.
func (s *Store) AppendNote(ctx context.Context, tenant, user, note string) (middleware.NoteAppend, error) {
	if _, err := userKey(tenant, user, notesKey); err != nil {
		return middleware.NoteAppend{}, err
	}
	note = strings.Join(strings.Fields(note), " ")
	if note == "" {
		return middleware.NoteAppend{}, errors.New("memory: the note is empty")
	}
	line := "- " + note
	for range maxCASAttempts {
		value, rev, moved, err := s.item(ctx, tenant, user, notesKey, legacyNotes)
		if err != nil {
			return middleware.NoteAppend{}, err
		}
		old := notesOf(value)
		if hasNote(old, note) {
			return middleware.NoteAppend{Notes: old, Unchanged: true}, nil
		}
		next := line
		if trimmed := strings.TrimRight(old, "\n"); trimmed != "" {
			next = trimmed + "\n" + line
		}
		if len(next) > s.cfg.MaxNotesBytes {
			return middleware.NoteAppend{}, fmt.Errorf("%w: %d of %d bytes are used and this note needs %d more",
				middleware.ErrNotesFull, len(old), s.cfg.MaxNotesBytes, len(next)-len(old))
		}
		err = s.putItem(ctx, tenant, user, notesKey, map[string]any{"content": next}, rev, moved)
		if err == nil {
			return middleware.NoteAppend{Notes: next}, nil
		}
		if !errors.Is(err, ErrConflict) {
			return middleware.NoteAppend{}, err
		}
	}
	return middleware.NoteAppend{}, fmt.Errorf("memory: the notes of %s kept changing; try again", user)
}

// hasNote reports whether notes hold a line saying note.
func hasNote(notes, note string) bool {
	want := normalize(note)
	for _, l := range strings.Split(notes, "\n") {
		l = strings.TrimSpace(l)
		l = strings.TrimSpace(strings.TrimPrefix(strings.TrimPrefix(l, "- "), "* "))
		if normalize(l) == want {
			return true
		}
	}
	return false
}

// normalize is the form two notes or facts are compared in: lower case,
// single spaces, without trailing punctuation.
func normalize(s string) string {
	s = strings.ToLower(strings.Join(strings.Fields(s), " "))
	return strings.TrimRight(s, ".!?;:,。！？ ")
}

type factsDoc struct {
	Facts []Fact `json:"facts"`
}

// Facts returns the user's facts, highest confidence first.
func (s *Store) Facts(ctx context.Context, tenant, user string) ([]Fact, error) {
	facts, _, _, err := s.facts(ctx, tenant, user)
	return facts, err
}

func (s *Store) facts(ctx context.Context, tenant, user string) ([]Fact, uint64, bool, error) {
	value, rev, moved, err := s.item(ctx, tenant, user, factsKey, legacyFacts)
	if err != nil || value == nil {
		return nil, rev, moved, err
	}
	data, err := json.Marshal(value)
	if err != nil {
		return nil, 0, false, err
	}
	var doc factsDoc
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, 0, false, fmt.Errorf("decode the facts of %s (store item %q %s): %w", user, Namespace(user), factsKey, err)
	}
	return doc.Facts, rev, moved, nil
}

// MergeFacts merges incoming facts into the user's facts with
// compare-and-set, as MergeFacts (the function) does, and returns the
// result.
func (s *Store) MergeFacts(ctx context.Context, tenant, user string, incoming []Fact, opts MergeOptions) ([]Fact, error) {
	if _, err := userKey(tenant, user, factsKey); err != nil {
		return nil, err
	}
	for range maxCASAttempts {
		cur, rev, moved, err := s.facts(ctx, tenant, user)
		if err != nil {
			return nil, err
		}
		merged := MergeFacts(cur, incoming, opts)
		value, err := factsValue(merged)
		if err != nil {
			return nil, err
		}
		err = s.putItem(ctx, tenant, user, factsKey, value, rev, moved)
		if err == nil {
			return merged, nil
		}
		if !errors.Is(err, ErrConflict) {
			return nil, err
		}
	}
	return nil, fmt.Errorf("memory: the facts of %s kept changing", user)
}

// factsValue is the store value of facts: {"facts": [...]}.
func factsValue(facts []Fact) (map[string]any, error) {
	data, err := json.Marshal(factsDoc{Facts: facts})
	if err != nil {
		return nil, err
	}
	var v map[string]any
	return v, json.Unmarshal(data, &v)
}

// Cursor is how far a thread's messages were distilled into facts.
type Cursor struct {
	// MessageID is the last message distilled.
	MessageID string `json:"message_id"`
	// Messages is how many messages the thread had up to it.
	Messages  int       `json:"messages"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Cursor reads a thread's cursor and its revision (0: none yet).
func (s *Store) Cursor(ctx context.Context, tenant, user, thread string) (Cursor, uint64, error) {
	key, err := cursorKey(tenant, user, thread)
	if err != nil {
		return Cursor{}, 0, err
	}
	data, rev, err := s.get(ctx, key)
	if err != nil || data == nil {
		return Cursor{}, rev, err
	}
	var c Cursor
	if err := json.Unmarshal(data, &c); err != nil {
		return Cursor{}, 0, fmt.Errorf("decode %s: %w", key, err)
	}
	return c, rev, nil
}

// SetCursor writes a thread's cursor over revision rev (0: create);
// ErrConflict when it changed.
func (s *Store) SetCursor(ctx context.Context, tenant, user, thread string, c Cursor, rev uint64) error {
	key, err := cursorKey(tenant, user, thread)
	if err != nil {
		return err
	}
	data, err := json.Marshal(c)
	if err != nil {
		return err
	}
	return s.put(ctx, key, data, rev)
}

func cursorKey(tenant, user, thread string) (string, error) {
	if !protocol.ValidToken(thread) {
		return "", fmt.Errorf("memory: thread %q is not valid", thread)
	}
	return userKey(tenant, user, "cursor", thread)
}

// payload is a memory job's data.
type payload struct {
	Tenant        string  `json:"tenant"`
	User          string  `json:"user"`
	Thread        string  `json:"thread"`
	Agent         string  `json:"agent,omitempty"`
	Model         string  `json:"model,omitempty"`
	MinConfidence float64 `json:"min_confidence"`
	MaxFacts      int     `json:"max_facts"`
}

// EnqueueMemoryJob enqueues the memory job of (tenant, user, thread) for
// the end of the debounce window now falls in (plus SettleDelay). Its id
// names the window, "memory.<tenant>.<user>.<thread>.<unix time / window>",
// so the jobs stream drops every later enqueue of the same window: several
// runs on a thread inside one window make one job. The job carries no
// messages (it reads the thread when it runs), so coalescing never loses
// a run's messages, whichever agent ran it.
func (s *Store) EnqueueMemoryJob(ctx context.Context, job middleware.MemoryJob) error {
	for _, t := range []string{job.Tenant, job.User, job.Thread} {
		if !protocol.ValidToken(t) {
			return fmt.Errorf("memory job: %q is not a valid token", t)
		}
	}
	window := int64(max(job.Debounce.Round(time.Second), time.Second) / time.Second)
	n := time.Now().Unix() / window
	data, err := json.Marshal(payload{
		Tenant: job.Tenant, User: job.User, Thread: job.Thread, Agent: job.Agent,
		Model: job.Model, MinConfidence: job.MinConfidence, MaxFacts: job.MaxFacts,
	})
	if err != nil {
		return err
	}
	_, err = jobs.Enqueue(ctx, s.js, s.cfg.Names, jobs.Spec{
		Kind:   JobKind,
		Tokens: []string{job.Tenant, job.User},
		Key:    job.Thread,
		ID:     fmt.Sprintf("memory.%s.%s.%s.%d", job.Tenant, job.User, job.Thread, n),
		Due:    time.Unix((n+1)*window, 0).Add(s.cfg.SettleDelay),
		Data:   data,
	})
	return err
}
