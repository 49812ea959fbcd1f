package memory

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/jobs"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
)

// Extractor runs memory jobs: it distils a thread's new messages into the
// user's facts with a model.
type Extractor struct {
	store   *Store
	threads *kv.Threads
	cps     *kv.Checkpoints
	model   model.Model
	log     *zap.Logger
	// MaxTranscriptChars bounds the conversation sent to the model; the
	// most recent messages are kept (default 16,000).
	MaxTranscriptChars int
	// CallTimeout bounds the model call (default 2m).
	CallTimeout time.Duration
}

// NewExtractor builds the memory job handler: it reads threads from
// stores and asks m (with the model name the job carries) for facts.
func NewExtractor(store *Store, stores *kv.Stores, m model.Model, log *zap.Logger) *Extractor {
	if log == nil {
		log = zap.NewNop()
	}
	return &Extractor{store: store, threads: stores.Threads, cps: stores.Checkpoints, model: m, log: log,
		MaxTranscriptChars: 16000, CallTimeout: 2 * time.Minute}
}

// fallbackMessages is how far back a thread is read when its cursor's
// message is gone (the transcript was rolled back or compacted): facts
// are deduplicated, so reading some messages twice costs only tokens.
const fallbackMessages = 40

// Handle is the jobs.Handler of JobKind. A payload that does not decode is
// permanent; a model answer that is not valid facts JSON fails the
// attempt, so the job is retried with backoff and then dead-lettered.
func (e *Extractor) Handle(ctx context.Context, job *jobs.Job) error {
	var p payload
	dec := json.NewDecoder(bytes.NewReader(job.Data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return jobs.Permanent(fmt.Errorf("memory job payload: %w", err))
	}
	for _, t := range []string{p.Tenant, p.User, p.Thread} {
		if !protocol.ValidToken(t) {
			return jobs.Permanent(fmt.Errorf("memory job payload: %q is not a valid token", t))
		}
	}
	log := e.log.With(zap.String("tenant", p.Tenant), zap.String("user", p.User), zap.String("thread_id", p.Thread), zap.String("agent", p.Agent), zap.String("job_id", job.ID))

	rec, _, err := e.threads.Get(ctx, p.Tenant, p.Thread)
	if errors.Is(err, kv.ErrNotFound) || (err == nil && rec.Status == protocol.ThreadDeleting) {
		return nil // the thread is gone, or going (internal/erase): nothing to remember
	}
	if err != nil {
		return err
	}
	st, _, err := e.cps.Load(ctx, p.Tenant, p.Thread, rec.Head)
	if err != nil {
		return err
	}
	end := len(st.Messages)
	if rec.Lease != nil {
		// A run holds the thread: its messages are unfinished. It
		// enqueues its own job when it succeeds.
		end = firstOfRun(st, rec.Lease.RunID)
	}
	cur, rev, err := e.store.Cursor(ctx, p.Tenant, p.User, p.Thread)
	if err != nil {
		return err
	}
	start := 0
	if cur.MessageID != "" {
		if i := st.Index(cur.MessageID); i >= 0 {
			start = i + 1
		} else {
			start = max(0, end-fallbackMessages)
		}
	}
	if start >= end {
		return nil
	}
	transcript := middleware.MemoryTranscript(st.Messages[start:end])
	next := Cursor{MessageID: st.Messages[end-1].ID, Messages: end, UpdatedAt: time.Now().UTC()}
	if !hasUser(transcript) {
		log.Debug("nothing to remember in the new messages")
		return e.advance(ctx, p, next, rev, st)
	}
	known, err := e.store.Facts(ctx, p.Tenant, p.User)
	if err != nil {
		return err
	}
	facts, err := e.extract(ctx, p, known, e.clip(transcript))
	if err != nil {
		return err
	}
	merged, err := e.store.MergeFacts(ctx, p.Tenant, p.User, facts, MergeOptions{MinConfidence: p.MinConfidence, MaxFacts: p.MaxFacts, Thread: p.Thread})
	if err != nil {
		return err
	}
	log.Info("memory facts updated", zap.Int("extracted", len(facts)), zap.Int("facts", len(merged)))
	return e.advance(ctx, p, next, rev, st)
}

// firstOfRun is the index of the first message of run, or len.
func firstOfRun(st *state.State, run string) int {
	for i, m := range st.Messages {
		if id, _ := m.Meta["run_id"].(string); id == run {
			return i
		}
	}
	return len(st.Messages)
}

func hasUser(ms []model.Message) bool {
	for _, m := range ms {
		if m.Role == model.RoleUser {
			return true
		}
	}
	return false
}

// advance moves the cursor with compare-and-set. If another job moved it
// meanwhile, the furthest cursor stays.
func (e *Extractor) advance(ctx context.Context, p payload, next Cursor, rev uint64, st *state.State) error {
	for range maxCASAttempts {
		err := e.store.SetCursor(ctx, p.Tenant, p.User, p.Thread, next, rev)
		if !errors.Is(err, ErrConflict) {
			return err
		}
		var cur Cursor
		cur, rev, err = e.store.Cursor(ctx, p.Tenant, p.User, p.Thread)
		if err != nil {
			return err
		}
		if st.Index(cur.MessageID) >= next.Messages-1 {
			return nil
		}
	}
	return fmt.Errorf("the memory cursor of thread %s kept changing", p.Thread)
}

// clip keeps the most recent messages within MaxTranscriptChars.
func (e *Extractor) clip(ms []model.Message) []model.Message {
	total := 0
	for i := len(ms) - 1; i >= 0; i-- {
		total += len(ms[i].Content)
		if total > e.MaxTranscriptChars && i < len(ms)-1 {
			return ms[i+1:]
		}
	}
	return ms
}

const extractionPrompt = `You keep a long-term memory about one user of an AI assistant. Read the conversation and pick out facts about the user that will still be true and useful in later, unrelated conversations: who they are, what they prefer, their goals and constraints, decisions they made, and corrections they gave the assistant.

Leave out small talk, details that only matter for the task at hand, and anything about the assistant itself. Never record passwords, keys, tokens or other secrets. Write each fact as one short sentence about the user in the third person, for example "The user prefers metric units.". Do not repeat a known fact unless the conversation confirms or changes it; then state it again with your new confidence.

Answer with JSON only, in exactly this shape and with nothing before or after it:
{"facts":[{"content":"The user ...","category":"preference","confidence":0.9}]}

category is one of: preference, correction, context, goal, behavior, identity, constraint, decision, other.
confidence is from 0 to 1: how sure you are that the fact is true and will last.
Answer {"facts":[]} when there is nothing worth keeping.`

var escapeData = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;")

// extract asks the model for facts and validates its answer.
func (e *Extractor) extract(ctx context.Context, p payload, known []Fact, transcript []model.Message) ([]Fact, error) {
	var b strings.Builder
	if len(known) > 0 {
		b.WriteString("<known_facts>\n")
		for _, f := range middleware.SelectFacts(known, 0, 30) {
			fmt.Fprintf(&b, "- [%s | %.2f] %s\n", escapeData.Replace(f.Category), f.Confidence, escapeData.Replace(f.Content))
		}
		b.WriteString("</known_facts>\n\n")
	}
	b.WriteString("<conversation>\n")
	for _, m := range transcript {
		fmt.Fprintf(&b, "%s: %s\n\n", m.Role, escapeData.Replace(m.Content))
	}
	b.WriteString("</conversation>")
	ctx, cancel := context.WithTimeout(ctx, e.CallTimeout)
	defer cancel()
	resp, err := e.model.Generate(ctx, &model.Request{
		Model:    p.Model,
		System:   extractionPrompt,
		Messages: []model.Message{{Role: model.RoleUser, Content: b.String()}},
	}, nil)
	if err != nil {
		return nil, fmt.Errorf("extraction model: %w", err)
	}
	facts, err := ParseFacts(resp.Message.Content)
	if err != nil {
		return nil, fmt.Errorf("extraction model answered no valid facts JSON: %w", err)
	}
	return facts, nil
}
