// Package natsagent runs LLM agents as jobs on NATS JetStream, from Go.
//
// A service that starts runs embeds a [Client]: it submits a run, follows
// its events, waits for it, cancels, steers or resumes it, and reads
// threads, their state, files and token usage. The client speaks the wire
// protocol only (docs/protocol.md): subjects, streams and read-only KV.
//
// A program that executes runs embeds a [Worker]: agents come from the
// YAML configuration, from Go ([Agent]), or both; Go code adds typed tools
// ([NewTool]), middleware (the hook interfaces: [BeforeModel],
// [WrapModelCall], ...) and model providers ([Model]). [RegisterTool],
// [RegisterMiddleware] and [RegisterModel] name such parts so a YAML
// configuration can use them.
//
// Package natsagenttest starts an embedded deployment with a scripted
// model for tests of code that uses this package.
package natsagent

import (
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
)

// Messages and model calls.
type (
	// Message is one message of a thread: user, assistant, tool or system.
	Message = model.Message
	// ToolCallRequest is a tool call an assistant message asks for.
	ToolCallRequest = model.ToolCall
	// ToolSpec is a tool as a model sees it: name, description and the
	// JSON schema of its arguments.
	ToolSpec = model.ToolSpec
	// Model is a model provider: the OpenAI-compatible client, the
	// offline demo model, or one of yours.
	Model = model.Model
	// ModelFunc adapts a function to [Model].
	ModelFunc = model.Func
	// GenerateRequest is one call to a [Model].
	GenerateRequest = model.Request
	// GenerateResponse is a [Model]'s answer.
	GenerateResponse = model.Response
	// Delta is a piece of a streamed answer.
	Delta = model.Delta
	// Usage counts a model call's tokens.
	Usage = model.Usage
)

// Message roles, tool result statuses and finish reasons.
const (
	RoleSystem    = model.RoleSystem
	RoleUser      = model.RoleUser
	RoleAssistant = model.RoleAssistant
	RoleTool      = model.RoleTool

	FinishStop      = model.FinishStop
	FinishToolCalls = model.FinishToolCalls
)

// Middleware: a middleware has a unique name and implements one or more
// of the hook interfaces. Before-hooks run in chain order, after-hooks in
// reverse, wrappers are nested with the first outermost (docs/middleware.md).
type (
	// Middleware is anything with a name that implements hooks.
	Middleware = middleware.Middleware
	// BeforeAgent runs once per run, before the first model call.
	BeforeAgent = middleware.BeforeAgent
	// BeforeModel runs before every model call.
	BeforeModel = middleware.BeforeModel
	// AfterModel runs after every model response.
	AfterModel = middleware.AfterModel
	// AfterAgent runs once at the end of a run.
	AfterAgent = middleware.AfterAgent
	// WrapModelCall wraps every model call.
	WrapModelCall = middleware.WrapModelCall
	// WrapToolCall wraps every tool call.
	WrapToolCall = middleware.WrapToolCall
	// HookResult is what a before/after hook returns: a state update and
	// an optional jump.
	HookResult = middleware.Result
	// Runtime is the run a middleware works in.
	Runtime = middleware.Runtime
	// ModelRequest is a model call as wrappers see it; edits affect that
	// call only.
	ModelRequest = middleware.ModelRequest
	// ModelResponse is a model call's result as wrappers see it.
	ModelResponse = middleware.ModelResponse
	// ModelHandler performs the rest of a model call.
	ModelHandler = middleware.ModelHandler
	// ToolCall is a tool call as wrappers see it.
	ToolCall = middleware.ToolCall
	// ToolResult is a tool call's result as wrappers see it.
	ToolResult = middleware.ToolResult
	// ToolHandler performs the rest of a tool call.
	ToolHandler = middleware.ToolHandler
	// State is a thread's state: its messages and the values middlewares
	// keep.
	State = state.State
	// StateUpdate changes a thread's state.
	StateUpdate = state.Update
)

// Jumps a before/after hook may ask for.
const (
	JumpNone  = middleware.JumpNone
	JumpEnd   = middleware.JumpEnd
	JumpModel = middleware.JumpModel
)

// The wire: requests, records and events (docs/protocol.md).
type (
	// RunRequest is a run request as published to the runs stream.
	RunRequest = protocol.RunRequest
	// RunInput is a run's new input.
	RunInput = protocol.Input
	// RunCommand resumes or redirects a waiting thread.
	RunCommand = protocol.Command
	// RunConfig is a run's settings (model, approval mode, steps).
	RunConfig = protocol.RunConfig
	// Run is a run record.
	Run = protocol.Run
	// Thread is a thread record.
	Thread = protocol.Thread
	// Status is a run's status.
	Status = protocol.Status
	// Interrupt is what an interrupted run waits for.
	Interrupt = protocol.Interrupt
	// Decision is a person's decision on one tool call waiting for
	// approval.
	Decision = protocol.Decision
	// FinishedData is the data of run.finished.
	FinishedData = protocol.FinishedData
	// RunUsage is a run's token usage.
	RunUsage = protocol.RunUsage
	// ThreadUsage is a thread's token usage.
	ThreadUsage = protocol.ThreadUsage
)

// Run statuses.
const (
	StatusPending     = protocol.StatusPending
	StatusRunning     = protocol.StatusRunning
	StatusSuccess     = protocol.StatusSuccess
	StatusError       = protocol.StatusError
	StatusCancelled   = protocol.StatusCancelled
	StatusInterrupted = protocol.StatusInterrupted
	StatusSteered     = protocol.StatusSteered
	StatusRejected    = protocol.StatusRejected
	StatusTimeout     = protocol.StatusTimeout
	// StatusIncomplete: a guard (max_steps, loop detection, a token
	// budget, a limit, a safety stop) cut the run short; the run's
	// stop_reason says which. Its output is the answer so far.
	StatusIncomplete = protocol.StatusIncomplete
)

// Event types every run emits.
const (
	EventRunQueued         = protocol.EventRunQueued
	EventRunStarted        = protocol.EventRunStarted
	EventRunFinished       = protocol.EventRunFinished
	EventMessageDelta      = protocol.EventMessageDelta
	EventMessageCompleted  = protocol.EventMessageCompleted
	EventToolStarted       = protocol.EventToolStarted
	EventToolFinished      = protocol.EventToolFinished
	EventApprovalRequested = protocol.EventApprovalRequested
)

// Decision types of an approval.
const (
	DecisionApprove = protocol.DecisionApprove
	DecisionEdit    = protocol.DecisionEdit
	DecisionReject  = protocol.DecisionReject
	DecisionRespond = protocol.DecisionRespond
)
