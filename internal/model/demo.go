package model

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// DemoToolName is the tool the demo model calls when it is offered.
const DemoToolName = "current_time"

// DemoModelName is the model name the demo model reports.
const DemoModelName = "natsagent-demo"

// DemoOptions configures the demo model.
type DemoOptions struct {
	// WordDelay is the pause between streamed pieces, so the quickstart
	// visibly streams. Zero means 25ms; negative means no pause (tests).
	WordDelay time.Duration
}

// Demo is an offline stand-in used when no LLM is configured, so the
// quickstart still shows a whole run: streamed text, a tool call, a tool
// result and a final answer. Everything it says starts with "[demo model]"
// so nobody mistakes it for a real model. Apart from tool call ids its
// answers are a pure function of the request.
type Demo struct {
	delay time.Duration
}

var _ Model = (*Demo)(nil)

// NewDemo returns the offline demo model.
func NewDemo(opts DemoOptions) *Demo {
	d := opts.WordDelay
	if d == 0 {
		d = 25 * time.Millisecond
	}
	return &Demo{delay: d}
}

// Generate implements Model. It calls current_time once per user turn when
// the tool is offered, then answers by quoting the tool result.
func (d *Demo) Generate(ctx context.Context, req *Request, onDelta func(Delta)) (*Response, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("model: demo: %w", err)
	}

	lastUser := -1
	for i, m := range req.Messages {
		if m.Role == RoleUser {
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

	offered := false
	for _, t := range req.Tools {
		if t.Name == DemoToolName {
			offered = true
			break
		}
	}

	resp := &Response{Message: Message{Role: RoleAssistant}, Model: DemoModelName}
	var text string
	if offered && result == nil {
		text = "[demo model] Let me look up the current time with the " + DemoToolName + " tool."
		resp.Message.ToolCalls = []ToolCall{{ID: newCallID(), Name: DemoToolName, Arguments: "{}"}}
		resp.FinishReason = FinishToolCalls
	} else {
		text = d.finalAnswer(req, lastUser, result)
		resp.FinishReason = FinishStop
	}

	if err := d.stream(ctx, text, onDelta); err != nil {
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

func (d *Demo) finalAnswer(req *Request, lastUser int, result *Message) string {
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
	b.WriteString("I am an offline demo model, so that is all I can do. " +
		"To use a real LLM, set OPENAI_BASE_URL, OPENAI_API_KEY and NATSAGENT_MODEL.")
	return b.String()
}

// stream sends text a word at a time, pausing between pieces, and gives up
// as soon as ctx ends.
func (d *Demo) stream(ctx context.Context, text string, onDelta func(Delta)) error {
	for i, piece := range words(text) {
		if i > 0 && d.delay > 0 {
			timer := time.NewTimer(d.delay)
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
