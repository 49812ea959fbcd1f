package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/state"
	"github.com/natsagent/natsagent/internal/tools"
)

type nopHost struct{}

func (nopHost) Checkpoint(context.Context, state.Update) error { return nil }
func (nopHost) Emit(string, any)                               {}

func history(n int) []model.Message {
	msgs := make([]model.Message, 0, n)
	for i := 0; len(msgs) < n; i++ {
		run := map[string]any{MetaRunID: fmt.Sprintf("old%d", i)}
		callID := fmt.Sprintf("c%d", i)
		msgs = append(msgs,
			model.Message{ID: fmt.Sprintf("u%d", i), Role: model.RoleUser, Content: "please look this up and summarise it for me", Meta: run},
			model.Message{ID: fmt.Sprintf("a%d", i), Role: model.RoleAssistant, ToolCalls: []model.ToolCall{{ID: callID, Name: "probe", Arguments: `{}`}}, Meta: run},
			model.Message{ID: fmt.Sprintf("t%d", i), Role: model.RoleTool, ToolCallID: callID, Name: "probe", Content: "Mon, 30 Nov 2026 00:00:00 +0000", Meta: run},
			model.Message{ID: fmt.Sprintf("f%d", i), Role: model.RoleAssistant, Content: "here is the summary you asked for", Meta: run})
	}
	return msgs[:n]
}

// BenchmarkPrepareCall measures what the loop and the default chain cost
// around a model call that answers at once, at several history lengths.
// ns/op is a whole run of two model calls (a tool call, then the answer):
// it includes the once-per-run work (indexing the loaded transcript,
// checking it once for repair). ns/next-call is the time from a tool's
// result to the next model call, the cost every further step of a run
// pays: it must stay flat as the history grows.
func BenchmarkPrepareCall(b *testing.B) {
	chain, err := middleware.Assemble(middleware.ChainConfig{}, middleware.Env{Model: model.NewFixed(model.Reply{Text: "ok"})})
	if err != nil {
		b.Fatal(err)
	}
	var toolDone time.Time
	set, err := tools.NewSet(tools.Func(model.ToolSpec{Name: "probe"}, func(context.Context, json.RawMessage) (string, error) {
		defer func() { toolDone = time.Now() }()
		return "ok", nil
	}))
	if err != nil {
		b.Fatal(err)
	}
	var next time.Duration
	calls := 0
	m := model.Func(func(ctx context.Context, req *model.Request, onDelta func(model.Delta)) (*model.Response, error) {
		calls++
		if req.Messages[len(req.Messages)-1].Role == model.RoleTool {
			next += time.Since(toolDone)
			return &model.Response{Message: model.Message{Role: model.RoleAssistant, Content: "done"}, FinishReason: model.FinishStop}, nil
		}
		call := model.ToolCall{ID: fmt.Sprintf("call_%d", calls), Name: "probe", Arguments: "{}"}
		return &model.Response{Message: model.Message{Role: model.RoleAssistant, ToolCalls: []model.ToolCall{call}}, FinishReason: model.FinishToolCalls}, nil
	})
	for _, n := range []int{10, 100, 1000} {
		base := history(n)
		b.Run(fmt.Sprintf("messages=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			next = 0
			for b.Loop() {
				b.StopTimer()
				st := &state.State{}
				st.Apply(state.Update{Messages: base}) // loaded from checkpoints: indexed as it is built
				b.StartTimer()
				out := Execute(context.Background(), &Run{
					Runtime: &middleware.Runtime{RunID: "r", ThreadID: "t", Tenant: "d", Tools: set, Logger: zap.NewNop(), Emit: func(string, any) {}},
					Chain:   chain, Model: m, System: "sys", State: st, Host: nopHost{},
					Input: []model.Message{{Role: model.RoleUser, Content: "and now?"}},
				})
				if out.Status != "success" {
					b.Fatal(out)
				}
			}
			b.ReportMetric(float64(next.Nanoseconds())/float64(b.N), "ns/next-call")
		})
	}
}

// BenchmarkNoopRun measures the loop and the default chain around a run
// whose model answers at once and whose middlewares have nothing to do:
// the part of a no-op run's CPU that is natsagent's own code rather than
// its writes (the host here stores nothing).
func BenchmarkNoopRun(b *testing.B) {
	m := model.NewFixed(model.Reply{Text: "ok"})
	chain, err := middleware.Assemble(middleware.ChainConfig{}, middleware.Env{Model: m})
	if err != nil {
		b.Fatal(err)
	}
	set, err := tools.NewSet()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		out := Execute(context.Background(), &Run{
			Runtime: &middleware.Runtime{RunID: "r", ThreadID: "t", Tenant: "d", Tools: set, Logger: zap.NewNop(), Emit: func(string, any) {}},
			Chain:   chain, Model: m, System: "sys", State: &state.State{}, Host: nopHost{},
			Input: []model.Message{{Role: model.RoleUser, Content: "hi"}},
		})
		if out.Status != "success" {
			b.Fatal(out)
		}
	}
}
