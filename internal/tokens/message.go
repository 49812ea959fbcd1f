package tokens

import (
	"github.com/natsagent/natsagent/internal/model"
)

// Overheads of OpenAI's chat format, after the OpenAI cookbook's
// num_tokens_from_messages (gpt-4, gpt-4o): every message is framed by 3
// tokens plus its role (one token for every role), a name costs one more,
// and the reply is primed with 3. Tool calls and tool schemas have no
// published formula; the figures below were fitted loosely to what the
// OpenAI API reports and are estimates, as are all counts for providers
// whose tokenizer is not tiktoken's.
const (
	PerMessage   = 3
	PerRole      = 1
	PerName      = 1
	ReplyPriming = 3
	// PerToolCall frames one call of an assistant message, besides its
	// name and arguments.
	PerToolCall = 3
	// PerTool frames one tool schema, besides its name, description and
	// parameters; ToolsOverhead is paid once when any tool is offered.
	PerTool       = 8
	ToolsOverhead = 12
)

// Message counts one message as it is sent: framing, role, name, content,
// tool calls and the tool call id it answers. Meta and Status are never
// sent and never counted.
func Message(c Counter, m *model.Message) int {
	n := PerMessage + PerRole + c.Count(m.Content)
	if m.Name != "" {
		n += PerName + c.Count(m.Name)
	}
	if m.ToolCallID != "" {
		n += c.Count(m.ToolCallID)
	}
	for i := range m.ToolCalls {
		n += toolCall(c, &m.ToolCalls[i])
	}
	return n
}

func toolCall(c Counter, tc *model.ToolCall) int {
	return PerToolCall + c.Count(tc.Name) + c.Count(tc.Arguments)
}

// Output counts what a model produced in a response message (its
// completion): content and tool calls, without the framing of a prompt
// message.
func Output(c Counter, m *model.Message) int {
	n := c.Count(m.Content)
	for i := range m.ToolCalls {
		n += toolCall(c, &m.ToolCalls[i])
	}
	return n
}

// System counts a system prompt sent as the leading system message (0 for
// none).
func System(c Counter, prompt string) int {
	if prompt == "" {
		return 0
	}
	return PerMessage + PerRole + c.Count(prompt)
}

// Tool counts one tool schema.
func Tool(c Counter, t *model.ToolSpec) int {
	return PerTool + c.Count(t.Name) + c.Count(t.Description) + c.Count(string(t.Parameters))
}

// Tools counts the tool schemas offered to a model.
func Tools(c Counter, specs []model.ToolSpec) int {
	if len(specs) == 0 {
		return 0
	}
	n := ToolsOverhead
	for i := range specs {
		n += Tool(c, &specs[i])
	}
	return n
}

// RequestCount is a model request's size in tokens, by part.
type RequestCount struct {
	System   int `json:"system_tokens"`
	Messages int `json:"messages_tokens"`
	Tools    int `json:"tools_tokens"`
	// Total is the whole prompt: the parts plus the reply priming.
	Total int `json:"total_tokens"`
}

func (r *RequestCount) sum() {
	r.Total = r.System + r.Messages + r.Tools + ReplyPriming
}

// Request counts a whole request without a cache: system prompt, messages
// and tool schemas.
func Request(c Counter, system string, msgs []model.Message, specs []model.ToolSpec) RequestCount {
	r := RequestCount{System: System(c, system), Tools: Tools(c, specs)}
	for i := range msgs {
		r.Messages += Message(c, &msgs[i])
	}
	r.sum()
	return r
}
