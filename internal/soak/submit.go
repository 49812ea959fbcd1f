package soak

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/natsagent/natsagent/internal/protocol"
)

// Submitter submits runs through a gateway's HTTP API the way a careful
// client does: it chooses the run id, and on any error that may be
// transient (no answer, 5xx, 429) it sends the same request again, so the
// gateway's dedupe by run id is what keeps it one run.
type Submitter struct {
	// BaseURL is the gateway's address ("http://127.0.0.1:8080").
	BaseURL string
	Client  *http.Client
	// Agent runs the submissions (default protocol.DefaultAgent).
	Agent string
	// Timeout bounds one attempt (default 30s); an attempt that times
	// out is sent again.
	Timeout time.Duration

	mu      sync.Mutex
	retries map[string]int
}

// Submit sends one run until the gateway accepts it or ctx ends. A
// refusal that a retry cannot change (4xx other than 429) is returned.
func (s *Submitter) Submit(ctx context.Context, ref RunRef, text string) error {
	agent := s.Agent
	if agent == "" {
		agent = protocol.DefaultAgent
	}
	body, err := json.Marshal(map[string]any{
		"run_id": ref.Run,
		"agent":  agent,
		"input":  map[string]any{"messages": []map[string]string{{"role": "user", "content": text}}},
	})
	if err != nil {
		return err
	}
	client := s.Client
	if client == nil {
		client = http.DefaultClient
	}
	url := strings.TrimSuffix(s.BaseURL, "/") + "/threads/" + ref.Thread + "/runs"
	backoff := 50 * time.Millisecond
	for {
		status, msg, err := s.post(ctx, client, url, ref.Tenant, body)
		switch {
		case err == nil && status == http.StatusOK:
			return nil
		case err == nil && status >= 400 && status < 500 && status != http.StatusTooManyRequests:
			return fmt.Errorf("run %s refused: %d %s", ref.Run, status, msg)
		case err != nil:
			s.count("no answer")
		default:
			s.count(fmt.Sprintf("%d", status))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("run %s not accepted before the end: %w", ref.Run, ctx.Err())
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

func (s *Submitter) post(ctx context.Context, client *http.Client, url, tenant string, body []byte) (int, string, error) {
	timeout := s.Timeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Tenant", tenant)
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, strings.TrimSpace(string(data)), nil
}

func (s *Submitter) count(reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.retries == nil {
		s.retries = map[string]int{}
	}
	s.retries[reason]++
}

// Retries returns how many submissions were sent again, by what the
// previous attempt got ("no answer", or the HTTP status).
func (s *Submitter) Retries() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.retries))
	for k, v := range s.retries {
		out[k] = v
	}
	return out
}
