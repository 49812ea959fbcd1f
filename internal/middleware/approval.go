package middleware

// Tool approval (human in the loop). Boundary: model response, tool call,
// and the tools offered. Reads the run's approval mode and the state's
// interrupt; writes the interrupt, the decisions' tool results, and the
// approved calls and edits (state values), so a resumed run on any worker
// knows what a person allowed. In mode "default" a lead agent's response
// that calls a gated tool (write_file, edit_file, execute by default) ends
// the run "interrupted" before anything runs; the interrupt lists the
// calls and the decisions a person may take. A resume run carries one
// decision per call, in order: approve runs it, edit runs it with the
// person's arguments (its result says so), reject answers it with an
// error result carrying the person's reason, respond answers it with the
// person's text. A wrong number or kind of decisions fails the run with a
// clear error and the thread keeps waiting. A subagent never asks a
// person: in default mode it is not offered gated tools, and an explicit
// call to one is refused (hiding is not the enforcement). Mode
// "always_trust" runs everything; mode "always_ask" (LangGraph's
// interrupt_before tools) asks before every call of a lead agent but
// ask_clarification.
//
// A rejected call is not asked about again in the run that carries the
// rejection (deepagents #2946): when the model re-issues it (same tool,
// same arguments as canonical JSON), the middleware answers it as not run
// without a new interrupt, max_rejected_repeats times (default 2); the
// next repeat strips the response's tool calls and ends the run incomplete
// with stop_reason rejected_call_repeated. Rejections and repeats are
// marked on their tool messages (meta rejected_call, rejected_repeat), so
// the count is the same on every worker and after a redelivery.

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
)

// State values of the approval middleware.
const (
	// ApprovedValue lists the tool call ids a person approved (or edited).
	ApprovedValue = "approved_tool_calls"
	// EditsValue maps a tool call id to the arguments a person gave it.
	EditsValue = "tool_call_edits"
)

// DefaultGatedTools need a person's approval in mode default.
var DefaultGatedTools = []string{"write_file", "edit_file", "execute"}

// ToolApproval gates sensitive tools behind a person's decision.
type ToolApproval struct {
	// Tools are the gated tool names.
	Tools []string `json:"tools"`
	// Decisions are the decisions a person may take.
	Decisions []string `json:"allowed_decisions"`
	// Mode is the default approval mode when a run sets none.
	Mode string `json:"mode"`
	// MaxRejectedRepeats is how many re-issues of a rejected call a run
	// answers before it ends (default 2).
	MaxRejectedRepeats int `json:"max_rejected_repeats"`
	kind               string
}

// Meta keys of the tool messages that answer a rejected call and its
// repeats; the value is the call's key (callIdentity).
const (
	MetaRejectedCall   = "rejected_call"
	MetaRejectedRepeat = "rejected_repeat"
)

// NewToolApproval checks the settings for a chain of the given kind.
func NewToolApproval(a ToolApproval, kind string) (*ToolApproval, error) {
	if a.Tools == nil {
		a.Tools = DefaultGatedTools
	}
	if len(a.Decisions) == 0 {
		a.Decisions = []string{protocol.DecisionApprove, protocol.DecisionEdit, protocol.DecisionReject, protocol.DecisionRespond}
	}
	for _, d := range a.Decisions {
		switch d {
		case protocol.DecisionApprove, protocol.DecisionEdit, protocol.DecisionReject, protocol.DecisionRespond:
		default:
			return nil, fmt.Errorf("allowed_decisions: %q is not one of approve, edit, reject, respond", d)
		}
	}
	switch a.Mode {
	case "":
		a.Mode = protocol.ApprovalDefault
	case protocol.ApprovalDefault, protocol.ApprovalAlwaysTrust, protocol.ApprovalAlwaysAsk:
	default:
		return nil, fmt.Errorf("mode: %q is not one of default, always_trust, always_ask", a.Mode)
	}
	if a.MaxRejectedRepeats == 0 {
		a.MaxRejectedRepeats = 2
	}
	if a.MaxRejectedRepeats < 1 || a.MaxRejectedRepeats > 100 {
		return nil, fmt.Errorf("max_rejected_repeats must be 1 to 100, not %d", a.MaxRejectedRepeats)
	}
	a.kind = kind
	return &a, nil
}

// Name implements Middleware.
func (*ToolApproval) Name() string { return "tool_approval" }

func (a *ToolApproval) gated(name string) bool { return slices.Contains(a.Tools, name) }

// gatedIn reports whether a call to name waits for a person in this run:
// a gated tool, or in mode always_ask any tool but ask_clarification
// (which asks a person itself).
func (a *ToolApproval) gatedIn(rt *Runtime, name string) bool {
	return a.gated(name) || (a.mode(rt) == protocol.ApprovalAlwaysAsk && name != ClarificationTool)
}

func (a *ToolApproval) mode(rt *Runtime) string {
	if m := rt.Config.ToolApprovalMode; m != "" {
		return m
	}
	return a.Mode
}

// active reports whether gating applies to this run.
func (a *ToolApproval) active(rt *Runtime) bool { return a.mode(rt) != protocol.ApprovalAlwaysTrust }

// asks reports whether this chain asks a person (a lead agent) rather
// than hiding the gated tools (a subagent).
func (a *ToolApproval) asks() bool { return a.kind != KindSubagent }

// EventApprovalRequested is emitted when a run stops for decisions.
const EventApprovalRequested = protocol.EventApprovalRequested

// AfterModel stops the run before gated calls run.
func (a *ToolApproval) AfterModel(ctx context.Context, rt *Runtime, st *state.State) (Result, error) {
	if !a.active(rt) || !a.asks() {
		return Result{}, nil
	}
	i := LastAssistant(st)
	if i < 0 || len(st.Messages[i].ToolCalls) == 0 {
		return Result{}, nil
	}
	m := st.Messages[i]
	answered := make(map[string]bool)
	for _, x := range st.Messages[i+1:] {
		if x.Role != model.RoleTool {
			return Result{}, nil // not a fresh response
		}
		answered[x.ToolCallID] = true
	}
	repeats, stop := a.repeated(rt, st, i, answered)
	if stop != nil {
		return *stop, nil
	}
	var reqs []protocol.ActionRequest
	for _, c := range m.ToolCalls {
		if a.gatedIn(rt, c.Name) && !answered[c.ID] {
			reqs = append(reqs, protocol.ActionRequest{
				ToolCallID:  c.ID,
				Name:        c.Name,
				Arguments:   c.Arguments,
				Description: fmt.Sprintf("%s needs your approval before it runs.", c.Name),
			})
		}
	}
	if len(reqs) == 0 {
		return Result{Update: state.Update{Messages: repeats}}, nil
	}
	intr := &protocol.Interrupt{
		Kind:             protocol.InterruptApproval,
		RunID:            rt.RunID,
		MessageID:        m.ID,
		ActionRequests:   reqs,
		AllowedDecisions: a.Decisions,
	}
	u, err := state.SetValue(InterruptValue, intr)
	if err != nil {
		return Result{}, err
	}
	if rt.Emit != nil {
		rt.Emit(EventApprovalRequested, intr)
	}
	u.Messages = repeats
	return Result{Update: u, Interrupt: intr}, nil
}

// repeated answers the calls of the response at index i that a person
// rejected earlier in this run (marking them answered), or returns the
// result that ends the run when the repeats went past the cap.
func (a *ToolApproval) repeated(rt *Runtime, st *state.State, i int, answered map[string]bool) ([]model.Message, *Result) {
	rejected := map[string]bool{}
	sent := 0
	for _, m := range st.Messages {
		if m.Role != model.RoleTool || m.Meta["run_id"] != rt.RunID {
			continue
		}
		if k, ok := m.Meta[MetaRejectedCall].(string); ok {
			rejected[k] = true
		}
		if m.Meta[MetaRejectedRepeat] != nil {
			sent++
		}
	}
	if len(rejected) == 0 {
		return nil, nil
	}
	var out []model.Message
	for _, c := range st.Messages[i].ToolCalls {
		key := callIdentity(c.Name, c.Arguments)
		if answered[c.ID] || !rejected[key] {
			continue
		}
		answered[c.ID] = true
		out = append(out, model.Message{
			ID: "repeat_" + c.ID, Role: model.RoleTool, ToolCallID: c.ID, Name: c.Name, Status: model.ToolStatusError,
			Content: fmt.Sprintf("Not run: the person already rejected this %s call with these arguments in this run. Do not ask for it again: go on without it, or give your answer and say what you could not do.", c.Name),
			Meta:    map[string]any{"run_id": rt.RunID, MetaRejectedRepeat: key},
		})
	}
	if len(out) > 0 && sent+len(out) > a.MaxRejectedRepeats {
		res := stopWith(st, i, protocol.StopRejectedCallRepeated, fmt.Sprintf(
			"[STOPPED: rejected_call_repeated] The model kept asking for a tool call the person had rejected (more than %d times), so the run was stopped. Nothing it asked for again was run.", a.MaxRejectedRepeats))
		return nil, &res
	}
	return out, nil
}

// callIdentity is a call's tool and its arguments as canonical JSON (keys
// sorted, no spacing), so a re-issue matches however it is formatted.
func callIdentity(name, args string) string {
	var v any
	dec := json.NewDecoder(strings.NewReader(args))
	dec.UseNumber()
	if err := dec.Decode(&v); err == nil {
		if canon, err := json.Marshal(v); err == nil {
			return name + " " + string(canon)
		}
	}
	return name + " " + strings.TrimSpace(args)
}

// BeforeAgent applies a resume's decisions.
func (a *ToolApproval) BeforeAgent(ctx context.Context, rt *Runtime, st *state.State) (Result, error) {
	if rt.Resume == nil {
		return Result{}, nil
	}
	var open protocol.Interrupt
	if ok, err := st.Value(InterruptValue, &open); !ok || err != nil || open.Kind != protocol.InterruptApproval {
		return Result{}, nil
	}
	var resume protocol.Resume
	if err := json.Unmarshal(rt.Resume, &resume); err != nil {
		return Result{}, fmt.Errorf("command.resume is not a decisions object: %v", err)
	}
	if err := CheckDecisions(&open, resume.Decisions); err != nil {
		return Result{}, err
	}
	i := st.Index(open.MessageID)
	if i < 0 {
		return Result{}, fmt.Errorf("the tool calls waiting for approval are gone from the thread (message %s)", open.MessageID)
	}
	u := state.Update{Values: map[string]json.RawMessage{InterruptValue: json.RawMessage("null")}}
	// Only this interrupt's approvals are kept: earlier ones have run.
	var approved []string
	edits := map[string]json.RawMessage{}
	for k, req := range open.ActionRequests {
		d := resume.Decisions[k]
		switch d.Type {
		case protocol.DecisionApprove:
			approved = append(approved, req.ToolCallID)
		case protocol.DecisionEdit:
			approved = append(approved, req.ToolCallID)
			edits[req.ToolCallID] = d.Arguments
		case protocol.DecisionReject:
			text := fmt.Sprintf("The person reviewing this call rejected it; %s was not run. Do not call it again unless the person asks for it.", req.Name)
			if strings.TrimSpace(d.Message) != "" {
				text = fmt.Sprintf("The person reviewing this call rejected it: %s. %s was not run. Do not call it again unless the person asks for it.", strings.TrimSpace(d.Message), req.Name)
			}
			result := decisionResult(rt, req, text, model.ToolStatusError)
			result.Meta[MetaRejectedCall] = callIdentity(req.Name, req.Arguments)
			u.Messages = append(u.Messages, result)
		case protocol.DecisionRespond:
			u.Messages = append(u.Messages, decisionResult(rt, req, d.Message, model.ToolStatusSuccess))
		}
	}
	av, _ := json.Marshal(approved)
	ev, _ := json.Marshal(edits)
	u.Values[ApprovedValue], u.Values[EditsValue] = av, ev
	return Result{Update: u, Jump: JumpTools}, nil
}

func decisionResult(rt *Runtime, req protocol.ActionRequest, text, status string) model.Message {
	return model.Message{
		ID: "decision_" + req.ToolCallID, Role: model.RoleTool, ToolCallID: req.ToolCallID, Name: req.Name,
		Content: text, Status: status, Meta: map[string]any{"run_id": rt.RunID},
	}
}

// CheckDecisions validates a resume's decisions against the interrupt
// (protocol.CheckDecisions).
func CheckDecisions(open *protocol.Interrupt, decisions []protocol.Decision) error {
	return protocol.CheckDecisions(open, decisions)
}

// EditNotice starts the result of a call a person edited.
const EditNotice = "Note: the person reviewing this call changed its arguments before it ran; the result below is for their version. Do not repeat the original call."

// WrapModelCall hides gated tools from a subagent.
func (a *ToolApproval) WrapModelCall(ctx context.Context, rt *Runtime, req *ModelRequest, next ModelHandler) (*ModelResponse, error) {
	if a.asks() || !a.active(rt) {
		return next(ctx, req)
	}
	return next(ctx, a.request(req))
}

// request is the model call's request without the gated tools (built
// apart: chain.go, "Frames").
func (a *ToolApproval) request(req *ModelRequest) *ModelRequest {
	c := *req
	c.Tools = make([]model.ToolSpec, 0, len(req.Tools))
	for _, t := range req.Tools {
		if !a.gated(t.Name) {
			c.Tools = append(c.Tools, t)
		}
	}
	return &c
}

// WrapToolCall runs a gated call only if a person approved it, with their
// arguments when they edited it.
func (a *ToolApproval) WrapToolCall(ctx context.Context, rt *Runtime, call *ToolCall, next ToolHandler) (*ToolResult, error) {
	gated := a.gated(call.Call.Name)
	if a.asks() {
		gated = a.gatedIn(rt, call.Call.Name)
	}
	if !a.active(rt) || !gated {
		return next(ctx, call)
	}
	if !a.asks() {
		return &ToolResult{Message: model.Message{
			Content: fmt.Sprintf("Error: %s needs a person's approval and cannot run in a subagent. Hand the change back to the lead agent, which can ask for approval.", call.Call.Name),
			Status:  model.ToolStatusError,
		}}, nil
	}
	var approved []string
	_ = readValue(call.State, ApprovedValue, &approved)
	if !slices.Contains(approved, call.Call.ID) {
		return &ToolResult{Message: model.Message{
			Content: fmt.Sprintf("Error: %s needs a person's approval first; it was not run.", call.Call.Name),
			Status:  model.ToolStatusError,
		}}, nil
	}
	edits := map[string]json.RawMessage{}
	_ = readValue(call.State, EditsValue, &edits)
	args, edited := edits[call.Call.ID]
	if !edited {
		return next(ctx, call)
	}
	c := *call
	c.Call.Arguments = string(args)
	res, err := next(ctx, &c)
	if err != nil || res == nil {
		return res, err
	}
	out := *res
	out.Message.Content = EditNotice + "\n\n" + res.Message.Content
	return &out, nil
}

func readValue(st *state.State, name string, v any) error {
	if st == nil {
		return nil
	}
	_, err := st.Value(name, v)
	return err
}
