package openaitest

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"net/http"
	"strings"
	"unicode"
)

// embeddingsPath is the OpenAI-compatible embeddings endpoint.
const embeddingsPath = "/v1/embeddings"

// EmbeddingDims is the size of the vectors the server answers with.
const EmbeddingDims = 64

// Embed is the vector the server answers for text: a bag of its words,
// each lower-cased word hashed to one of EmbeddingDims dimensions, so
// texts that share words are close (cosine) and tests can predict the
// order of a semantic search.
func Embed(text string) []float32 {
	v := make([]float32, EmbeddingDims)
	for _, w := range strings.FieldsFunc(strings.ToLower(text), func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) }) {
		h := fnv.New32a()
		h.Write([]byte(w))
		v[h.Sum32()%EmbeddingDims]++
	}
	var n float64
	for _, x := range v {
		n += float64(x) * float64(x)
	}
	if n == 0 {
		v[0] = 1
		return v
	}
	for i := range v {
		v[i] = float32(float64(v[i]) / math.Sqrt(n))
	}
	return v
}

// EmbeddingCount is the number of embeddings requests received so far.
func (s *Server) EmbeddingCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.embeddings
}

func (s *Server) serveEmbeddings(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		writeError(w, http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed",
			"openaitest: embeddings only accept POST")
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	var req struct {
		Input json.RawMessage `json:"input"`
		Model string          `json:"model"`
	}
	var texts []string
	if err := json.Unmarshal(body, &req); err == nil && req.Model != "" {
		var one string
		if json.Unmarshal(req.Input, &one) == nil {
			texts = []string{one}
		} else if json.Unmarshal(req.Input, &texts) != nil {
			texts = nil
		}
	}
	s.mu.Lock()
	s.embeddings++
	s.mu.Unlock()
	if len(texts) == 0 {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_input",
			fmt.Sprintf("openaitest: embeddings need a model and a non-empty input (string or array of strings): %s", body))
		return
	}
	type datum struct {
		Object    string    `json:"object"`
		Index     int       `json:"index"`
		Embedding []float32 `json:"embedding"`
	}
	out := struct {
		Object string  `json:"object"`
		Data   []datum `json:"data"`
		Model  string  `json:"model"`
		Usage  struct {
			PromptTokens int `json:"prompt_tokens"`
			TotalTokens  int `json:"total_tokens"`
		} `json:"usage"`
	}{Object: "list", Model: req.Model}
	for i, t := range texts {
		out.Data = append(out.Data, datum{Object: "embedding", Index: i, Embedding: Embed(t)})
		out.Usage.PromptTokens += len(strings.Fields(t))
	}
	out.Usage.TotalTokens = out.Usage.PromptTokens
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}
