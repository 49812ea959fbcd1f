package memory

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nuid"
)

// Categories a fact may have; the extraction model's unknown ones become
// "other".
var Categories = []string{"preference", "correction", "context", "goal", "behavior", "identity", "constraint", "decision", "other"}

// MaxFactChars bounds one fact's content.
const MaxFactChars = 500

// MaxFactsPerAnswer bounds the facts taken from one extraction answer.
const MaxFactsPerAnswer = 20

// MergeOptions configure MergeFacts.
type MergeOptions struct {
	// MinConfidence: incoming facts below it are dropped.
	MinConfidence float64
	// MaxFacts caps the result; the lowest confidence is evicted first
	// (default 100).
	MaxFacts int
	// Thread is recorded as the source of new facts.
	Thread string
	Now    time.Time
}

// MergeFacts merges incoming facts into current: incoming facts below
// MinConfidence are dropped; one with the same normalized content as a
// current fact updates it (the higher confidence wins, with its wording
// and category) instead of adding a duplicate; the result is capped at
// MaxFacts, evicting the lowest confidence (then the least recently
// updated). The result is ordered by confidence, highest first.
func MergeFacts(current, incoming []Fact, opts MergeOptions) []Fact {
	if opts.MaxFacts <= 0 {
		opts.MaxFacts = 100
	}
	if opts.Now.IsZero() {
		opts.Now = time.Now().UTC()
	}
	out := slices.Clone(current)
	index := make(map[string]int, len(out))
	for i, f := range out {
		index[normalize(f.Content)] = i
	}
	for _, f := range incoming {
		content := strings.Join(strings.Fields(f.Content), " ")
		if content == "" || f.Confidence < opts.MinConfidence {
			continue
		}
		key := normalize(content)
		if i, ok := index[key]; ok {
			cur := &out[i]
			if f.Confidence > cur.Confidence {
				cur.Content, cur.Category, cur.Confidence = content, f.Category, f.Confidence
			}
			cur.UpdatedAt = opts.Now
			if opts.Thread != "" {
				cur.SourceThread = opts.Thread
			}
			continue
		}
		index[key] = len(out)
		out = append(out, Fact{
			ID: "fact_" + nuid.Next(), Content: content, Category: f.Category, Confidence: f.Confidence,
			CreatedAt: opts.Now, UpdatedAt: opts.Now, SourceThread: opts.Thread,
		})
	}
	slices.SortStableFunc(out, func(a, b Fact) int {
		if a.Confidence != b.Confidence {
			if a.Confidence > b.Confidence {
				return -1
			}
			return 1
		}
		return b.UpdatedAt.Compare(a.UpdatedAt)
	})
	if len(out) > opts.MaxFacts {
		out = out[:opts.MaxFacts]
	}
	return out
}

// ParseFacts decodes an extraction model's answer strictly: exactly one
// JSON object {"facts": [{"content", "category", "confidence"}]} and
// nothing else (one surrounding Markdown code fence is tolerated). Every
// fact needs a content of at most MaxFactChars characters and a
// confidence from 0 to 1; an unknown category becomes "other". At most
// MaxFactsPerAnswer facts are taken.
func ParseFacts(answer string) ([]Fact, error) {
	text := strings.TrimSpace(answer)
	if body, ok := strings.CutPrefix(text, "```"); ok {
		body = strings.TrimPrefix(body, "json")
		body, ok = strings.CutSuffix(strings.TrimSpace(body), "```")
		if !ok {
			return nil, errors.New("the answer opens a code fence it does not close")
		}
		text = strings.TrimSpace(body)
	}
	var doc struct {
		Facts *[]struct {
			Content    *string  `json:"content"`
			Category   string   `json:"category"`
			Confidence *float64 `json:"confidence"`
		} `json:"facts"`
	}
	dec := json.NewDecoder(strings.NewReader(text))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("the answer is not the facts JSON object: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("the answer has text after the JSON object")
	}
	if doc.Facts == nil {
		return nil, errors.New(`the answer has no "facts" array`)
	}
	var out []Fact
	for i, f := range *doc.Facts {
		if f.Content == nil || strings.TrimSpace(*f.Content) == "" {
			return nil, fmt.Errorf("facts[%d]: content is missing or empty", i)
		}
		if n := utf8.RuneCountInString(*f.Content); n > MaxFactChars {
			return nil, fmt.Errorf("facts[%d]: content has %d characters, more than %d", i, n, MaxFactChars)
		}
		if f.Confidence == nil || *f.Confidence < 0 || *f.Confidence > 1 {
			return nil, fmt.Errorf("facts[%d]: confidence must be a number from 0 to 1", i)
		}
		category := strings.ToLower(strings.TrimSpace(f.Category))
		if !slices.Contains(Categories, category) {
			category = "other"
		}
		if len(out) < MaxFactsPerAnswer {
			out = append(out, Fact{Content: strings.TrimSpace(*f.Content), Category: category, Confidence: *f.Confidence})
		}
	}
	return out, nil
}
