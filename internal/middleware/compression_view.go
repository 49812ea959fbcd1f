package middleware

// The request view of context compression: the projection of the summary
// record over the transcript, and its compacted twin, both kept per run
// and extended call after call, so preparing a call costs its new messages
// (plus the few that leave the latest step), not the whole history.

import (
	"context"
	"slices"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/state"
)

// viewCache is the last request view of a run. view is the projection
// (summary message, pinned request, then the transcript from the cut);
// comp is view with compaction applied, valid for its first cn positions.
type viewCache struct {
	ok       bool
	st       *state.State
	rewrites uint64
	recKey   string
	// own: view was built from the state's own transcript (so it only
	// grows between calls while rewrites is unchanged); n is how many of
	// the state's messages it took.
	own     bool
	n       int
	headLen int

	view     []model.Message
	tok      []int
	sum      int
	lastAsst int // position of the last assistant message, -1 for none
	lastUser int // position of the last person's message, -1 for none

	head headKey

	comp      []model.Message
	ctok      []int
	csum      int
	cn        int
	exempt    []int // positions where comp holds the original for now
	changed   int   // positions where comp differs from view
	compForce bool
}

// isOwn reports whether msgs is the state's own transcript (or a prefix).
func isOwn(st *state.State, msgs []model.Message) bool {
	return st != nil && len(msgs) > 0 && len(msgs) <= len(st.Messages) && &msgs[0] == &st.Messages[0]
}

func recKeyOf(rec *ContextSummary) string {
	if rec == nil {
		return ""
	}
	return itoa(rec.Seq) + "/" + rec.CutBeforeMessageID + "/" + rec.LastSummarizedMessageID + "/" + rec.PinnedMessageID
}

// view returns the run's request view for req under rec, extending the
// cached one when req's transcript only grew since.
func (c *ContextCompression) view(run *ccRun, rc *runCounter, req *ModelRequest, rec *ContextSummary) *viewCache {
	v := &run.v
	st, msgs := req.State, req.Messages
	own := isOwn(st, msgs)
	key := recKeyOf(rec)
	// The view grows with the transcript, unless a request pinned after
	// the summary now has a newer one, which replaces it.
	if own && v.ok && v.own && v.st == st && v.rewrites == st.Rewrites() && v.recKey == key && v.n <= len(msgs) &&
		!(v.headLen > 1 && hasNewerUser(msgs[v.n:])) {
		if v.headLen == 0 {
			c.plain(v, rc, st, msgs)
		} else {
			c.grow(v, rc, msgs[v.n:], true)
		}
		v.n = len(msgs)
	} else {
		c.rebuild(v, rc, req, rec, own)
	}
	if rec != nil && v.headLen > 0 {
		// The carried-over context (todos, skills) may change any call.
		k := headKey{rec: key, todos: rawID(st, TodosValue), skills: rawID(st, SkillsValue),
			todosShown: slices.ContainsFunc(req.Tools, func(s model.ToolSpec) bool { return s.Name == WriteTodosTool })}
		if k != v.head {
			if text := c.summaryText(rec, st, req.Tools); text != v.view[0].Content {
				v.setHead(rc, 0, summaryMessage(rec, text))
			}
			v.head = k
		}
	}
	return v
}

// headKey is what the summary message depends on besides its record.
type headKey struct {
	rec           string
	todos, skills valueID
	todosShown    bool
}

// valueID identifies a state value's current encoding without reading it.
type valueID struct {
	p *byte
	n int
}

func rawID(st *state.State, name string) valueID {
	if st == nil {
		return valueID{}
	}
	raw := st.Values[name]
	if len(raw) == 0 {
		return valueID{}
	}
	return valueID{&raw[0], len(raw)}
}

// rebuild makes the view from scratch.
func (c *ContextCompression) rebuild(v *viewCache, rc *runCounter, req *ModelRequest, rec *ContextSummary, own bool) {
	st, msgs := req.State, req.Messages
	*v = viewCache{ok: true, st: st, own: own, lastAsst: -1, lastUser: -1}
	if st != nil {
		v.rewrites = st.Rewrites()
	}
	v.recKey = recKeyOf(rec)
	cut := -1
	if rec != nil {
		cut = cutIndex(st, msgs, rec)
	}
	if cut < 0 {
		// No record, or it no longer fits the transcript (its cut
		// message was removed): the whole transcript.
		c.plain(v, rc, st, msgs)
		v.n = len(msgs)
		return
	}
	v.head = headKey{rec: v.recKey, todos: rawID(st, TodosValue), skills: rawID(st, SkillsValue),
		todosShown: slices.ContainsFunc(req.Tools, func(s model.ToolSpec) bool { return s.Name == WriteTodosTool })}
	head := []model.Message{summaryMessage(rec, c.summaryText(rec, st, req.Tools))}
	if p := rec.PinnedMessageID; p != "" {
		if i := locate(st, msgs, p); i >= 0 && i < cut && !hasNewerUser(msgs[cut:]) {
			head = append(head, msgs[i])
		}
	}
	v.view = make([]model.Message, 0, len(head)+len(msgs)-cut+8)
	c.grow(v, rc, head, true)
	v.headLen = len(head)
	c.grow(v, rc, msgs[cut:], true)
	v.n = len(msgs)
}

// plain makes the view the request's transcript itself (no summary in
// effect): nothing is copied, and it is counted through the run's counter,
// which token_usage shares, so its new messages are counted once per call
// for both. Per-message counts are filled only when compaction needs them.
func (c *ContextCompression) plain(v *viewCache, rc *runCounter, st *state.State, msgs []model.Message) {
	from := len(v.view)
	v.view = msgs
	v.sum = rc.messages(st, msgs)
	v.scan(from)
}

// grow adds messages at the end of a projected view (v.view is the
// run's own slice), counting each.
func (c *ContextCompression) grow(v *viewCache, rc *runCounter, msgs []model.Message, copyIn bool) {
	from := len(v.view)
	if copyIn {
		v.view = append(v.view, msgs...)
	}
	v.counts(rc)
	for p := from; p < len(v.view); p++ {
		v.sum += v.tok[p]
	}
	v.scan(from)
}

// scan notes the last assistant and person messages from position from.
func (v *viewCache) scan(from int) {
	for p := from; p < len(v.view); p++ {
		switch m := &v.view[p]; {
		case m.Role == model.RoleAssistant:
			v.lastAsst = p
		case isPersonMessage(m):
			v.lastUser = p
		}
	}
}

// counts fills the per-message counts of the view.
func (v *viewCache) counts(rc *runCounter) {
	for p := len(v.tok); p < len(v.view); p++ {
		v.tok = append(v.tok, rc.cache.Message(&v.view[p]))
	}
}

// setHead replaces a head message, and its compacted twin.
func (v *viewCache) setHead(rc *runCounter, p int, m model.Message) {
	v.counts(rc)
	n := rc.cache.Message(&m)
	v.view[p] = m
	v.sum += n - v.tok[p]
	v.tok[p] = n
	if p < v.cn {
		v.comp[p] = m
		v.csum += n - v.ctok[p]
		v.ctok[p] = n
	}
}

// isPersonMessage reports a message a person wrote (not injected context).
func isPersonMessage(m *model.Message) bool {
	if m.Role != model.RoleUser || m.Name != "" {
		return false
	}
	hidden, _ := m.Meta[MetaHidden].(bool)
	return !hidden
}

func hasNewerUser(msgs []model.Message) bool {
	for i := range msgs {
		if isPersonMessage(&msgs[i]) {
			return true
		}
	}
	return false
}

// locate finds a message by id in msgs, which is usually the state's
// transcript or a copy of it in the same order.
func locate(st *state.State, msgs []model.Message, id string) int {
	if id == "" {
		return -1
	}
	if st != nil {
		if i := st.Index(id); i >= 0 && i < len(msgs) && msgs[i].ID == id {
			return i
		}
	}
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].ID == id {
			return i
		}
	}
	return -1
}

// cutIndex is the index in msgs of the first message shown after rec's
// summary, or -1 when msgs does not hold rec's cut.
func cutIndex(st *state.State, msgs []model.Message, rec *ContextSummary) int {
	if i := locate(st, msgs, rec.CutBeforeMessageID); i >= 0 {
		return i
	}
	if i := locate(st, msgs, rec.LastSummarizedMessageID); i >= 0 {
		return i + 1
	}
	return -1
}

// compact brings the compacted view up to date and returns how many
// messages were compacted for the first time in this run.
func (c *ContextCompression) compact(ctx context.Context, rt *Runtime, run *ccRun, rc *runCounter, v *viewCache, force bool) int {
	if v.compForce != force || v.cn > len(v.view) || len(v.comp) != v.cn {
		v.comp, v.ctok, v.csum, v.cn, v.exempt, v.changed = v.comp[:0], v.ctok[:0], 0, 0, nil, 0
		v.compForce = force
	}
	v.counts(rc)
	newly := 0
	put := func(p int) (model.Message, bool) {
		src := &v.view[p]
		if p < v.headLen {
			return *src, false
		}
		out, changed, fresh := c.compactMessage(ctx, rt, run, rc, src)
		if fresh {
			newly++
		}
		return out, changed
	}
	// Positions that were the latest step last time may be old now.
	keep := v.exempt[:0]
	for _, p := range v.exempt {
		if c.exemptAt(v, p, force) {
			keep = append(keep, p)
			continue
		}
		out, changed := put(p)
		if changed {
			n := rc.cache.Message(&out)
			v.comp[p] = out
			v.csum += n - v.ctok[p]
			v.ctok[p] = n
			v.changed++
		}
	}
	v.exempt = keep
	for p := v.cn; p < len(v.view); p++ {
		out, n := v.view[p], v.tok[p]
		if c.exemptAt(v, p, force) {
			v.exempt = append(v.exempt, p)
		} else if m, changed := put(p); changed {
			out, n = m, rc.cache.Message(&m)
			v.changed++
		}
		v.comp = append(v.comp, out)
		v.ctok = append(v.ctok, n)
		v.csum += n
	}
	v.cn = len(v.view)
	return newly
}

// exemptAt reports whether position p is in the latest step (the last
// assistant message and the tool results after it), which compaction
// leaves alone unless forced: the model sees each result in full once,
// and what it just asked for as it asked.
func (c *ContextCompression) exemptAt(v *viewCache, p int, force bool) bool {
	return !force && v.lastAsst >= 0 && p >= v.lastAsst
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	neg := n < 0
	if neg {
		n = -n
	}
	for n > 0 {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
	}
	if neg {
		i--
		b[i] = '-'
	}
	return string(b[i:])
}
