package middleware

// Subagents. Boundary: prompt and tools offered (request only), tool call.
// In a lead agent's chain it offers the delegation tools (task,
// subagent_start, subagent_status, subagent_cancel, subagent_await) and a
// system prompt section naming the subagents the profile may start, and
// answers their calls through the run's Delegator: each child is an
// ordinary run on the queue, started with ids derived from the calling
// tool call (protocol.SubagentThreadID), so a retried or recovered call
// finds the same child. In a subagent's chain it offers none of them, nor
// ask_clarification, and refuses an explicit call to any of them (no
// nesting; a subagent never asks a person). State: reads the transcript
// (which run owns a call), writes nothing; a child's ids are derivable from
// the calls alone (DelegatedRuns), which is what the worker cancels and
// counts when the lead run ends. Emits subagent.started, subagent.progress
// (the child's tool calls and messages, while a tool waits for it) and
// subagent.finished, with the child's run and thread ids.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
	"github.com/natsagent/natsagent/internal/tools"
)

// Delegation tools of a lead agent.
const (
	TaskTool           = "task"
	SubagentStartTool  = "subagent_start"
	SubagentStatusTool = "subagent_status"
	SubagentCancelTool = "subagent_cancel"
	SubagentAwaitTool  = "subagent_await"
)

// SubagentTools lists the delegation tools.
var SubagentTools = []string{TaskTool, SubagentStartTool, SubagentStatusTool, SubagentCancelTool, SubagentAwaitTool}

// isDelegation reports whether a tool starts a child run.
func isDelegation(name string) bool { return name == TaskTool || name == SubagentStartTool }

// SubagentInfo is a subagent a lead profile may start.
type SubagentInfo struct {
	Name        string
	Description string
}

// Delegator starts and follows subagent runs for a lead run. The worker
// gives every run one (Runtime.Subagents); its errors are
// *protocol.SubagentError where the caller can act on them (busy,
// unknown run, invalid request).
type Delegator interface {
	StartSubagent(ctx context.Context, tenant string, req *protocol.SubagentStart) (*protocol.SubagentStarted, error)
	SubagentStatus(ctx context.Context, tenant string, q protocol.SubagentQuery) (*protocol.SubagentStatus, error)
	CancelSubagent(ctx context.Context, tenant string, q protocol.SubagentQuery) (*protocol.SubagentStatus, error)
	// AwaitSubagent returns when the child ended (its status with the
	// result) or timeout passed (TimedOut set), or with ctx's error.
	// progress, when not nil, gets each step of the child as it happens.
	AwaitSubagent(ctx context.Context, tenant string, q protocol.SubagentQuery, timeout time.Duration, progress func(line string)) (*protocol.SubagentStatus, error)
}

// ErrHandOff is the cause of Runtime.Preempt when the worker hands the
// run to another worker (shutdown): the run goes on elsewhere, so a tool
// waiting for a child leaves the child running.
var ErrHandOff = errors.New("run handed to another worker")

// Subagents offers and answers the delegation tools.
type Subagents struct {
	// TaskTimeoutSeconds bounds how long task waits for its child before
	// answering that it still runs (default 1800).
	TaskTimeoutSeconds int `json:"task_timeout_seconds"`
	// AwaitTimeoutSeconds is subagent_await's longest wait (default 600);
	// the model may ask for less.
	AwaitTimeoutSeconds int `json:"await_timeout_seconds"`

	kind   string
	agents []SubagentInfo
	// tools and prompt are what a lead is offered, built once.
	tools  []model.ToolSpec
	prompt string
}

// NewSubagents checks the settings for a chain of env's kind; a lead gets
// env.Subagents.
func NewSubagents(s Subagents, env Env) (*Subagents, error) {
	if s.TaskTimeoutSeconds == 0 {
		s.TaskTimeoutSeconds = 1800
	}
	if s.AwaitTimeoutSeconds == 0 {
		s.AwaitTimeoutSeconds = 600
	}
	if s.TaskTimeoutSeconds < 1 || s.AwaitTimeoutSeconds < 1 {
		return nil, fmt.Errorf("task_timeout_seconds and await_timeout_seconds must be positive")
	}
	s.kind = env.Kind
	if s.kind != KindSubagent && len(env.Subagents) > 0 {
		s.agents = slices.Clone(env.Subagents)
		s.tools, s.prompt = s.specs(), s.guide()
	}
	return &s, nil
}

// Name implements Middleware.
func (*Subagents) Name() string { return "subagents" }

// hiddenInSubagent are the tools a subagent never gets: no nesting, and
// nothing that needs a person.
func hiddenInSubagent(name string) bool {
	return slices.Contains(SubagentTools, name) || name == ClarificationTool
}

func (s *Subagents) offers(rt *Runtime) bool {
	return s.kind != KindSubagent && len(s.agents) > 0 && rt.Subagents != nil
}

// WrapModelCall offers the tools to a lead, hides them from a subagent.
func (s *Subagents) WrapModelCall(ctx context.Context, rt *Runtime, req *ModelRequest, next ModelHandler) (*ModelResponse, error) {
	if SwitchedOff(rt.Config.Subagents) {
		return next(ctx, req) // subagents off for this run: no tools, no prompt
	}
	return next(ctx, s.request(rt, req))
}

// request is the model call's request with the delegation tools and
// prompt (built apart: chain.go, "Frames").
func (s *Subagents) request(rt *Runtime, req *ModelRequest) *ModelRequest {
	if s.kind == KindSubagent {
		if !slices.ContainsFunc(req.Tools, func(t model.ToolSpec) bool { return hiddenInSubagent(t.Name) }) {
			return req
		}
		c := *req
		c.Tools = slices.DeleteFunc(slices.Clone(req.Tools), func(t model.ToolSpec) bool { return hiddenInSubagent(t.Name) })
		return &c
	}
	if !s.offers(rt) {
		return req
	}
	c := *req
	offered := func(spec model.ToolSpec) bool {
		return slices.ContainsFunc(req.Tools, func(t model.ToolSpec) bool { return t.Name == spec.Name })
	}
	add := s.tools
	if slices.ContainsFunc(add, offered) {
		add = slices.DeleteFunc(slices.Clone(add), offered)
	}
	c.Tools = withTools(req.Tools, add...)
	c.appendShared(s.prompt)
	if req.State != nil {
		return withContextSection(&c, ledgerSection(RunningSubagents(rt, req.State)))
	}
	return &c
}

func (s *Subagents) guide() string {
	var b strings.Builder
	b.WriteString("You can delegate work to subagents. Each runs as a separate run with its own context and shares your files; it sees only the task you write (not this conversation), so put everything it needs in the task, and it returns only its final answer. Subagents you can start:\n")
	for _, a := range s.agents {
		desc := oneLine(a.Description)
		if desc == "" {
			desc = "(no description)"
		}
		fmt.Fprintf(&b, "- %s: %s\n", a.Name, desc)
	}
	b.WriteString("Use task to delegate and wait for the answer; put independent tasks in one response so they run in parallel (the number per response and per run is limited). subagent_start starts one without waiting: follow it with subagent_status or subagent_await, and await every subagent you started before your final answer, since subagents still running when your run ends are cancelled.")
	return b.String()
}

func (s *Subagents) names() []string {
	out := make([]string, len(s.agents))
	for i, a := range s.agents {
		out[i] = a.Name
	}
	return out
}

func (s *Subagents) specs() []model.ToolSpec {
	// The subagents and the wait bound are known only now: the enum
	// and the maximum are set on the generated schemas.
	ds := tools.Schema[delegation]()
	ds.Properties["subagent_type"].Enum = nil
	for _, n := range s.names() {
		ds.Properties["subagent_type"].Enum = append(ds.Properties["subagent_type"].Enum, n)
	}
	delegate := tools.MarshalSchema(ds)
	byRun := tools.SchemaJSON[subagentRunArgs]()
	as := tools.Schema[subagentAwaitArgs]()
	limit := float64(s.AwaitTimeoutSeconds)
	as.Properties["timeout_seconds"].Maximum = &limit
	as.Properties["timeout_seconds"].Description = fmt.Sprintf("How long to wait at most (default and maximum %d).", s.AwaitTimeoutSeconds)
	await := tools.MarshalSchema(as)
	return []model.ToolSpec{
		{Name: TaskTool, Description: "Delegate a task to a subagent and wait for its final answer, which becomes this call's result. Several task calls in one response run in parallel.", Parameters: delegate},
		{Name: SubagentStartTool, Description: "Start a subagent on a task without waiting; returns its run_id and thread_id. Check on it with subagent_status, collect its answer with subagent_await.", Parameters: delegate},
		{Name: SubagentStatusTool, Description: "Status of a subagent you started in this run, with its last few steps and its answer once finished.", Parameters: byRun},
		{Name: SubagentCancelTool, Description: "Cancel a subagent you started in this run.", Parameters: byRun},
		{Name: SubagentAwaitTool, Description: "Wait for a subagent you started in this run to finish and return its answer, or say it still runs when the timeout passes.", Parameters: await},
	}
}

// WrapToolCall answers the delegation tools (lead) or refuses them
// (subagent).
func (s *Subagents) WrapToolCall(ctx context.Context, rt *Runtime, call *ToolCall, next ToolHandler) (*ToolResult, error) {
	name := call.Call.Name
	if s.kind == KindSubagent {
		if !hiddenInSubagent(name) {
			return next(ctx, call)
		}
		what := "start other subagents"
		if name == ClarificationTool {
			what = "ask the person a question"
		}
		return s.blocked(fmt.Sprintf("Error: %s is not available to a subagent: a subagent cannot %s. Finish the task with what you have, and say in your final answer what is missing or what the lead agent should decide.", name, what)), nil
	}
	if !slices.Contains(SubagentTools, name) {
		return next(ctx, call)
	}
	if !s.offers(rt) {
		return s.blocked(fmt.Sprintf("Error: %s is not available: this agent has no subagents.", name)), nil
	}
	switch name {
	case TaskTool, SubagentStartTool:
		return s.delegate(ctx, rt, call, name == TaskTool)
	case SubagentStatusTool:
		q, res := s.query(rt, call)
		if res != nil {
			return res, nil
		}
		st, err := rt.Subagents.SubagentStatus(ctx, rt.Tenant, q)
		if err != nil {
			return s.failed(ctx, "read the subagent's status", err)
		}
		if st.Status.Terminal() {
			s.finished(rt, call.Call.ID, st)
		}
		return withChildUsage(jsonResult(statusView(st, "")), st), nil
	case SubagentCancelTool:
		q, res := s.query(rt, call)
		if res != nil {
			return res, nil
		}
		st, err := rt.Subagents.CancelSubagent(ctx, rt.Tenant, q)
		if err != nil {
			return s.failed(ctx, "cancel the subagent", err)
		}
		return withChildUsage(jsonResult(statusView(st, "")), st), nil
	default: // SubagentAwaitTool
		q, res := s.query(rt, call)
		if res != nil {
			return res, nil
		}
		var in subagentAwaitArgs
		_ = json.Unmarshal([]byte(call.Call.Arguments), &in)
		timeout := s.AwaitTimeoutSeconds
		if in.TimeoutSeconds > 0 && in.TimeoutSeconds < timeout {
			timeout = in.TimeoutSeconds
		}
		st, res, err := s.wait(ctx, rt, call.Call.ID, q, "", "", time.Duration(timeout)*time.Second)
		if res != nil || err != nil {
			return res, err
		}
		msg := ""
		if st.TimedOut {
			msg = fmt.Sprintf("The subagent is still running after %d s; await it again or check it with subagent_status. Do not treat its work as done.", timeout)
		}
		return withChildUsage(jsonResult(statusView(st, msg)), st), nil
	}
}

// MetaSubagentUsage is the tool-result meta holding a finished child's
// token usage ({"run_id", "input_tokens", "output_tokens"}), set on the
// result that first or again reports the child ended; the token budget
// counts each child once by its run id.
const MetaSubagentUsage = "subagent_usage"

// withChildUsage records on res the usage of a child st reports ended.
func withChildUsage(res *ToolResult, st *protocol.SubagentStatus) *ToolResult {
	if st == nil || !st.Status.Terminal() || st.Usage == nil {
		return res
	}
	if res.Message.Meta == nil {
		res.Message.Meta = map[string]any{}
	}
	res.Message.Meta[MetaSubagentUsage] = map[string]any{"run_id": st.RunID, "input_tokens": st.Usage.Input, "output_tokens": st.Usage.Output}
	return res
}

// ChildUsage sums the usage of run runID's children that its part of the
// transcript reports ended, each child once whatever the number of
// results that report it (task, then subagent_status).
func ChildUsage(st *state.State, runID string) (in, out int) {
	seen := make(map[string]bool)
	for i := len(st.Messages) - 1; i >= 0; i-- {
		m := &st.Messages[i]
		if id, _ := m.Meta["run_id"].(string); id != runID && id != "" {
			break
		}
		raw, ok := m.Meta[MetaSubagentUsage].(map[string]any)
		if !ok || m.Role != model.RoleTool {
			continue
		}
		child, _ := raw["run_id"].(string)
		if child == "" || seen[child] {
			continue
		}
		seen[child] = true
		u := usageFromMeta(raw)
		in += u.Input
		out += u.Output
	}
	return in, out
}

func (s *Subagents) blocked(text string) *ToolResult {
	return &ToolResult{Message: model.Message{Content: text, Status: model.ToolStatusError, Meta: map[string]any{MetaBlockedBy: s.Name()}}}
}

// delegation is the arguments of task and subagent_start.
// delegation is the arguments of task and subagent_start; the
// subagent_type enum is set per profile (specs).
type delegation struct {
	Description  string `json:"description" jsonschema:"The complete task for the subagent, with every fact, path and constraint it needs: it does not see this conversation."`
	SubagentType string `json:"subagent_type" jsonschema:"Which subagent runs the task."`
	ThreadID     string `json:"thread_id,omitempty" jsonschema:"Optional: the thread_id of an earlier subagent of the same type, to continue that conversation instead of starting fresh."`
}

// subagentRunArgs is the arguments of subagent_status and
// subagent_cancel.
type subagentRunArgs struct {
	RunID string `json:"run_id" jsonschema:"The subagent's run_id, as subagent_start or task returned it."`
}

// subagentAwaitArgs is the arguments of subagent_await; the maximum
// wait is set per profile (specs).
type subagentAwaitArgs struct {
	RunID          string `json:"run_id" jsonschema:"The subagent's run_id, as subagent_start returned it."`
	TimeoutSeconds int    `json:"timeout_seconds,omitempty" schema:"minimum=1" jsonschema:"How long to wait at most."`
}

func parseDelegation(args string) (delegation, error) {
	var d delegation
	if err := json.Unmarshal([]byte(args), &d); err != nil {
		return d, fmt.Errorf(`takes {"description": "...", "subagent_type": "..."}: %v`, err)
	}
	d.Description = strings.TrimSpace(d.Description)
	d.SubagentType = strings.TrimSpace(d.SubagentType)
	d.ThreadID = strings.TrimSpace(d.ThreadID)
	return d, nil
}

func (s *Subagents) delegate(ctx context.Context, rt *Runtime, call *ToolCall, wait bool) (*ToolResult, error) {
	// A call refused here started nothing: marked blocked, it counts for
	// neither the limit nor the children of the run.
	d, err := parseDelegation(call.Call.Arguments)
	if err != nil {
		return s.blocked(fmt.Sprintf("Error: %s %v", call.Call.Name, err)), nil
	}
	if !slices.Contains(s.names(), d.SubagentType) {
		return s.blocked(fmt.Sprintf("Error: there is no subagent %q; the subagents you can start are: %s.", d.SubagentType, strings.Join(s.names(), ", "))), nil
	}
	if d.Description == "" {
		return s.blocked("Error: description is empty; write the complete task for the subagent."), nil
	}
	if d.ThreadID != "" && !protocol.ValidToken(d.ThreadID) {
		return s.blocked(fmt.Sprintf("Error: thread_id %q is not a subagent thread id; leave it out to start fresh.", clipText(d.ThreadID, 40))), nil
	}
	req := &protocol.SubagentStart{
		Parent:   protocol.Parent{RunID: rt.RunID, ThreadID: rt.ThreadID, ToolCallID: call.Call.ID},
		Subagent: d.SubagentType,
		Task:     d.Description,
		ThreadID: d.ThreadID,
		// The child acts for the same person with the same approval
		// mode and tool policy; its model and limits are its profile's.
		Config:    protocol.RunConfig{UserID: rt.Config.UserID, ToolApprovalMode: rt.Config.ToolApprovalMode},
		Principal: rt.Principal,
	}
	started, err := rt.Subagents.StartSubagent(ctx, rt.Tenant, req)
	if err != nil {
		var se *protocol.SubagentError
		if errors.As(err, &se) && se.Code == protocol.CodeBusy {
			// Never a hidden queue: the model decides what to do.
			return jsonResult(map[string]any{"status": "busy", "thread_id": se.ThreadID, "active_run_id": se.ActiveRunID,
				"message": "That subagent thread is running another task. Wait for it (subagent_await), check it (subagent_status) or cancel it, then try again; or leave thread_id out to start a fresh subagent."}), nil
		}
		return s.failed(ctx, "start the subagent", err)
	}
	if rt.Emit != nil {
		rt.Emit(protocol.EventSubagentStarted, protocol.SubagentEventData{RunID: started.RunID, ThreadID: started.ThreadID,
			Subagent: started.Subagent, ToolCallID: call.Call.ID, Existing: started.Existing, Status: started.Status})
	}
	meta := map[string]any{"subagent_run_id": started.RunID, "subagent_thread_id": started.ThreadID}
	if !wait {
		status := "started"
		if started.Existing {
			status = "existing"
		}
		res := jsonResult(map[string]any{"status": status, "run_id": started.RunID, "thread_id": started.ThreadID,
			"subagent": started.Subagent, "run_status": started.Status,
			"message": "The subagent runs on its own. Collect its answer with subagent_await before your final answer."})
		res.Message.Meta = meta
		return res, nil
	}
	q := protocol.SubagentQuery{RunID: started.RunID, ParentRunID: rt.RunID}
	st, res, err := s.wait(ctx, rt, call.Call.ID, q, started.Subagent, started.ThreadID, time.Duration(s.TaskTimeoutSeconds)*time.Second)
	if res != nil || err != nil {
		if res != nil {
			res.Message.Meta = meta
		}
		return res, err
	}
	res = taskResult(st, s.TaskTimeoutSeconds)
	meta[MetaSubagentStatus] = string(st.Status)
	res.Message.Meta = meta
	withChildUsage(res, st)
	return res, nil
}

// wait awaits a child, streaming its progress as events of this run. A
// non-nil result or error ends the tool call there: the run stopped, was
// preempted, or the wait failed.
func (s *Subagents) wait(ctx context.Context, rt *Runtime, toolCallID string, q protocol.SubagentQuery, subagent, threadID string, timeout time.Duration) (*protocol.SubagentStatus, *ToolResult, error) {
	waitCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if rt.Preempt != nil {
		stop := context.AfterFunc(rt.Preempt, func() { cancel(context.Cause(rt.Preempt)) })
		defer stop()
	}
	progress := func(line string) {
		if rt.Emit != nil {
			rt.Emit(protocol.EventSubagentProgress, protocol.SubagentEventData{RunID: q.RunID, ThreadID: threadID, Subagent: subagent, ToolCallID: toolCallID, Line: line})
		}
	}
	if subagent == "" {
		// subagent_await: the ids come with the status.
		if st, err := rt.Subagents.SubagentStatus(ctx, rt.Tenant, q); err == nil {
			subagent, threadID = st.Subagent, st.ThreadID
		}
	}
	st, err := rt.Subagents.AwaitSubagent(waitCtx, rt.Tenant, q, timeout, progress)
	switch {
	case ctx.Err() != nil:
		// The run itself stopped (cancel, timeout, lost lease): the loop
		// answers the call, and the worker cancels the child.
		return nil, nil, context.Cause(ctx)
	case err != nil && waitCtx.Err() != nil:
		if errors.Is(context.Cause(waitCtx), ErrHandOff) {
			return nil, jsonResult(map[string]any{"status": "running", "run_id": q.RunID,
				"message": "This run moved to another worker while the subagent was working; the subagent goes on. Call subagent_await with this run_id to collect its answer."}), nil
		}
		res := errorResult(fmt.Sprintf("Stopped waiting for subagent run %s: a newer message preempted this run, and the subagent is cancelled with it.", q.RunID))
		return nil, res, nil
	case err != nil:
		res, err := s.failed(ctx, "wait for the subagent", err)
		return nil, res, err
	}
	if st.Status.Terminal() {
		s.finished(rt, toolCallID, st)
	}
	return st, nil, nil
}

// finished emits subagent.finished once per child and run.
func (s *Subagents) finished(rt *Runtime, toolCallID string, st *protocol.SubagentStatus) {
	if rt.Emit == nil {
		return
	}
	seen := Scratch(rt, "subagents:finished", func() *sync.Map { return &sync.Map{} })
	if _, dup := seen.LoadOrStore(st.RunID, true); dup {
		return
	}
	rt.Emit(protocol.EventSubagentFinished, protocol.SubagentEventData{RunID: st.RunID, ThreadID: st.ThreadID, Subagent: st.Subagent,
		ToolCallID: toolCallID, Status: st.Status, StopReason: st.StopReason, Error: st.Error})
}

// query reads a run_id argument; only children of this run are visible.
func (s *Subagents) query(rt *Runtime, call *ToolCall) (protocol.SubagentQuery, *ToolResult) {
	var in subagentRunArgs
	if err := json.Unmarshal([]byte(call.Call.Arguments), &in); err != nil || !protocol.ValidToken(strings.TrimSpace(in.RunID)) {
		return protocol.SubagentQuery{}, errorResult(fmt.Sprintf(`Error: %s takes {"run_id": "..."} with the run_id subagent_start or task returned.`, call.Call.Name))
	}
	return protocol.SubagentQuery{RunID: strings.TrimSpace(in.RunID), ParentRunID: rt.RunID}, nil
}

// failed turns a delegator error into a result the model can act on; a
// stop of the run passes through.
func (s *Subagents) failed(ctx context.Context, what string, err error) (*ToolResult, error) {
	if ctx.Err() != nil {
		return nil, context.Cause(ctx)
	}
	var se *protocol.SubagentError
	if errors.As(err, &se) && se.Code == protocol.CodeNotFound {
		return errorResult("Error: " + se.Message + " Only subagents started by this run can be checked, awaited or cancelled."), nil
	}
	return errorResult(fmt.Sprintf("Error: could not %s: %v", what, err)), nil
}

// taskResult is task's result: the child's answer, or why there is none.
func taskResult(st *protocol.SubagentStatus, timeout int) *ToolResult {
	head := fmt.Sprintf("[subagent %s · run %s · thread %s]", st.Subagent, st.RunID, st.ThreadID)
	if st.TimedOut {
		return &ToolResult{Message: model.Message{Status: model.ToolStatusSuccess, Content: fmt.Sprintf(
			"%s\n\nThe subagent is still running after %d s (status %s); it has not returned a final answer. Collect it later with subagent_await (run_id %s) or check it with subagent_status; do not treat the task as done.",
			head, timeout, st.Status, st.RunID)}}
	}
	answer := st.Result
	if strings.TrimSpace(answer) == "" {
		answer = "(The subagent finished without a text answer.)"
	}
	if st.Status == protocol.StatusSuccess || st.Status == protocol.StatusIncomplete {
		if st.StopReason != "" {
			head += fmt.Sprintf(" (stopped early: %s)", st.StopReason)
		}
		return &ToolResult{Message: model.Message{Status: model.ToolStatusSuccess, Content: head + "\n\n" + answer}}
	}
	text := fmt.Sprintf("%s\n\nThe subagent run ended %s", head, st.Status)
	if st.Error != "" {
		text += ": " + st.Error
	}
	text += "."
	if strings.TrimSpace(st.Result) != "" {
		text += "\n\nIts last answer:\n" + st.Result
	}
	return &ToolResult{Message: model.Message{Status: model.ToolStatusError, Content: text}}
}

// statusView is the JSON a status, cancel or await call returns.
func statusView(st *protocol.SubagentStatus, message string) map[string]any {
	v := map[string]any{"status": st.Status, "run_id": st.RunID, "thread_id": st.ThreadID, "subagent": st.Subagent}
	if st.StopReason != "" {
		v["stop_reason"] = st.StopReason
	}
	if st.Error != "" {
		v["error"] = st.Error
	}
	if len(st.Progress) > 0 {
		v["progress"] = st.Progress
	}
	if st.Status.Terminal() {
		v["result"] = st.Result
	}
	if st.TimedOut {
		v["wait_timed_out"] = true
	}
	if message != "" {
		v["message"] = message
	}
	return v
}

func jsonResult(v any) *ToolResult {
	data, _ := json.MarshalIndent(v, "", "  ")
	return &ToolResult{Message: model.Message{Content: string(data), Status: model.ToolStatusSuccess}}
}

// ChildRun is a subagent run a lead run's delegation call started, or may
// have started: its ids are derived from the call.
type ChildRun struct {
	RunID      string
	ThreadID   string
	Subagent   string
	ToolCallID string
}

// DelegatedRuns returns the children of run runID on thread, derived from
// the run's task and subagent_start calls in the transcript (calls a guard
// answered before they ran are left out). A call whose start never
// happened yields ids with no run behind them. The worker uses it when the
// run ends, to cancel children still running and add their usage.
func DelegatedRuns(st *state.State, thread, runID string) []ChildRun {
	blocked := make(map[string]bool)
	var out []ChildRun
	seen := make(map[string]bool)
	for i := len(st.Messages) - 1; i >= 0; i-- {
		m := st.Messages[i]
		if id, _ := m.Meta["run_id"].(string); id != runID && id != "" {
			break // an earlier run's turn
		}
		if m.Role == model.RoleTool && m.Meta[MetaBlockedBy] != nil {
			blocked[m.ToolCallID] = true
		}
		if m.Role != model.RoleAssistant {
			continue
		}
		for _, c := range m.ToolCalls {
			if !isDelegation(c.Name) || blocked[c.ID] || c.ID == "" {
				continue
			}
			d, err := parseDelegation(c.Arguments)
			if err != nil || !protocol.ValidToken(d.SubagentType) {
				continue
			}
			child := d.ThreadID
			if child == "" {
				child = protocol.SubagentThreadID(thread, runID, d.SubagentType, c.ID)
			} else if !protocol.ValidToken(child) {
				continue
			}
			run := protocol.SubagentRunID(child, runID, c.ID)
			if seen[run] {
				continue
			}
			seen[run] = true
			out = append(out, ChildRun{RunID: run, ThreadID: child, Subagent: d.SubagentType, ToolCallID: c.ID})
		}
	}
	return out
}

// ProvidedTools implements ToolProvider.
func (*Subagents) ProvidedTools() []string { return SubagentTools }
