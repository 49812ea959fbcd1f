package middleware

import (
	"fmt"
	"testing"

	"github.com/natsagent/natsagent/internal/model"
)

// transcript builds a valid history of n messages: user turns, assistant
// tool calls and their results, final answers.
func transcript(n int) []model.Message {
	msgs := make([]model.Message, 0, n)
	for i := 0; len(msgs) < n; i++ {
		msgs = append(msgs, model.Message{ID: fmt.Sprintf("u%d", i), Role: model.RoleUser, Content: "please look this up and summarise it for me"})
		callID := fmt.Sprintf("c%d", i)
		msgs = append(msgs, model.Message{ID: fmt.Sprintf("a%d", i), Role: model.RoleAssistant, ToolCalls: []model.ToolCall{{ID: callID, Name: "search", Arguments: `{"query":"something"}`}}})
		msgs = append(msgs, model.Message{ID: fmt.Sprintf("t%d", i), Role: model.RoleTool, ToolCallID: callID, Name: "search", Content: "a result of moderate length that the model reads"})
		msgs = append(msgs, model.Message{ID: fmt.Sprintf("f%d", i), Role: model.RoleAssistant, Content: "here is the summary you asked for"})
	}
	return msgs[:n]
}

// BenchmarkRepairTranscript measures the repair every model call pays on a
// valid transcript (the common case: nothing to change).
func BenchmarkRepairTranscript(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		msgs := transcript(n)
		b.Run(fmt.Sprintf("messages=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_, _, changed := RepairTranscript("system", msgs)
				if changed && n%4 == 0 {
					b.Fatal("a valid transcript was changed")
				}
			}
		})
	}
}
