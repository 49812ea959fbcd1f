package middleware_test

import (
	"context"
	"encoding/json"
	"testing"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
	"github.com/natsagent/natsagent/internal/tools"
)

// formMiddleware raises an interrupt of its own kind after the first
// model response and, on a resume, keeps the resume value as sent.
type formMiddleware struct{ got []byte }

func (*formMiddleware) Name() string { return "form" }

func (f *formMiddleware) AfterModel(ctx context.Context, rt *middleware.Runtime, st *state.State) (middleware.Result, error) {
	if rt.Resume != nil {
		return middleware.Result{}, nil
	}
	intr := &protocol.Interrupt{Kind: "form", RunID: rt.RunID}
	u, err := state.SetValue(middleware.InterruptValue, intr)
	return middleware.Result{Update: u, Interrupt: intr}, err
}

func (f *formMiddleware) BeforeAgent(ctx context.Context, rt *middleware.Runtime, st *state.State) (middleware.Result, error) {
	var open protocol.Interrupt
	if ok, _ := st.Value(middleware.InterruptValue, &open); !ok || open.Kind != "form" || rt.Resume == nil {
		return middleware.Result{}, nil
	}
	f.got = append([]byte(nil), rt.Resume...)
	return middleware.Result{Update: state.Update{Values: map[string]json.RawMessage{middleware.InterruptValue: json.RawMessage("null")}}}, nil
}

// A custom interrupt's resume reaches its middleware as sent, whatever
// JSON it is, and the run goes on.
func TestCustomInterruptGetsResumeValue(t *testing.T) {
	form := &formMiddleware{}
	chain, err := middleware.NewChain([]middleware.Middleware{form})
	if err != nil {
		t.Fatal(err)
	}
	m := model.NewScripted(func(n int, req *model.Request) model.Reply { return model.Reply{Text: "answer"} })
	st := &state.State{}
	run := func(resume []byte, input []model.Message) agent.Outcome {
		return agent.Execute(context.Background(), &agent.Run{
			Runtime: &middleware.Runtime{RunID: "r", ThreadID: "t", Tenant: "d", Resume: resume, Logger: zap.NewNop(), Emit: func(string, any) {}},
			Chain:   chain, Model: m, System: "sys", State: st, Host: &memHost{base: &state.State{}}, Input: input,
		})
	}
	if out := run(nil, []model.Message{{Role: model.RoleUser, Content: "fill the form"}}); out.Status != protocol.StatusInterrupted || out.Interrupt == nil || out.Interrupt.Kind != "form" {
		t.Fatalf("first run %+v", out)
	}
	value := []byte(`{"email":"a@b.c","fields":[1,2]}`)
	if out := run(value, nil); out.Status != protocol.StatusSuccess {
		t.Fatalf("resumed run %+v", out)
	}
	if string(form.got) != string(value) {
		t.Fatalf("the middleware read %s, want %s", form.got, value)
	}
}

// Mode always_ask (interrupt_before tools) stops before a tool no gating
// list names, and runs it once approved.
func TestAlwaysAskGatesEveryTool(t *testing.T) {
	ran := 0
	set, err := tools.NewSet(
		tools.Func(model.ToolSpec{Name: "read_file"}, func(context.Context, json.RawMessage) (string, error) { ran++; return "content", nil }),
	)
	if err != nil {
		t.Fatal(err)
	}
	chain, err := middleware.Assemble(middleware.ChainConfig{}, middleware.Env{Kind: middleware.KindLead, KnownTool: func(string) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	m := model.NewScripted(func(n int, req *model.Request) model.Reply {
		if last := req.Messages[len(req.Messages)-1]; last.Role == model.RoleUser {
			return model.Reply{ToolCalls: []model.ToolCall{{ID: "c1", Name: "read_file", Arguments: `{"path":"/x"}`}}}
		}
		return model.Reply{Text: "done"}
	})
	st := &state.State{}
	run := func(mode string, resume []byte, input []model.Message) agent.Outcome {
		return agent.Execute(context.Background(), &agent.Run{
			Runtime: &middleware.Runtime{RunID: "r", ThreadID: "t", Tenant: "d", Tools: set, Resume: resume, Config: protocol.RunConfig{ToolApprovalMode: mode},
				Logger: zap.NewNop(), Emit: func(string, any) {}},
			Chain: chain, Model: m, System: "sys", State: st, Host: &memHost{base: &state.State{}}, Input: input,
		})
	}
	// Not gated in mode default.
	if out := run(protocol.ApprovalDefault, nil, []model.Message{{Role: model.RoleUser, Content: "read it"}}); out.Status != protocol.StatusSuccess || ran != 1 {
		t.Fatalf("default mode: %+v, ran %d", out, ran)
	}
	out := run(protocol.ApprovalAlwaysAsk, nil, []model.Message{{Role: model.RoleUser, Content: "read it again"}})
	if out.Status != protocol.StatusInterrupted || out.Interrupt == nil || len(out.Interrupt.ActionRequests) != 1 || out.Interrupt.ActionRequests[0].Name != "read_file" || ran != 1 {
		t.Fatalf("always_ask: %+v, ran %d", out, ran)
	}
	if out := run(protocol.ApprovalAlwaysAsk, []byte(`{"decisions":[{"type":"approve"}]}`), nil); out.Status != protocol.StatusSuccess || ran != 2 {
		t.Fatalf("approved: %+v, ran %d", out, ran)
	}
}

// A command's goto tools runs the last response's unanswered tool calls
// through the tool chain, then the loop goes on with the model; the
// command's update (a title) is applied first.
func TestGotoToolsAndUpdate(t *testing.T) {
	ran := 0
	set, err := tools.NewSet(
		tools.Func(model.ToolSpec{Name: "read_file"}, func(context.Context, json.RawMessage) (string, error) { ran++; return "content", nil }),
	)
	if err != nil {
		t.Fatal(err)
	}
	chain, err := middleware.NewChain(nil)
	if err != nil {
		t.Fatal(err)
	}
	var seen []model.Message
	m := model.NewScripted(func(n int, req *model.Request) model.Reply {
		seen = req.Messages
		return model.Reply{Text: "done"}
	})
	st := &state.State{}
	st.Apply(state.Update{Messages: []model.Message{
		{ID: "u1", Role: model.RoleUser, Content: "read it"},
		{ID: "a1", Role: model.RoleAssistant, ToolCalls: []model.ToolCall{{ID: "c1", Name: "read_file", Arguments: `{}`}}},
	}})
	out := agent.Execute(context.Background(), &agent.Run{
		Runtime: &middleware.Runtime{RunID: "r2", ThreadID: "t", Tenant: "d", Tools: set, Logger: zap.NewNop(), Emit: func(string, any) {}},
		Chain:   chain, Model: m, System: "sys", State: st, Host: &memHost{base: &state.State{}},
		Update: state.Update{Values: map[string]json.RawMessage{middleware.TitleValue: json.RawMessage(`"Reading"`)}},
		Goto:   protocol.GotoTools,
	})
	if out.Status != protocol.StatusSuccess || ran != 1 {
		t.Fatalf("goto tools: %+v, ran %d", out, ran)
	}
	var title string
	if ok, _ := st.Value(middleware.TitleValue, &title); !ok || title != "Reading" {
		t.Fatalf("title %q", title)
	}
	if middleware.ToolCallsWaiting(st) {
		t.Fatal("tool calls still waiting after goto tools")
	}
	var answered bool
	for _, msg := range seen {
		if msg.ToolCallID == "c1" && msg.Content == "content" {
			answered = true
		}
	}
	if !answered {
		t.Fatalf("the model did not see the tool's result: %+v", seen)
	}
}
