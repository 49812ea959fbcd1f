package model

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"
)

// Reply is one answer of a Scripted model.
type Reply struct {
	Text      string
	ToolCalls []ToolCall
	// Pieces splits Text into that many streamed deltas (default 1).
	Pieces int
	// Delay passes before the first delta, PieceDelay between deltas.
	Delay      time.Duration
	PieceDelay time.Duration
	// Err fails the call (after Delay).
	Err          error
	FinishReason string
	Usage        *Usage
}

// Scripted is an in-process model whose answers a function decides. Tests
// and the bench command use it to measure the run queue without HTTP.
type Scripted struct {
	reply func(call int, req *Request) Reply
	mu    sync.Mutex
	calls int
	reqs  []*Request
	keep  bool
}

// NewScripted returns a model answering call n (from 0) with reply(n, req).
func NewScripted(reply func(call int, req *Request) Reply) *Scripted {
	return &Scripted{reply: reply, keep: true}
}

// NewFixed returns a model that answers every call with the same reply and
// keeps no record of requests (for benchmarks).
func NewFixed(r Reply) *Scripted {
	return &Scripted{reply: func(int, *Request) Reply { return r }}
}

// Calls returns how many calls the model received.
func (s *Scripted) Calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

// Requests returns copies of the requests received so far.
func (s *Scripted) Requests() []*Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*Request(nil), s.reqs...)
}

// Generate implements Model.
func (s *Scripted) Generate(ctx context.Context, req *Request, onDelta func(Delta)) (*Response, error) {
	s.mu.Lock()
	n := s.calls
	s.calls++
	if s.keep {
		// Tests see the request as a provider would: the system prompt as
		// the leading message.
		c := req.Clone()
		c.Messages, c.System = c.WithSystem(), ""
		req = c
		s.reqs = append(s.reqs, c)
	}
	s.mu.Unlock()
	r := s.reply(n, req)
	if err := pause(ctx, r.Delay); err != nil {
		return nil, err
	}
	if r.Err != nil {
		return nil, r.Err
	}
	pieces := split(r.Text, r.Pieces)
	for i, p := range pieces {
		if i > 0 {
			if err := pause(ctx, r.PieceDelay); err != nil {
				return nil, err
			}
		}
		if onDelta != nil {
			onDelta(Delta{Content: p})
		}
	}
	finish := r.FinishReason
	if finish == "" {
		finish = FinishStop
		if len(r.ToolCalls) > 0 {
			finish = FinishToolCalls
		}
	}
	return &Response{
		Message:      Message{Role: RoleAssistant, Content: r.Text, ToolCalls: append([]ToolCall(nil), r.ToolCalls...)},
		FinishReason: finish,
		Usage:        r.Usage,
		Model:        "scripted",
	}, nil
}

func pause(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("model call stopped: %w", err)
		}
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return fmt.Errorf("model call stopped: %w", ctx.Err())
	case <-t.C:
		return nil
	}
}

// split cuts s into n pieces of about equal length (at least one piece
// when s is not empty).
func split(s string, n int) []string {
	if s == "" {
		return nil
	}
	if n <= 1 {
		return []string{s}
	}
	words := strings.SplitAfter(s, " ")
	if len(words) < n {
		n = len(words)
	}
	out := make([]string, 0, n)
	per := (len(words) + n - 1) / n
	for i := 0; i < len(words); i += per {
		out = append(out, strings.Join(words[i:min(i+per, len(words))], ""))
	}
	return out
}
