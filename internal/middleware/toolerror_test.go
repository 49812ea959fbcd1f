package middleware

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/natsagent/natsagent/internal/model"
)

func TestToolErrorGuard(t *testing.T) {
	rt, _ := newRuntime("r1")
	c := &ToolCall{Call: call("c1", "search", `{}`)}
	guard := ToolErrorGuard{}
	for _, tc := range []struct {
		name    string
		res     *ToolResult
		err     error
		wantHas string
	}{
		{"tool error", nil, errors.New("disk full"), "Error: disk full"},
		{"no result", nil, nil, "no result"},
		{"panic", nil, &PanicError{What: "tool search", Value: "nil map", Stack: []byte("goroutine 1 [running]:\nsecret/stack.go:12")}, "failed unexpectedly: nil map"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := guard.WrapToolCall(context.Background(), rt, c, func(context.Context, *ToolCall) (*ToolResult, error) { return tc.res, tc.err })
			if err != nil {
				t.Fatalf("err = %v, want an error result", err)
			}
			if res.Message.Status != model.ToolStatusError || !strings.Contains(res.Message.Content, tc.wantHas) {
				t.Errorf("result = %+v, want an error mentioning %q", res.Message, tc.wantHas)
			}
			if strings.Contains(res.Message.Content, "goroutine") {
				t.Error("the stack reached the model")
			}
		})
	}
	t.Run("success passes through", func(t *testing.T) {
		want := &ToolResult{Message: model.Message{Content: "ok", Status: model.ToolStatusSuccess}}
		res, err := guard.WrapToolCall(context.Background(), rt, c, func(context.Context, *ToolCall) (*ToolResult, error) { return want, nil })
		if err != nil || res != want {
			t.Errorf("res %+v, err %v", res, err)
		}
	})
	t.Run("a stopped run passes through as an error", func(t *testing.T) {
		cause := errors.New("run cancelled by a person")
		ctx, cancel := context.WithCancelCause(context.Background())
		cancel(cause)
		res, err := guard.WrapToolCall(ctx, rt, c, func(ctx context.Context, _ *ToolCall) (*ToolResult, error) { return nil, ctx.Err() })
		if !errors.Is(err, cause) || res != nil {
			t.Errorf("res %+v, err %v; want the cancel cause", res, err)
		}
	})
}
