package events

import (
	"cmp"
	"context"
	"encoding/json"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/protocol"
)

// Follow reads a run's (or a thread's) events as a person sees them: the
// stored ones in stream order from a Feed, and the live ones (token
// deltas and the other protocol.LiveEvent types, published on core NATS
// only) from a subscription to the matching live subject, merged into
// the order the worker emitted them. The gateway's SSE streams and the
// CLI's run and tail read through it; a reader that wants stored events
// only (a wait, a count) uses a Feed.
//
// The merge (merger) holds a live event until the stored event it
// follows (its "after") was delivered, delivers live events in their
// "index" order, and drops a live event that is stale (an older attempt),
// repeated, or made redundant: a delta of a message whose
// message.completed was delivered, anything of a run whose run.finished
// was delivered.
type Follow struct {
	feed   *Feed
	sub    *nats.Subscription
	live   chan *nats.Msg
	stored chan feedItem
	ctx    context.Context
	cancel context.CancelFunc
	once   sync.Once
	m      merger
	ready  []Item
	err    error // the feed's, once it failed
}

// Item is one event a Follow delivers.
type Item struct {
	// Data is the envelope.
	Data []byte
	// Type is the envelope's type.
	Type string
	// StreamSeq is a stored event's sequence in the events stream (an SSE
	// id, a Last-Event-ID); 0 for a live event.
	StreamSeq uint64
	// Live marks an event that was not stored.
	Live bool
}

type feedItem struct {
	m   jetstream.Msg
	err error
}

// liveBuffer bounds the live events received and not yet read; beyond
// it the subscription drops them (a slow reader loses deltas, never the
// stored message.completed that repeats them).
const liveBuffer = 8192

// OpenFollow subscribes to the live events that go with subject (a
// filter of the events stream: bus.Names RunEvents or ThreadEvents), then
// opens the Feed of subject (OpenFeed, with cfg): a live event published
// once OpenFollow returns is not missed on this server. A feed that
// starts mid-run (cfg.After, NewOnly, Since) does not know the stored
// events before it: a live event of a run it has seen no stored event of
// is delivered at once, unless SawSeq says where the reader was.
func OpenFollow(ctx context.Context, js jetstream.JetStream, names bus.Names, subject string, cfg FeedConfig) (*Follow, error) {
	fw := &Follow{live: make(chan *nats.Msg, liveBuffer), stored: make(chan feedItem)}
	fw.m.fromStart = !cfg.NewOnly && cfg.After == 0 && cfg.Since.IsZero()
	if live := names.LiveOf(subject); live != "" {
		sub, err := js.Conn().ChanSubscribe(live, fw.live)
		if err != nil {
			return nil, err
		}
		fw.sub = sub
	}
	f, err := OpenFeed(ctx, js, names, subject, cfg)
	if err != nil {
		if fw.sub != nil {
			_ = fw.sub.Unsubscribe()
		}
		return nil, err
	}
	fw.feed = f
	fw.ctx, fw.cancel = context.WithCancel(context.Background())
	return fw, nil
}

// SawStarted tells the follow that the reader already had run's
// run.started of attempt (Feed.SawStarted), before the first Next.
func (fw *Follow) SawStarted(tenant, run string, attempt int) {
	fw.feed.SawStarted(tenant, run, attempt)
	fw.m.view(tenant, run).started(attempt)
}

// SawSeq tells the follow that the reader already had run's stored
// events up to seq (the envelope seq of the event at its Last-Event-ID),
// before the first Next: a live event after it is delivered at once, one
// after a later seq waits for that stored event.
func (fw *Follow) SawSeq(tenant, run string, seq uint64) {
	v := fw.m.view(tenant, run)
	v.known = true
	v.seq = max(v.seq, seq)
}

// Next returns the next event, or ctx's error.
func (fw *Follow) Next(ctx context.Context) (Item, error) {
	fw.once.Do(func() { go fw.pump() })
	for len(fw.ready) == 0 {
		if fw.err != nil {
			return Item{}, fw.err
		}
		select {
		case <-ctx.Done():
			return Item{}, ctx.Err()
		case it := <-fw.stored:
			if it.err != nil {
				fw.err = it.err
				continue
			}
			// The live events received before this stored one go first:
			// a select picks among ready cases at random, and a delta
			// taken after its message.completed would be dropped. On one
			// server a connection receives a worker's deltas before the
			// consumer delivers the stored event it published after them.
			fw.drainLive()
			var seq uint64
			if md, err := it.m.Metadata(); err == nil {
				seq = md.Sequence.Stream
			}
			fw.ready = fw.m.stored(fw.ready, it.m.Data(), seq)
		case m := <-fw.live:
			fw.ready = fw.m.live(fw.ready, m.Data)
		}
	}
	it := fw.ready[0]
	fw.ready[0] = Item{}
	fw.ready = fw.ready[1:]
	return it, nil
}

// drainLive takes the live events already received.
func (fw *Follow) drainLive() {
	for {
		select {
		case m := <-fw.live:
			fw.ready = fw.m.live(fw.ready, m.Data)
		default:
			return
		}
	}
}

// NextWithin returns the next event, or context.DeadlineExceeded once
// wait has passed without one (Feed.NextWithin).
func (fw *Follow) NextWithin(ctx context.Context, wait time.Duration) (Item, error) {
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	return fw.Next(wctx)
}

// pump moves the feed's messages to fw.stored, so that Next waits on the
// feed and the live subscription at once.
func (fw *Follow) pump() {
	for {
		m, err := fw.feed.Next(fw.ctx)
		select {
		case fw.stored <- feedItem{m, err}:
		case <-fw.ctx.Done():
			return
		}
		if err != nil {
			return
		}
	}
}

// Close stops the subscription and the feed (Feed.Close).
func (fw *Follow) Close() {
	if fw.sub != nil {
		_ = fw.sub.Unsubscribe()
	}
	fw.cancel()
	fw.feed.Close()
}

// merger orders live events among stored ones, per run. It is the whole
// reading rule of docs/protocol.md 2.10 for live events, kept apart from
// NATS so that it can be tested with crafted envelopes.
type merger struct {
	// fromStart: the stored events arrive from each run's first one, so
	// a run without any delivered yet is at seq 0.
	fromStart bool
	runs      map[string]*runView
}

// runView is what the merger knows of one run.
type runView struct {
	// known: seq is the last stored seq the reader had (else a live
	// event cannot be placed and goes out at once).
	known bool
	seq   uint64
	// attempt is the newest run.started seen; index the last live index
	// delivered of it.
	attempt int
	index   uint64
	// completed holds the messages whose message.completed was delivered.
	completed map[string]bool
	finished  bool
	held      []heldLive
}

type heldLive struct {
	env liveEnvelope
	it  Item
}

// maxHeld bounds the live events a run holds while its stored events
// lag: beyond it the oldest are dropped (the stored events repeat them).
const maxHeld = 4096

func (m *merger) view(tenant, run string) *runView {
	if m.runs == nil {
		m.runs = map[string]*runView{}
	}
	key := tenant + "." + run
	v := m.runs[key]
	if v == nil {
		v = &runView{known: m.fromStart}
		m.runs[key] = v
	}
	return v
}

func (v *runView) started(attempt int) {
	if attempt > v.attempt {
		v.attempt, v.index = attempt, 0
	}
}

// storedEnvelope is what the merger reads of a stored event.
type storedEnvelope struct {
	Type    string `json:"type"`
	Seq     uint64 `json:"seq"`
	RunID   string `json:"run_id"`
	Tenant  string `json:"tenant"`
	Attempt int    `json:"attempt"`
	Data    struct {
		ID string `json:"id"` // message.completed
	} `json:"data"`
}

// liveEnvelope is what the merger reads of a live event.
type liveEnvelope struct {
	Type    string `json:"type"`
	Live    bool   `json:"live"`
	After   uint64 `json:"after"`
	Index   uint64 `json:"index"`
	RunID   string `json:"run_id"`
	Tenant  string `json:"tenant"`
	Attempt int    `json:"attempt"`
	Data    struct {
		MessageID string `json:"message_id"` // message.delta
	} `json:"data"`
}

// stored appends to out the stored event data (stream sequence seq) and
// the live events it releases.
func (m *merger) stored(out []Item, data []byte, seq uint64) []Item {
	var env storedEnvelope
	if json.Unmarshal(data, &env) != nil || env.RunID == "" {
		return append(out, Item{Data: data, Type: env.Type, StreamSeq: seq})
	}
	v := m.view(env.Tenant, env.RunID)
	out = append(out, Item{Data: data, Type: env.Type, StreamSeq: seq})
	v.known = true
	v.seq = max(v.seq, env.Seq)
	switch env.Type {
	case protocol.EventRunStarted:
		v.started(env.Attempt)
	case protocol.EventMessageCompleted:
		if env.Data.ID != "" {
			if v.completed == nil {
				v.completed = map[string]bool{}
			}
			v.completed[env.Data.ID] = true
		}
	case protocol.EventRunFinished:
		v.finished = true
		v.held = nil
		return out
	}
	return v.release(out)
}

// live appends to out the live event data, unless it waits for a stored
// event or is dropped.
func (m *merger) live(out []Item, data []byte) []Item {
	var env liveEnvelope
	if json.Unmarshal(data, &env) != nil || !env.Live || env.RunID == "" || env.Index == 0 {
		return out
	}
	v := m.view(env.Tenant, env.RunID)
	if v.drop(&env) {
		return out
	}
	h := heldLive{env: env, it: Item{Data: data, Type: env.Type, Live: true}}
	if !v.known || env.After <= v.seq {
		// Its stored event was delivered (the held ones all wait for a
		// later one), or the reader cannot place it: now.
		return v.deliver(out, h)
	}
	// Held in (attempt, index) order until its stored event comes.
	i, found := slices.BinarySearchFunc(v.held, env, func(h heldLive, e liveEnvelope) int {
		if h.env.Attempt != e.Attempt {
			return h.env.Attempt - e.Attempt
		}
		return cmp.Compare(h.env.Index, e.Index)
	})
	if found {
		return out
	}
	v.held = slices.Insert(v.held, i, h)
	if len(v.held) > maxHeld {
		v.held = slices.Delete(v.held, 0, 1)
	}
	return out
}

// deliver appends a live event to out and notes it delivered.
func (v *runView) deliver(out []Item, h heldLive) []Item {
	// An attempt newer than the last run.started delivered: its
	// run.started was dropped or is before the reader's start.
	v.started(h.env.Attempt)
	v.index = h.env.Index
	return append(out, h.it)
}

// drop reports whether a live event is stale, repeated or redundant.
func (v *runView) drop(env *liveEnvelope) bool {
	switch {
	case v.finished, env.Attempt < v.attempt:
		return true
	case env.Attempt == v.attempt && env.Index <= v.index:
		return true
	case env.Type == protocol.EventMessageDelta && v.completed[env.Data.MessageID]:
		return true
	}
	return false
}

// release appends the held live events whose stored event was
// delivered, in order, and drops those that became stale or redundant.
func (v *runView) release(out []Item) []Item {
	kept := v.held[:0]
	for _, h := range v.held {
		switch {
		case v.drop(&h.env):
		case h.env.After > v.seq:
			kept = append(kept, h)
		default:
			out = v.deliver(out, h)
		}
	}
	clear(v.held[len(kept):])
	v.held = kept
	return out
}
