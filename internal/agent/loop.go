// Package agent owns the agent loop (model call, tool calls, repeat) around
// a middleware chain, and the agent profiles that decide which model,
// tools and middlewares a run gets. The loop knows safe boundaries and
// checkpoints; it does not know NATS, leases or events' subjects: the
// worker gives it a Host that persists and publishes.
package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/nats-io/nuid"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
	"github.com/natsagent/natsagent/internal/tools"
)

// ErrPreempted is the cause of a run stopped at a safe boundary because a
// steer or rollback asked for the thread.
var ErrPreempted = errors.New("run preempted by a newer run on its thread")

// MetaRunID is the message meta key naming the run that produced a
// message. Recovery uses it to tell this run's progress from history.
const MetaRunID = "run_id"

// Host persists and publishes for the loop. The worker implements it with
// leases, KV checkpoints and the events stream.
type Host interface {
	// Checkpoint persists u, the state changes since the last checkpoint.
	// The changes of a run's last step come back in Outcome.Pending
	// instead, for the host to persist with the run's end.
	Checkpoint(ctx context.Context, u state.Update) error
	// Emit publishes a run event.
	Emit(eventType string, data any)
}

// Run is one execution of the loop.
type Run struct {
	Runtime   *middleware.Runtime
	Chain     *middleware.Chain
	Model     model.Model
	ModelName string
	System    string
	// MaxSteps bounds model calls in this run (0 = unlimited).
	MaxSteps int
	// State is the thread's state; the loop updates it in place.
	State *state.State
	// Input holds the run's new messages; nil when resuming.
	Input []model.Message
	// Update is a command's change to the state, applied before the
	// before-agent hooks (messages appended, marked as this run's).
	Update state.Update
	// Goto is a command's target node: protocol.GotoTools runs the last
	// response's unanswered tool calls first; GotoModel (or "") goes on
	// with a model call.
	Goto string
	Host Host
	// ToolEnv is what tools get of the run (workdir, identity); the loop
	// adds the state and the event emitter.
	ToolEnv tools.Env
	// Preempt is done when a newer run asked for the thread: the loop
	// stops at its next safe boundary (aborting a streaming response,
	// never a tool batch).
	Preempt context.Context
	// NoImages is set when the model takes no image input: the image
	// parts of the transcript go to it as text notes naming their files
	// (Prepared.Vision false).
	NoImages bool
}

// Outcome is how a run ended.
type Outcome struct {
	// Status is the terminal status the loop decided, or "" when Stopped
	// is set.
	Status     protocol.Status
	StopReason string
	Output     *model.Message
	Error      string
	// Stopped is set when something outside the loop ended the run: the
	// context's cause (cancel, timeout, lost lease, shutdown) or
	// ErrPreempted. The worker turns it into a status.
	Stopped error
	// Interrupt is set when the run paused for a person (status
	// interrupted).
	Interrupt *protocol.Interrupt
	// Pending holds the state changes of the run's last step, not yet
	// checkpointed: the host persists them with the run's end (one write
	// fewer per run). Empty when the run stopped or failed: those paths
	// checkpoint what they have themselves.
	Pending state.Update
}

// Execute runs the loop until a final answer, a guard, an error or a stop.
func Execute(ctx context.Context, r *Run) Outcome {
	l := &loop{Run: r, rt: r.Runtime, st: r.State}
	if r.NoImages {
		// The chain sees what the loop does (view_image).
		l.rt.NoImages = true
	}
	return l.execute(ctx)
}

type loop struct {
	*Run
	rt      *middleware.Runtime
	st      *state.State
	pending state.Update
	// toolCall is the tool chain, composed at the first tool call: most
	// runs make none, and composing costs an allocation per wrapper.
	toolCall middleware.ToolHandler
	// again is set when an after-model hook sent a final answer back to
	// the model (a reminder): the next step calls the model although the
	// run's last message is an answer.
	again bool
	// images are the run's input images, read for model requests.
	images inputImages
}

// toolHandler returns the tool chain, composing it on first use.
func (l *loop) toolHandler() middleware.ToolHandler {
	if l.toolCall == nil {
		l.toolCall = l.Chain.ToolCall(l.rt, callTool)
	}
	return l.toolCall
}

// stage applies u to the state and queues it for the next checkpoint.
func (l *loop) stage(u state.Update) {
	if u.Empty() {
		return
	}
	l.st.Apply(u)
	l.pending.Merge(u)
}

// keep queues an update a hook already applied to the state.
func (l *loop) keep(u state.Update) {
	if !u.Empty() {
		l.pending.Merge(u)
	}
}

func (l *loop) flush(ctx context.Context) error {
	if l.pending.Empty() {
		return nil
	}
	if err := l.Host.Checkpoint(ctx, l.pending); err != nil {
		if errors.Is(err, ErrLeaseLost) {
			return err
		}
		return fmt.Errorf("%w: %w", ErrCheckpointFailed, err)
	}
	l.pending = state.Update{}
	return nil
}

// stopped ends the run because of ctx or a preemption, saving what was
// staged so nothing completed is lost (a steered run's input stays in the
// thread).
func (l *loop) stopped(ctx context.Context, cause error) Outcome {
	if !errors.Is(cause, ErrLeaseLost) {
		saveCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := l.flush(saveCtx); err != nil {
			l.rt.Logger.Warn("checkpoint on stop failed", zap.Error(err))
		}
	}
	return Outcome{Stopped: cause}
}

// abandonInterrupt settles an interrupt the thread waited for when new
// input arrives instead of a resume: tool calls still waiting for a
// decision are answered as not run, so the transcript stays valid, and the
// thread no longer waits.
func (l *loop) abandonInterrupt() {
	var open protocol.Interrupt
	if ok, _ := l.st.Value(middleware.InterruptValue, &open); !ok {
		return
	}
	u := state.Update{Values: map[string]json.RawMessage{middleware.InterruptValue: json.RawMessage("null")}}
	if i := l.st.Index(open.MessageID); i >= 0 {
		m := l.st.Messages[i]
		for _, c := range l.unanswered(&m) {
			u.Messages = append(u.Messages, l.mark(model.Message{
				ID: newID("msg"), Role: model.RoleTool, ToolCallID: c.ID, Name: c.Name, Status: model.ToolStatusError,
				Content: "Not run: the person sent a new message instead of deciding on this call.",
			}))
		}
	}
	l.stage(u)
}

// paused ends the run for a person: what it staged (the response whose
// calls wait, the interrupt) is persisted with the run's end.
func (l *loop) paused(intr *protocol.Interrupt) Outcome {
	if intr.RunID == "" {
		intr.RunID = l.rt.RunID
	}
	out := Outcome{Status: protocol.StatusInterrupted, Interrupt: intr, Pending: l.pending}
	l.pending = state.Update{}
	return out
}

// Fence is implemented by a Host whose right to run can lapse (a worker's
// thread lease): Fenced returns ErrLeaseLost once it did. The loop asks
// before every model call and tool call, so a run that lost its lease
// starts neither, even when the signal that stops it is still on its way
// (a process resumed after a pause runs its goroutines in any order).
//
// Fenced may wait: a host whose right is in doubt (a lease renewal that
// is late) holds the call until it knows, or ctx ends.
type Fence interface {
	Fenced(ctx context.Context) error
}

// fenced is the host's Fence answer, nil for a host without one.
func (l *loop) fenced(ctx context.Context) error {
	if f, ok := l.Host.(Fence); ok {
		return f.Fenced(ctx)
	}
	return nil
}

// ErrLeaseLost is the cause of a run whose worker lost the thread's lease:
// another worker owns the run now, so this one writes nothing more.
var ErrLeaseLost = errors.New("lease on the thread was lost")

// ErrCheckpointFailed is the cause of a run whose progress could not be
// saved (the checkpoint bucket did not take the write, as during a node
// loss). Nothing is wrong with the run itself, so it does not end: the
// host hands it back, and the next attempt continues from the last
// checkpoint that was saved.
var ErrCheckpointFailed = errors.New("the run's progress could not be saved")

func (l *loop) failed(ctx context.Context, err error) Outcome {
	if cause := stopCause(ctx, l.Preempt); cause != nil {
		return l.stopped(ctx, cause)
	}
	if errors.Is(err, ErrLeaseLost) {
		return Outcome{Stopped: ErrLeaseLost}
	}
	if errors.Is(err, ErrCheckpointFailed) {
		return Outcome{Stopped: err}
	}
	saveCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if ferr := l.flush(saveCtx); ferr != nil {
		// The failure is not recorded over progress that was not saved:
		// the next attempt redoes the step from the last checkpoint.
		return Outcome{Stopped: ferr}
	}
	return Outcome{Status: protocol.StatusError, Error: err.Error()}
}

// stopCause returns why the run must stop now, or nil.
func stopCause(ctx, preempt context.Context) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	if preempt != nil && preempt.Err() != nil {
		return ErrPreempted
	}
	return nil
}

// execute runs the whole loop. It and the functions it calls while the
// model answers (agentLoop, modelStep, callChain and the chain) are kept
// to small frames, their work done in helpers that have returned by then:
// a run spends most of its life waiting there, and its goroutine's stack
// is sized by the deepest point it reached (operations.md, "Memory").
func (l *loop) execute(ctx context.Context) Outcome {
	l.stageInput()
	out, done := l.agentLoop(ctx)
	if !done {
		return out
	}
	return l.finish(ctx, out)
}

// stageInput stages a command's update and the run's input, marked as
// this run's.
func (l *loop) stageInput() {
	if len(l.Input) > 0 || (l.rt.Resume == nil && l.Goto != protocol.GotoTools && (!l.Update.Empty() || l.Goto != "")) {
		// New input, or a command that is no resume: the waiting
		// interrupt is settled as not answered.
		l.abandonInterrupt()
	}
	if !l.Update.Empty() {
		u := l.Update
		msgs := make([]model.Message, len(u.Messages))
		for i, m := range u.Messages {
			m = m.Clone()
			if m.ID == "" {
				m.ID = newID("msg")
			}
			msgs[i] = l.mark(m)
		}
		u.Messages = msgs
		l.stage(u)
	}
	if len(l.Input) > 0 {
		in := make([]model.Message, len(l.Input))
		for i, m := range l.Input {
			m = m.Clone()
			if m.ID == "" {
				m.ID = newID("msg")
			}
			in[i] = l.mark(m)
		}
		l.stage(state.Update{Messages: in})
	}
}

// finish runs the after-agent hooks of a run that ended on its own.
func (l *loop) finish(ctx context.Context, out Outcome) Outcome {
	res, err := l.Chain.RunHooks(ctx, middleware.HookAfterAgent, l.rt, l.st)
	l.keep(res.Update)
	if err != nil {
		return l.failed(ctx, err)
	}
	// The last changes are not checkpointed here: the host persists them
	// together with the run's end, which saves a write per run.
	out.Pending = l.pending
	l.pending = state.Update{}
	if out.Status == protocol.StatusSuccess || out.Status == protocol.StatusIncomplete {
		out.Output = l.lastAssistant()
	}
	return out
}

// agentLoop runs before-agent hooks and the model/tool loop. done is false
// when the run stopped and after-agent hooks must not run. Each step's
// work is in beforeStep and afterStep, so only the model call's own
// frames stay on the stack while the model answers.
func (l *loop) agentLoop(ctx context.Context) (out Outcome, done bool) {
	modelCall, out, done, stop := l.begin(ctx)
	if stop {
		return out, done
	}
	jumps := 0
	for {
		var req *middleware.ModelRequest
		if req, out, done, stop = l.beforeStep(ctx, &jumps); stop {
			return out, done
		}
		if req == nil {
			continue
		}
		msgID := newID("msg")
		l.rt.Step++
		resp, usage, err := l.modelStep(ctx, modelCall, msgID, req)
		l.again = false
		if out, done, stop = l.afterStep(ctx, msgID, resp, usage, err); stop {
			return out, done
		}
		jumps = 0
	}
}

// begin runs the before-agent hooks and what a command asks for before
// the first model call, and composes the model call chain. stop is set
// when the run ends here (done as for agentLoop).
func (l *loop) begin(ctx context.Context) (modelCall middleware.ModelHandler, out Outcome, done, stop bool) {
	res, err := l.Chain.RunHooks(ctx, middleware.HookBeforeAgent, l.rt, l.st)
	l.keep(res.Update)
	if err != nil {
		return nil, l.failed(ctx, err), false, true
	}
	if res.Interrupt != nil {
		return nil, l.paused(res.Interrupt), false, true
	}
	if l.rt.Resume != nil {
		var open protocol.Interrupt
		if ok, _ := l.st.Value(middleware.InterruptValue, &open); ok {
			return nil, l.failed(ctx, fmt.Errorf("the resume did not answer the %s the thread waits for: no middleware of this agent handles it", open.Kind)), false, true
		}
	}
	modelCall = l.Chain.ModelCall(l.rt, l.callModel)
	jump := res.Jump
	if jump == middleware.JumpNone && l.Goto == protocol.GotoTools {
		jump = middleware.JumpTools
	}
	switch jump {
	case middleware.JumpEnd:
		return nil, ended(res.StopReason), true, true
	case middleware.JumpTools:
		// A resumed approval: the calls a person let through run now.
		if i := middleware.LastAssistant(l.st); i >= 0 {
			last := l.st.Messages[i]
			if calls := l.unanswered(&last); len(calls) > 0 {
				if out, stop := l.runTools(ctx, l.toolHandler(), calls); stop {
					return nil, out, false, true
				}
			}
		}
	}
	return modelCall, Outcome{}, false, false
}

// beforeStep does what comes before a model call: it returns the call's
// request, or nil to go round the loop again (tool calls recovered, a
// hook sent the run back to the model); stop is set when the run ends.
func (l *loop) beforeStep(ctx context.Context, jumps *int) (req *middleware.ModelRequest, out Outcome, done, stop bool) {
	// Recovery: a redelivered run continues where its last checkpoint
	// left it. Tool calls this run asked for and that have no result
	// yet run now; a final answer already given ends the run.
	if last := l.lastOwn(); last != nil && last.Role == model.RoleAssistant {
		if calls := l.unanswered(last); len(calls) > 0 {
			if out, stop := l.runTools(ctx, l.toolHandler(), calls); stop {
				return nil, out, false, true
			}
			return nil, Outcome{}, false, false
		}
		if len(last.ToolCalls) == 0 && l.isLast(last.ID) && !l.again && last.Meta[middleware.MetaSentBack] == nil {
			// A guard's note ends the run as the guard did.
			reason, _ := last.Meta[middleware.MetaStopNote].(string)
			return nil, ended(reason), true, true
		}
	}

	// Safe boundary before a model call.
	if cause := stopCause(ctx, l.Preempt); cause != nil {
		return nil, l.stopped(ctx, cause), false, true
	}
	if l.MaxSteps > 0 && l.rt.Step >= l.MaxSteps {
		// The last step went back to the model (a hook asked for another
		// call): the run ends on a note that says it was cut, so its
		// output is never a stale answer or a tool call's message.
		l.stage(state.Update{Messages: []model.Message{l.mark(l.maxStepsNote())}})
		return nil, ended(protocol.StopMaxSteps), true, true
	}
	res, err := l.Chain.RunHooks(ctx, middleware.HookBeforeModel, l.rt, l.st)
	l.keep(res.Update)
	if err != nil {
		return nil, l.failed(ctx, err), false, true
	}
	if res.Interrupt != nil {
		return nil, l.paused(res.Interrupt), false, true
	}
	switch res.Jump {
	case middleware.JumpEnd:
		return nil, ended(res.StopReason), true, true
	case middleware.JumpModel:
		if *jumps++; *jumps > 100 {
			return nil, l.failed(ctx, errors.New("middleware sent the run back to the model 100 times without a model call")), false, true
		}
		return nil, Outcome{}, false, false
	}
	return &middleware.ModelRequest{
		System: l.System,
		// The state's own messages, capped so that an append by a
		// wrapper copies instead of writing into state: no copy per
		// call (see ModelRequest.Messages).
		Messages:  l.st.Messages[:len(l.st.Messages):len(l.st.Messages)],
		Tools:     l.rt.Tools.Specs(),
		Model:     l.Model,
		ModelName: l.ModelName,
		State:     l.st,
	}, Outcome{}, false, false
}

// afterStep takes a model call's result into the state, runs the
// after-model hooks and the tool calls asked for; stop is set when the
// run ends (done as for agentLoop), else the loop goes on.
func (l *loop) afterStep(ctx context.Context, msgID string, resp *middleware.ModelResponse, usage middleware.Usage, err error) (out Outcome, done, stop bool) {
	if err != nil {
		return l.failed(ctx, err), false, true
	}
	if resp == nil || resp.Response == nil {
		return l.failed(ctx, errors.New("model call returned no response")), false, true
	}
	msg := resp.Response.Message.Clone()
	msg.Role = model.RoleAssistant
	msg.ID = msgID
	if msg.Meta == nil {
		msg.Meta = map[string]any{}
	}
	if resp.Response.FinishReason != "" {
		msg.Meta["finish_reason"] = resp.Response.FinishReason
	}
	middleware.SetUsage(&msg, usage)
	msg = l.mark(msg)
	l.stage(resp.Update)
	l.stage(state.Update{Messages: []model.Message{msg}})

	res, err := l.Chain.RunHooks(ctx, middleware.HookAfterModel, l.rt, l.st)
	l.keep(res.Update)
	if err != nil {
		return l.failed(ctx, err), false, true
	}
	if res.Interrupt != nil {
		if final := l.message(msgID); final != nil {
			l.Host.Emit(protocol.EventMessageCompleted, middleware.CompletedMessage(final, usage, l.rt.Step))
		}
		return l.paused(res.Interrupt), false, true
	}
	final := l.message(msgID)
	if res.Jump == middleware.JumpNone && final != nil && len(final.ToolCalls) > 0 && l.MaxSteps > 0 && l.rt.Step >= l.MaxSteps {
		// The last step the run may take asked for tools: nothing could
		// read their results, so they are not run. The calls are
		// stripped with a note (invariant 2) and the run ends cut.
		stripped := middleware.StripToolCalls(*final, protocol.StopMaxSteps, l.maxStepsNote().Content)
		l.stage(state.Update{Messages: []model.Message{stripped}})
		final = l.message(msgID)
		res.Jump, res.StopReason = middleware.JumpEnd, protocol.StopMaxSteps
	}
	// Published after the after-model hooks, so a client sees the
	// message as it is stored: without tool calls a guard stripped.
	if final != nil {
		l.Host.Emit(protocol.EventMessageCompleted, middleware.CompletedMessage(final, usage, l.rt.Step))
	}
	switch {
	case res.Jump == middleware.JumpEnd:
		return ended(res.StopReason), true, true
	case res.Jump != middleware.JumpModel && (final == nil || len(final.ToolCalls) == 0):
		// A final answer: its checkpoint goes with the run's end.
		return Outcome{Status: protocol.StatusSuccess}, true, true
	}
	if res.Jump == middleware.JumpModel && final != nil && len(final.ToolCalls) == 0 {
		// Saved with the step: a redelivery before the next model call
		// makes that call instead of ending on this answer.
		sent := final.Clone()
		if sent.Meta == nil {
			sent.Meta = map[string]any{}
		}
		sent.Meta[middleware.MetaSentBack] = true
		l.stage(state.Update{Messages: []model.Message{sent}})
	}
	if err := l.flush(ctx); err != nil {
		return l.failed(ctx, err), false, true
	}
	if res.Jump == middleware.JumpModel {
		l.again = true
		return Outcome{}, false, false
	}
	if out, stop := l.runTools(ctx, l.toolHandler(), l.unanswered(final)); stop {
		return out, false, true
	}
	return Outcome{}, false, false
}

// ended is the outcome of a run that ended on its own: success, or
// incomplete when a guard cut it (stopReason set).
func ended(stopReason string) Outcome {
	if stopReason == "" {
		return Outcome{Status: protocol.StatusSuccess}
	}
	return Outcome{Status: protocol.StatusIncomplete, StopReason: stopReason}
}

// maxStepsNote is the assistant message that ends a run cut by max_steps.
func (l *loop) maxStepsNote() model.Message {
	return model.Message{
		ID: newID("msg"), Role: model.RoleAssistant,
		Content: fmt.Sprintf("[STOPPED: max_steps] The run reached its limit of %d model calls before the agent finished; the answer is incomplete. Send another message to continue.", l.MaxSteps),
		Meta:    map[string]any{middleware.MetaStopNote: protocol.StopMaxSteps, "finish_reason": model.FinishStop},
	}
}

// callModel is the innermost model handler: it calls the provider and
// streams deltas as events.
func (l *loop) callModel(ctx context.Context, req *middleware.ModelRequest) (*middleware.ModelResponse, error) {
	// The transcript goes to the provider as it is (providers send only
	// the wire fields, never Meta or Status), copied only when the
	// request has a dynamic context, which goes last, after the history,
	// so the prompt's prefix stays stable (middleware/promptcontext.go).
	req = middleware.Sent(req)
	middleware.RecordSent(ctx, req)
	var msgs []model.Message
	if l.NoImages {
		msgs = imageNotes(req.Messages)
	} else {
		msgs = l.images.resolve(ctx, l.rt.Files, req.Messages)
	}
	mreq := &model.Request{Model: req.ModelName, System: req.System, Messages: msgs, Tools: req.Tools}
	msgID := middleware.MessageID(ctx)
	if err := l.fenced(ctx); err != nil {
		return nil, err
	}
	start := time.Now()
	resp, err := req.Model.Generate(ctx, mreq, func(d model.Delta) {
		if d.Content != "" {
			l.Host.Emit(protocol.EventMessageDelta, protocol.DeltaData{MessageID: msgID, Delta: d.Content})
		}
	})
	l.observeModelCall(ctx, req, start, err)
	if err != nil {
		if cause := context.Cause(ctx); cause != nil && ctx.Err() != nil {
			return nil, fmt.Errorf("model call stopped: %w", cause)
		}
		return nil, err
	}
	return &middleware.ModelResponse{Response: resp}, nil
}

// callChain runs the model call chain under a context a steer cancels: a
// steer aborts a streaming response (nothing was executed yet, so the
// partial message is dropped) and any retry backoff around it.
func (l *loop) callChain(ctx context.Context, chain middleware.ModelHandler, msgID string, req *middleware.ModelRequest) (*middleware.ModelResponse, error) {
	callCtx, cancel := context.WithCancelCause(middleware.WithMessageID(ctx, msgID))
	defer cancel(nil)
	if l.Preempt != nil {
		stop := context.AfterFunc(l.Preempt, func() { cancel(ErrPreempted) })
		defer stop()
	}
	return chain(callCtx, req)
}

// runTools executes one batch of tool calls concurrently and stages the
// results in call order. stop is true when the run must end here.
func (l *loop) runTools(ctx context.Context, handler middleware.ToolHandler, calls []model.ToolCall) (Outcome, bool) {
	results := make([]*middleware.ToolResult, len(calls))
	errs := make([]error, len(calls))
	env := l.ToolEnv
	env.Tenant, env.Thread, env.Run, env.State, env.Emit = l.rt.Tenant, l.rt.ThreadID, l.rt.RunID, l.st, l.Host.Emit
	var wg sync.WaitGroup
	for i, c := range calls {
		l.Host.Emit(protocol.EventToolStarted, protocol.ToolEventData{ToolCallID: c.ID, Name: c.Name, Arguments: c.Arguments})
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A panic in a tool wrapper must not take the worker down: this
			// goroutine is outside the job's own recover.
			defer func() {
				if p := recover(); p != nil {
					errs[i] = &middleware.PanicError{What: "tool call " + c.Name, Value: p, Stack: debug.Stack()}
				}
			}()
			if err := l.fenced(ctx); err != nil {
				errs[i] = err
				return
			}
			results[i], errs[i] = toolStep(ctx, handler, &middleware.ToolCall{Call: c, Tool: l.rt.Tools.Get(c.Name), State: l.st, Env: &env}, l.rt.Metrics)
		}()
	}
	wg.Wait()

	cause := stopCause(ctx, nil)
	var msgs []model.Message
	var update state.Update
	var firstErr error
	var intr *protocol.Interrupt
	for i, c := range calls {
		res, err := results[i], errs[i]
		var msg model.Message
		switch {
		case err == nil && res != nil:
			msg = res.Message
			update.Merge(res.Update)
			if res.Interrupt != nil && intr == nil {
				intr = res.Interrupt
			}
		case cause != nil:
			// Cancelled mid-batch: answer the call so the transcript stays
			// valid for the next run on the thread.
			msg = model.Message{Content: fmt.Sprintf("Tool call %s was not completed: the run was stopped (%v).", c.Name, cause), Status: model.ToolStatusError}
		default:
			if err == nil {
				err = fmt.Errorf("tool %s returned no result", c.Name)
			}
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		msg.Role = model.RoleTool
		msg.ToolCallID = c.ID
		msg.Name = c.Name
		if msg.ID == "" {
			msg.ID = newID("msg")
		}
		if msg.Status == "" {
			msg.Status = model.ToolStatusSuccess
		}
		msgs = append(msgs, l.mark(msg))
		l.Host.Emit(protocol.EventToolFinished, protocol.ToolEventData{ToolCallID: c.ID, Name: c.Name, Status: msg.Status, Result: clip(msg.Content, 2000), MessageID: msg.ID})
	}
	if firstErr != nil && cause == nil {
		return l.failed(ctx, firstErr), true
	}
	l.stage(update)
	l.stage(state.Update{Messages: msgs})
	if cause != nil {
		return l.stopped(ctx, cause), true
	}
	if intr != nil {
		return l.paused(intr), true
	}
	if err := l.flush(ctx); err != nil {
		return l.failed(ctx, err), true
	}
	return Outcome{}, false
}

// callTool is the innermost tool handler: it checks the call and runs the
// tool, turning a panic into an error.
func callTool(ctx context.Context, call *middleware.ToolCall) (res *middleware.ToolResult, err error) {
	if call.Tool == nil {
		return nil, fmt.Errorf("tool %q is not available to this run", call.Call.Name)
	}
	args := json.RawMessage(call.Call.Arguments)
	if len(args) == 0 {
		args = json.RawMessage("{}")
	}
	// Refused before any tool decodes them: nesting deeper than a request
	// may have, and strings that are not UTF-8 (decoding would quietly
	// replace their bytes), with the field named so the model can fix it.
	if err := protocol.CheckJSON(args, protocol.MaxJSONDepth); err != nil {
		return nil, fmt.Errorf("arguments of %s: %v", call.Call.Name, err)
	}
	if !json.Valid(args) {
		return nil, fmt.Errorf("arguments of %s are not valid JSON: %s", call.Call.Name, clip(call.Call.Arguments, 200))
	}
	defer func() {
		if p := recover(); p != nil {
			err = &middleware.PanicError{What: "tool " + call.Call.Name, Value: p, Stack: debug.Stack()}
		}
	}()
	env := call.Env
	if env == nil {
		env = &tools.Env{}
	}
	out, err := call.Tool.Call(ctx, &tools.Call{ID: call.Call.ID, Name: call.Call.Name, Args: args, Env: env})
	if err != nil {
		return nil, err
	}
	if out == nil {
		return nil, fmt.Errorf("tool %s returned no result", call.Call.Name)
	}
	status := model.ToolStatusSuccess
	if out.Error {
		status = model.ToolStatusError
	}
	return &middleware.ToolResult{Message: model.Message{Content: out.Content, Status: status}, Update: out.Update}, nil
}

// callUsage is the usage token_usage settled for a call, else the
// provider's, else an estimate by the model's tokenizer.
func (l *loop) callUsage(req *middleware.ModelRequest, resp *middleware.ModelResponse) middleware.Usage {
	if resp.Usage != nil {
		return *resp.Usage
	}
	return middleware.CallUsage(l.rt, req, resp.Response)
}

// mark tags a message with the run that produced it.
func (l *loop) mark(m model.Message) model.Message {
	if m.Meta == nil {
		m.Meta = map[string]any{}
	}
	m.Meta[MetaRunID] = l.rt.RunID
	return m
}

// lastOwn returns the last assistant message this run produced, or nil.
// Only the tail of the transcript is read, so the cost does not grow with
// the thread's history.
func (l *loop) lastOwn() *model.Message {
	for i := len(l.st.Messages) - 1; i >= 0; i-- {
		m := &l.st.Messages[i]
		if id, _ := m.Meta[MetaRunID].(string); id != l.rt.RunID {
			return nil
		}
		if m.Role == model.RoleAssistant {
			return m
		}
	}
	return nil
}

func (l *loop) isLast(id string) bool {
	n := len(l.st.Messages)
	return n > 0 && l.st.Messages[n-1].ID == id
}

func (l *loop) message(id string) *model.Message {
	if i := l.st.Index(id); i >= 0 {
		return &l.st.Messages[i]
	}
	return nil
}

// unanswered returns the tool calls of m that have no tool message after
// it yet.
func (l *loop) unanswered(m *model.Message) []model.ToolCall {
	if len(m.ToolCalls) == 0 {
		return nil
	}
	answered := make(map[string]bool)
	for i := l.st.Index(m.ID) + 1; i > 0 && i < len(l.st.Messages); i++ {
		if x := l.st.Messages[i]; x.Role == model.RoleTool {
			answered[x.ToolCallID] = true
		}
	}
	var out []model.ToolCall
	for _, c := range m.ToolCalls {
		if !answered[c.ID] {
			out = append(out, c)
		}
	}
	return out
}

func (l *loop) lastAssistant() *model.Message {
	for i := len(l.st.Messages) - 1; i >= 0; i-- {
		if l.st.Messages[i].Role == model.RoleAssistant {
			m := l.st.Messages[i].Clone()
			return &m
		}
	}
	return nil
}

func newID(prefix string) string { return prefix + "_" + nuid.Next() }

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
