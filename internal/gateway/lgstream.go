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
	"time"

	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/langgraph"
	"github.com/natsagent/natsagent/internal/middleware"
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
	return langgraph.NewStream(m, langgraph.Run{RunID: rec.RunID, ThreadID: rec.ThreadID, Agent: rec.Agent, Attempt: rec.Attempt}, src, middleware.InterruptValue)
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
	rec, _, err := src.s.stores.Runs.Get(ctx, src.tenant, src.run)
	if err != nil {
		return inputState(src.input), err
	}
	g, err := src.graph(ctx)
	if err != nil || g == nil {
		return inputState(src.input), err
	}
	var own []*kv.Delta // the run's checkpoints, oldest first
	for i := len(g.order) - 1; i >= 0; i-- {
		if d := g.order[i]; d.RunID == src.run {
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
	for _, d := range g.order {
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
