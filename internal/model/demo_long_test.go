package model_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/tokens"
)

// The long reply is what the README says it is: the demo reports its
// usage in words, about 6,500 output tokens, while a tokenizer counts
// about 7,500 (what context compression sees).
func TestDemoLongReplyMatchesTheREADME(t *testing.T) {
	req := &model.Request{Tools: demoTools, Messages: []model.Message{{Role: model.RoleUser, Content: "give me a long reply"}}}
	resp, err := fastDemo().Generate(context.Background(), req, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Usage == nil {
		t.Fatal("no usage")
	}
	about := func(n int) string {
		r := (n + 250) / 500 * 500
		return fmt.Sprintf("%d,%03d", r/1000, r%1000)
	}
	reported := about(resp.Usage.CompletionTokens)
	c, err := tokens.ForEncoding(tokens.DefaultEncoding)
	if err != nil {
		t.Fatal(err)
	}
	counted := about(c.Count(resp.Message.Content))
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var line string
	for _, l := range strings.Split(string(readme), "\n") {
		if strings.HasPrefix(l, "- `give me a long reply`") {
			line = l
		}
	}
	if !strings.Contains(line, "about "+reported+" output tokens") || !strings.Contains(line, "about "+counted+" by a tokenizer") {
		t.Errorf("the demo reports %d output tokens (about %s) and a tokenizer counts about %s; the README says:\n%s",
			resp.Usage.CompletionTokens, reported, counted, line)
	}
}
