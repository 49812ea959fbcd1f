// Package webhook delivers a run's webhook: after the run ended, its final
// record is POSTed to the URL the run named, signed with an HMAC of the
// body, retried with backoff as a job in the jobs stream (so a worker that
// dies mid-delivery loses nothing), and the delivery's state is written on
// the run record. It owns the URL rules against server-side request
// forgery: loopback, private, link-local and other non-public addresses
// are refused unless the deployment allows them, when the run is
// submitted and again at every connection (the address actually dialed is
// checked, so a name that resolves elsewhere later gains nothing). It
// must not touch threads, leases or the runs stream.
package webhook

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/jobs"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/protocol"
)

// JobKind is the job that delivers one run's webhook.
const JobKind = "webhook"

// Headers of a delivery.
const (
	// HeaderSignature is "sha256=<hex HMAC-SHA256 of the body>" with the
	// deployment's webhook secret (absent when none is set).
	HeaderSignature = "X-Natsagent-Signature"
	HeaderRunID     = "X-Natsagent-Run-Id"
	HeaderAttempt   = "X-Natsagent-Delivery-Attempt"
)

// MaxURLBytes bounds a webhook URL.
const MaxURLBytes = 2048

// Config configures deliveries.
type Config struct {
	// Secret signs every body (HMAC-SHA256); empty sends no signature.
	Secret string
	// AllowPrivate lets webhooks reach loopback and private addresses
	// (tests, a receiver on the same network). Off by default.
	AllowPrivate bool
	// MaxAttempts bounds POSTs of one delivery (default 5).
	MaxAttempts int
	// Timeout bounds one POST (default 10s).
	Timeout time.Duration
}

func (c Config) withDefaults() Config {
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 5
	}
	if c.Timeout <= 0 {
		c.Timeout = 10 * time.Second
	}
	return c
}

// ErrRefused reports a URL or an address the rules refuse.
var ErrRefused = errors.New("webhook address refused")

// CheckURL checks a webhook URL's form: http or https, a host, no user
// name or password, at most MaxURLBytes.
func CheckURL(raw string) (*url.URL, error) {
	if len(raw) > MaxURLBytes {
		return nil, fmt.Errorf("the URL is %d bytes; at most %d", len(raw), MaxURLBytes)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("not a URL: %v", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, errors.New("the URL must be http or https")
	}
	if u.Hostname() == "" {
		return nil, errors.New("the URL has no host")
	}
	if u.User != nil {
		return nil, errors.New("the URL must not carry a user name or password")
	}
	return u, nil
}

// CheckHost resolves the URL's host and refuses it when any address it
// resolves to is not public (unless allowPrivate). It answers early at
// submission; the dialer checks again at every delivery.
func CheckHost(ctx context.Context, u *url.URL, allowPrivate bool) error {
	if allowPrivate {
		return nil
	}
	host := u.Hostname()
	if a, err := netip.ParseAddr(host); err == nil {
		return checkAddr(a)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return fmt.Errorf("cannot resolve %s: %v", host, err)
	}
	for _, a := range addrs {
		if err := checkAddr(a); err != nil {
			return fmt.Errorf("%s resolves to %s: %w", host, a.Unmap(), err)
		}
	}
	return nil
}

// nonPublic are ranges no webhook may reach beyond what netip names:
// shared address space, benchmarking, reserved, IETF protocol
// assignments, NAT64 (which may reach private IPv4 behind it), 6to4 and
// Teredo (which embed IPv4).
var nonPublic = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("192.0.2.0/24"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("198.51.100.0/24"),
	netip.MustParsePrefix("203.0.113.0/24"),
	netip.MustParsePrefix("240.0.0.0/4"),
	netip.MustParsePrefix("64:ff9b::/96"),
	netip.MustParsePrefix("64:ff9b:1::/48"),
	netip.MustParsePrefix("2002::/16"),
	netip.MustParsePrefix("2001::/32"),
	netip.MustParsePrefix("2001:db8::/32"),
	netip.MustParsePrefix("100::/64"),
}

func checkAddr(a netip.Addr) error {
	a = a.Unmap()
	switch {
	case !a.IsValid(), a.IsLoopback(), a.IsPrivate(), a.IsLinkLocalUnicast(), a.IsLinkLocalMulticast(),
		a.IsInterfaceLocalMulticast(), a.IsMulticast(), a.IsUnspecified():
		return fmt.Errorf("%w: %s is not a public address (loopback, private, link-local...); the deployment's webhooks.allow_private allows it", ErrRefused, a)
	}
	for _, p := range nonPublic {
		if p.Contains(a) {
			return fmt.Errorf("%w: %s is in %s, not a public range; the deployment's webhooks.allow_private allows it", ErrRefused, a, p)
		}
	}
	return nil
}

// Client returns the HTTP client deliveries use: no proxy (it would
// resolve names where we cannot check them), no redirects (a 3xx could
// point anywhere), and a dialer that checks the address it connects to.
func Client(cfg Config) *http.Client {
	cfg = cfg.withDefaults()
	d := &net.Dialer{Timeout: cfg.Timeout}
	if !cfg.AllowPrivate {
		d.Control = func(network, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("%w: cannot read the address %s", ErrRefused, address)
			}
			return checkAddr(ap.Addr())
		}
	}
	return &http.Client{
		Timeout: cfg.Timeout,
		Transport: &http.Transport{
			Proxy:                 nil,
			DialContext:           d.DialContext,
			TLSHandshakeTimeout:   cfg.Timeout,
			ResponseHeaderTimeout: cfg.Timeout,
			MaxIdleConns:          10,
			IdleConnTimeout:       30 * time.Second,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// Sign is the signature header's value for body.
func Sign(secret string, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// job is a delivery's job data.
type job struct {
	Tenant string `json:"tenant"`
	RunID  string `json:"run_id"`
}

// Enqueue schedules the delivery of a run's webhook, once per run (the job
// id dedupes within the jobs stream's window, and a delivery that was sent
// is not sent again).
func Enqueue(ctx context.Context, js jetstream.JetStream, names bus.Names, rec *protocol.Run) error {
	if rec.Webhook == nil || rec.Webhook.URL == "" || !rec.Status.Terminal() {
		return nil
	}
	data, _ := json.Marshal(job{Tenant: rec.Tenant, RunID: rec.RunID})
	_, err := jobs.Enqueue(ctx, js, names, jobs.Spec{
		Kind: JobKind, Tokens: []string{rec.Tenant}, Key: rec.RunID,
		ID: "webhook." + rec.Tenant + "." + rec.RunID, Data: data,
	})
	return err
}

// Handler delivers webhooks.
type Handler struct {
	cfg    Config
	stores *kv.Stores
	client *http.Client
	log    *zap.Logger
}

// NewHandler builds the job handler.
func NewHandler(cfg Config, stores *kv.Stores, log *zap.Logger) *Handler {
	cfg = cfg.withDefaults()
	return &Handler{cfg: cfg, stores: stores, client: Client(cfg), log: log}
}

// Handle is the jobs.Handler: one POST. A failure is retried by the
// runner with its backoff until MaxAttempts, then the delivery is marked
// failed.
func (h *Handler) Handle(ctx context.Context, j *jobs.Job) error {
	var spec job
	if err := json.Unmarshal(j.Data, &spec); err != nil || !protocol.ValidToken(spec.Tenant) || !protocol.ValidToken(spec.RunID) {
		return jobs.Permanent(fmt.Errorf("webhook job: bad data %q", j.Data))
	}
	rec, _, err := h.stores.Runs.Get(ctx, spec.Tenant, spec.RunID)
	if errors.Is(err, kv.ErrNotFound) {
		return nil // the run was deleted
	}
	if err != nil {
		return err
	}
	wh := rec.Webhook
	if wh == nil || wh.Status == protocol.WebhookSent || wh.Status == protocol.WebhookFailed {
		return nil
	}
	attempts := wh.Attempts + 1
	sendErr := h.post(ctx, rec, attempts)
	status, last := protocol.WebhookSent, ""
	var sentAt *time.Time
	switch {
	case sendErr == nil:
		now := time.Now().UTC()
		sentAt = &now
	case errors.Is(sendErr, ErrRefused) || attempts >= h.cfg.MaxAttempts:
		status, last = protocol.WebhookFailed, clip(sendErr.Error(), 500)
	default:
		status, last = protocol.WebhookRetrying, clip(sendErr.Error(), 500)
	}
	if _, _, err := h.stores.Runs.Mutate(ctx, spec.Tenant, spec.RunID, func(r *protocol.Run) error {
		if r.Webhook == nil {
			return kv.ErrNotFound
		}
		r.Webhook.Status, r.Webhook.Attempts, r.Webhook.LastError, r.Webhook.SentAt = status, attempts, last, sentAt
		return nil
	}); err != nil && !errors.Is(err, kv.ErrNotFound) {
		h.log.Warn("could not record the webhook delivery", zap.String("run_id", spec.RunID), zap.Error(err))
	}
	log := h.log.With(zap.String("tenant", spec.Tenant), zap.String("run_id", spec.RunID), zap.Int("attempt", attempts))
	switch status {
	case protocol.WebhookSent:
		log.Info("webhook sent")
		return nil
	case protocol.WebhookFailed:
		log.Warn("webhook failed for good", zap.Error(sendErr))
		return nil
	}
	log.Info("webhook failed; retrying", zap.Error(sendErr))
	return sendErr
}

// post sends the run record once.
func (h *Handler) post(ctx context.Context, rec *protocol.Run, attempt int) error {
	u, err := CheckURL(rec.Webhook.URL)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrRefused, err)
	}
	final := *rec
	final.Webhook = nil
	body, err := json.Marshal(&final)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, h.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "natsagent-webhook")
	req.Header.Set(HeaderRunID, rec.RunID)
	req.Header.Set(HeaderAttempt, fmt.Sprint(attempt))
	if h.cfg.Secret != "" {
		req.Header.Set(HeaderSignature, Sign(h.cfg.Secret, body))
	}
	resp, err := h.client.Do(req)
	if err != nil {
		if errors.Is(err, ErrRefused) {
			return fmt.Errorf("%w: %s", ErrRefused, strings.TrimPrefix(err.Error(), "Post "))
		}
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("the receiver answered %s", resp.Status)
	}
	return nil
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
