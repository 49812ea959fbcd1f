package model_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/model/openaitest"
)

var demoTools = []model.ToolSpec{
	{Name: "read_file", Description: "unrelated"},
	{Name: model.DemoToolName, Description: "Current time"},
}

func fastDemo() *model.Demo { return model.NewDemo(model.DemoOptions{WordDelay: -1}) }

// validate runs the demo's transcript through the strict provider rules,
// so what the demo produces is something a real provider would accept.
func validate(t *testing.T, req *model.Request) {
	t.Helper()
	wire := &openaitest.Request{Model: "demo"}
	for _, ts := range req.Tools {
		wire.Tools = append(wire.Tools, openaitest.Tool{Type: "function", Function: openaitest.Function{Name: ts.Name}})
	}
	for _, m := range req.Messages {
		wm := openaitest.Message{Role: m.Role, Content: m.Content, Name: m.Name, ToolCallID: m.ToolCallID}
		for _, tc := range m.ToolCalls {
			wm.ToolCalls = append(wm.ToolCalls, openaitest.ToolCallMsg{ID: tc.ID, Type: "function",
				Function: openaitest.FunctionCall{Name: tc.Name, Arguments: tc.Arguments}})
		}
		wire.Messages = append(wire.Messages, wm)
	}
	if p := openaitest.Validate(wire); len(p) > 0 {
		t.Fatalf("demo transcript is invalid: %q", p)
	}
}

func TestDemoCallsToolThenAnswers(t *testing.T) {
	d := fastDemo()
	req := &model.Request{Tools: demoTools, Messages: []model.Message{
		{Role: model.RoleSystem, Content: "sys"},
		{Role: model.RoleUser, Content: "What time is it?"},
	}}

	var rec deltaRecorder
	first, err := d.Generate(context.Background(), req, rec.add)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(first.Message.Content, "[demo model]") {
		t.Fatalf("first answer %q is not labelled", first.Message.Content)
	}
	if pieces := rec.get(); len(pieces) < 3 || strings.Join(pieces, "") != first.Message.Content {
		t.Fatalf("deltas %q do not stream the content %q word by word", pieces, first.Message.Content)
	}
	if first.FinishReason != model.FinishToolCalls || len(first.Message.ToolCalls) != 1 {
		t.Fatalf("first response %+v, want one tool call", first)
	}
	call := first.Message.ToolCalls[0]
	if call.Name != model.DemoToolName || call.Arguments != "{}" || !strings.HasPrefix(call.ID, "call_") || len(call.ID) < 10 {
		t.Fatalf("tool call %+v", call)
	}
	if first.Usage == nil || first.Usage.CompletionTokens == 0 || first.Usage.PromptTokens == 0 ||
		first.Usage.TotalTokens != first.Usage.PromptTokens+first.Usage.CompletionTokens {
		t.Fatalf("usage %+v", first.Usage)
	}
	if first.Message.Role != model.RoleAssistant || first.Model == "" {
		t.Fatalf("response %+v", first)
	}

	req.Messages = append(req.Messages, first.Message, model.Message{
		Role: model.RoleTool, ToolCallID: call.ID, Name: call.Name, Content: "2025-06-01T12:00:00Z",
	})
	validate(t, req)

	rec = deltaRecorder{}
	second, err := d.Generate(context.Background(), req, rec.add)
	if err != nil {
		t.Fatal(err)
	}
	text := second.Message.Content
	if second.FinishReason != model.FinishStop || len(second.Message.ToolCalls) != 0 {
		t.Fatalf("second response %+v, want a final answer", second)
	}
	for _, want := range []string{"[demo model]", "2025-06-01T12:00:00Z", "What time is it?",
		"offline demo model", "OPENAI_BASE_URL", "OPENAI_API_KEY", "NATSAGENT_MODEL"} {
		if !strings.Contains(text, want) {
			t.Errorf("final answer %q lacks %q", text, want)
		}
	}
	if strings.Join(rec.get(), "") != text {
		t.Fatalf("deltas %q do not match content %q", rec.get(), text)
	}
	req.Messages = append(req.Messages, second.Message)
	validate(t, req)

	// A new user turn calls the tool again rather than reusing the old result.
	req.Messages = append(req.Messages, model.Message{Role: model.RoleUser, Content: "And now?"})
	third, err := d.Generate(context.Background(), req, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(third.Message.ToolCalls) != 1 || third.Message.ToolCalls[0].ID == call.ID {
		t.Fatalf("third response %+v, want a fresh tool call", third)
	}
}

func TestDemoWithoutToolAnswersDirectly(t *testing.T) {
	req := &model.Request{Messages: []model.Message{{Role: model.RoleUser, Content: "Tell me a joke"}}}
	resp, err := fastDemo().Generate(context.Background(), req, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.FinishReason != model.FinishStop || len(resp.Message.ToolCalls) != 0 ||
		!strings.HasPrefix(resp.Message.Content, "[demo model]") || !strings.Contains(resp.Message.Content, "Tell me a joke") ||
		!strings.Contains(resp.Message.Content, "NATSAGENT_MODEL") || resp.Usage == nil {
		t.Fatalf("response %+v", resp)
	}
}

func TestDemoIsDeterministic(t *testing.T) {
	req := &model.Request{Tools: demoTools, Messages: []model.Message{{Role: model.RoleUser, Content: "hi"}}}
	a, err := fastDemo().Generate(context.Background(), req, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := fastDemo().Generate(context.Background(), req, nil)
	if err != nil {
		t.Fatal(err)
	}
	if a.Message.Content != b.Message.Content || a.Message.ToolCalls[0].Name != b.Message.ToolCalls[0].Name {
		t.Fatalf("answers differ: %+v vs %+v", a, b)
	}
	if a.Message.ToolCalls[0].ID == b.Message.ToolCalls[0].ID {
		t.Fatalf("tool call ids repeat: %q", a.Message.ToolCalls[0].ID)
	}
}

func TestDemoDefaultDelayStreamsVisibly(t *testing.T) {
	req := &model.Request{Tools: demoTools, Messages: []model.Message{{Role: model.RoleUser, Content: "hi"}}}
	var rec deltaRecorder
	start := time.Now()
	if _, err := model.NewDemo(model.DemoOptions{}).Generate(context.Background(), req, rec.add); err != nil {
		t.Fatal(err)
	}
	gaps := len(rec.get()) - 1
	if floor := time.Duration(gaps) * 25 * time.Millisecond; time.Since(start) < floor {
		t.Fatalf("%d pieces streamed in %v, want at least %v with the default delay", gaps+1, time.Since(start), floor)
	}
}

func TestDemoHonoursCancellation(t *testing.T) {
	d := model.NewDemo(model.DemoOptions{WordDelay: time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req := &model.Request{Messages: []model.Message{{Role: model.RoleUser, Content: "hi"}}}
	start := time.Now()
	var pieces int
	_, err := d.Generate(ctx, req, func(model.Delta) {
		pieces++
		cancel() // during the first pause
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	if pieces != 1 || time.Since(start) > 500*time.Millisecond {
		t.Fatalf("%d pieces, returned after %v", pieces, time.Since(start))
	}
}

func TestPickDemoBehaviour(t *testing.T) {
	for msg, want := range map[string]model.DemoBehaviour{
		"What time is it?":               model.DemoTime,
		"Count SLOWLY please":            model.DemoSlow,
		"write a file":                   model.DemoWrite,
		"Ask me something":               model.DemoAsk,
		"clarify, then write":            model.DemoWrite, // the first rule wins, not the first word
		"hand this to a subagent":        model.DemoSubagent,
		"a task for you":                 model.DemoSubagent,
		"give me a long reply":           model.DemoLong,
		"rewrite, tasks, asking, longer": model.DemoTime, // whole words only
	} {
		if got := model.PickDemoBehaviour(msg); got != want {
			t.Errorf("%q: %s, want %s", msg, got, want)
		}
	}
}

// A request that offers no tools (a summary, a title) gets a short answer
// whatever words it quotes: a summary of a "long" thread must not be long.
func TestDemoWithoutToolsAnswersPlainly(t *testing.T) {
	for _, msg := range []string{"give me a long reply", "count slowly", "write a file"} {
		req := &model.Request{Messages: []model.Message{{Role: model.RoleUser, Content: msg}}}
		resp, err := fastDemo().Generate(context.Background(), req, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Message.ToolCalls) != 0 || len(resp.Message.Content) > 600 {
			t.Errorf("%q: %d tool calls, %d bytes", msg, len(resp.Message.ToolCalls), len(resp.Message.Content))
		}
	}
}

// A behaviour whose tool is not offered (a subagent has no write_file)
// falls back to current_time and says what it would have called.
func TestDemoFallsBackWithoutItsTool(t *testing.T) {
	d := fastDemo()
	req := &model.Request{Tools: demoTools, Messages: []model.Message{{Role: model.RoleUser, Content: "write a file"}}}
	first, err := d.Generate(context.Background(), req, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Message.ToolCalls) != 1 || first.Message.ToolCalls[0].Name != model.DemoToolName {
		t.Fatalf("first response %+v", first.Message)
	}
	call := first.Message.ToolCalls[0]
	req.Messages = append(req.Messages, first.Message, model.Message{Role: model.RoleTool, ToolCallID: call.ID, Name: call.Name, Content: "noon"})
	validate(t, req)
	final, err := d.Generate(context.Background(), req, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(final.Message.Content, "would have called write_file") || len(final.Message.ToolCalls) != 0 {
		t.Fatalf("final %q", final.Message.Content)
	}
}

// The slow answer streams hundreds of pieces (half a minute at 100ms).
func TestDemoSlowStreamsManyPieces(t *testing.T) {
	d := model.NewDemo(model.DemoOptions{WordDelay: -1, SlowDelay: -1})
	req := &model.Request{Tools: demoTools, Messages: []model.Message{{Role: model.RoleUser, Content: "slow"}}}
	var rec deltaRecorder
	resp, err := d.Generate(context.Background(), req, rec.add)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(rec.get()); n < 300 || strings.Join(rec.get(), "") != resp.Message.Content {
		t.Fatalf("%d pieces", n)
	}
}
