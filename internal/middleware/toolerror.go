package middleware

// Tool error guard. Boundary: tool call. Reads and writes no state. Emits
// nothing. A tool that fails, panics or does not exist becomes an error
// tool message the model can read and react to, so one bad tool call never
// ends the run; only a stop of the run itself (cancel, shutdown) passes
// through as an error.

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/model"
)

// ToolErrorGuard turns tool failures into error tool messages.
type ToolErrorGuard struct{}

// Name implements Middleware.
func (ToolErrorGuard) Name() string { return "tool_error_guard" }

// WrapToolCall implements WrapToolCall.
func (ToolErrorGuard) WrapToolCall(ctx context.Context, rt *Runtime, call *ToolCall, next ToolHandler) (res *ToolResult, err error) {
	defer func() {
		// A panic in an inner wrapper is a tool failure too.
		if p := recover(); p != nil {
			res, err = guardError(ctx, rt, call, &PanicError{What: "tool call " + call.Call.Name, Value: p, Stack: debug.Stack()})
		}
	}()
	res, err = next(ctx, call)
	if err == nil && res != nil {
		return res, nil
	}
	if err == nil {
		err = errors.New("the tool returned no result")
	}
	return guardError(ctx, rt, call, err)
}

func guardError(ctx context.Context, rt *Runtime, call *ToolCall, err error) (*ToolResult, error) {
	if ctx.Err() != nil {
		return nil, context.Cause(ctx)
	}
	if rt.Logger != nil {
		fields := []zap.Field{zap.String("tool", call.Call.Name), zap.String("tool_call_id", call.Call.ID), zap.Error(err)}
		var p *PanicError
		if errors.As(err, &p) {
			fields = append(fields, zap.ByteString("stack", p.Stack))
		}
		rt.Logger.Info("tool call failed", fields...)
	}
	return &ToolResult{Message: model.Message{
		Content: fmt.Sprintf("Error: %v", err),
		Status:  model.ToolStatusError,
	}}, nil
}

// PanicError is a panic recovered from a tool or middleware. Its message is
// safe to show to the model; the stack goes to the log only.
type PanicError struct {
	What  string
	Value any
	Stack []byte
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("%s failed unexpectedly: %v", e.What, e.Value)
}
