package langgraph

import (
	"encoding/json"
	"time"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
)

// InterruptKey is the key of the pending interrupts in the values
// runs.wait and runs.join answer with while a thread waits for a person
// (LangGraph's "__interrupt__").
const InterruptKey = "__interrupt__"

// Node names a thread waits in while interrupted, as LangChain's
// create_agent names them: an approval is asked after the model call
// (HumanInTheLoopMiddleware), a clarification inside the tool node.
const (
	NodeModel    = "model"
	NodeTools    = "tools"
	NodeApproval = "HumanInTheLoopMiddleware.after_model"
)

// Values returns a state's values as LangGraph shows them: "messages" in
// LangChain's shape and the other values natsagent keeps (title, todos,
// ...) as they are, except hidden ones (the interrupt, which the state
// shows as tasks). hidden names the values left out.
func Values(st *state.State, hidden ...string) map[string]any {
	out := otherValues(st, hidden)
	out["messages"] = FromModels(st.Messages)
	return out
}

// ValuesWith is Values with the messages encoded by enc.
func ValuesWith(enc *Encoder, st *state.State, hidden ...string) (map[string]any, error) {
	out := otherValues(st, hidden)
	msgs, err := enc.Messages(st.Messages)
	out["messages"] = msgs
	return out, err
}

func otherValues(st *state.State, hidden []string) map[string]any {
	out := make(map[string]any, len(st.Values)+1)
	for k, v := range st.Values {
		out[k] = json.RawMessage(v)
	}
	for _, k := range hidden {
		delete(out, k)
	}
	return out
}

// Interrupt is LangGraph's Interrupt: what a paused graph waits for.
type Interrupt struct {
	Value any    `json:"value"`
	ID    string `json:"id"`
}

// ApprovalRequest is the value of an approval interrupt: the
// HumanInTheLoopMiddleware request of LangChain (action_requests and
// review_configs), with natsagent's kind and ids beside it.
type ApprovalRequest struct {
	Kind           string          `json:"kind"`
	ActionRequests []ActionRequest `json:"action_requests"`
	ReviewConfigs  []ReviewConfig  `json:"review_configs"`
}

// ActionRequest is one tool call waiting for a decision.
type ActionRequest struct {
	Name        string `json:"name"`
	Args        any    `json:"args"`
	Description string `json:"description,omitempty"`
	ToolCallID  string `json:"tool_call_id"`
}

// ReviewConfig says which decisions a tool call may get.
type ReviewConfig struct {
	ActionName       string   `json:"action_name"`
	AllowedDecisions []string `json:"allowed_decisions"`
}

// FromInterrupt converts natsagent's interrupt to LangGraph's, and names
// the node the thread waits in.
func FromInterrupt(in *protocol.Interrupt) (Interrupt, string) {
	id := "interrupt-" + in.RunID
	if in.MessageID != "" {
		id += "-" + in.MessageID
	} else if in.ToolCallID != "" {
		id += "-" + in.ToolCallID
	}
	if in.Kind != protocol.InterruptApproval {
		return Interrupt{ID: id, Value: in}, NodeTools
	}
	req := ApprovalRequest{Kind: in.Kind, ActionRequests: []ActionRequest{}, ReviewConfigs: []ReviewConfig{}}
	seen := map[string]bool{}
	for _, a := range in.ActionRequests {
		var args any = a.Arguments
		if m, err := decodeArgs(a.Arguments); err == nil {
			args = m
		}
		req.ActionRequests = append(req.ActionRequests, ActionRequest{Name: a.Name, Args: args, Description: a.Description, ToolCallID: a.ToolCallID})
		if !seen[a.Name] {
			seen[a.Name] = true
			req.ReviewConfigs = append(req.ReviewConfigs, ReviewConfig{ActionName: a.Name, AllowedDecisions: nonNil(in.AllowedDecisions)})
		}
	}
	return Interrupt{ID: id, Value: req}, NodeApproval
}

// Checkpoint names a checkpoint of a thread.
type Checkpoint struct {
	ThreadID      string         `json:"thread_id"`
	CheckpointNS  string         `json:"checkpoint_ns"`
	CheckpointID  string         `json:"checkpoint_id"`
	CheckpointMap map[string]any `json:"checkpoint_map"`
}

// Task is a step the thread would run next, with the interrupts it
// waits on.
type Task struct {
	ID         string      `json:"id"`
	Name       string      `json:"name"`
	Path       []string    `json:"path"`
	Error      *string     `json:"error"`
	Interrupts []Interrupt `json:"interrupts"`
	Checkpoint *Checkpoint `json:"checkpoint"`
	State      any         `json:"state"`
	Result     any         `json:"result,omitempty"`
}

// ThreadState is a thread's state at one checkpoint, LangGraph's
// StateSnapshot.
type ThreadState struct {
	Values           map[string]any `json:"values"`
	Next             []string       `json:"next"`
	Tasks            []Task         `json:"tasks"`
	Checkpoint       *Checkpoint    `json:"checkpoint"`
	ParentCheckpoint *Checkpoint    `json:"parent_checkpoint"`
	Metadata         map[string]any `json:"metadata"`
	CreatedAt        *time.Time     `json:"created_at"`
	// Interrupts lists the tasks' interrupts together (LangGraph
	// includes them at the top level too).
	Interrupts []Interrupt `json:"interrupts"`
}

// Snapshot is what a checkpoint is made of, as the gateway read it.
type Snapshot struct {
	ThreadID     string
	CheckpointID string // "" for a thread without checkpoints
	Parent       string
	CreatedAt    time.Time
	Metadata     map[string]any
	State        *state.State
	// Interrupt is the interrupt open at the checkpoint, if any.
	Interrupt *protocol.Interrupt
	// Settled says no step follows without new input (the gateway: an
	// idle head written outside a run). Other checkpoints say what comes
	// next from their last message.
	Settled bool
	// Hidden names the values not shown in values.
	Hidden []string
	// Encoder, when set, encodes the messages (sharing the work between
	// the states of one response).
	Encoder *Encoder
}

// State builds the ThreadState of a snapshot.
func State(s Snapshot) ThreadState {
	values := Values
	if s.Encoder != nil {
		values = func(st *state.State, hidden ...string) map[string]any {
			v, err := ValuesWith(s.Encoder, st, hidden...)
			if err != nil { // only a value json cannot encode: none here
				return Values(st, hidden...)
			}
			return v
		}
	}
	out := ThreadState{Values: values(s.State, s.Hidden...), Next: []string{}, Tasks: []Task{}, Interrupts: []Interrupt{}, Metadata: s.Metadata}
	if out.Metadata == nil {
		out.Metadata = map[string]any{}
	}
	if s.CheckpointID != "" {
		out.Checkpoint = &Checkpoint{ThreadID: s.ThreadID, CheckpointID: s.CheckpointID}
		t := s.CreatedAt
		out.CreatedAt = &t
	}
	if s.Parent != "" {
		out.ParentCheckpoint = &Checkpoint{ThreadID: s.ThreadID, CheckpointID: s.Parent}
	}
	switch {
	case s.Interrupt != nil:
		in, node := FromInterrupt(s.Interrupt)
		out.Next = []string{node}
		out.Interrupts = []Interrupt{in}
		out.Tasks = []Task{{ID: in.ID, Name: node, Path: []string{"__pregel_pull", node}, Interrupts: []Interrupt{in}}}
	case !s.Settled:
		if node := NextNode(s.State.Messages); node != "" {
			out.Next = []string{node}
			out.Tasks = []Task{{ID: s.CheckpointID + "-" + node, Name: node, Path: []string{"__pregel_pull", node}, Interrupts: []Interrupt{}}}
		}
	}
	return out
}

// NextNode is what a run does after a transcript: the tools when the last
// message asks for tool calls, the model after new input or tool results,
// nothing ("") after an answer.
func NextNode(ms []model.Message) string {
	if len(ms) == 0 {
		return ""
	}
	switch last := ms[len(ms)-1]; last.Role {
	case model.RoleAssistant:
		if len(last.ToolCalls) > 0 {
			return NodeTools
		}
	case model.RoleUser, model.RoleTool:
		return NodeModel
	}
	return ""
}

// WithInterrupt returns values with the interrupt under "__interrupt__",
// as runs.wait answers for a paused thread.
func WithInterrupt(values map[string]any, in *protocol.Interrupt) map[string]any {
	if in == nil {
		return values
	}
	i, _ := FromInterrupt(in)
	values[InterruptKey] = []Interrupt{i}
	return values
}
