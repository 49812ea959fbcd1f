package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/events"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/langgraph"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
)

// streamFields are the stream options of a run body: LangGraph's
// stream_mode (a mode or a list; absent means values) and
// stream_subgraphs.
type streamFields struct {
	StreamMode      json.RawMessage `json:"stream_mode"`
	StreamSubgraphs bool            `json:"stream_subgraphs"`
}

// modes reads the stream modes of a run body.
func (f *streamFields) modes() (langgraph.Modes, error) {
	var list []string
	raw := bytes.TrimSpace(f.StreamMode)
	switch {
	case len(raw) == 0 || bytes.Equal(raw, []byte("null")):
	case raw[0] == '"':
		var one string
		if err := json.Unmarshal(raw, &one); err != nil {
			return langgraph.Modes{}, errInvalid("stream_mode", "stream_mode must be a string or a list of strings")
		}
		list = []string{one}
	default:
		if err := json.Unmarshal(raw, &list); err != nil {
			return langgraph.Modes{}, errInvalid("stream_mode", "stream_mode must be a string or a list of strings")
		}
	}
	m, err := langgraph.ParseModes(list, f.StreamSubgraphs)
	if err != nil {
		return m, errInvalid("stream_mode", err.Error())
	}
	return m, nil
}

// queryModes reads the stream modes of GET .../stream: ?stream_mode=
// (repeated for several) and ?stream_subgraphs=true.
func queryModes(r *http.Request) (langgraph.Modes, error) {
	q := r.URL.Query()
	sub := false
	if v := q.Get("stream_subgraphs"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return langgraph.Modes{}, errInvalid("stream_subgraphs", fmt.Sprintf("stream_subgraphs %q is not a boolean", clip(v)))
		}
		sub = b
	}
	m, err := langgraph.ParseModes(q["stream_mode"], sub)
	if err != nil {
		return m, errInvalid("stream_mode", err.Error())
	}
	return m, nil
}

// streamLocation is where a client reconnects to a run's stream with the
// same modes (the SDK follows Location with Last-Event-ID).
func streamLocation(thread, run string, m langgraph.Modes) string {
	q := url.Values{"stream_mode": m.List()}
	if m.Subgraphs {
		q.Set("stream_subgraphs", "true")
	}
	return runLocation(thread, run) + "/stream?" + q.Encode()
}

// nameInput gives the run's input messages their ids before submission
// (the worker keeps an id it is given), so the values a stream shows
// before the run's first checkpoint name them as the thread will.
func nameInput(req *protocol.RunRequest) {
	if req.Input == nil {
		return
	}
	for i := range req.Input.Messages {
		if req.Input.Messages[i].ID == "" {
			req.Input.Messages[i].ID = "msg_" + newID()
		}
	}
}

// translator starts the LangGraph translation of rec's run, nil for
// natsagent's own events. input is the run's input when this request
// submitted it.
func (s *Server) translator(rec *protocol.Run, m langgraph.Modes, input []model.Message) *langgraph.Stream {
	if m.Native() {
		return nil
	}
	src := &runSource{s: s, tenant: rec.Tenant, thread: rec.ThreadID, run: rec.RunID, input: input}
	return langgraph.NewStream(m, langgraph.Run{RunID: rec.RunID, ThreadID: rec.ThreadID, Agent: rec.Agent, Attempt: rec.Attempt}, src, protocol.InterruptValue)
}

// runSource reads a run's thread state for the translation of its
// stream: the state each attempt starts from, and the state after the
// run. Values between are the events applied to the start.
type runSource struct {
	s                   *Server
	tenant, thread, run string
	input               []model.Message
}

func (src *runSource) graph(ctx context.Context) (*threadGraph, error) {
	th, _, err := src.s.stores.Threads.Get(ctx, src.tenant, src.thread)
	if errors.Is(err, kv.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return src.s.loadGraph(ctx, th)
}

// Start is the state attempt continues from: the first attempt starts at
// the run's base checkpoint with the run's input (from its first
// checkpoint once saved, else as submitted); a later one at the run's
// newest checkpoint saved before it started (t).
func (src *runSource) Start(ctx context.Context, attempt int, t time.Time) (*state.State, error) {
	// The view: a running run's base checkpoint is on its lease (v2).
	rec, err := src.s.runView(ctx, src.tenant, src.thread, src.run)
	if err != nil {
		return inputState(src.input), err
	}
	g, err := src.graph(ctx)
	if err != nil || g == nil {
		return inputState(src.input), err
	}
	var own []*kv.Delta // the run's checkpoints, oldest first
	for i := len(g.stored) - 1; i >= 0; i-- {
		if d := g.stored[i]; d.RunID == src.run {
			own = append(own, d)
		}
	}
	at := rec.BaseCheckpoint
	if attempt > 1 {
		for _, d := range own {
			if !d.Time.After(t) {
				at = d.ID
			}
		}
	}
	st := &state.State{}
	if at != "" && g.has(at) {
		st = g.stateAt(at)
	}
	if at == rec.BaseCheckpoint {
		in := src.input
		if len(own) > 0 {
			in = nil
			for _, m := range own[0].Update.Messages {
				if m.Role == model.RoleUser {
					in = append(in, m)
				}
			}
		}
		st.Apply(state.Update{Messages: in})
	}
	return st, nil
}

func inputState(in []model.Message) *state.State {
	st := &state.State{}
	st.Apply(state.Update{Messages: in})
	return st
}

// Final is the state at the run's last checkpoint.
func (src *runSource) Final(ctx context.Context) (*state.State, error) {
	g, err := src.graph(ctx)
	if err != nil || g == nil {
		return nil, err
	}
	return g.stateAfter(src.run), nil
}

// stateAfter is the state at run's last checkpoint on the history (the
// head when it has none: runs queued after it may have moved the head on
// since).
func (g *threadGraph) stateAfter(run string) *state.State {
	at := g.th.Head
	for _, d := range g.stored {
		if d.RunID == run {
			at = d.ID
			break
		}
	}
	if at == "" || !g.has(at) {
		return &state.State{}
	}
	return g.stateAt(at)
}

// childWait bounds how long a finished lead run's stream waits for the
// last parts of its subagents' streams.
const childWait = 10 * time.Second

// streamTranslated is streamRun in LangGraph's stream modes: tr
// translates the events f reads from the run's first one; what comes
// before after (the client's Last-Event-ID) is replayed without being
// sent. With stream_subgraphs, the subagent runs the events name are
// followed too, their parts namespaced.
func (s *Server) streamTranslated(ctx context.Context, out *sse, f *events.Follow, rec *protocol.Run, after uint64, tr *langgraph.Stream, log *zap.Logger, ended []byte, trailing bool) {
	send := func(parts []langgraph.Part) error {
		for _, p := range parts {
			if err := out.event(p.ID, p.Event, p.Data); err != nil {
				log.Debug("event stream write failed", zap.Error(err))
				return err
			}
		}
		return nil
	}
	warn := func(err error) {
		if err != nil {
			log.Warn("read the thread's state for the stream; its values lack what the events do not say", zap.Error(err))
		}
	}
	if after == 0 && send(tr.Open()) != nil {
		return
	}
	// end sends the record's run.finished, which has no stored event.
	end := func() {
		parts, err := tr.Next(ctx, langgraph.Native{Data: ended})
		warn(err)
		_ = send(parts)
	}
	if ended != nil && !trailing {
		end()
		return
	}
	ctx, cancel := context.WithCancel(ctx)
	lead := make(chan followed)
	pumped := make(chan struct{})
	go func() {
		defer close(pumped)
		pumpFollow(ctx, f, lead)
	}()
	kids := make(chan []langgraph.Part, 64)
	var wg sync.WaitGroup
	// Nothing reads f or a child's follow once this returns: the caller
	// closes f.
	defer func() {
		cancel()
		<-pumped
		wg.Wait()
	}()
	keepAlive := time.NewTimer(s.keepAlive)
	defer keepAlive.Stop()
	// silence fires once a trailing stream's feed stayed silent for
	// trailWait: the record's run.finished ends it (streamRun).
	var silence *time.Timer
	var silent <-chan time.Time
	if trailing {
		silence = time.NewTimer(s.trailWait)
		defer silence.Stop()
		silent = silence.C
	}
	// caughtUp: the client has what came before.
	caughtUp := after == 0
	for {
		select {
		case <-ctx.Done():
			log.Debug("event stream client left")
			return
		case <-keepAlive.C:
			if out.comment("keep-alive") != nil {
				return
			}
			keepAlive.Reset(s.keepAlive)
		case parts := <-kids:
			if send(parts) != nil {
				return
			}
		case <-silent:
			s.drainChildren(ctx, &wg, kids, send)
			end()
			return
		case it := <-lead:
			if it.err != nil {
				if ctx.Err() == nil {
					log.Warn("event stream ended early; the client resumes with Last-Event-ID", zap.Error(it.err))
				}
				return
			}
			m := it.m
			id := ""
			if !m.Live {
				id = strconv.FormatUint(m.StreamSeq, 10)
			}
			parts, err := tr.Next(ctx, langgraph.Native{Data: m.Data, ID: id})
			warn(err)
			if !caughtUp && !m.Live && m.StreamSeq >= after {
				caughtUp = true
				if m.StreamSeq == after {
					parts = nil // the client had it
				}
			}
			if !caughtUp {
				parts = nil
			}
			for _, c := range tr.Children() {
				wg.Add(1)
				go s.followChild(ctx, rec, c, c.Namespace(), tr.Modes(), kids, &wg)
			}
			if tr.Done() {
				// The subagents' last parts go before the lead's end.
				s.drainChildren(ctx, &wg, kids, send)
				if send(parts) == nil && !m.Live && m.Type == protocol.EventRunFinished {
					s.noteFinishedEventID(rec, m.StreamSeq)
				}
				return
			}
			if send(parts) != nil {
				return
			}
			keepAlive.Reset(s.keepAlive)
			if silence != nil {
				silence.Reset(s.trailWait)
			}
		}
	}
}

type followed struct {
	m   events.Item
	err error
}

// pumpFollow hands f's events to ch until ctx ends or f fails.
func pumpFollow(ctx context.Context, f *events.Follow, ch chan<- followed) {
	for {
		m, err := f.Next(ctx)
		select {
		case ch <- followed{m, err}:
		case <-ctx.Done():
			return
		}
		if err != nil {
			return
		}
	}
}

// drainChildren sends the subagent streams' parts until they all ended,
// for childWait at most.
func (s *Server) drainChildren(ctx context.Context, wg *sync.WaitGroup, kids <-chan []langgraph.Part, send func([]langgraph.Part) error) {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	limit := time.NewTimer(childWait)
	defer limit.Stop()
	for {
		select {
		case parts := <-kids:
			if send(parts) != nil {
				return
			}
		case <-done:
			for {
				select {
				case parts := <-kids:
					if send(parts) != nil {
						return
					}
				default:
					return
				}
			}
		case <-limit.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// followChild streams a subagent run of parent's (named by its
// subagent.started) into kids, its parts namespaced ns, and its own
// subagents' under ns too, until its run.finished or ctx ends. The child
// is read in the parent's tenant only, and only when its record names
// parent and the tool call as its parent: an event naming another run
// reads nothing.
func (s *Server) followChild(ctx context.Context, parent *protocol.Run, c langgraph.Child, ns string, modes langgraph.Modes, kids chan<- []langgraph.Part, wg *sync.WaitGroup) {
	defer wg.Done()
	tenant := parent.Tenant
	log := s.log.With(zap.String("tenant", tenant), zap.String("thread_id", c.ThreadID), zap.String("run_id", c.RunID))
	if !protocol.ValidToken(c.RunID) || !protocol.ValidToken(c.ThreadID) {
		return
	}
	rec, err := s.runView(ctx, tenant, c.ThreadID, c.RunID)
	if err != nil || rec.ThreadID != c.ThreadID || rec.Parent == nil ||
		*rec.Parent != (protocol.Parent{RunID: parent.RunID, ThreadID: parent.ThreadID, ToolCallID: c.ToolCallID}) {
		log.Debug("subagent.started names no child run of this one", zap.Error(err))
		return
	}
	f, err := s.openFollow(ctx, s.names.RunEvents(tenant, c.ThreadID, c.RunID), 0)
	if err != nil {
		log.Debug("follow a subagent run", zap.Error(err))
		return
	}
	defer f.Close()
	tr := s.translator(rec, modes, nil)
	for !tr.Done() {
		m, err := f.Next(ctx)
		if err != nil {
			return
		}
		parts, _ := tr.Next(ctx, langgraph.Native{Data: m.Data})
		for _, gc := range tr.Children() {
			wg.Add(1)
			go s.followChild(ctx, rec, gc, ns+"|"+gc.Namespace(), modes, kids, wg)
		}
		if parts = langgraph.Subgraph(parts, ns); len(parts) > 0 {
			select {
			case kids <- parts:
			case <-ctx.Done():
				return
			}
		}
	}
}
