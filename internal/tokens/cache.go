package tokens

import (
	"bytes"
	"sync"
	"sync/atomic"

	"github.com/natsagent/natsagent/internal/model"
)

// DefaultCacheSize bounds the messages a Cache keeps counts for.
const DefaultCacheSize = 4096

// Cache remembers the counts of messages by id, so counting a request
// costs the messages that are new (or changed) since the last count. A hit
// needs the same id and the same sent fields (role, content, name, tool
// calls, tool call id): a message edited under its id, as context
// compaction does in a request, is counted again, and versions of
// different sizes stay cached side by side. Comparing the fields costs no
// scan of the text while the message is the one already seen: equal
// strings sharing their bytes compare in constant time.
//
// A Cache is meant for one run (keep it in middleware.Scratch): it holds
// the text of the messages it counted, which the run's state holds anyway.
// Behind it, a process-wide level keyed by a hash of the sent fields (it
// holds no text) serves the first call of the next run on the same thread,
// so a new run on a long thread hashes its history instead of encoding it.
//
// Both levels are bounded: two generations each; when the current one
// fills, the older one is dropped. A Cache is safe for concurrent use.
type Cache struct {
	counter Counter
	shared  *sharedCache // nil for counters cheaper than hashing
	half    int

	mu           sync.Mutex
	cur, old     map[cacheKey]*cacheEntry
	system       textEntry
	hits, misses uint64
}

type cacheKey struct {
	id string
	// size separates versions of one message (a compacted tool result
	// next to the original) without reading the text.
	size int
}

type cacheEntry struct {
	m model.Message // the sent fields only
	n int
}

type textEntry struct {
	text string
	n    int
	ok   bool
}

type toolEntry struct {
	spec model.ToolSpec
	n    int
}

// NewCache returns a cache over counter keeping at most size message
// counts (size <= 0: DefaultCacheSize).
func NewCache(counter Counter, size int) *Cache {
	if size <= 0 {
		size = DefaultCacheSize
	}
	half := max(size/2, 1)
	c := &Cache{counter: counter, half: half, cur: make(map[cacheKey]*cacheEntry)}
	if counter.Encoding() != Approximate {
		c.shared = sharedFor(counter.Encoding())
	}
	return c
}

// Counter returns the counter the cache counts with.
func (c *Cache) Counter() Counter { return c.counter }

// Stats returns how many message counts were served from the cache and
// how many were not (computed, or found in the process-wide level).
func (c *Cache) Stats() (hits, misses uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits, c.misses
}

// Len returns the number of message counts held.
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.cur) + len(c.old)
}

func keyOf(m *model.Message) cacheKey {
	size := len(m.Content)
	for i := range m.ToolCalls {
		size += len(m.ToolCalls[i].Arguments) + 1
	}
	return cacheKey{id: m.ID, size: size}
}

func sameSent(a, b *model.Message) bool {
	if a.Role != b.Role || a.Content != b.Content || a.Name != b.Name || a.ToolCallID != b.ToolCallID || len(a.ToolCalls) != len(b.ToolCalls) {
		return false
	}
	for i := range a.ToolCalls {
		if a.ToolCalls[i] != b.ToolCalls[i] {
			return false
		}
	}
	return true
}

// Message counts one message (Message's formula), from the cache when it
// was counted before. Messages without an id are always counted.
func (c *Cache) Message(m *model.Message) int {
	if m.ID == "" {
		return Message(c.counter, m)
	}
	k := keyOf(m)
	c.mu.Lock()
	n, ok := c.lookup(k, m)
	c.mu.Unlock()
	if ok {
		return n
	}
	e := c.count(k, m)
	c.mu.Lock()
	c.insert(k, e)
	c.mu.Unlock()
	return e.n
}

// Messages counts a transcript, taking the lock twice whatever its length.
func (c *Cache) Messages(msgs []model.Message) int {
	total := 0
	var missed []int
	c.mu.Lock()
	for i := range msgs {
		m := &msgs[i]
		if m.ID == "" {
			missed = append(missed, i)
			continue
		}
		if n, ok := c.lookup(keyOf(m), m); ok {
			total += n
		} else {
			missed = append(missed, i)
		}
	}
	c.mu.Unlock()
	if len(missed) == 0 {
		return total
	}
	// Counted outside the lock: a parallel count of the same message does
	// the work twice and stores the same number.
	keys := make([]cacheKey, len(missed))
	entries := make([]*cacheEntry, len(missed))
	for j, i := range missed {
		m := &msgs[i]
		if m.ID == "" {
			total += Message(c.counter, m)
			continue
		}
		keys[j] = keyOf(m)
		entries[j] = c.count(keys[j], m)
		total += entries[j].n
	}
	c.mu.Lock()
	for j := range missed {
		if entries[j] != nil {
			c.insert(keys[j], entries[j])
		}
	}
	c.mu.Unlock()
	return total
}

// Tally remembers, position by position, the messages of the last
// transcript counted through it. Counting the next version of that
// transcript (the same messages, some new at the end, an edit here and
// there: what a wrapper's edited copy of the state's transcript looks
// like call after call) then compares each message with the one at its
// position, in constant time while they share their text, and looks up
// only the others. The zero Tally is ready; it is not safe for concurrent
// use.
type Tally struct {
	entries []*cacheEntry
}

// Transcript counts msgs like Messages, through t.
func (c *Cache) Transcript(t *Tally, msgs []model.Message) int {
	total := 0
	next := make([]*cacheEntry, len(msgs))
	var missed []int
	for i := range msgs {
		m := &msgs[i]
		if i < len(t.entries) {
			if e := t.entries[i]; e != nil && e.m.ID == m.ID && sameSent(&e.m, m) {
				total += e.n
				next[i] = e
				continue
			}
		}
		missed = append(missed, i)
	}
	if len(missed) > 0 {
		c.mu.Lock()
		var count []int
		for _, i := range missed {
			m := &msgs[i]
			if m.ID == "" {
				total += Message(c.counter, m)
				continue
			}
			k := keyOf(m)
			if e, ok := c.find(k, m); ok {
				total += e.n
				next[i] = e
				continue
			}
			count = append(count, i)
		}
		c.mu.Unlock()
		for _, i := range count {
			m := &msgs[i]
			k := keyOf(m)
			e := c.count(k, m)
			c.mu.Lock()
			c.insert(k, e)
			c.mu.Unlock()
			total += e.n
			next[i] = e
		}
	}
	t.entries = next
	return total
}

// find is lookup returning the entry. Call with c.mu held.
func (c *Cache) find(k cacheKey, m *model.Message) (*cacheEntry, bool) {
	e, ok := c.cur[k]
	if !ok {
		if e, ok = c.old[k]; ok {
			c.insert(k, e)
		}
	}
	if ok && sameSent(&e.m, m) {
		c.hits++
		return e, true
	}
	c.misses++
	return nil, false
}

// lookup finds a current count of m. Call with c.mu held.
func (c *Cache) lookup(k cacheKey, m *model.Message) (int, bool) {
	if e, ok := c.find(k, m); ok {
		return e.n, true
	}
	return 0, false
}

// count counts m, through the process-wide level when there is one.
func (c *Cache) count(k cacheKey, m *model.Message) *cacheEntry {
	e := &cacheEntry{m: model.Message{ID: m.ID, Role: m.Role, Content: m.Content, Name: m.Name, ToolCallID: m.ToolCallID, ToolCalls: append([]model.ToolCall(nil), m.ToolCalls...)}}
	if c.shared == nil {
		e.n = Message(c.counter, m)
		return e
	}
	sk := sharedKey{id: k.id, size: k.size, sum: c.shared.sum(m)}
	if n, ok := c.shared.get(sk); ok {
		e.n = n
		return e
	}
	e.n = Message(c.counter, m)
	c.shared.put(sk, e.n)
	return e
}

// insert stores e under k in the current generation, rotating when full.
// Call with c.mu held.
func (c *Cache) insert(k cacheKey, e *cacheEntry) {
	if _, there := c.cur[k]; !there && len(c.cur) >= c.half {
		c.old = c.cur
		c.cur = make(map[cacheKey]*cacheEntry)
	}
	c.cur[k] = e
}

// System counts a system prompt, remembering the last one.
func (c *Cache) System(prompt string) int {
	if prompt == "" {
		return 0
	}
	c.mu.Lock()
	if c.system.ok && c.system.text == prompt {
		n := c.system.n
		c.mu.Unlock()
		return n
	}
	c.mu.Unlock()
	n := c.systemCount(prompt)
	c.mu.Lock()
	c.system = textEntry{text: prompt, n: n, ok: true}
	c.mu.Unlock()
	return n
}

// maxTools bounds the tool schema counts the process keeps, and
// maxToolVariants those it keeps under one name.
const (
	maxTools        = 1024
	maxToolVariants = 8
)

// toolCounts remembers each tool schema's count, process-wide, by encoding
// and tool name (*toolVariants): the runs of a deployment offer the same
// tools, so one entry serves them all and a run holds none of its own.
// One name may carry several schemas (an MCP server's tool and a local one
// under the same name, two MCP servers): each keeps its own entry, so
// profiles offering them in turn count neither again. An entry keeps the
// spec it counted by reference (ToolSpec.Parameters is never changed in
// place once a tool hands it out), so a hit compares the schema without
// scanning it while the bytes are the ones counted.
//
// Bounded: a name keeps its maxToolVariants latest schemas, and the
// process about maxTools entries in all (runs racing to add one may pass
// it by one each); past that every count is dropped (MCP
// schemas come and go, and a count is cheap to make again).
var (
	toolCounts sync.Map
	toolsHeld  atomic.Int64
)

type toolKey struct{ encoding, name string }

// toolVariants are the schemas counted under one name, newest last. A
// value is never changed once stored: a new schema stores a new one.
type toolVariants struct {
	entries []*toolEntry
}

func (v *toolVariants) find(s *model.ToolSpec) (int, bool) {
	if v == nil {
		return 0, false
	}
	for _, e := range v.entries {
		if e.spec.Description == s.Description && bytes.Equal(e.spec.Parameters, s.Parameters) {
			return e.n, true
		}
	}
	return 0, false
}

// Tools counts tool schemas.
func (c *Cache) Tools(specs []model.ToolSpec) int {
	if len(specs) == 0 {
		return 0
	}
	n := ToolsOverhead
	enc := c.counter.Encoding()
	for i := range specs {
		n += c.toolCount(toolKey{enc, specs[i].Name}, &specs[i])
	}
	return n
}

// toolCount is the count of s, kept under k.
func (c *Cache) toolCount(k toolKey, s *model.ToolSpec) int {
	v, _ := toolCounts.Load(k)
	old, _ := v.(*toolVariants)
	if n, ok := old.find(s); ok {
		return n
	}
	e := &toolEntry{spec: *s, n: c.tool(s)}
	for {
		next := &toolVariants{entries: []*toolEntry{e}}
		added := int64(1)
		if old != nil {
			kept := old.entries
			if len(kept) >= maxToolVariants {
				kept, added = kept[len(kept)-maxToolVariants+1:], 0
			}
			next.entries = append(append(make([]*toolEntry, 0, len(kept)+1), kept...), e)
		}
		var stored bool
		if old == nil {
			_, loaded := toolCounts.LoadOrStore(k, next)
			stored = !loaded
		} else {
			stored = toolCounts.CompareAndSwap(k, old, next)
		}
		if stored {
			if toolsHeld.Add(added) > maxTools {
				// Dropped all at once: what is counted again is what runs
				// still offer.
				toolCounts.Clear()
				toolsHeld.Store(0)
			}
			return e.n
		}
		// Another run stored a schema under this name first.
		v, _ = toolCounts.Load(k)
		if old, _ = v.(*toolVariants); old != nil {
			if _, ok := old.find(s); ok {
				return e.n
			}
		}
	}
}

// systemCount counts a system prompt, through the process-wide level
// when there is one: the runs of a profile share most of theirs.
func (c *Cache) systemCount(prompt string) int {
	if c.shared == nil {
		return System(c.counter, prompt)
	}
	k := sharedKey{id: "\x00system", size: len(prompt), sum: c.shared.textSum(prompt)}
	if n, ok := c.shared.get(k); ok {
		return n
	}
	n := System(c.counter, prompt)
	c.shared.put(k, n)
	return n
}

// tool counts a tool schema, through the process-wide level when there
// is one: every run of a profile offers the same schemas.
func (c *Cache) tool(s *model.ToolSpec) int {
	if c.shared == nil {
		return Tool(c.counter, s)
	}
	k := sharedKey{id: s.Name, size: -1 - len(s.Description) - len(s.Parameters), sum: c.shared.toolSum(s)}
	if n, ok := c.shared.get(k); ok {
		return n
	}
	n := Tool(c.counter, s)
	c.shared.put(k, n)
	return n
}

// Request counts a whole request: system prompt, messages and tool
// schemas.
func (c *Cache) Request(system string, msgs []model.Message, specs []model.ToolSpec) RequestCount {
	r := RequestCount{System: c.System(system), Messages: c.Messages(msgs), Tools: c.Tools(specs)}
	r.sum()
	return r
}
