package middleware

// Clarification. Boundary: tool call and model response. Provides the
// ask_clarification tool to lead agents; writes the question's tool
// result and the interrupt, and on resume the answer. When the model asks,
// the run ends "interrupted" (reason clarification) with the question;
// the answer arrives as a resume run ("command":{"resume":{"answer":..}})
// or simply as the person's next message. Sibling tool calls in the same
// response are answered as not run, so the outcome never depends on the
// order the model listed its calls in (deer-flow #4906). With disabled
// set (no person present), the tool tells the model to go on with its
// best judgment. It sits last in the chain: innermost around tools, first
// to see a response.

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
	"github.com/natsagent/natsagent/internal/tools"
)

// ClarificationTool is the tool's name.
const ClarificationTool = "ask_clarification"

// Clarification types the model may use.
var clarificationTypes = []string{"missing_info", "ambiguous_requirement", "approach_choice", "risk_confirmation", "suggestion"}

// Clarification lets the model ask the person a question.
type Clarification struct {
	// Disabled answers every question with "proceed with your best
	// judgment" (non-interactive deployments).
	Disabled bool `json:"disabled"`
}

// NewClarification checks the settings.
func NewClarification(c Clarification) (*Clarification, error) { return &c, nil }

// Name implements Middleware.
func (*Clarification) Name() string { return "clarification" }

var clarificationSpec = model.ToolSpec{
	Name:        ClarificationTool,
	Description: "Ask the person a question when you cannot go on without their input: missing information, an ambiguous request, a choice between approaches, or a risky action to confirm. The run pauses until they answer. Ask one clear question; offer options when the answer is a choice.",
	Parameters:  tools.SchemaJSON[clarificationArgs](),
}

// WrapModelCall offers the tool.
func (c *Clarification) WrapModelCall(ctx context.Context, rt *Runtime, req *ModelRequest, next ModelHandler) (*ModelResponse, error) {
	if SwitchedOff(rt.Config.Clarification) {
		return next(ctx, req)
	}
	r := *req
	r.Tools = withTools(req.Tools, clarificationSpec)
	return next(ctx, &r)
}

// AfterModel answers the siblings of a question as not run, and all but
// the first question.
func (c *Clarification) AfterModel(ctx context.Context, rt *Runtime, st *state.State) (Result, error) {
	i := LastAssistant(st)
	if i < 0 || i != len(st.Messages)-1 || len(st.Messages[i].ToolCalls) < 2 {
		return Result{}, nil
	}
	calls := st.Messages[i].ToolCalls
	first := -1
	for k, call := range calls {
		if call.Name == ClarificationTool {
			first = k
			break
		}
	}
	if first < 0 {
		return Result{}, nil
	}
	var u state.Update
	for k, call := range calls {
		if k == first {
			continue
		}
		u.Messages = append(u.Messages, model.Message{
			ID: "not_run_" + call.ID, Role: model.RoleTool, ToolCallID: call.ID, Name: call.Name, Status: model.ToolStatusError,
			Content: "Not run: you asked the person a question in the same response. Call it again, if still needed, once they answered.",
			Meta:    map[string]any{"run_id": rt.RunID},
		})
	}
	return Result{Update: u}, nil
}

// clarificationArgs are ask_clarification's arguments; the type enum
// is clarificationTypes (TestClarificationTypesInSchema).
type clarificationArgs struct {
	Question string   `json:"question" jsonschema:"The question, in one or two sentences."`
	Type     string   `json:"type,omitempty" schema:"enum=missing_info|ambiguous_requirement|approach_choice|risk_confirmation|suggestion" jsonschema:"What kind of question this is."`
	Context  string   `json:"context,omitempty" jsonschema:"Why you ask, briefly."`
	Options  []string `json:"options,omitempty" jsonschema:"Choices to offer, when the answer is one of a few."`
}

// WrapToolCall turns ask_clarification into an interrupt.
func (c *Clarification) WrapToolCall(ctx context.Context, rt *Runtime, call *ToolCall, next ToolHandler) (*ToolResult, error) {
	if call.Call.Name != ClarificationTool {
		return next(ctx, call)
	}
	if c.Disabled {
		return &ToolResult{Message: model.Message{Content: "No person can answer questions in this run. Go on with your best judgment, do what was asked, and state the assumptions you made in your answer."}}, nil
	}
	var a clarificationArgs
	if err := json.Unmarshal([]byte(call.Call.Arguments), &a); err != nil || strings.TrimSpace(a.Question) == "" {
		return &ToolResult{Message: model.Message{Content: `Error: ask_clarification needs {"question": "..."}.`, Status: model.ToolStatusError}}, nil
	}
	typ := a.Type
	if !contains(clarificationTypes, typ) {
		typ = "missing_info"
	}
	var options []string
	for _, o := range a.Options {
		if o = strings.TrimSpace(o); o != "" && len(options) < 24 {
			options = append(options, clipText(o, 200))
		}
	}
	question := clipText(strings.TrimSpace(a.Question), 2000)
	if ctxText := strings.TrimSpace(a.Context); ctxText != "" {
		question = clipText(ctxText, 1000) + "\n\n" + question
	}
	intr := &protocol.Interrupt{Kind: protocol.InterruptClarification, RunID: rt.RunID, Question: question, Type: typ, Options: options, ToolCallID: call.Call.ID}
	u, err := state.SetValue(InterruptValue, intr)
	if err != nil {
		return nil, err
	}
	text := "Waiting for the person's answer to: " + question
	if len(options) > 0 {
		text += "\nOptions: " + strings.Join(options, " | ")
	}
	return &ToolResult{
		// A stable id: a retried question replaces its message
		// (deer-flow #2350).
		Message:   model.Message{ID: clarificationMsgID(call.Call.ID), Content: text},
		Update:    u,
		Interrupt: intr,
	}, nil
}

func clarificationMsgID(callID string) string { return "clarification_" + callID }

// BeforeAgent puts a resume's answer in place of the question's result.
func (c *Clarification) BeforeAgent(ctx context.Context, rt *Runtime, st *state.State) (Result, error) {
	if rt.Resume == nil {
		return Result{}, nil
	}
	var open protocol.Interrupt
	if ok, err := st.Value(InterruptValue, &open); !ok || err != nil || open.Kind != protocol.InterruptClarification {
		return Result{}, nil
	}
	answer, ok := protocol.ResumeAnswer(rt.Resume)
	if !ok {
		return Result{}, fmt.Errorf(`command.resume: the thread waits for an answer to %q; send {"resume":"..."} or {"resume":{"answer":"..."}}`, clipText(open.Question, 200))
	}
	i := st.Index(clarificationMsgID(open.ToolCallID))
	if i < 0 {
		return Result{}, fmt.Errorf("the question the thread waits for is gone from it (tool call %s)", open.ToolCallID)
	}
	answered := st.Messages[i]
	answered.Content = "The person answered: " + answer
	answered.Status = model.ToolStatusSuccess
	return Result{Update: state.Update{
		Messages: []model.Message{answered},
		Values:   map[string]json.RawMessage{InterruptValue: json.RawMessage("null")},
	}}, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// ProvidedTools implements ToolProvider.
func (*Clarification) ProvidedTools() []string { return []string{ClarificationTool} }
