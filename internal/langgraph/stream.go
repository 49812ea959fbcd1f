package langgraph

// The stream modes of the LangGraph Agent Server, as a translation of
// natsagent's own run events (docs/protocol.md 2.10): the gateway (and any
// other reader of a run's events) feeds a run's events, stored and live,
// in the order events.Follow delivers them, and writes what comes out.
// Nothing here reads NATS: what the events cannot tell (the thread's state
// when the run starts and after it ends) comes from a Source.

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
)

// Stream modes a client may ask for (stream_mode).
const (
	ModeValues        = "values"
	ModeUpdates       = "updates"
	ModeMessagesTuple = "messages-tuple"
	ModeMessages      = "messages"
	ModeCustom        = "custom"
	ModeEvents        = "events"
	ModeDebug         = "debug"
	ModeTasks         = "tasks"
	ModeCheckpoints   = "checkpoints"
	// ModeTools is the SDK's tool progress: on_tool_start, on_tool_end,
	// on_tool_error.
	ModeTools = "tools"
	// ModeLifecycle sends "lifecycle|tools:<tool_call_id>" when a
	// subagent starts and ends.
	ModeLifecycle = "lifecycle"
	// ModeNative streams natsagent's own events (the envelope as data),
	// untranslated. It cannot be combined with another mode.
	ModeNative = "natsagent"
)

var knownModes = []string{ModeValues, ModeUpdates, ModeMessagesTuple, ModeMessages, ModeCustom, ModeEvents, ModeDebug, ModeTasks, ModeCheckpoints, ModeTools, ModeLifecycle, ModeNative}

// Modes is what a stream sends.
type Modes struct {
	list []string
	// Subgraphs is stream_subgraphs: subagent runs' events, namespaced.
	Subgraphs bool
}

// ParseModes reads the stream modes a client asked for; none means
// LangGraph's default, values.
func ParseModes(modes []string, subgraphs bool) (Modes, error) {
	out := Modes{Subgraphs: subgraphs}
	for _, m := range modes {
		if !slices.Contains(knownModes, m) {
			return Modes{}, fmt.Errorf("stream mode %q is not one of %s", clip(m), strings.Join(knownModes, ", "))
		}
		if !slices.Contains(out.list, m) {
			out.list = append(out.list, m)
		}
	}
	if len(out.list) == 0 {
		out.list = []string{ModeValues}
	}
	if slices.Contains(out.list, ModeNative) && len(out.list) > 1 {
		return Modes{}, fmt.Errorf("stream mode %q cannot be combined with other modes", ModeNative)
	}
	return out, nil
}

// Native reports whether the stream sends natsagent's own events.
func (m Modes) Native() bool { return len(m.list) == 1 && m.list[0] == ModeNative }

// Has reports whether mode was asked for.
func (m Modes) Has(mode string) bool { return slices.Contains(m.list, mode) }

// List returns the modes, in the order asked.
func (m Modes) List() []string { return slices.Clone(m.list) }

// Part is one SSE event of a translated stream.
type Part struct {
	Event string
	Data  json.RawMessage
	// ID is the SSE id: the stream sequence of the stored event the part
	// was derived from, on the last part derived from it; "" otherwise.
	ID string
}

// Source reads what a run's events do not say.
type Source interface {
	// Start returns the thread's state when attempt of the run started
	// (at time t), with the run's input.
	Start(ctx context.Context, attempt int, t time.Time) (*state.State, error)
	// Final returns the thread's state after the run: its last
	// checkpoint.
	Final(ctx context.Context) (*state.State, error)
}

// Native is a natsagent event as a reader delivers it.
type Native struct {
	// Data is the envelope.
	Data []byte
	// ID is a stored event's stream sequence (its SSE id); "" for a live
	// event.
	ID string
}

// Run names the run a stream follows.
type Run struct {
	RunID, ThreadID, Agent string
	Attempt                int
}

// Stream translates one run's events to the stream modes asked for. It is
// not safe for concurrent use.
type Stream struct {
	modes  Modes
	run    Run
	src    Source
	hidden []string
	enc    Encoder

	st        *state.State
	attempt   int
	step      int
	modelName string
	// streamed holds the text streamed for each message so far.
	streamed map[string]*strings.Builder
	// running holds the tool calls started and not finished.
	running []string
	// lastValues is the last values part sent.
	lastValues []byte
	done       bool
	// children are the subagent runs seen; newChildren those not yet
	// taken by Children.
	children, newChildren []Child
}

// NewStream starts translating a run's events. hidden names the state
// values never shown (natsagent's open interrupt).
func NewStream(modes Modes, run Run, src Source, hidden ...string) *Stream {
	return &Stream{modes: modes, run: run, src: src, hidden: hidden, streamed: map[string]*strings.Builder{}}
}

// Open returns the parts a new stream starts with: metadata.
func (s *Stream) Open() []Part {
	return []Part{s.metadata(max(s.run.Attempt, 1))}
}

// Modes returns the modes the stream sends.
func (s *Stream) Modes() Modes { return s.modes }

// Done reports whether the run's end was translated.
func (s *Stream) Done() bool { return s.done }

func (s *Stream) metadata(attempt int) Part {
	return part("metadata", map[string]any{"run_id": s.run.RunID, "thread_id": s.run.ThreadID, "attempt": attempt})
}

func part(event string, data any) Part {
	b, err := json.Marshal(data)
	if err != nil {
		b, _ = json.Marshal(map[string]string{"error": err.Error()})
	}
	return Part{Event: event, Data: b}
}

// envelope is what the translator reads of an event.
type envelope struct {
	Type    string          `json:"type"`
	RunID   string          `json:"run_id"`
	Attempt int             `json:"attempt"`
	Time    time.Time       `json:"time"`
	Data    json.RawMessage `json:"data"`
}

// Next translates one event. The error is the Source's: the parts are
// still what the events alone tell.
func (s *Stream) Next(ctx context.Context, ev Native) ([]Part, error) {
	var env envelope
	if json.Unmarshal(ev.Data, &env) != nil || s.done {
		return nil, nil
	}
	var out []Part
	var err error
	switch env.Type {
	case protocol.EventRunStarted:
		out, err = s.started(ctx, &env)
	case protocol.EventMessageDelta:
		out, err = s.delta(ctx, &env)
	case protocol.EventMessageCompleted:
		out, err = s.completed(ctx, &env)
	case protocol.EventToolStarted:
		out = s.toolStarted(&env)
	case protocol.EventToolFinished:
		out, err = s.toolFinished(ctx, &env)
	case protocol.EventRunFinished:
		out, err = s.finished(ctx, &env)
	case eventModelRetry:
		var d struct {
			MessageID string `json:"message_id"`
		}
		if json.Unmarshal(env.Data, &d) == nil && d.MessageID != "" {
			delete(s.streamed, d.MessageID)
		}
	case eventUsageModel:
		var d struct {
			Model string `json:"model"`
		}
		if json.Unmarshal(env.Data, &d) == nil && d.Model != "" {
			s.modelName = d.Model
		}
	case eventTodos, eventSkills, protocol.EventThreadTitled:
		out, err = s.stateEvent(ctx, &env)
	}
	if s.modes.Has(ModeLifecycle) && (env.Type == eventSubagentStarted || env.Type == eventSubagentFinished) {
		out = append(out, lifecycle(&env)...)
	}
	if s.modes.Subgraphs && env.Type == eventSubagentStarted {
		var c Child
		if json.Unmarshal(env.Data, &c) == nil && c.RunID != "" && c.ThreadID != "" && c.ToolCallID != "" && !slices.Contains(s.children, c) {
			s.children = append(s.children, c)
			s.newChildren = append(s.newChildren, c)
		}
	}
	if s.modes.Has(ModeCustom) && protocol.KindOf(env.Type) == protocol.KindCustom {
		out = append(out, part(ModeCustom, map[string]any{"type": env.Type, "data": rawOrEmpty(env.Data)}))
	}
	if len(out) > 0 && ev.ID != "" {
		out[len(out)-1].ID = ev.ID
	}
	return out, err
}

// Event types the translator reads beyond protocol's (docs/protocol.md
// 2.10.2).
const (
	eventModelRetry = "model.retry"
	eventUsageModel = "usage.model"
	eventTodos      = "state.todos"
	eventSkills     = "state.skills"
	// eventSubagentStarted names a child run (docs/protocol.md 2.17).
	eventSubagentStarted  = "subagent.started"
	eventSubagentFinished = "subagent.finished"
)

// lifecycle is the lifecycle part of a subagent.started or
// subagent.finished.
func lifecycle(env *envelope) []Part {
	var d struct {
		ToolCallID string          `json:"tool_call_id"`
		Status     protocol.Status `json:"status"`
		StopReason string          `json:"stop_reason"`
		Error      string          `json:"error"`
	}
	if json.Unmarshal(env.Data, &d) != nil || d.ToolCallID == "" {
		return nil
	}
	ns := Child{ToolCallID: d.ToolCallID}.Namespace()
	data := map[string]any{"event": "started", "namespace": []string{ns}, "tool_call_id": d.ToolCallID}
	if env.Type == eventSubagentFinished {
		switch d.Status {
		case protocol.StatusSuccess, protocol.StatusIncomplete:
			data["event"] = "completed"
		case protocol.StatusInterrupted:
			data["event"] = "interrupted"
		default:
			data["event"] = "failed"
			msg := d.Error
			if msg == "" {
				msg = "the subagent run ended " + string(d.Status)
			}
			data["error"] = map[string]any{"error": ErrorName(d.Status, d.StopReason), "message": msg}
		}
	}
	return []Part{part(ModeLifecycle+"|"+ns, data)}
}

// Child is a subagent run a lead run started, as subagent.started names
// it: with stream_subgraphs, its events are streamed too, namespaced
// "<event>|tools:<tool_call_id>".
type Child struct {
	RunID      string `json:"run_id"`
	ThreadID   string `json:"thread_id"`
	ToolCallID string `json:"tool_call_id"`
}

// Namespace is the child's namespace in a subgraphs stream.
func (c Child) Namespace() string { return "tools:" + c.ToolCallID }

// Children returns the subagent runs the events named since the last
// call (with stream_subgraphs): the reader follows their events with
// streams of their own and sends their parts renamed (Subgraph).
func (s *Stream) Children() []Child {
	out := s.newChildren
	s.newChildren = nil
	return out
}

// Subgraph renames a child stream's parts into the namespace ns
// ("tools:<tool_call_id>", nested ones joined by "|") and drops what
// belongs to the lead's stream alone: metadata, error and end, and ids
// (a child's events are not the lead's to resume).
func Subgraph(parts []Part, ns string) []Part {
	out := parts[:0]
	for _, p := range parts {
		switch p.Event {
		case "metadata", "error", "end":
			continue
		}
		// The namespace goes after the mode, before a namespace the
		// part has already (a lifecycle part's).
		mode, rest, nested := strings.Cut(p.Event, "|")
		p.Event = mode + "|" + ns
		if nested {
			p.Event += "|" + rest
		}
		p.ID = ""
		out = append(out, p)
	}
	return out
}

// Node names of LangChain's create_agent (and its middleware) that
// natsagent's steps stand for.
const (
	nodeTitle = "TitleMiddleware.before_agent"
)

func rawOrEmpty(raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 {
		return json.RawMessage("{}")
	}
	return raw
}

// state returns the state the events apply to, reading the run's start
// from the Source the first time.
func (s *Stream) state(ctx context.Context, attempt int, t time.Time) (*state.State, error) {
	if s.st != nil {
		return s.st, nil
	}
	st, err := s.src.Start(ctx, attempt, t)
	if st == nil {
		st = &state.State{}
	}
	s.st = st
	return st, err
}

func (s *Stream) started(ctx context.Context, env *envelope) ([]Part, error) {
	var d struct {
		Attempt int `json:"attempt"`
	}
	_ = json.Unmarshal(env.Data, &d)
	attempt := max(d.Attempt, env.Attempt, 1)
	var out []Part
	if attempt > 1 && attempt > s.attempt {
		// A takeover: LangGraph starts a retried run's stream with its
		// metadata again.
		out = append(out, s.metadata(attempt))
	}
	s.attempt = attempt
	// Each attempt continues from what was saved: what the events of an
	// earlier attempt added after its last checkpoint is void.
	s.st, s.running = nil, nil
	clear(s.streamed)
	_, err := s.state(ctx, attempt, env.Time)
	if s.modes.Has(ModeValues) {
		out = append(out, s.values())
	}
	return out, err
}

// values is the values part of the state now.
func (s *Stream) values() Part {
	v, err := ValuesWith(&s.enc, s.st, s.hidden...)
	if err != nil {
		v = Values(s.st, s.hidden...)
	}
	p := part(ModeValues, v)
	s.lastValues = p.Data
	return p
}

// tupleMeta is the metadata of a messages-tuple part.
func (s *Stream) tupleMeta(node string, step int) map[string]any {
	m := map[string]any{
		"tags":                    []string{},
		"run_id":                  s.run.RunID,
		"thread_id":               s.run.ThreadID,
		"assistant_id":            s.run.Agent,
		"graph_id":                s.run.Agent,
		"run_attempt":             max(s.attempt, 1),
		"langgraph_step":          step,
		"langgraph_node":          node,
		"langgraph_triggers":      []string{"branch:to:" + node},
		"langgraph_path":          []string{"__pregel_pull", node},
		"langgraph_checkpoint_ns": "",
		"checkpoint_ns":           "",
	}
	if node == NodeModel && s.modelName != "" {
		m["ls_model_name"] = s.modelName
		m["ls_model_type"] = "chat"
	}
	return m
}

// chunk is an AIMessageChunk as LangGraph serializes one.
type chunk struct {
	Type             string            `json:"type"`
	Content          string            `json:"content"`
	ID               string            `json:"id"`
	ToolCalls        []ToolCall        `json:"tool_calls"`
	ToolCallChunks   []toolCallChunk   `json:"tool_call_chunks"`
	InvalidToolCalls []InvalidToolCall `json:"invalid_tool_calls"`
	UsageMetadata    *UsageMetadata    `json:"usage_metadata,omitempty"`
	ResponseMetadata map[string]any    `json:"response_metadata"`
	AdditionalKwargs map[string]any    `json:"additional_kwargs"`
}

type toolCallChunk struct {
	ID    string `json:"id"`
	Name  string `json:"name"`
	Args  string `json:"args"`
	Index int    `json:"index"`
	Type  string `json:"type"` // "tool_call_chunk"
}

const typeAIChunk = "AIMessageChunk"

func (s *Stream) delta(ctx context.Context, env *envelope) ([]Part, error) {
	var d protocol.DeltaData
	if json.Unmarshal(env.Data, &d) != nil || d.MessageID == "" {
		return nil, nil
	}
	b := s.streamed[d.MessageID]
	first := b == nil
	if first {
		b = &strings.Builder{}
		s.streamed[d.MessageID] = b
	}
	b.WriteString(d.Delta)
	step := s.step + 1
	var out []Part
	c := chunk{Type: typeAIChunk, Content: d.Delta, ID: d.MessageID, ToolCalls: []ToolCall{}, ToolCallChunks: []toolCallChunk{}, InvalidToolCalls: []InvalidToolCall{}, ResponseMetadata: map[string]any{}, AdditionalKwargs: map[string]any{}}
	if s.modes.Has(ModeMessagesTuple) {
		out = append(out, part(ModeMessages, []any{c, s.tupleMeta(NodeModel, step)}))
	}
	if s.modes.Has(ModeMessages) {
		if first {
			out = append(out, part("messages/metadata", map[string]any{d.MessageID: map[string]any{"metadata": s.tupleMeta(NodeModel, step)}}))
		}
		msg := Message{Type: TypeAI, Content: b.String(), ID: d.MessageID, ResponseMetadata: map[string]any{}, AdditionalKwargs: map[string]any{}}
		out = append(out, part("messages/partial", []Message{msg}))
	}
	if s.modes.Has(ModeEvents) {
		if first {
			out = append(out, s.event("on_chat_model_start", s.modelLabel(), d.MessageID, NodeModel, step, map[string]any{"input": map[string]any{}}))
		}
		out = append(out, s.event("on_chat_model_stream", s.modelLabel(), d.MessageID, NodeModel, step, map[string]any{"chunk": c}))
	}
	return out, nil
}

func (s *Stream) modelLabel() string {
	if s.modelName != "" {
		return s.modelName
	}
	return "model"
}

// event is an events part: a LangChain astream_events (v2) event.
func (s *Stream) event(name, label, runID, node string, step int, data any) Part {
	return part(ModeEvents, map[string]any{
		"event":      name,
		"name":       label,
		"tags":       []string{},
		"run_id":     runID,
		"metadata":   s.tupleMeta(node, step),
		"parent_ids": []string{s.run.RunID},
		"data":       data,
	})
}

func (s *Stream) completed(ctx context.Context, env *envelope) ([]Part, error) {
	var msg model.Message
	if json.Unmarshal(env.Data, &msg) != nil || msg.ID == "" {
		return nil, nil
	}
	st, err := s.state(ctx, max(env.Attempt, 1), env.Time)
	s.step++
	lc := FromModel(msg)
	var out []Part
	streamed := ""
	if b := s.streamed[msg.ID]; b != nil {
		streamed = b.String()
	}
	if s.modes.Has(ModeMessagesTuple) {
		// The last chunk: the text not streamed yet (all of it when no
		// delta came), the tool calls, usage and finish reason, so the
		// chunks concatenate to the completed message.
		c := chunk{Type: typeAIChunk, ID: msg.ID, ToolCalls: nonNil(lc.ToolCalls), ToolCallChunks: []toolCallChunk{}, InvalidToolCalls: nonNil(lc.InvalidToolCalls),
			UsageMetadata: lc.UsageMetadata, ResponseMetadata: lc.ResponseMetadata, AdditionalKwargs: lc.AdditionalKwargs}
		if rest, ok := strings.CutPrefix(msg.Content, streamed); ok {
			c.Content = rest
		}
		for i, tc := range msg.ToolCalls {
			c.ToolCallChunks = append(c.ToolCallChunks, toolCallChunk{ID: tc.ID, Name: tc.Name, Args: tc.Arguments, Index: i, Type: "tool_call_chunk"})
		}
		out = append(out, part(ModeMessages, []any{c, s.tupleMeta(NodeModel, s.step)}))
	}
	if s.modes.Has(ModeMessages) {
		if streamed == "" && s.streamed[msg.ID] == nil {
			out = append(out, part("messages/metadata", map[string]any{msg.ID: map[string]any{"metadata": s.tupleMeta(NodeModel, s.step)}}))
		}
		out = append(out, part("messages/complete", []Message{lc}))
	}
	if s.modes.Has(ModeEvents) {
		if s.streamed[msg.ID] == nil {
			out = append(out, s.event("on_chat_model_start", s.modelLabel(), msg.ID, NodeModel, s.step, map[string]any{"input": map[string]any{}}))
		}
		out = append(out, s.event("on_chat_model_end", s.modelLabel(), msg.ID, NodeModel, s.step, map[string]any{"output": lc}))
	}
	delete(s.streamed, msg.ID)
	st.Apply(state.Update{Messages: []model.Message{msg}})
	update := map[string]any{"messages": []Message{lc}}
	out = append(out, s.stepDone(NodeModel, msg.ID, update)...)
	return out, err
}

// stepDone is what follows a node's step: its update, its task result,
// the values and the checkpoint after it.
func (s *Stream) stepDone(node, taskID string, update map[string]any) []Part {
	var out []Part
	if s.modes.Has(ModeUpdates) {
		out = append(out, part(ModeUpdates, map[string]any{node: update}))
	}
	if s.modes.Has(ModeTasks) || s.modes.Has(ModeDebug) {
		res := make([][2]any, 0, len(update))
		for _, k := range sortedKeys(update) {
			res = append(res, [2]any{k, update[k]})
		}
		task := map[string]any{"id": taskID, "name": node, "error": nil, "result": res, "interrupts": []Interrupt{}}
		out = append(out, s.taskParts("task_result", task)...)
	}
	return append(out, s.boundary()...)
}

// boundary is what a step's end sends: the values, and the checkpoint.
func (s *Stream) boundary() []Part {
	var out []Part
	if s.modes.Has(ModeValues) {
		out = append(out, s.values())
	}
	if s.modes.Has(ModeCheckpoints) || s.modes.Has(ModeDebug) {
		cp := s.checkpoint()
		if s.modes.Has(ModeCheckpoints) {
			out = append(out, part(ModeCheckpoints, cp))
		}
		if s.modes.Has(ModeDebug) {
			out = append(out, s.debug("checkpoint", cp))
		}
	}
	return out
}

// checkpoint is a checkpoints part: the state after a step of the run.
// Its checkpoint id is the run's step ("<run_id>-<step>"): the stored
// checkpoint ids are known once the run ended (state and history).
func (s *Stream) checkpoint() map[string]any {
	v, err := ValuesWith(&s.enc, s.st, s.hidden...)
	if err != nil {
		v = Values(s.st, s.hidden...)
	}
	next := []string{}
	if node := NextNode(s.st.Messages); node != "" {
		next = []string{node}
	}
	id := fmt.Sprintf("%s-%d", s.run.RunID, s.step)
	cfg := map[string]any{"configurable": map[string]any{"thread_id": s.run.ThreadID, "checkpoint_ns": "", "checkpoint_id": id}}
	return map[string]any{
		"config":     cfg,
		"checkpoint": map[string]any{"thread_id": s.run.ThreadID, "checkpoint_ns": "", "checkpoint_id": id},
		"metadata":   map[string]any{"source": "loop", "step": s.step, "run_id": s.run.RunID},
		"values":     v,
		"next":       next,
		"tasks":      []Task{},
	}
}

func (s *Stream) taskParts(kind string, task map[string]any) []Part {
	var out []Part
	if s.modes.Has(ModeTasks) {
		out = append(out, part(ModeTasks, task))
	}
	if s.modes.Has(ModeDebug) {
		out = append(out, s.debug(kind, task))
	}
	return out
}

func (s *Stream) debug(kind string, payload any) Part {
	return part(ModeDebug, map[string]any{"type": kind, "timestamp": time.Now().UTC().Format(time.RFC3339Nano), "step": s.step, "payload": payload})
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func (s *Stream) toolStarted(env *envelope) []Part {
	var d protocol.ToolEventData
	if json.Unmarshal(env.Data, &d) != nil || d.ToolCallID == "" {
		return nil
	}
	if !slices.Contains(s.running, d.ToolCallID) {
		s.running = append(s.running, d.ToolCallID)
	}
	var args any = d.Arguments
	if a, err := decodeArgs(d.Arguments); err == nil {
		args = a
	}
	var out []Part
	if s.modes.Has(ModeTasks) || s.modes.Has(ModeDebug) {
		task := map[string]any{"id": d.ToolCallID, "name": NodeTools, "input": map[string]any{"tool_call": ToolCall{ID: d.ToolCallID, Name: d.Name, Args: asObject(args), Type: "tool_call"}}, "triggers": []string{"__pregel_push"}, "interrupts": []Interrupt{}}
		out = append(out, s.taskParts("task", task)...)
	}
	if s.modes.Has(ModeEvents) {
		out = append(out, s.event("on_tool_start", d.Name, d.ToolCallID, NodeTools, s.step+1, map[string]any{"input": args}))
	}
	if s.modes.Has(ModeTools) {
		out = append(out, part(ModeTools, map[string]any{"event": "on_tool_start", "toolCallId": d.ToolCallID, "name": d.Name, "input": args}))
	}
	return out
}

func asObject(v any) map[string]any {
	if m, ok := v.(map[string]any); ok {
		return m
	}
	return map[string]any{}
}

func (s *Stream) toolFinished(ctx context.Context, env *envelope) ([]Part, error) {
	var d protocol.ToolEventData
	if json.Unmarshal(env.Data, &d) != nil || d.ToolCallID == "" {
		return nil, nil
	}
	st, err := s.state(ctx, max(env.Attempt, 1), env.Time)
	// An event of a worker before message_id existed has none: the
	// values after the run carry the stored id.
	id := d.MessageID
	if id == "" {
		id = "tool-" + d.ToolCallID
	}
	msg := model.Message{ID: id, Role: model.RoleTool, ToolCallID: d.ToolCallID, Name: d.Name, Content: d.Result, Status: d.Status}
	lc := FromModel(msg)
	step := s.step + 1
	var out []Part
	if s.modes.Has(ModeMessagesTuple) {
		out = append(out, part(ModeMessages, []any{lc, s.tupleMeta(NodeTools, step)}))
	}
	if s.modes.Has(ModeMessages) {
		out = append(out, part("messages/complete", []Message{lc}))
	}
	if s.modes.Has(ModeEvents) {
		out = append(out, s.event("on_tool_end", d.Name, d.ToolCallID, NodeTools, step, map[string]any{"output": lc}))
	}
	if s.modes.Has(ModeTools) {
		if d.Status == model.ToolStatusError {
			out = append(out, part(ModeTools, map[string]any{"event": "on_tool_error", "toolCallId": d.ToolCallID, "name": d.Name, "error": d.Result}))
		} else {
			out = append(out, part(ModeTools, map[string]any{"event": "on_tool_end", "toolCallId": d.ToolCallID, "name": d.Name, "output": d.Result}))
		}
	}
	if s.modes.Has(ModeUpdates) {
		out = append(out, part(ModeUpdates, map[string]any{NodeTools: map[string]any{"messages": []Message{lc}}}))
	}
	if s.modes.Has(ModeTasks) || s.modes.Has(ModeDebug) {
		task := map[string]any{"id": d.ToolCallID, "name": NodeTools, "error": nil, "result": [][2]any{{"messages", []Message{lc}}}, "interrupts": []Interrupt{}}
		out = append(out, s.taskParts("task_result", task)...)
	}
	st.Apply(state.Update{Messages: []model.Message{msg}})
	s.running = slices.DeleteFunc(s.running, func(id string) bool { return id == d.ToolCallID })
	if len(s.running) == 0 {
		// The batch is done: that is the tools step.
		s.step++
		out = append(out, s.boundary()...)
	}
	return out, err
}

// stateEvent applies a value a middleware changed.
func (s *Stream) stateEvent(ctx context.Context, env *envelope) ([]Part, error) {
	var key, node string
	var field string
	switch env.Type {
	case eventTodos:
		key, field, node = "todos", "todos", NodeTools
	case eventSkills:
		key, field, node = "activated_skills", "activated", NodeTools
	default:
		key, field, node = "title", "title", nodeTitle
	}
	var d map[string]json.RawMessage
	if json.Unmarshal(env.Data, &d) != nil || d[field] == nil {
		return nil, nil
	}
	st, err := s.state(ctx, max(env.Attempt, 1), env.Time)
	st.Apply(state.Update{Values: map[string]json.RawMessage{key: d[field]}})
	if !s.modes.Has(ModeUpdates) {
		return nil, err
	}
	return []Part{part(ModeUpdates, map[string]any{node: map[string]any{key: d[field]}})}, err
}

func (s *Stream) finished(ctx context.Context, env *envelope) ([]Part, error) {
	s.done = true
	var d protocol.FinishedData
	_ = json.Unmarshal(env.Data, &d)
	var out []Part
	var err error
	if s.modes.Has(ModeValues) || s.modes.Has(ModeEvents) {
		var st *state.State
		st, err = s.src.Final(ctx)
		if st != nil {
			s.st = st
		} else if s.st == nil {
			s.st = &state.State{}
		}
		if s.modes.Has(ModeValues) {
			// The values after the run, read from its last checkpoint
			// (tool results in events are clipped): sent unless the last
			// values sent were the same.
			last := s.lastValues
			if p := s.values(); string(p.Data) != string(last) {
				out = append(out, p)
			}
		}
	}
	if d.Interrupt != nil {
		in, _ := FromInterrupt(d.Interrupt)
		ins := map[string]any{InterruptKey: []Interrupt{in}}
		if s.modes.Has(ModeValues) {
			out = append(out, part(ModeValues, ins))
		}
		if s.modes.Has(ModeUpdates) {
			out = append(out, part(ModeUpdates, ins))
		}
	}
	if s.modes.Has(ModeEvents) {
		v, verr := ValuesWith(&s.enc, s.st, s.hidden...)
		if verr != nil {
			v = Values(s.st, s.hidden...)
		}
		out = append(out, part(ModeEvents, map[string]any{"event": "on_chain_end", "name": "LangGraph", "tags": []string{}, "run_id": s.run.RunID,
			"metadata": map[string]any{"run_id": s.run.RunID, "thread_id": s.run.ThreadID}, "parent_ids": []string{}, "data": map[string]any{"output": v}}))
	}
	switch d.Status {
	case protocol.StatusError, protocol.StatusTimeout:
		msg := d.Error
		if msg == "" {
			msg = "the run ended " + string(d.Status)
		}
		out = append(out, part("error", map[string]any{"error": ErrorName(d.Status, d.StopReason), "message": msg}))
	}
	out = append(out, part("end", map[string]any{"run_id": s.run.RunID, "status": d.Status}))
	return out, err
}

// ErrorName is the "error" LangGraph clients get for a run that failed:
// its stop reason, else TimeoutError or RunError.
func ErrorName(status protocol.Status, stopReason string) string {
	switch {
	case stopReason != "":
		return stopReason
	case status == protocol.StatusTimeout:
		return "TimeoutError"
	}
	return "RunError"
}
