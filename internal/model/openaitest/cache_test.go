package openaitest_test

import (
	"context"
	"testing"

	openai "github.com/sashabaranov/go-openai"

	"github.com/natsagent/natsagent/internal/model/openaitest"
)

// The simulated cache reports, per conversation, the bytes a request
// shares with that conversation's previous request.
func TestSimulatePromptCache(t *testing.T) {
	srv := openaitest.NewServer(t, nil)
	srv.SimulatePromptCache()
	c := newClient(srv)
	ask := func(msgs ...openai.ChatCompletionMessage) openai.Usage {
		t.Helper()
		resp, err := c.CreateChatCompletion(context.Background(), openai.ChatCompletionRequest{Model: "m", Messages: msgs})
		if err != nil {
			t.Fatal(err)
		}
		if resp.Usage.PromptTokensDetails == nil {
			t.Fatalf("no prompt_tokens_details: %+v", resp.Usage)
		}
		return resp.Usage
	}
	sys := openai.ChatCompletionMessage{Role: "system", Content: "You are terse."}
	u1 := openai.ChatCompletionMessage{Role: "user", Content: "first question"}
	a1 := openai.ChatCompletionMessage{Role: "assistant", Content: "first answer"}
	u2 := openai.ChatCompletionMessage{Role: "user", Content: "second question"}

	first := ask(sys, u1)
	if first.PromptTokensDetails.CachedTokens != 0 || first.PromptTokens == 0 {
		t.Fatalf("first request: %+v", first)
	}
	second := ask(sys, u1, a1, u2)
	// The first prompt is a strict prefix of the second.
	if second.PromptTokensDetails.CachedTokens != first.PromptTokens {
		t.Fatalf("second request cached %d of the first's %d bytes", second.PromptTokensDetails.CachedTokens, first.PromptTokens)
	}
	if second.PromptTokens <= first.PromptTokens {
		t.Fatalf("second prompt %d bytes, first %d", second.PromptTokens, first.PromptTokens)
	}
	// A changed system prompt shares only its common start.
	changed := ask(openai.ChatCompletionMessage{Role: "system", Content: "You are verbose."}, u1, a1, u2)
	if got := changed.PromptTokensDetails.CachedTokens; got == 0 || got >= first.PromptTokens/2 {
		t.Fatalf("a changed system prompt still cached %d bytes of %d", got, changed.PromptTokens)
	}
	// Another conversation has its own history.
	other := ask(sys, openai.ChatCompletionMessage{Role: "user", Content: "unrelated"})
	if other.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("another conversation cached %d bytes", other.PromptTokensDetails.CachedTokens)
	}
	if got, want := len(openaitest.PromptBytes(&srv.Requests()[1])), second.PromptTokens; got != want {
		t.Fatalf("PromptBytes = %d bytes, usage says %d", got, want)
	}
}
