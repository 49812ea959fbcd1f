package openaitest

import "encoding/json"

// Prompt caching, simulated. Real providers cache a request's longest
// prefix they have seen before (tools, then the system prompt, then the
// messages in order) and report it as usage.prompt_tokens_details.
// cached_tokens. With SimulatePromptCache the server does the same, in
// bytes: a request's prompt is the canonical JSON of its tools and
// messages, in that order, its prompt_tokens are that prompt's length in
// bytes, and its cached_tokens the length of the longest common prefix
// with the previous request of the same conversation (the same first user
// message). Real providers count in tokens and cache in blocks (OpenAI:
// from 1,024 tokens, in steps of 128); bytes and no blocks keep the figure
// exact and the same for every encoding, so a test can compare layouts.

// SimulatePromptCache makes the server report every successful answer's
// usage as described above: prompt_tokens the prompt's bytes,
// cached_tokens the bytes shared with the conversation's previous
// request, completion_tokens the reply's text and arguments in bytes. A
// handler's own Usage is replaced.
func (s *Server) SimulatePromptCache() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.prompts == nil {
		s.prompts = make(map[string][]byte)
	}
}

// PromptBytes is the canonical prompt of a request: its tools, then its
// messages, each as JSON, in order.
func PromptBytes(req *Request) []byte {
	var b []byte
	for _, t := range req.Tools {
		j, _ := json.Marshal(t)
		b = append(b, j...)
	}
	for _, m := range req.Messages {
		w := struct {
			Role       string        `json:"role"`
			Name       string        `json:"name,omitempty"`
			Content    string        `json:"content"`
			Parts      []ContentPart `json:"parts,omitempty"`
			ToolCalls  []ToolCallMsg `json:"tool_calls,omitempty"`
			ToolCallID string        `json:"tool_call_id,omitempty"`
		}{m.Role, m.Name, m.Content, m.Parts, m.ToolCalls, m.ToolCallID}
		j, _ := json.Marshal(w)
		b = append(b, j...)
	}
	return b
}

// conversationKey tells a request's conversation: its first user message.
func conversationKey(req *Request) string {
	for _, m := range req.Messages {
		if m.Role == "user" {
			return m.Content
		}
	}
	return ""
}

// cachedUsage returns the simulated usage of a request about to be
// answered with reply, and remembers its prompt; ok is false when the
// simulation is off.
func (s *Server) cachedUsage(req *Request, reply Reply) (*Usage, bool) {
	s.mu.Lock()
	on := s.prompts != nil
	s.mu.Unlock()
	if !on {
		return nil, false
	}
	prompt := PromptBytes(req)
	key := conversationKey(req)
	s.mu.Lock()
	prev := s.prompts[key]
	s.prompts[key] = prompt
	s.mu.Unlock()
	n := 0
	for n < len(prev) && n < len(prompt) && prev[n] == prompt[n] {
		n++
	}
	out := len(reply.Text)
	for _, c := range reply.ToolCalls {
		out += len(c.Name) + len(c.Arguments)
	}
	return &Usage{PromptTokens: len(prompt), CompletionTokens: max(out, 1), CachedTokens: &n}, true
}
