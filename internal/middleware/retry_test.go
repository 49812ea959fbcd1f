package middleware

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/model"
)

// vclock is a virtual clock: sleeping advances it at once.
type vclock struct {
	mu     sync.Mutex
	t      time.Time
	sleeps []time.Duration
}

func newVClock() *vclock { return &vclock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *vclock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *vclock) sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
	c.sleeps = append(c.sleeps, d)
	return nil
}

func (c *vclock) total() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	var sum time.Duration
	for _, d := range c.sleeps {
		sum += d
	}
	return sum
}

func (c *vclock) slept() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.sleeps...)
}

// retryOn returns a Retry with the defaults filled, running on clock c.
func retryOn(c *vclock, r Retry) *Retry {
	r.sleep, r.now = c.sleep, c.now
	return NewRetry(r)
}

// flaky is a model handler answering call n with errs[n] (nil: success);
// the last entry repeats forever.
type flaky struct {
	mu     sync.Mutex
	errs   []error
	calls  int
	models []string
}

func failing(errs ...error) *flaky { return &flaky{errs: errs} }

func (f *flaky) next(ctx context.Context, req *ModelRequest) (*ModelResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	err := f.errs[min(f.calls, len(f.errs)-1)]
	f.calls++
	f.models = append(f.models, req.ModelName)
	if err != nil {
		return nil, err
	}
	return &ModelResponse{Response: &model.Response{Message: asst("", "ok"), FinishReason: model.FinishStop}}, nil
}

func (f *flaky) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

func wantOK(t *testing.T, resp *ModelResponse, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("err = %v, want success", err)
	}
	if resp == nil || resp.Response == nil || resp.Response.Message.Content != "ok" {
		t.Fatalf("resp = %+v", resp)
	}
}

func netErr() error { return errors.New("Connection refused to api host") }
func authErr() error {
	return &model.APIError{StatusCode: 401, Type: "authentication_error", Message: "invalid api key"}
}

func baseRequest() *ModelRequest {
	return &ModelRequest{ModelName: "main", Messages: []model.Message{user("u1", "hi")}}
}

// Yuxi test_network_retry.py cases 1, 2, 12, 13.
func TestIsNetworkError(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"Connection error.", errors.New("Connection error."), true},
		{"OpenAIConnectionError", errors.New("OpenAIConnectionError: Connection error"), true},
		{"connection refused", errors.New("Connection refused to api host"), true},
		{"APITimeoutError", errors.New("APITimeoutError: Request timed out"), true},
		{"httpx.ReadTimeout", errors.New("httpx.ReadTimeout while reading"), true},
		{"503 text", errors.New("503 Service Unavailable"), true},
		{"502 text", errors.New("502 Bad Gateway from upstream"), true},
		{"RateLimitError text", errors.New("RateLimitError: 429 too many requests"), false},
		{"AuthenticationError text", errors.New("AuthenticationError: invalid api key"), false},
		{"NotFoundError text", errors.New("NotFoundError: model not found"), false},
		{"invalid_request_error text", errors.New("invalid_request_error: bad parameter"), false},
		{"logic bug", errors.New("This is a logic bug"), false},
		{"cause chain", fmt.Errorf("model call wrapper failed: %w", errors.New("Connection reset by peer")), true},
		{"ECONNRESET wrapped twice", fmt.Errorf("outer: %w", fmt.Errorf("read: %w", syscall.ECONNRESET)), true},
		{"ErrTruncated", model.ErrTruncated, true},
		{"ErrTruncated wrapped", fmt.Errorf("stream: %w", model.ErrTruncated), true},
		{"unexpected EOF", fmt.Errorf("reading body: %w", io.ErrUnexpectedEOF), true},
		{"net.OpError", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true},
		{"net.OpError wrapped", fmt.Errorf("post: %w", &net.OpError{Op: "read", Net: "tcp", Err: errors.New("i/o")}), true},
		{"context.Canceled", context.Canceled, false},
		{"context.Canceled wrapped", fmt.Errorf("model call stopped: %w", context.Canceled), false},
		// A 4xx whose text speaks of a timeout is still not a network fault.
		{"400 mentioning timeout", &model.APIError{StatusCode: 400, Message: "Unsupported parameter: timeout"}, false},
		{"timeout text caused by a 400", fmt.Errorf("Connection timeout in model wrapper: %w", &model.APIError{StatusCode: 400, Message: "Unsupported parameter: timeout"}), false},
		{"5xx wrapped", fmt.Errorf("call: %w", &model.APIError{StatusCode: 500, Message: "upstream overloaded"}), true},
	}
	for _, status := range []int{400, 401, 403, 404, 429, 500, 502, 503, 504} {
		cases = append(cases, struct {
			name string
			err  error
			want bool
		}{fmt.Sprintf("APIError %d", status), &model.APIError{StatusCode: status, Message: "request timed out"}, status >= 500})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := IsNetworkError(tc.err); got != tc.want {
				t.Errorf("IsNetworkError(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

// Yuxi case 3: network twice then ok.
func TestRetry_NetworkTwiceThenOK(t *testing.T) {
	c := newVClock()
	r := retryOn(c, Retry{NetworkBudget: 30 * time.Second, NetworkInitialDelay: 10 * time.Millisecond, NetworkMaxDelay: 20 * time.Millisecond})
	f := failing(netErr(), netErr(), nil)
	rt, _ := newRuntime("r1")
	resp, err := r.WrapModelCall(context.Background(), rt, baseRequest(), f.next)
	wantOK(t, resp, err)
	if f.count() != 3 {
		t.Errorf("calls = %d, want 3", f.count())
	}
	if got := c.slept(); len(got) != 2 || got[0] != 10*time.Millisecond || got[1] != 20*time.Millisecond {
		t.Errorf("sleeps = %v, want [10ms 20ms]", got)
	}
}

// Yuxi cases 4 and 8: a permanent network fault gives up within the
// budget and returns the provider's own error.
func TestRetry_NetworkBudgetExhausted(t *testing.T) {
	t.Run("small budget", func(t *testing.T) {
		c := newVClock()
		r := retryOn(c, Retry{NetworkBudget: 50 * time.Millisecond, NetworkInitialDelay: 30 * time.Millisecond})
		orig := netErr()
		f := failing(orig)
		rt, _ := newRuntime("r1")
		_, err := r.WrapModelCall(context.Background(), rt, baseRequest(), f.next)
		if err != orig {
			t.Fatalf("err = %v, want the original error", err)
		}
		if f.count() < 2 {
			t.Errorf("calls = %d, want at least 2", f.count())
		}
		if c.total() > 50*time.Millisecond {
			t.Errorf("slept %v, over the 50ms budget", c.total())
		}
	})
	t.Run("default delays within 600s", func(t *testing.T) {
		c := newVClock()
		r := retryOn(c, Retry{NetworkBudget: 600 * time.Second})
		orig := &model.APIError{StatusCode: 502, Message: "bad gateway"}
		f := failing(orig)
		rt, _ := newRuntime("r1")
		_, err := r.WrapModelCall(context.Background(), rt, baseRequest(), f.next)
		if !errors.Is(err, orig) {
			t.Fatalf("err = %v", err)
		}
		total := c.total()
		if total <= 0 || total > 600*time.Second {
			t.Errorf("slept %v, want 0 < total <= 600s", total)
		}
		want := []time.Duration{2, 4, 8, 16, 30, 30}
		got := c.slept()
		for i, w := range want {
			if i >= len(got) || got[i] != w*time.Second {
				t.Fatalf("sleeps = %v, want them to start %v s (no jitter on the network path)", got, want)
			}
		}
	})
	t.Run("disabled budget returns a 5xx after one call", func(t *testing.T) {
		c := newVClock()
		r := retryOn(c, Retry{NetworkBudget: -1, MaxRetries: 2})
		orig := &model.APIError{StatusCode: 500, Message: "internal"}
		f := failing(orig)
		rt, _ := newRuntime("r1")
		_, err := r.WrapModelCall(context.Background(), rt, baseRequest(), f.next)
		if err != orig || f.count() != 1 || c.total() != 0 {
			t.Errorf("err = %v, calls = %d, slept %v; want the 5xx after 1 call and no sleep (never retried by count)", err, f.count(), c.total())
		}
	})
}

// Yuxi cases 6, 7, 9: non-network errors are retried by count and then
// the very same error is returned.
func TestRetry_NonNetworkRetriedByCount(t *testing.T) {
	for _, tc := range []struct {
		maxRetries int
		wantCalls  int
	}{{-1, 1}, {1, 2}, {2, 3}, {4, 5}} {
		t.Run(fmt.Sprintf("max_retries=%d", tc.maxRetries), func(t *testing.T) {
			c := newVClock()
			r := retryOn(c, Retry{MaxRetries: tc.maxRetries, NetworkBudget: 30 * time.Second})
			orig := &model.APIError{StatusCode: 429, Type: "rate_limit_error", Message: "too many requests"}
			f := failing(orig)
			rt, _ := newRuntime("r1")
			resp, err := r.WrapModelCall(context.Background(), rt, baseRequest(), f.next)
			if resp != nil || err != orig || !errors.Is(err, orig) {
				t.Fatalf("resp = %v, err = %v; want the original error object", resp, err)
			}
			if f.count() != tc.wantCalls {
				t.Errorf("calls = %d, want %d", f.count(), tc.wantCalls)
			}
			if len(c.slept()) != tc.wantCalls-1 {
				t.Errorf("sleeps = %v, want %d", c.slept(), tc.wantCalls-1)
			}
		})
	}
	t.Run("twice then ok", func(t *testing.T) {
		c := newVClock()
		r := retryOn(c, Retry{MaxRetries: 2})
		f := failing(authErr(), authErr(), nil)
		rt, _ := newRuntime("r1")
		resp, err := r.WrapModelCall(context.Background(), rt, baseRequest(), f.next)
		wantOK(t, resp, err)
		if f.count() != 3 {
			t.Errorf("calls = %d, want 3", f.count())
		}
	})
}

// Yuxi case 10: network retried inside, auth by count.
func TestRetry_NetworkAuthAuthOK(t *testing.T) {
	c := newVClock()
	r := retryOn(c, Retry{MaxRetries: 2, NetworkBudget: 30 * time.Second, NetworkInitialDelay: time.Millisecond, InitialDelay: time.Millisecond})
	f := failing(netErr(), authErr(), authErr(), nil)
	rt, _ := newRuntime("r1")
	resp, err := r.WrapModelCall(context.Background(), rt, baseRequest(), f.next)
	wantOK(t, resp, err)
	if f.count() != 4 {
		t.Errorf("calls = %d, want 4", f.count())
	}
}

// Yuxi case 11: a count retry does not reset the network budget.
func TestRetry_CountRetryDoesNotResetNetworkBudget(t *testing.T) {
	c := newVClock()
	r := retryOn(c, Retry{MaxRetries: 1, NetworkBudget: 5 * time.Second, NetworkInitialDelay: 2 * time.Second})
	f := failing(netErr(), authErr(), netErr())
	rt, _ := newRuntime("r1")
	_, err := r.WrapModelCall(context.Background(), rt, baseRequest(), f.next)
	if err == nil {
		t.Fatal("want an error")
	}
	if f.count() < 3 {
		t.Errorf("calls = %d, want at least 3 (network, auth, network)", f.count())
	}
	if c.total() > 5*time.Second {
		t.Errorf("slept %v (%v), over the 5s budget", c.total(), c.slept())
	}
}

// namedRetry lets two Retry middlewares share a chain.
type namedRetry struct {
	*Retry
	name string
}

func (n namedRetry) Name() string { return n.name }

// A network budget is not multiplied by nested retries: an inner Retry
// inherits the outer call's deadline instead of starting a fresh budget.
func TestRetry_NestedRetriesShareTheNetworkBudget(t *testing.T) {
	for _, tc := range []struct {
		name          string
		outer, inner  time.Duration
		wantMaxSleeps time.Duration
	}{
		{"equal budgets", 5 * time.Second, 5 * time.Second, 5 * time.Second},
		{"inner budget larger", 5 * time.Second, 600 * time.Second, 5 * time.Second},
		{"inner budget smaller", 600 * time.Second, 5 * time.Second, 600 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newVClock()
			outer := retryOn(c, Retry{MaxRetries: -1, NetworkBudget: tc.outer, NetworkInitialDelay: 2 * time.Second})
			inner := retryOn(c, Retry{MaxRetries: -1, NetworkBudget: tc.inner, NetworkInitialDelay: 2 * time.Second})
			chain, err := NewChain([]Middleware{namedRetry{outer, "outer_retry"}, namedRetry{inner, "inner_retry"}})
			if err != nil {
				t.Fatal(err)
			}
			f := failing(netErr())
			rt, _ := newRuntime("r1")
			_, err = chain.ModelCall(rt, f.next)(context.Background(), baseRequest())
			if err == nil {
				t.Fatal("want an error")
			}
			if c.total() > tc.wantMaxSleeps {
				t.Errorf("slept %v (%v), over the outer budget %v", c.total(), c.slept(), tc.wantMaxSleeps)
			}
			if f.count() < 2 {
				t.Errorf("calls = %d, want retries", f.count())
			}
		})
	}
}

func TestRetry_NeverCallsAgainAfterSuccess(t *testing.T) {
	for _, errs := range [][]error{{nil}, {netErr(), nil}, {authErr(), nil}} {
		c := newVClock()
		r := retryOn(c, Retry{MaxRetries: 5, NetworkBudget: time.Hour})
		f := failing(append(errs, authErr())...) // a call after the success would fail
		rt, _ := newRuntime("r1")
		resp, err := r.WrapModelCall(context.Background(), rt, baseRequest(), f.next)
		wantOK(t, resp, err)
		if f.count() != len(errs) {
			t.Errorf("errors %v: calls = %d, want %d", errs, f.count(), len(errs))
		}
	}
}

// A cancel (or a steer) interrupts the backoff sleep at once; the run does
// not wait out the delay. Real sleeps, cancelled after a few milliseconds.
func TestRetry_CancelDuringBackoff(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    Retry
		err  error
	}{
		{"network backoff", Retry{NetworkInitialDelay: 30 * time.Second, NetworkBudget: time.Hour}, netErr()},
		{"count backoff", Retry{InitialDelay: 30 * time.Second, MaxRetries: 3}, authErr()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := NewRetry(tc.r)
			f := failing(tc.err)
			rt, _ := newRuntime("r1")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			timer := time.AfterFunc(20*time.Millisecond, cancel)
			defer timer.Stop()
			start := time.Now()
			resp, err := r.WrapModelCall(ctx, rt, baseRequest(), f.next)
			if elapsed := time.Since(start); elapsed > 2*time.Second {
				t.Errorf("returned after %v, want promptly after the cancel", elapsed)
			}
			if err == nil || resp != nil {
				t.Errorf("resp = %v, err = %v; want an error", resp, err)
			}
			if f.count() != 1 {
				t.Errorf("calls = %d, want 1 (no call after the cancel)", f.count())
			}
		})
	}
}

func TestRetry_Fallbacks(t *testing.T) {
	t.Run("tried in order after exhaustion", func(t *testing.T) {
		c := newVClock()
		r := retryOn(c, Retry{MaxRetries: 1, NetworkBudget: -1, Fallbacks: []string{"backup1", "backup2"}})
		okOn := "backup2"
		var models []string
		next := func(ctx context.Context, req *ModelRequest) (*ModelResponse, error) {
			models = append(models, req.ModelName)
			if req.ModelName == okOn {
				return &ModelResponse{Response: &model.Response{Message: asst("", "ok")}}, nil
			}
			return nil, &model.APIError{StatusCode: 404, Message: "model not found"}
		}
		rt, ev := newRuntime("r1")
		req := baseRequest()
		resp, err := r.WrapModelCall(context.Background(), rt, req, next)
		wantOK(t, resp, err)
		want := []string{"main", "main", "backup1", "backup1", "backup2"}
		if fmt.Sprint(models) != fmt.Sprint(want) {
			t.Errorf("models = %v, want %v", models, want)
		}
		if req.ModelName != "main" {
			t.Errorf("the caller's request was changed: model %q", req.ModelName)
		}
		var fallbacks []string
		for _, e := range ev.ofType(EventModelRetry) {
			if d := e.Data.(RetryData); d.Kind == "fallback" {
				fallbacks = append(fallbacks, d.Model)
			}
		}
		if fmt.Sprint(fallbacks) != "[backup1 backup2]" {
			t.Errorf("fallback events for %v", fallbacks)
		}
	})
	t.Run("all fail: the last error", func(t *testing.T) {
		c := newVClock()
		r := retryOn(c, Retry{MaxRetries: -1, Fallbacks: []string{"backup"}})
		last := &model.APIError{StatusCode: 400, Message: "backup says no"}
		next := func(ctx context.Context, req *ModelRequest) (*ModelResponse, error) {
			if req.ModelName == "backup" {
				return nil, last
			}
			return nil, &model.APIError{StatusCode: 400, Message: "main says no"}
		}
		rt, _ := newRuntime("r1")
		if _, err := r.WrapModelCall(context.Background(), rt, baseRequest(), next); err != last {
			t.Errorf("err = %v, want the last model's error", err)
		}
	})
	t.Run("after a spent network budget", func(t *testing.T) {
		c := newVClock()
		r := retryOn(c, Retry{NetworkBudget: 5 * time.Second, NetworkInitialDelay: 2 * time.Second, Fallbacks: []string{"backup"}})
		var models []string
		next := func(ctx context.Context, req *ModelRequest) (*ModelResponse, error) {
			models = append(models, req.ModelName)
			if req.ModelName == "backup" {
				return &ModelResponse{Response: &model.Response{Message: asst("", "ok")}}, nil
			}
			return nil, netErr()
		}
		rt, _ := newRuntime("r1")
		resp, err := r.WrapModelCall(context.Background(), rt, baseRequest(), next)
		wantOK(t, resp, err)
		if fmt.Sprint(models) != "[main main backup]" || c.total() > 5*time.Second {
			t.Errorf("models = %v, slept %v", models, c.total())
		}
	})
}

func TestRetry_Events(t *testing.T) {
	c := newVClock()
	r := retryOn(c, Retry{MaxRetries: 2, NetworkBudget: time.Minute})
	f := failing(netErr(), netErr(), authErr(), nil)
	rt, ev := newRuntime("r1")
	ctx := WithMessageID(context.Background(), "msg_1")
	resp, err := r.WrapModelCall(ctx, rt, baseRequest(), f.next)
	wantOK(t, resp, err)
	got := ev.ofType(EventModelRetry)
	want := []struct {
		kind    string
		attempt int
	}{{"network", 1}, {"network", 2}, {"error", 1}}
	if len(got) != len(want) {
		t.Fatalf("events = %+v, want %d", got, len(want))
	}
	for i, w := range want {
		d, ok := got[i].Data.(RetryData)
		if !ok {
			t.Fatalf("event data %T", got[i].Data)
		}
		if d.Kind != w.kind || d.Attempt != w.attempt || d.DelayS <= 0 || d.Error == "" || d.Model != "main" || d.MessageID != "msg_1" {
			t.Errorf("event %d = %+v, want kind %s attempt %d", i, d, w.kind, w.attempt)
		}
	}
}

func TestNewRetry_Defaults(t *testing.T) {
	t.Setenv(EnvNetworkRetryBudget, "7.5")
	r := NewRetry(Retry{})
	if r.MaxRetries != 2 || r.NetworkBudget != 7500*time.Millisecond || r.NetworkInitialDelay != 2*time.Second || r.NetworkMaxDelay != 30*time.Second {
		t.Errorf("defaults = %+v", r)
	}
	for attempt := range 12 {
		base := min(float64(time.Second)*float64(int(1)<<attempt), float64(60*time.Second))
		d := float64(r.backoff(attempt))
		if d < 0.75*base || d > 1.25*base {
			t.Errorf("backoff(%d) = %v, want %v ±25%%", attempt, time.Duration(d), time.Duration(base))
		}
	}
}
