package model

import (
	"context"
	"errors"
	"fmt"
	"strings"

	openai "github.com/sashabaranov/go-openai"
)

// Embedder turns texts into vectors, one per text, in order. The store's
// semantic search uses it (internal/store).
type Embedder interface {
	Embed(ctx context.Context, texts []string) ([][]float32, error)
}

// EmbeddingsConfig configures a client for an OpenAI-compatible
// /embeddings endpoint.
type EmbeddingsConfig struct {
	// BaseURL is the API root including the version, e.g.
	// http://localhost:8000/v1; empty means https://api.openai.com/v1.
	BaseURL string
	// APIKey is sent as a bearer token; empty sends none.
	APIKey string
	// Model is the embeddings model, e.g. text-embedding-3-small.
	Model string
	// Dimensions asks the model for vectors of this size (0: the model's
	// own; only text-embedding-3 and later honour it).
	Dimensions int
}

// OpenAIEmbeddings is an Embedder backed by an OpenAI-compatible
// /embeddings endpoint, through the same client library as OpenAI. It is
// safe for concurrent use.
type OpenAIEmbeddings struct {
	client *openai.Client
	cfg    EmbeddingsConfig
}

var _ Embedder = (*OpenAIEmbeddings)(nil)

// NewOpenAIEmbeddings returns a client for cfg. It does not contact the
// provider.
func NewOpenAIEmbeddings(cfg EmbeddingsConfig) (*OpenAIEmbeddings, error) {
	if strings.TrimSpace(cfg.Model) == "" {
		return nil, errors.New("model: an embeddings provider needs a model name")
	}
	oc := openai.DefaultConfig(cfg.APIKey)
	if cfg.BaseURL != "" {
		oc.BaseURL = cfg.BaseURL
	}
	return &OpenAIEmbeddings{client: openai.NewClientWithConfig(oc), cfg: cfg}, nil
}

// Embed implements Embedder with one request for all texts.
func (o *OpenAIEmbeddings) Embed(ctx context.Context, texts []string) ([][]float32, error) {
	if len(texts) == 0 {
		return nil, nil
	}
	res, err := o.client.CreateEmbeddings(ctx, openai.EmbeddingRequestStrings{
		Input: texts, Model: openai.EmbeddingModel(o.cfg.Model), Dimensions: o.cfg.Dimensions,
		EncodingFormat: openai.EmbeddingEncodingFormatFloat,
	})
	if err != nil {
		return nil, convertError(ctx, err)
	}
	if len(res.Data) != len(texts) {
		return nil, fmt.Errorf("model: embeddings: %d vectors for %d texts", len(res.Data), len(texts))
	}
	out := make([][]float32, len(texts))
	for _, d := range res.Data {
		if d.Index < 0 || d.Index >= len(texts) || out[d.Index] != nil {
			return nil, fmt.Errorf("model: embeddings: index %d out of place", d.Index)
		}
		if len(d.Embedding) == 0 {
			return nil, fmt.Errorf("model: embeddings: empty vector for text %d", d.Index)
		}
		out[d.Index] = d.Embedding
	}
	return out, nil
}
