package model_test

import (
	"context"
	"slices"
	"testing"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/model/openaitest"
)

func TestOpenAIEmbeddings(t *testing.T) {
	srv := openaitest.NewServer(t, nil)
	e, err := model.NewOpenAIEmbeddings(model.EmbeddingsConfig{BaseURL: srv.URL(), Model: "embed-test"})
	if err != nil {
		t.Fatal(err)
	}
	texts := []string{"cats like fish", "dogs like bones", "cats like fish"}
	vs, err := e.Embed(context.Background(), texts)
	if err != nil {
		t.Fatal(err)
	}
	if len(vs) != 3 {
		t.Fatalf("%d vectors for 3 texts", len(vs))
	}
	for i, v := range vs {
		if !slices.Equal(v, openaitest.Embed(texts[i])) {
			t.Fatalf("vector %d is not the server's for %q", i, texts[i])
		}
	}
	if slices.Equal(vs[0], vs[1]) {
		t.Fatal("different texts got the same vector")
	}
	if srv.EmbeddingCount() != 1 {
		t.Fatalf("%d requests for one Embed call, want 1", srv.EmbeddingCount())
	}
	if _, err := model.NewOpenAIEmbeddings(model.EmbeddingsConfig{BaseURL: srv.URL()}); err == nil {
		t.Fatal("a config without a model was accepted")
	}
	bad, _ := model.NewOpenAIEmbeddings(model.EmbeddingsConfig{BaseURL: srv.URL() + "/nowhere", Model: "m"})
	if _, err := bad.Embed(context.Background(), []string{"x"}); err == nil {
		t.Fatal("a 404 from the provider was not an error")
	}
}
