package middleware

// Model retry. Boundary: model call. Reads and writes no state; emits
// model.retry events (custom kind) so a client sees why a run pauses. Two
// loops, after Yuxi's NetworkRetryMiddleware: network faults (connection
// refused or reset, timeouts, truncated streams, HTTP 5xx) are retried
// inside a time budget fixed per model call (2 s doubling to 30 s, 600 s by
// default), other errors (4xx including 429, invalid parameters) by count
// with jittered backoff; "context too long" is not retried as it is (see
// IsContextTooLong) and goes to the fallbacks. When both give up, optional
// fallback models are tried in order; then the error ends the run. A
// retry never produces a made-up answer, never calls the model again after
// a successful response, and a cancel or steer interrupts its sleep.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
)

// EnvNetworkRetryBudget overrides the default network retry budget, in
// seconds.
const EnvNetworkRetryBudget = "NATSAGENT_NETWORK_RETRY_BUDGET_SECONDS"

// Retry retries failed model calls.
type Retry struct {
	// MaxRetries is how often a non-network error is retried (default 2;
	// negative means never).
	MaxRetries int
	// InitialDelay, MaxDelay and Factor shape the backoff of non-network
	// retries (1 s, 60 s, 2), each delay jittered by ±25 %.
	InitialDelay time.Duration
	MaxDelay     time.Duration
	Factor       float64
	// NetworkBudget bounds the time spent retrying network faults within
	// one model call (default 600 s, or EnvNetworkRetryBudget); negative
	// disables network retries.
	NetworkBudget time.Duration
	// NetworkInitialDelay and NetworkMaxDelay shape the network backoff
	// (2 s doubling to 30 s).
	NetworkInitialDelay time.Duration
	NetworkMaxDelay     time.Duration
	// Fallbacks are model names tried in order when retries give up.
	Fallbacks []string

	// sleep waits d or until ctx ends; tests replace it with a clock.
	sleep func(ctx context.Context, d time.Duration) error
	now   func() time.Time
}

// NewRetry returns a Retry with the defaults filled.
func NewRetry(r Retry) *Retry {
	if r.MaxRetries == 0 {
		r.MaxRetries = 2
	}
	if r.InitialDelay == 0 {
		r.InitialDelay = time.Second
	}
	if r.MaxDelay == 0 {
		r.MaxDelay = 60 * time.Second
	}
	if r.Factor == 0 {
		r.Factor = 2
	}
	if r.NetworkBudget == 0 {
		r.NetworkBudget = 600 * time.Second
		if s, err := strconv.ParseFloat(os.Getenv(EnvNetworkRetryBudget), 64); err == nil {
			r.NetworkBudget = time.Duration(s * float64(time.Second))
		}
	}
	if r.NetworkInitialDelay == 0 {
		r.NetworkInitialDelay = 2 * time.Second
	}
	if r.NetworkMaxDelay == 0 {
		r.NetworkMaxDelay = 30 * time.Second
	}
	if r.sleep == nil {
		r.sleep = sleepCtx
	}
	if r.now == nil {
		r.now = time.Now
	}
	return &r
}

// Name implements Middleware.
func (*Retry) Name() string { return "model_retry" }

type budgetKey struct{}

// WrapModelCall implements WrapModelCall.
func (r *Retry) WrapModelCall(ctx context.Context, rt *Runtime, req *ModelRequest, next ModelHandler) (*ModelResponse, error) {
	// The network budget is fixed once per model call and shared with any
	// retry nested inside, so nesting never multiplies it.
	deadline := r.now().Add(r.NetworkBudget)
	if outer, ok := ctx.Value(budgetKey{}).(time.Time); ok && outer.Before(deadline) {
		deadline = outer
	}
	ctx = context.WithValue(ctx, budgetKey{}, deadline)
	// The first attempt is made here and the retries in retry, so the
	// frame that stays on the run's stack while the model answers is
	// small (chain.go, "Frames").
	resp, err := next(ctx, req)
	if err == nil {
		return resp, nil
	}
	return r.retry(ctx, rt, req, next, deadline, err)
}

// retry goes on after a first attempt that failed with first: retries,
// then the fallback models.
func (r *Retry) retry(ctx context.Context, rt *Runtime, req *ModelRequest, next ModelHandler, deadline time.Time, first error) (*ModelResponse, error) {
	netDelay := r.NetworkInitialDelay
	netRetries := 0

	models := append([]string{req.ModelName}, r.Fallbacks...)
	var lastErr error
	for mi, name := range models {
		call := req
		if mi > 0 {
			c := *req
			c.ModelName = name
			call = &c
			r.note(ctx, rt, "fallback", 0, 0, lastErr, name)
		}
		for attempt := 0; ; attempt++ {
			var resp *ModelResponse
			var err error
			if first != nil {
				err, first = first, nil
			} else {
				resp, err = next(ctx, call)
			}
			if err == nil {
				return resp, nil
			}
			lastErr = err
			if ctx.Err() != nil {
				return nil, err
			}
			if IsNetworkError(err) {
				if r.NetworkBudget < 0 || r.now().Add(netDelay).After(deadline) {
					break // budget spent: give up on this model
				}
				netRetries++
				r.note(ctx, rt, "network", netRetries, netDelay, err, call.ModelName)
				if serr := r.sleep(ctx, netDelay); serr != nil {
					return nil, err
				}
				netDelay = min(netDelay*2, r.NetworkMaxDelay)
				attempt-- // network retries do not use up the count
				continue
			}
			if attempt >= r.MaxRetries || IsContextTooLong(err) {
				// The same request is as long next time: the fallbacks
				// may have a larger window, context_compression (outside)
				// shortens it.
				break
			}
			d := r.backoff(attempt)
			r.note(ctx, rt, "error", attempt+1, d, err, call.ModelName)
			if serr := r.sleep(ctx, d); serr != nil {
				return nil, err
			}
		}
	}
	return nil, lastErr
}

func (r *Retry) backoff(attempt int) time.Duration {
	d := float64(r.InitialDelay)
	for range attempt {
		d *= r.Factor
	}
	d = min(d, float64(r.MaxDelay))
	d *= 0.75 + rand.Float64()/2 // ±25 %
	return time.Duration(d)
}

// EventModelRetry is emitted before each retry.
const EventModelRetry = protocol.EventModelRetry

// RetryData is the data of a model.retry event. MessageID names the
// assistant message whose streamed deltas so far are void: the retried
// call streams it again from the start.
type RetryData struct {
	Kind      string  `json:"kind"` // network, error, fallback
	Attempt   int     `json:"attempt,omitempty"`
	DelayS    float64 `json:"delay_s,omitempty"`
	Error     string  `json:"error"`
	Model     string  `json:"model,omitempty"`
	MessageID string  `json:"message_id,omitempty"`
}

func (r *Retry) note(ctx context.Context, rt *Runtime, kind string, attempt int, d time.Duration, err error, modelName string) {
	if rt.Logger != nil {
		rt.Logger.Warn("model call failed; retrying", zap.String("kind", kind), zap.Int("attempt", attempt), zap.Duration("delay", d), zap.String("model", modelName), zap.Error(err))
	}
	if rt.Emit != nil {
		rt.Emit(EventModelRetry, RetryData{Kind: kind, Attempt: attempt, DelayS: d.Seconds(), Error: clipText(fmt.Sprint(err), 500), Model: modelName, MessageID: MessageID(ctx)})
	}
	if rt.Metrics != nil {
		rt.Metrics.ModelRetry(kind)
	}
	traceRetry(ctx, kind, attempt, modelName)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

var (
	nonNetworkMarkers = []string{"ratelimit", "rate limit", "authentication", "permission", "invalid_request", "not_found", "not found", "context_length", "context length"}
	networkMarkers    = []string{"connectionerror", "connection error", "connection refused", "connection reset", "connecttimeout", "readtimeout", "apitimeouterror", "timeout", "timed out", "temporarily unavailable", "service unavailable", "bad gateway", "remote_protocol", "broken pipe", "eof"}
)

// IsNetworkError classifies a model call error: the HTTP status first
// (5xx is a network fault, 4xx including 429 is not), then the error's
// type along its chain, then its text.
func IsNetworkError(err error) bool {
	var apiErr *model.APIError
	if errors.As(err, &apiErr) && apiErr.StatusCode >= 400 && apiErr.StatusCode < 600 {
		return apiErr.StatusCode >= 500
	}
	if errors.Is(err, model.ErrTruncated) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return true
	}
	if errors.Is(err, context.Canceled) {
		return false
	}
	var netErr net.Error
	if errors.As(err, &netErr) {
		return true
	}
	var urlErr *url.Error
	if errors.As(err, &urlErr) {
		return true
	}
	text := strings.ToLower(err.Error())
	for _, m := range nonNetworkMarkers {
		if strings.Contains(text, m) {
			return false
		}
	}
	for _, m := range networkMarkers {
		if strings.Contains(text, m) {
			return true
		}
	}
	return false
}
