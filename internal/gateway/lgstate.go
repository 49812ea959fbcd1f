package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/erase"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/langgraph"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
)

// Thread state, history and time travel in the LangGraph Agent Server's
// shapes (docs/protocol.md 3.7). natsagent's own shapes stay available
// with ?format=natsagent.

// formatNatsagent asks for natsagent's shapes instead of LangGraph's.
const formatNatsagent = "natsagent"

// nativeFormat reports whether the request asks for natsagent's shapes
// (?format=natsagent); ?format=langgraph or none is LangGraph's.
func nativeFormat(r *http.Request) (bool, error) {
	switch f := r.URL.Query().Get("format"); f {
	case "", "langgraph":
		return false, nil
	case formatNatsagent:
		return true, nil
	default:
		return false, errInvalid("format", fmt.Sprintf("%q is not one of langgraph, natsagent", clip(f)))
	}
}

// threadState: GET /threads/{thread_id}/state, the state at the head.
func (s *Server) threadState(w http.ResponseWriter, r *http.Request, tenant string) error {
	native, err := nativeFormat(r)
	if err != nil {
		return err
	}
	th, err := s.thread(r, tenant)
	if err != nil {
		return err
	}
	if native {
		return s.nativeState(w, r, th)
	}
	g, err := s.loadGraph(r.Context(), th)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, g.snapshot(th.Head))
	return nil
}

// checkpointRef is a checkpoint as LangGraph clients name it: an object
// {"checkpoint_id", "checkpoint_ns", "thread_id", "checkpoint_map"},
// possibly inside {"configurable": {...}}, or just its id as a string.
type checkpointRef struct {
	id string
	ns string
}

func (c *checkpointRef) UnmarshalJSON(data []byte) error {
	data = bytes.TrimSpace(data)
	if bytes.Equal(data, []byte("null")) {
		return nil
	}
	if len(data) > 0 && data[0] == '"' {
		return json.Unmarshal(data, &c.id)
	}
	var obj struct {
		CheckpointID string `json:"checkpoint_id"`
		CheckpointNS string `json:"checkpoint_ns"`
		Configurable *struct {
			CheckpointID string `json:"checkpoint_id"`
			CheckpointNS string `json:"checkpoint_ns"`
		} `json:"configurable"`
	}
	if err := json.Unmarshal(data, &obj); err != nil {
		return err
	}
	c.id, c.ns = obj.CheckpointID, obj.CheckpointNS
	if cf := obj.Configurable; cf != nil && c.id == "" {
		c.id, c.ns = cf.CheckpointID, cf.CheckpointNS
	}
	return nil
}

// resolve returns the checkpoint id a request names, checking it against
// the thread's history; field names the input for errors.
func (g *threadGraph) resolve(field string, ref checkpointRef) (string, error) {
	if ref.ns != "" {
		return "", errInvalid(field+".checkpoint_ns", fmt.Sprintf("%q: natsagent threads have no subgraph namespaces; send \"\"", clip(ref.ns)))
	}
	if err := protocol.CheckToken(field+".checkpoint_id", ref.id); err != nil {
		return "", err
	}
	if !g.has(ref.id) {
		return "", errNotFound(fmt.Sprintf("checkpoint %s not found in the history of thread %s", ref.id, g.th.ThreadID))
	}
	return ref.id, nil
}

// stateAtCheckpoint: GET /threads/{thread_id}/state/{checkpoint_id}.
func (s *Server) stateAtCheckpoint(w http.ResponseWriter, r *http.Request, tenant string) error {
	return s.writeStateAt(w, r, tenant, checkpointRef{id: r.PathValue("checkpoint_id")}, "checkpoint_id")
}

// stateAtCheckpointBody: POST /threads/{thread_id}/state/checkpoint with
// {"checkpoint": {...}}, as the SDK sends a checkpoint object.
func (s *Server) stateAtCheckpointBody(w http.ResponseWriter, r *http.Request, tenant string) error {
	var body struct {
		Checkpoint checkpointRef `json:"checkpoint"`
	}
	if err := decodeBody(r, &body); err != nil {
		return err
	}
	return s.writeStateAt(w, r, tenant, body.Checkpoint, "checkpoint")
}

func (s *Server) writeStateAt(w http.ResponseWriter, r *http.Request, tenant string, ref checkpointRef, field string) error {
	th, err := s.thread(r, tenant)
	if err != nil {
		return err
	}
	g, err := s.loadGraph(r.Context(), th)
	if err != nil {
		return err
	}
	id, err := g.resolve(field, ref)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, g.snapshot(id))
	return nil
}

// historyBody is the body of POST /threads/{thread_id}/history.
type historyBody struct {
	Limit      *int           `json:"limit"`
	Before     *checkpointRef `json:"before"`
	Metadata   map[string]any `json:"metadata"`
	Checkpoint *checkpointRef `json:"checkpoint"`
}

// History limits: LangGraph's default, and the most one page holds.
const (
	defaultHistoryLimit = 10
	maxHistoryLimit     = 1000
)

// threadHistory: GET or POST /threads/{thread_id}/history, the thread's
// states newest first: the chain from the head and the branches time
// travel left behind. Filters (body, or query for GET): limit, before (a
// checkpoint: only older ones), metadata (entries whose metadata has
// these values), checkpoint (that checkpoint alone).
func (s *Server) threadHistory(w http.ResponseWriter, r *http.Request, tenant string) error {
	native, err := nativeFormat(r)
	if err != nil {
		return err
	}
	th, err := s.thread(r, tenant)
	if err != nil {
		return err
	}
	if native {
		return s.nativeHistory(w, r, th)
	}
	var body historyBody
	if r.Method == http.MethodPost {
		if err := decodeBody(r, &body); err != nil {
			return err
		}
	}
	q := r.URL.Query()
	if v := q.Get("limit"); v != "" && body.Limit == nil {
		n, err := strconv.Atoi(v)
		if err != nil {
			return errInvalid("limit", fmt.Sprintf("limit must be a number from 1 to %d", maxHistoryLimit))
		}
		body.Limit = &n
	}
	if v := q.Get("before"); v != "" && body.Before == nil {
		body.Before = &checkpointRef{id: v}
	}
	limit := defaultHistoryLimit
	if body.Limit != nil {
		if *body.Limit < 1 || *body.Limit > maxHistoryLimit {
			return errInvalid("limit", fmt.Sprintf("limit must be a number from 1 to %d", maxHistoryLimit))
		}
		limit = *body.Limit
	}
	offset := 0
	if v := q.Get("offset"); v != "" {
		if offset, err = strconv.Atoi(v); err != nil || offset < 0 || offset > maxOffset {
			return errInvalid("offset", fmt.Sprintf("offset must be a number from 0 to %d", maxOffset))
		}
	}
	g, err := s.loadGraph(r.Context(), th)
	if err != nil {
		return err
	}
	entries := g.history()
	if body.Before != nil && (body.Before.id != "" || body.Before.ns != "") {
		id, err := g.resolve("before", *body.Before)
		if err != nil {
			return err
		}
		for i, d := range entries {
			if d.ID == id {
				entries = entries[i+1:]
				break
			}
		}
	}
	if c := body.Checkpoint; c != nil {
		if c.ns != "" {
			entries = nil // no subgraphs: nothing lives in another namespace
		} else if c.id != "" {
			if err := protocol.CheckToken("checkpoint.checkpoint_id", c.id); err != nil {
				return err
			}
			var only []*kv.Delta
			for _, d := range entries {
				if d.ID == c.id {
					only = append(only, d)
				}
			}
			entries = only
		}
	}
	var picked []string
	for _, d := range entries {
		if len(picked) == limit+offset {
			break
		}
		if len(body.Metadata) > 0 && !matches(g.metadata(d), body.Metadata) {
			continue
		}
		picked = append(picked, d.ID)
	}
	picked = picked[min(offset, len(picked)):]
	// The states are written one by one as they are built: a long page
	// of a long thread holds one state in memory at a time, not the page.
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte{'['})
	for i, id := range picked {
		data, err := json.Marshal(g.snapshot(id))
		if err != nil {
			s.log.Error("history entry not encoded", zap.String("tenant", tenant), zap.String("thread_id", th.ThreadID), zap.String("checkpoint", id), zap.Error(err))
			return nil // the truncated body tells the client
		}
		if i > 0 {
			_, _ = w.Write([]byte{','})
		}
		if _, err := w.Write(data); err != nil {
			return nil // the client left
		}
	}
	_, _ = w.Write([]byte("]\n"))
	return nil
}

// updateStateBody is the body of POST /threads/{thread_id}/state.
type updateStateBody struct {
	Values       json.RawMessage `json:"values"`
	Checkpoint   *checkpointRef  `json:"checkpoint"`
	CheckpointID string          `json:"checkpoint_id"`
	AsNode       string          `json:"as_node"`
}

// Values a state update may set besides messages: those a person may
// edit without bypassing what the agent enforces (approvals, interrupts,
// skills and summaries stay the agent's).
var updatableValues = map[string]func(json.RawMessage) error{
	protocol.TodosValue: func(raw json.RawMessage) error {
		var todos []protocol.Todo
		return json.Unmarshal(raw, &todos)
	},
	protocol.TitleValue: func(raw json.RawMessage) error {
		var title string
		return json.Unmarshal(raw, &title)
	},
}

// updateState: POST /threads/{thread_id}/state. It writes a checkpoint
// with the values given, on the head or on the checkpoint named (which
// forks the thread there: the head moves to the new checkpoint, the old
// branch stays in the history). A thread a run holds or waits for is 409.
func (s *Server) updateState(w http.ResponseWriter, r *http.Request, tenant string) error {
	var body updateStateBody
	if err := decodeBody(r, &body); err != nil {
		return err
	}
	if len(body.AsNode) > 128 {
		return errInvalid("as_node", "as_node is longer than 128 bytes")
	}
	u, title, err := stateUpdate(body.Values)
	if err != nil {
		return err
	}
	ref, field := checkpointRef{id: body.CheckpointID}, "checkpoint_id"
	if body.Checkpoint != nil && body.Checkpoint.id != "" {
		if ref.id != "" && ref.id != body.Checkpoint.id {
			return errInvalid("checkpoint_id", "checkpoint and checkpoint_id name different checkpoints; send one")
		}
		ref, field = *body.Checkpoint, "checkpoint"
	}
	th, err := s.thread(r, tenant)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), s.submitTimeout)
	defer cancel()
	d := &kv.Delta{ID: "update-" + newID(), Source: kv.SourceUpdate, AsNode: body.AsNode, Update: u}
	if err := s.timeTravel(ctx, th, ref, field, d, title); err != nil {
		return err
	}
	cp := langgraph.Checkpoint{ThreadID: th.ThreadID, CheckpointID: d.ID}
	writeJSON(w, http.StatusOK, map[string]any{"checkpoint": cp, "configurable": cp})
	return nil
}

// stateUpdate turns the values of a state update into a checkpoint
// update: messages (one or a list, LangChain's or natsagent's shape;
// upserted by id, {"type": "remove", "id"} removes one), todos and title.
func stateUpdate(raw json.RawMessage) (state.Update, string, error) {
	var u state.Update
	var title string
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return u, "", nil
	}
	var values map[string]json.RawMessage
	if err := json.Unmarshal(raw, &values); err != nil {
		return u, "", errInvalid("values", "values must be an object of state keys (messages, todos, title)")
	}
	for k, v := range values {
		if k == "messages" {
			continue
		}
		check, ok := updatableValues[k]
		if !ok {
			return u, "", errInvalid("values."+k, fmt.Sprintf("%q cannot be updated: a state update may set messages, todos and title", clip(k)))
		}
		if err := check(v); err != nil {
			return u, "", errInvalid("values."+k, fmt.Sprintf("values.%s: %v", k, err))
		}
		if u.Values == nil {
			u.Values = map[string]json.RawMessage{}
		}
		u.Values[k] = v
		if k == protocol.TitleValue {
			_ = json.Unmarshal(v, &title)
		}
	}
	if msgs, ok := values["messages"]; ok {
		msgs = bytes.TrimSpace(msgs)
		if len(msgs) > 0 && msgs[0] == '{' {
			msgs = append(append([]byte("["), msgs...), ']')
		}
		var in []langgraph.Input
		if err := json.Unmarshal(msgs, &in); err != nil {
			return u, "", errInvalid("values.messages", "values.messages must be a message or a list of messages: "+err.Error())
		}
		for i, m := range in {
			field := fmt.Sprintf("values.messages[%d]", i)
			if id, ok := m.Remove(); ok {
				if err := protocol.CheckToken(field+".id", id); err != nil {
					return u, "", err
				}
				u.Remove = append(u.Remove, id)
				continue
			}
			msg, err := updateMessage(field, m)
			if err != nil {
				return u, "", err
			}
			u.Messages = append(u.Messages, msg)
		}
	}
	return u, title, nil
}

// updateMessage checks one message of a state update: human or ai text
// (an ai message with tool calls would have the agent run them without
// asking; tool and system messages are the agent's), a valid id or none
// (one is given).
func updateMessage(field string, in langgraph.Input) (model.Message, error) {
	m, err := langgraph.ToModel(in)
	if err != nil {
		var fe *langgraph.FieldError
		if errors.As(err, &fe) {
			return m, errInvalid(field+"."+fe.Field, fmt.Sprintf("%s.%s %s", field, fe.Field, fe.Msg))
		}
		return m, errInvalid(field, err.Error())
	}
	switch m.Role {
	case model.RoleUser:
	case model.RoleAssistant:
		if len(m.ToolCalls) > 0 {
			return m, errInvalid(field+".tool_calls", "a state update cannot add tool calls: the agent would run them without asking; send text")
		}
	default:
		kind := ".type"
		if in.Role != "" {
			kind = ".role"
		}
		return m, errInvalid(field+kind, fmt.Sprintf("%q messages cannot be written by a state update; send human or ai messages (or {\"type\": \"remove\", \"id\"})", clip(m.Role)))
	}
	if len(m.Parts) > 0 {
		return m, errInvalid(field+".content", "images are not stored in a thread: put them in the thread's workdir (file upload)")
	}
	if m.ID == "" {
		m.ID = "msg_" + newID()
	} else if err := protocol.CheckToken(field+".id", m.ID); err != nil {
		return m, err
	}
	m.ToolCallID, m.Status = "", ""
	return m, nil
}

// errTimeTravelMoved: the thread changed between the read and the write.
var errTimeTravelMoved = errors.New("thread moved")

// timeTravel writes d (its id, source and update set) on the checkpoint
// ref names, or on the head when ref is empty, and moves the head to it
// with a compare-and-set of the thread record, only while no run holds
// or waits for the thread (409 otherwise). A checkpoint other than the
// head forks the thread: d records the head it replaces, so that branch
// stays in the history.
func (s *Server) timeTravel(ctx context.Context, th *protocol.Thread, ref checkpointRef, field string, d *kv.Delta, title string) error {
	own := d.Update
	for attempt := 0; ; attempt++ {
		if th.Status == protocol.ThreadDeleting {
			return errDeleting(th.ThreadID)
		}
		busy, holder, err := s.busy(ctx, th)
		if err != nil {
			return err
		}
		if busy {
			msg := fmt.Sprintf("thread %s is busy", th.ThreadID)
			if holder != "" {
				msg += " with run " + holder
			}
			return errConflict(msg + "; change its state when the run has ended (or cancel it)")
		}
		base := th.Head
		g, err := s.loadGraph(ctx, th)
		if err != nil {
			return err
		}
		if ref.id != "" || ref.ns != "" {
			if base, err = g.resolve(field, ref); err != nil {
				return err
			}
		}
		d.Parent, d.Time, d.Replaced, d.At, d.Update = base, time.Now().UTC(), "", "", own
		if base == inputCheckpoint {
			d.Parent = "" // the thread starts over: a new root
		} else if parent, prefix, step := g.storedBase(base); step {
			// A step inside a run's delta: the checkpoint is stored on
			// the delta's parent with the delta's changes up to the step,
			// so a worker loads it by parents alone.
			prefix.Merge(own)
			d.Parent, d.At, d.Update = parent, base, prefix
		}
		if base != th.Head {
			d.Replaced = th.Head
		}
		after := g.stateAt(base).Clone()
		after.Apply(own)
		status := protocol.ThreadIdle
		if ok, _ := after.Value(protocol.InterruptValue, &protocol.Interrupt{}); ok {
			status = protocol.ThreadInterrupted
		}
		if _, err := s.stores.Checkpoints.Put(ctx, th.Tenant, th.ThreadID, d); err != nil {
			return err
		}
		head, lastRun, created := th.Head, th.LastRunID, th.CreatedAt
		_, _, err = s.stores.Threads.Mutate(ctx, th.Tenant, th.ThreadID, func(t *protocol.Thread) error {
			if t.Lease != nil || t.Head != head || t.LastRunID != lastRun || t.Status == protocol.ThreadDeleting || len(t.Preempt) > 0 ||
				!t.CreatedAt.Equal(created) {
				return errTimeTravelMoved
			}
			switch {
			case base == head:
				// On the head: the same files (a state update records
				// none), shown already.
				if t.FilesAt == head && head != "" {
					t.FilesAt = d.ID
				}
			case t.FilesAt == "":
				// The workdir shows the old head's files until they are
				// checked out (syncFiles, or the next run).
				t.FilesAt = t.Head
			}
			t.Head, t.Status = d.ID, status
			if title != "" {
				t.Title = title
			}
			return nil
		})
		if !errors.Is(err, errTimeTravelMoved) {
			if err == nil {
				s.log.Info("thread state written", zap.String("tenant", th.Tenant), zap.String("thread_id", th.ThreadID),
					zap.String("checkpoint", d.ID), zap.String("source", d.Source), zap.String("parent", d.Parent), zap.String("replaced", d.Replaced))
				s.syncFiles(ctx, th.Tenant, th.ThreadID)
			}
			return err
		}
		// A run took the thread, or another update moved it: the delta
		// stays unreferenced (retention removes it) and the next round
		// answers from the thread as it is now.
		if attempt == 2 {
			return errConflict(fmt.Sprintf("thread %s changed while its state was written; try again", th.ThreadID))
		}
		tenant, thread := th.Tenant, th.ThreadID
		if th, _, err = s.stores.Threads.GetLatest(ctx, tenant, thread); errors.Is(err, kv.ErrNotFound) {
			return errNotFound(fmt.Sprintf("thread %s not found", thread))
		} else if err != nil {
			return err
		}
		d.ID = d.Source + "-" + newID()
	}
}

// forkFields are the checkpoint fields of a run body: a run that names a
// checkpoint starts from it (LangGraph's fork).
type forkFields struct {
	Checkpoint   *checkpointRef `json:"checkpoint"`
	CheckpointID string         `json:"checkpoint_id"`
}

// ref returns the checkpoint named, if any.
func (f *forkFields) ref() (checkpointRef, string, bool, error) {
	ref, field := checkpointRef{id: f.CheckpointID}, "checkpoint_id"
	if c := f.Checkpoint; c != nil && (c.id != "" || c.ns != "") {
		if ref.id != "" && ref.id != c.id {
			return ref, field, false, errInvalid("checkpoint_id", "checkpoint and checkpoint_id name different checkpoints; send one")
		}
		ref, field = *c, "checkpoint"
	}
	return ref, field, ref.id != "" || ref.ns != "", nil
}

// forkForRun moves a thread's head to the checkpoint a new run names, so
// the run starts from it: a checkpoint other than the head gets a fork
// checkpoint on it that records the head it replaces (the old branch stays
// in the history). Like a state update it needs the thread idle (409). A
// retry of a run that exists forks nothing.
func (s *Server) forkForRun(ctx context.Context, tenant, thread, runID string, f *forkFields) error {
	ref, field, ok, err := f.ref()
	if err != nil || !ok {
		return err
	}
	if runID != "" {
		if _, _, err := s.stores.Runs.Get(ctx, tenant, runID); err == nil {
			return nil
		} else if !errors.Is(err, kv.ErrNotFound) {
			return err
		}
	}
	th, _, err := s.stores.Threads.Get(ctx, tenant, thread)
	if errors.Is(err, kv.ErrNotFound) {
		return errNotFound(fmt.Sprintf("thread %s not found: a run can start from a checkpoint of an existing thread only", thread))
	}
	if err != nil {
		return err
	}
	if ref.ns == "" && ref.id == th.Head {
		return nil
	}
	return s.timeTravel(ctx, th, ref, field, &kv.Delta{ID: "fork-" + newID(), Source: kv.SourceFork}, "")
}

// continueRun sets the command of a run sent without input or command, as
// LangGraph runs a graph with input null from a checkpoint (useStream's
// regenerate: submit(undefined, {checkpoint})): the step that comes next
// at the checkpoint named (else the head) runs, the model after input or
// tool results (command.goto model), the tools after a response with
// tool calls (command.goto tools). A checkpoint waiting for a person, one
// that ends with the agent's answer, and a thread without checkpoints have
// nothing to go on with: 400 naming input.
func (s *Server) continueRun(ctx context.Context, tenant, thread string, req *protocol.RunRequest, f *forkFields) error {
	th, _, err := s.stores.Threads.Get(ctx, tenant, thread)
	if errors.Is(err, kv.ErrNotFound) || (err == nil && th.Head == "") {
		return errInvalid("input", "input is required (or command to resume an interrupted thread): the thread has no checkpoint to go on from")
	}
	if err != nil {
		return err
	}
	g, err := s.loadGraph(ctx, th)
	if err != nil {
		return err
	}
	id := th.Head
	ref, field, named, err := f.ref()
	if err != nil {
		return err
	}
	if named {
		if id, err = g.resolve(field, ref); err != nil {
			return err
		}
	}
	st := g.stateAt(id)
	if ok, _ := st.Value(protocol.InterruptValue, &protocol.Interrupt{}); ok {
		return errInvalid("input", fmt.Sprintf("checkpoint %s waits for a person: answer with command.resume, or send input", id))
	}
	node := langgraph.NextNode(st.Messages)
	if node == "" {
		return errInvalid("input", fmt.Sprintf("input is required: checkpoint %s ends with the agent's answer, so a run without input has nothing to do", id))
	}
	req.Command.Goto = node
	return nil
}

// runResult is what runs.wait and runs.join answer, as LangGraph does:
// the thread's values after the run (its last checkpoint), with
// "__interrupt__" when it waits for a person, or {"__error__": {"error",
// "message"}} when it failed. ?format=natsagent answers the run record
// instead. X-Natsagent-Run-Status carries the run's status either way.
func (s *Server) runResult(ctx context.Context, r *http.Request, rec *protocol.Run) (any, error) {
	native, err := nativeFormat(r)
	if err != nil || native {
		return rec, err
	}
	switch rec.Status {
	case protocol.StatusError, protocol.StatusTimeout:
		msg := rec.Error
		if msg == "" {
			msg = "the run ended " + string(rec.Status)
		}
		return map[string]any{"__error__": map[string]any{"error": runErrorName(rec), "message": msg}}, nil
	}
	th, _, err := s.stores.Threads.Get(ctx, rec.Tenant, rec.ThreadID)
	if errors.Is(err, kv.ErrNotFound) {
		return map[string]any{"messages": []langgraph.Message{}}, nil
	}
	if err != nil {
		return nil, err
	}
	g, err := s.loadGraph(ctx, th)
	if err != nil {
		return nil, err
	}
	values := langgraph.Values(g.stateAfter(rec.RunID), protocol.InterruptValue)
	if rec.Status == protocol.StatusInterrupted {
		values = langgraph.WithInterrupt(values, rec.Interrupt)
	}
	return values, nil
}

// runErrorName is the "error" of a failed run's __error__: its stop
// reason, or its status.
func runErrorName(rec *protocol.Run) string {
	return langgraph.ErrorName(rec.Status, rec.StopReason)
}

// writeRunResult answers a finished run for runs.wait and runs.join.
func (s *Server) writeRunResult(w http.ResponseWriter, r *http.Request, rec *protocol.Run) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), s.submitTimeout)
	defer cancel()
	out, err := s.runResult(ctx, r, rec)
	if err != nil {
		return err
	}
	w.Header().Set("X-Natsagent-Run-Status", string(rec.Status))
	writeJSON(w, http.StatusOK, out)
	return nil
}

// patchThreadBody is the body of PATCH /threads/{thread_id}.
type patchThreadBody struct {
	Metadata map[string]any  `json:"metadata"`
	TTL      json.RawMessage `json:"ttl"`
}

// patchThread: PATCH /threads/{thread_id} merges metadata into the
// thread's (a key set to null is kept as null, as LangGraph does). A ttl
// is refused: threads expire by the deployment's retention rules.
func (s *Server) patchThread(w http.ResponseWriter, r *http.Request, tenant string) error {
	var body patchThreadBody
	if err := decodeBody(r, &body); err != nil {
		return err
	}
	if ttl := bytes.TrimSpace(body.TTL); len(ttl) > 0 && !bytes.Equal(ttl, []byte("null")) {
		return errInvalid("ttl", "a thread ttl is not supported: threads expire by the deployment's retention rules (operations.md)")
	}
	th, err := s.thread(r, tenant)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), s.submitTimeout)
	defer cancel()
	th, _, err = s.stores.Threads.Mutate(ctx, tenant, th.ThreadID, func(t *protocol.Thread) error {
		if !t.CreatedAt.Equal(th.CreatedAt) {
			return errNotFound(fmt.Sprintf("thread %s not found", th.ThreadID)) // deleted meanwhile
		}
		if len(body.Metadata) > 0 && t.Metadata == nil {
			t.Metadata = make(map[string]any, len(body.Metadata))
		}
		added := 0
		for k, v := range body.Metadata {
			if _, ok := t.Metadata[k]; !ok {
				added++
			}
			t.Metadata[k] = v
		}
		if added > 0 {
			// Only new fields: a thread its first run tagged past the
			// bound still takes changes to the fields it has.
			return checkMetadataFields(len(t.Metadata))
		}
		return nil
	})
	if err != nil {
		return err
	}
	if r.Header.Get("Prefer") == "return=minimal" {
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	writeJSON(w, http.StatusOK, viewThread(th))
	return nil
}

// copyThread: POST /threads/{thread_id}/copy creates a new thread with the
// same history (every checkpoint is written again under the new thread:
// the cost is the thread's checkpoints), metadata and title, owned by the
// requester. The workdir's files are not copied.
func (s *Server) copyThread(w http.ResponseWriter, r *http.Request, tenant string) error {
	th, err := s.thread(r, tenant)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), s.submitTimeout)
	defer cancel()
	g, err := s.loadGraph(ctx, th)
	if err != nil {
		return err
	}
	cp := newThread(tenant, newID(), th.Metadata)
	// The copy's runs must not write checkpoint ids it already has: they
	// count epochs on from the original's.
	cp.Owner, cp.Title, cp.Epoch = ownerOf(r), th.Title, th.Epoch
	// The record goes first, without a head, so a copy that fails half way
	// is a thread the eraser removes whole rather than keys no record
	// names.
	if _, err := s.stores.Threads.Put(ctx, cp, 0); err != nil {
		return err
	}
	if err := s.copyHistory(ctx, g, cp); err != nil {
		cleanup, done := context.WithTimeout(context.WithoutCancel(ctx), s.submitTimeout)
		defer done()
		if derr := s.eraser.DeleteThread(cleanup, tenant, cp.ThreadID, erase.ThreadOptions{}); derr != nil {
			s.log.Warn("a failed thread copy was not removed", zap.String("tenant", tenant), zap.String("thread_id", cp.ThreadID), zap.Error(derr))
		}
		return err
	}
	s.log.Info("thread copied", zap.String("tenant", tenant), zap.String("thread_id", th.ThreadID), zap.String("copy", cp.ThreadID), zap.Int("checkpoints", len(g.stored)))
	writeJSON(w, http.StatusOK, viewThread(cp))
	return nil
}

// copyHistory writes the history of g under the thread cp and moves cp's
// head to the original's.
func (s *Server) copyHistory(ctx context.Context, g *threadGraph, cp *protocol.Thread) error {
	for _, d := range g.stored {
		// The workdir is not copied: the copy's checkpoints name no files
		// (their content is the original's, under its thread).
		d := *d
		d.Files = nil
		if _, err := s.stores.Checkpoints.Put(ctx, cp.Tenant, cp.ThreadID, &d); err != nil {
			return err
		}
	}
	head := g.th.Head
	if _, ok := g.byID[head]; !ok {
		return nil
	}
	status := protocol.ThreadIdle
	if ok, _ := g.stateAt(head).Value(protocol.InterruptValue, &protocol.Interrupt{}); ok {
		status = protocol.ThreadInterrupted
	}
	updated, _, err := s.stores.Threads.Mutate(ctx, cp.Tenant, cp.ThreadID, func(t *protocol.Thread) error {
		if !t.CreatedAt.Equal(cp.CreatedAt) || t.Head != "" || t.Lease != nil {
			return errConflict(fmt.Sprintf("thread %s changed while it was copied", cp.ThreadID))
		}
		t.Head, t.Status = head, status
		return nil
	})
	if err == nil {
		*cp = *updated
	}
	return err
}
