package model

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// DemoToolName is the tool the demo model calls when it is offered.
const DemoToolName = "current_time"

// DemoModelName is the model name the demo model reports.
const DemoModelName = "natsagent-demo"

// DemoContextWindow is the context window a deployment gives the demo
// model: small, so the long reply ("long") fills it and the next turn
// shows context compression.
const DemoContextWindow = 8192

// The tools the demo's behaviours call, by their names in the chain
// (middleware and tools own them; the model package cannot import them).
const (
	demoWriteTool   = "write_file"
	demoAskTool     = "ask_clarification"
	demoTaskTool    = "task"
	demoSlowPieces  = 300
	demoLongLines   = 360
	demoLongPerPart = 12
)

// DemoOptions configures the demo model.
type DemoOptions struct {
	// WordDelay is the pause between streamed pieces, so the quickstart
	// visibly streams. Zero means 25ms; negative means no pause (tests).
	WordDelay time.Duration
	// SlowDelay is the pause between the pieces of the slow answer (a
	// message with "slow"): zero means 100ms, so its 300 pieces take half
	// a minute, long enough to cancel or steer by hand; negative means
	// no pause.
	SlowDelay time.Duration
}

// Demo is an offline stand-in used when no LLM is configured, so the
// quickstart still shows a whole run: streamed text, a tool call, a tool
// result and a final answer. A word in the person's message picks what it
// shows (DemoBehaviour): a slow answer to cancel or steer, a file write
// that waits for approval, a clarification question, a subagent, a reply
// long enough that the next turn compacts the thread. Everything it says
// starts with "[demo model]" so nobody mistakes it for a real model.
// Apart from tool call ids its answers are a pure function of the request.
type Demo struct {
	delay, slow time.Duration
}

var _ Model = (*Demo)(nil)

// NewDemo returns the offline demo model.
func NewDemo(opts DemoOptions) *Demo {
	d := opts.WordDelay
	if d == 0 {
		d = 25 * time.Millisecond
	}
	slow := opts.SlowDelay
	if slow == 0 {
		slow = 100 * time.Millisecond
	}
	return &Demo{delay: d, slow: slow}
}

// DemoBehaviour is what the demo model does with a person's message.
type DemoBehaviour string

// The demo's behaviours, each picked by a word of the message (the first
// rule that matches wins).
const (
	// DemoSlow ("slow"): a long answer streamed a piece every 100ms.
	DemoSlow DemoBehaviour = "slow"
	// DemoWrite ("write"): calls write_file, which waits for a person's
	// approval in the default approval mode.
	DemoWrite DemoBehaviour = "write"
	// DemoAsk ("ask", "clarify"): asks the person a question with
	// ask_clarification; the run waits for the answer.
	DemoAsk DemoBehaviour = "ask"
	// DemoSubagent ("subagent", "task"): delegates to a subagent with the
	// task tool and quotes its answer.
	DemoSubagent DemoBehaviour = "subagent"
	// DemoLong ("long"): a reply of about 6,500 words (7,500 tokens by a
	// tokenizer; its usage counts words, as all the demo's), so the next turn's
	// request passes the compression trigger of DemoContextWindow.
	DemoLong DemoBehaviour = "long"
	// DemoTime (anything else): calls current_time and quotes it.
	DemoTime DemoBehaviour = "time"
)

var demoWords = []struct {
	words []string
	b     DemoBehaviour
}{
	{[]string{"slow", "slowly"}, DemoSlow},
	{[]string{"write"}, DemoWrite},
	{[]string{"ask", "clarify"}, DemoAsk},
	{[]string{"subagent", "task"}, DemoSubagent},
	{[]string{"long"}, DemoLong},
}

// PickDemoBehaviour is the behaviour a message asks the demo for: the
// first rule with one of its words in the message, case-insensitive,
// whole words only.
func PickDemoBehaviour(message string) DemoBehaviour {
	have := make(map[string]bool)
	for _, w := range strings.FieldsFunc(strings.ToLower(message), func(r rune) bool { return !unicode.IsLetter(r) }) {
		have[w] = true
	}
	for _, rule := range demoWords {
		for _, w := range rule.words {
			if have[w] {
				return rule.b
			}
		}
	}
	return DemoTime
}

// DefaultModel implements Defaulted.
func (d *Demo) DefaultModel() string { return DemoModelName }

// Generate implements Model. An agent's turn (a request that offers
// tools) does what the person's last message picked: at most one tool
// call, then an answer that quotes its result. A request without tools (a
// summary, a title) gets a short plain answer, whatever words it quotes.
func (d *Demo) Generate(ctx context.Context, req *Request, onDelta func(Delta)) (*Response, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("model: demo: %w", err)
	}

	lastUser := -1
	for i, m := range req.Messages {
		if m.Role == RoleUser && m.Name != ContextMessageName {
			lastUser = i
		}
	}
	// The most recent tool result of this turn, if any.
	var result *Message
	for i := lastUser + 1; i < len(req.Messages); i++ {
		if req.Messages[i].Role == RoleTool {
			result = &req.Messages[i]
		}
	}
	behaviour := DemoTime
	if lastUser >= 0 && len(req.Tools) > 0 {
		behaviour = PickDemoBehaviour(req.Messages[lastUser].Content)
	}

	resp := &Response{Message: Message{Role: RoleAssistant}, Model: DemoModelName}
	var text string
	call, missing := d.toolCall(req, behaviour)
	delay, pieces := d.delay, words
	switch {
	case result == nil && call != nil:
		text = "[demo model] " + call.say
		resp.Message.ToolCalls = []ToolCall{{ID: newCallID(), Name: call.name, Arguments: call.args}}
		resp.FinishReason = FinishToolCalls
	case result == nil && behaviour == DemoSlow:
		text, delay = slowAnswer(d.slow), d.slow
		resp.FinishReason = FinishStop
	case result == nil && behaviour == DemoLong:
		text, pieces = longAnswer(), lines
		resp.FinishReason = FinishStop
	default:
		text = d.finalAnswer(req, lastUser, result, missing)
		resp.FinishReason = FinishStop
	}

	if err := stream(ctx, pieces(text), delay, onDelta); err != nil {
		return nil, err
	}
	resp.Message.Content = text
	resp.Usage = &Usage{
		PromptTokens:     requestWords(req),
		CompletionTokens: countWords(text) + len(resp.Message.ToolCalls),
	}
	resp.Usage.TotalTokens = resp.Usage.PromptTokens + resp.Usage.CompletionTokens
	return resp, nil
}

// demoCall is the tool call a behaviour makes, and what the demo says
// while making it.
type demoCall struct {
	name, args, say string
}

// toolCall is the call behaviour b makes when its tool is offered; missing
// names the tool it wanted when it is not (a subagent has no write_file
// in the default approval mode, nor task, nor ask_clarification).
func (d *Demo) toolCall(req *Request, b DemoBehaviour) (call *demoCall, missing string) {
	spec := func(name string) *ToolSpec {
		for i := range req.Tools {
			if req.Tools[i].Name == name {
				return &req.Tools[i]
			}
		}
		return nil
	}
	want := map[DemoBehaviour]string{DemoWrite: demoWriteTool, DemoAsk: demoAskTool, DemoSubagent: demoTaskTool}[b]
	if want != "" && spec(want) == nil {
		missing = want
	}
	switch {
	case b == DemoWrite && missing == "":
		return &demoCall{name: demoWriteTool, args: `{"path":"/demo.txt","content":"Written by the natsagent demo model.\n"}`,
			say: "I will write /demo.txt with the write_file tool; it waits for your approval."}, ""
	case b == DemoAsk && missing == "":
		return &demoCall{name: demoAskTool, args: `{"question":"Which city should I look at?","type":"approach_choice","options":["Paris","Lyon","Marseille"]}`,
			say: "I need to know one thing first."}, ""
	case b == DemoSubagent && missing == "":
		subagent := firstSubagent(spec(demoTaskTool))
		if subagent == "" {
			return nil, demoTaskTool
		}
		args, _ := json.Marshal(map[string]string{"description": "Tell me the current time.", "subagent_type": subagent})
		return &demoCall{name: demoTaskTool, args: string(args),
			say: "I will hand this to the " + subagent + " subagent with the task tool and wait for its answer."}, ""
	case b == DemoTime || missing != "":
		if spec(DemoToolName) != nil {
			return &demoCall{name: DemoToolName, args: "{}", say: "Let me look up the current time with the " + DemoToolName + " tool."}, missing
		}
	}
	return nil, missing
}

// firstSubagent is the first subagent the task tool's schema offers.
func firstSubagent(task *ToolSpec) string {
	var schema struct {
		Properties struct {
			SubagentType struct {
				Enum []string `json:"enum"`
			} `json:"subagent_type"`
		} `json:"properties"`
	}
	if task == nil || json.Unmarshal(task.Parameters, &schema) != nil || len(schema.Properties.SubagentType.Enum) == 0 {
		return ""
	}
	return schema.Properties.SubagentType.Enum[0]
}

// slowAnswer counts to demoSlowPieces, one number a piece.
func slowAnswer(delay time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[demo model] A slow answer, one number every %s, so you can cancel it or steer me with a new message: ", delay)
	for i := 1; i <= demoSlowPieces; i++ {
		b.WriteString(strconv.Itoa(i))
		b.WriteString(" ")
	}
	b.WriteString("Done.")
	return b.String()
}

// longAnswer is about 6,500 words, which the demo's usage reports as
// output tokens, and about 7,500 tokens (by cl100k and o200k alike), most of
// DemoContextWindow: the next turn's request passes the compression
// trigger (80% of the window), so that turn summarizes this one first.
func longAnswer() string {
	var b strings.Builder
	b.WriteString("[demo model] A long reply, so that your next message makes the thread compact its older messages into a summary.\n")
	for i := 1; i <= demoLongLines; i++ {
		fmt.Fprintf(&b, "Line %d of the long demo reply: these words only fill the context window of the demo model.\n", i)
	}
	return b.String()
}

func (d *Demo) finalAnswer(req *Request, lastUser int, result *Message, missing string) string {
	var b strings.Builder
	b.WriteString("[demo model] ")
	if result != nil {
		name := "the tool"
		if result.Name != "" {
			name = "the " + result.Name + " tool"
		}
		fmt.Fprintf(&b, "According to %s: \"%s\" ", name, brief(result.Content, 200))
	}
	if lastUser >= 0 {
		fmt.Fprintf(&b, "You wrote: \"%s\" ", brief(req.Messages[lastUser].Content, 80))
	}
	if missing != "" {
		fmt.Fprintf(&b, "(I would have called %s, but it is not offered here.) ", missing)
	}
	b.WriteString("I am an offline demo model, so that is all I can do. " +
		"Words that show more: slow, write, ask, subagent, long. " +
		"To use a real LLM, set OPENAI_BASE_URL, OPENAI_API_KEY and NATSAGENT_MODEL.")
	return b.String()
}

// stream sends pieces, pausing delay between them, and gives up as soon
// as ctx ends.
func stream(ctx context.Context, pieces []string, delay time.Duration, onDelta func(Delta)) error {
	for i, piece := range pieces {
		if i > 0 && delay > 0 {
			timer := time.NewTimer(delay)
			select {
			case <-ctx.Done():
				timer.Stop()
				return fmt.Errorf("model: demo: %w", ctx.Err())
			case <-timer.C:
			}
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("model: demo: %w", err)
		}
		if onDelta != nil {
			onDelta(Delta{Content: piece})
		}
	}
	return nil
}

// lines splits s into pieces of demoLongPerPart lines, which concatenate
// back to s exactly.
func lines(s string) []string {
	var out []string
	for s != "" {
		cut := 0
		for n := 0; n < demoLongPerPart && cut < len(s); n++ {
			i := strings.IndexByte(s[cut:], '\n')
			if i < 0 {
				cut = len(s)
				break
			}
			cut += i + 1
		}
		out = append(out, s[:cut])
		s = s[cut:]
	}
	return out
}

// words splits s into words that keep their trailing whitespace, so the
// pieces concatenate back to s exactly.
func words(s string) []string {
	var out []string
	start := 0
	inSpace := false
	for i, r := range s {
		space := unicode.IsSpace(r)
		if inSpace && !space {
			out = append(out, s[start:i])
			start = i
		}
		inSpace = space
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

func countWords(s string) int { return len(strings.Fields(s)) }

// requestWords approximates prompt tokens by words: usage only has to be
// plausible and non-nil so the usage plumbing is exercised offline.
func requestWords(req *Request) int {
	n := 0
	for _, m := range req.Messages {
		n += countWords(m.Content)
		for _, tc := range m.ToolCalls {
			n += 1 + countWords(tc.Arguments)
		}
	}
	return n
}

// brief flattens s to one line and shortens it to at most limit runes.
func brief(s string, limit int) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) <= limit {
		return s
	}
	r := []rune(s)
	return string(r[:limit]) + "…"
}

// newCallID returns a random id: a counter would repeat after a worker
// restart and collide with ids already in a resumed transcript.
func newCallID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "call_demo_" + hex.EncodeToString(b[:])
}
