package middleware_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/state"
	"github.com/natsagent/natsagent/internal/tools"
)

// longThread is a thread of n messages shaped like real turns: a
// question, a tool call, its result (about 400 tokens) and an answer.
func longThread(n int) *state.State {
	var msgs []model.Message
	for turn := 0; len(msgs) < n; turn++ {
		id := func(k string) string { return fmt.Sprintf("%s%d", k, turn) }
		msgs = append(msgs,
			user(id("u"), fmt.Sprintf("Turn %d: look this up and summarise it.", turn)),
			calls(id("a"), call(id("c"), "search", fmt.Sprintf(`{"query":"topic %d"}`, turn))),
			result(id("t"), id("c"), "search", fill(fmt.Sprintf("result%d", turn), 400)),
			answer(id("f"), fmt.Sprintf("Here is the summary of topic %d.", turn)),
		)
	}
	return history(msgs[:n]...)
}

// withSummary records a summary whose cut leaves the last keep messages.
func withSummary(st *state.State, keep int) *state.State {
	st = st.Clone()
	i := len(st.Messages) - keep
	for st.Messages[i].Role == model.RoleTool {
		i--
	}
	rec := middleware.ContextSummary{Summary: fill("summary", 600), Seq: 1, Count: i, Summarized: i,
		CutBeforeMessageID: st.Messages[i].ID, LastSummarizedMessageID: st.Messages[i-1].ID, At: time.Now().UTC(), Reason: "trigger"}
	u, _ := state.SetValue(middleware.ContextSummaryValue, rec)
	st.Apply(u)
	return st
}

// BenchmarkCompressionPrepare measures what context compression adds to a
// model call in a run that goes on: the call after a tool step, on a
// thread of 100 and 1,000 messages, below the trigger (the common case)
// and right after a summary (the request is projected). It should not
// grow with the history.
func BenchmarkCompressionPrepare(b *testing.B) {
	next := func(ctx context.Context, req *middleware.ModelRequest) (*middleware.ModelResponse, error) {
		return &middleware.ModelResponse{Response: &model.Response{Message: model.Message{Role: model.RoleAssistant, Content: "ok"}}}, nil
	}
	for _, n := range []int{100, 1000} {
		for _, kind := range []string{"below_trigger", "after_summary"} {
			base := longThread(n)
			if kind == "after_summary" {
				base = withSummary(base, 20)
			}
			cc, err := middleware.NewContextCompression(middleware.ContextCompression{}, middleware.ContextLimits{Window: 10_000_000})
			if err != nil {
				b.Fatal(err)
			}
			b.Run(fmt.Sprintf("%s/messages=%d", kind, n), func(b *testing.B) {
				b.ReportAllocs()
				var (
					st   *state.State
					rt   *middleware.Runtime
					step int
				)
				prepare := func() {
					req := &middleware.ModelRequest{System: "You are a test agent.", Messages: st.Messages[:len(st.Messages):len(st.Messages)], ModelName: "test-model", State: st}
					if _, err := cc.WrapModelCall(context.Background(), rt, req, next); err != nil {
						b.Fatal(err)
					}
				}
				// A run's first call counts its history once (the process
				// caches make it cheap on later runs); measured are the
				// calls after it, 50 steps per run.
				reset := func() {
					st = base.Clone()
					// Room for the run's steps: the benchmark measures the
					// middleware, not the transcript's reallocation.
					st.Messages = slices.Grow(st.Messages, 128)
					rt = &middleware.Runtime{RunID: "bench", ThreadID: "h1", Logger: zap.NewNop()}
					prepare()
				}
				reset()
				for b.Loop() {
					if step++; step%50 == 0 {
						b.StopTimer()
						reset()
						b.StartTimer()
					}
					id := fmt.Sprintf("s%d", step)
					st.Apply(state.Update{Messages: []model.Message{
						calls("a"+id, call("c"+id, "search", `{"query":"more"}`)),
						result("t"+id, "c"+id, "search", "a short result"),
					}})
					prepare()
				}
			})
		}
	}
}

// deltaHost stores checkpoints the way the worker does (kv.Delta as
// JSON) and keeps their sizes.
type deltaHost struct {
	sizes []int
	st    *state.State
}

func (h *deltaHost) Checkpoint(ctx context.Context, u state.Update) error {
	data, err := json.Marshal(&kv.Delta{ID: fmt.Sprintf("e1-%d", len(h.sizes)+1), Parent: "e1-0", RunID: "r1", Step: len(h.sizes) + 1, Time: time.Now().UTC(), Update: u})
	if err != nil {
		return err
	}
	h.sizes = append(h.sizes, len(data))
	var d kv.Delta
	if err := json.Unmarshal(data, &d); err != nil {
		return err
	}
	h.st.Apply(d.Update)
	return nil
}

func (h *deltaHost) Emit(string, any) {}

// stepRun runs a run of steps tool steps on a thread of n messages with
// the default lead chain (compression on, summarizing at trigger), and
// returns the checkpoint sizes and what was stored.
func stepRun(tb testing.TB, n, steps int, settings string) ([]int, *state.State) {
	tb.Helper()
	cfg := middleware.ChainConfig{Settings: map[string]json.RawMessage{
		"tool_approval": json.RawMessage(`{"enabled": false}`),
		"title":         json.RawMessage(`{"enabled": false}`),
	}}
	if settings != "" {
		cfg.Settings["context_compression"] = json.RawMessage(settings)
	}
	chain, err := middleware.Assemble(cfg, middleware.Env{Tools: tools.NewRegistry(), KnownTool: func(n string) bool { return n == "echo" }})
	if err != nil {
		tb.Fatal(err)
	}
	mains := 0
	m := model.NewScripted(func(i int, req *model.Request) model.Reply {
		if len(req.Messages) > 0 && strings.Contains(req.Messages[0].Content, summaryMarker) {
			return model.Reply{Text: "A summary of the earlier work."}
		}
		if mains++; mains <= steps {
			return model.Reply{ToolCalls: []model.ToolCall{{ID: fmt.Sprintf("call_%d", i), Name: "echo", Arguments: fmt.Sprintf(`{"query":"step %d of new work"}`, mains)}}}
		}
		return model.Reply{Text: "done"}
	})
	base := longThread(n)
	st := base.Clone()
	host := &deltaHost{st: base.Clone()}
	rt := &middleware.Runtime{RunID: "r1", ThreadID: "h1", Tenant: "default", Tools: echoSet(tb), Logger: zap.NewNop(), Emit: host.Emit}
	out := agent.Execute(context.Background(), &agent.Run{Runtime: rt, Chain: chain, Model: m, ModelName: "test-model", System: "s",
		MaxSteps: 100, State: st, Input: []model.Message{user("new", "go on")}, Host: host})
	if out.Status != "success" {
		tb.Fatalf("outcome %+v", out)
	}
	if err := host.Checkpoint(context.Background(), out.Pending); err != nil {
		tb.Fatal(err)
	}
	return host.sizes, host.st
}

// deepagents #2874: checkpoint storage per step grows with the step's new
// content, not the history, at 100 and 1,000 messages, also with a
// summary in the run; no summary deletes a stored message.
func TestCheckpointGrowthPerStep_Deepagents2874(t *testing.T) {
	const steps = 6
	perStep := map[int]int{}
	for _, n := range []int{100, 1000} {
		sizes, stored := stepRun(t, n, steps, `{"trigger_messages": 40, "keep": {"messages": 10}}`)
		var rec middleware.ContextSummary
		if ok, _ := stored.Value(middleware.ContextSummaryValue, &rec); !ok {
			t.Fatalf("%d messages: no summary was made", n)
		}
		if want := n + 1 + 2*steps + 1; len(stored.Messages) != want {
			t.Fatalf("%d messages: %d stored after the run, want %d: a summary must not delete messages", n, len(stored.Messages), want)
		}
		// Steps without a new summary: every step but the first (it also
		// holds the new input and the summary record).
		maxPlain := 0
		for _, s := range sizes[1:] {
			maxPlain = max(maxPlain, s)
		}
		perStep[n] = maxPlain
		if sizes[0] > maxPlain+4000 {
			t.Errorf("%d messages: the step with the summary wrote %d bytes", n, sizes[0])
		}
	}
	if perStep[1000] > perStep[100]+64 {
		t.Fatalf("checkpoint bytes per step: %d at 100 messages, %d at 1,000: they grow with the history", perStep[100], perStep[1000])
	}
}

// BenchmarkCheckpointBytesPerStep reports the checkpoint bytes of a tool
// step (the assistant's call, then its result, each checkpointed) on a
// thread of 100 and 1,000 messages with the default chain.
func BenchmarkCheckpointBytesPerStep(b *testing.B) {
	for _, n := range []int{100, 1000} {
		b.Run(fmt.Sprintf("messages=%d", n), func(b *testing.B) {
			var bytes, count int
			for b.Loop() {
				sizes, _ := stepRun(b, n, 4, "")
				for _, s := range sizes[1:] {
					bytes += s
					count++
				}
			}
			b.ReportMetric(float64(bytes)/float64(count), "bytes/checkpoint")
		})
	}
}

func echoSet(tb testing.TB) *tools.Set {
	tb.Helper()
	set, err := tools.NewSet(tools.Func(model.ToolSpec{Name: "echo", Description: "echoes", Parameters: json.RawMessage(`{"type":"object"}`)},
		func(ctx context.Context, args json.RawMessage) (string, error) { return "echo " + string(args), nil }))
	if err != nil {
		tb.Fatal(err)
	}
	return set
}
