// Package intake is the submit service: how a tenant in its own NATS
// account submits runs. Tenants may not write the runs stream (only the
// service account's users can); their account imports the service account's
// P.submit.<tenant>.* under the local subject P.runs.<tenant>.*, so a
// tenant client publishes run requests exactly as before and the server
// delivers them here, to a queue group every worker joins, with a
// Nats-Request-Info header that says which account and user sent them.
// The service checks the request, stamps the principal (JetStream strips
// Nats-Request-Info from stored messages, so it must be stamped into the
// request itself) and enqueues it as every submitter does (internal/submit).
//
// It answers only through the requester's reply subject (m.Respond), which
// the server maps back to the requesting account: what a client names as
// its reply can never reach a stream, a bucket or another tenant. The answer
// is the stream's PubAck JSON, so a JetStream client's Publish on
// P.runs.<tenant>.<thread> works through the import, or a JetStream API
// error JSON with Nats-Service-Error headers.
//
// It owns the submission of NATS clients; the account layout is
// internal/tenancy's, authentication the NATS server's.
package intake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/limits"
	"github.com/natsagent/natsagent/internal/metrics"
	"github.com/natsagent/natsagent/internal/natsjwt"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/submit"
)

// QueueGroup is the queue group of the submit service in every worker.
const QueueGroup = "natsagent-submit"

// HeaderRequestInfo is the header a NATS server adds to a request that
// crossed a service import with share: the requester's account and user
// (nats-server's server.ClientInfo; a client cannot forge it, the server
// replaces it).
const HeaderRequestInfo = "Nats-Request-Info"

// ClientInfo is the part of Nats-Request-Info the service reads.
type ClientInfo struct {
	// Account is the requester's account: the tenant's name (static
	// accounts) or the account's public key (JWT mode).
	Account string `json:"acc"`
	// User is the user name (static config) or the user's public nkey (JWT).
	User string `json:"user"`
	// NameTag is the user JWT's name, when the server knows it.
	NameTag string `json:"name_tag"`
	// Tags are the user JWT's tags; in JWT mode they hold the tenant's
	// (natsjwt.TenantTag).
	Tags []string `json:"tags"`
}

// Authorize decides whether principal p of tenant may submit req (with
// req.Principal already stamped). An error refuses the request with its
// message (code 403). req.Config.UserID holds what the client asked for;
// when it is empty after Authorize, it becomes the principal's user.
type Authorize func(ctx context.Context, tenant string, p *protocol.Principal, req *protocol.RunRequest) error

// Hooks are the service's policy: who may submit what, and with which
// roles. Zero Hooks allow every tenant user its own runs.
type Hooks struct {
	// Authorize is the policy hook; nil is DefaultAuthorize.
	Authorize Authorize
	// Roles gives the roles of a NATS user of a tenant (nil: none).
	Roles func(tenant string, info ClientInfo) []string
	// MayUseThread decides whether the principal may run on an existing
	// thread another user may own (nil: only the thread's owner, or any
	// principal on a thread without one).
	MayUseThread func(th *protocol.Thread, p *protocol.Principal) bool
}

// Principal is the user a request info names: the user JWT's name when
// the server knows it, else the user.
func (c ClientInfo) Principal() string {
	if c.NameTag != "" {
		return c.NameTag
	}
	return c.User
}

// Config configures the service.
type Config struct {
	Settings bus.Settings
	Stores   *kv.Stores
	Queue    *submit.Queue
	Logger   *zap.Logger
	// Limits applies the tenants' limits to a submission as the gateway
	// does (run time and steps, stored events, runs per minute); nil
	// applies none.
	Limits *limits.Limiter
	Hooks
	// Concurrency bounds the submissions handled at once (default 64).
	Concurrency int
	// Metrics counts the submissions a full store refused (nil: none).
	Metrics metrics.Recorder
}

// DefaultAuthorize allows everything except acting for another user: a
// body user_id other than the principal's.
func DefaultAuthorize(_ context.Context, _ string, p *protocol.Principal, req *protocol.RunRequest) error {
	if req.Config.UserID != "" && req.Config.UserID != p.User {
		return fmt.Errorf("config.user_id %q is not your user %q: a NATS user submits runs for itself; leave config.user_id out", clip(req.Config.UserID), p.User)
	}
	return nil
}

// Service is a running submit service.
type Service struct {
	cfg  Config
	sub  *nats.Subscription
	sem  chan struct{}
	wg   sync.WaitGroup
	log  *zap.Logger
	stop sync.Once
}

// Start subscribes to P.submit.> in the queue group.
func Start(nc *nats.Conn, cfg Config) (*Service, error) {
	cfg.Metrics = metrics.Or(cfg.Metrics)
	if cfg.Authorize == nil {
		cfg.Authorize = DefaultAuthorize
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 64
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	s := &Service{cfg: cfg, sem: make(chan struct{}, cfg.Concurrency), log: cfg.Logger}
	sub, err := nc.QueueSubscribe(cfg.Settings.Names.SubmitSubjects(), QueueGroup, func(m *nats.Msg) {
		s.sem <- struct{}{} // back pressure: the subscription's pending limits apply beyond this
		s.wg.Add(1)
		go func() {
			defer func() { <-s.sem; s.wg.Done() }()
			s.handle(m)
		}()
	})
	if err != nil {
		return nil, fmt.Errorf("subscribe to %s: %w", cfg.Settings.Names.SubmitSubjects(), err)
	}
	s.sub = sub
	return s, nc.Flush()
}

// Stop unsubscribes and waits for the submissions in flight.
func (s *Service) Stop() {
	s.stop.Do(func() {
		_ = s.sub.Unsubscribe()
		s.wg.Wait()
	})
}

// Error codes of the answers (err_code in the JetStream API error JSON;
// outside the range nats-server uses).
const (
	ErrCodeInvalid     = 10900
	ErrCodeForbidden   = 10901
	ErrCodeConflict    = 10902
	ErrCodeTooLarge    = 10903
	ErrCodeUnavailable = 10904
	ErrCodeNotFound    = 10905
	ErrCodeRateLimited = 10906
	ErrCodeQuota       = 10907
	// ErrCodeStoreFull (with code 507): JetStream had no room to store
	// the submission; nothing was stored (bus.ErrCodeSubmitStoreFull).
	ErrCodeStoreFull = bus.ErrCodeSubmitStoreFull
)

// refusal is an answer with an error.
type refusal struct {
	status  int
	errCode int
	msg     string
}

func (r *refusal) Error() string { return r.msg }

func refuse(status, code int, format string, args ...any) *refusal {
	return &refusal{status: status, errCode: code, msg: fmt.Sprintf(format, args...)}
}

func (s *Service) handle(m *nats.Msg) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tenant, thread, _ := s.cfg.Settings.Names.ParseSubmitSubject(m.Subject)
	ack, err := s.submit(ctx, m)
	log := s.log.With(zap.String("tenant", tenant), zap.String("thread_id", thread))
	if err != nil {
		var r *refusal
		if store, full := bus.IsStoreFull(err); full && !errors.As(err, &r) {
			if store == "" {
				store = "unknown"
			}
			s.cfg.Metrics.StoreFull(store)
			log.Error("submission refused: JetStream has no room", zap.String("store", store), zap.Error(err))
			r = refuse(507, ErrCodeStoreFull, "JetStream has no room to store the run (%s: %s); nothing was stored. An operator must free space; try again later", store, bus.StoreFullText(err))
		}
		if r == nil && !errors.As(err, &r) {
			log.Warn("submission failed", zap.Error(err))
			r = refuse(503, ErrCodeUnavailable, "could not submit the run: %v; try again", err)
		} else {
			log.Info("submission refused", zap.String("reason", r.msg))
		}
		respondError(m, r)
		return
	}
	if m.Reply == "" {
		return
	}
	data, _ := json.Marshal(ack)
	_ = m.Respond(data)
}

// submit checks and enqueues one request.
func (s *Service) submit(ctx context.Context, m *nats.Msg) (*jetstream.PubAck, error) {
	names := s.cfg.Settings.Names
	tenant, thread, ok := names.ParseSubmitSubject(m.Subject)
	if !ok {
		return nil, refuse(400, ErrCodeInvalid, "subject %q is not a run subject (%s)", clip(m.Subject), names.RunSubject("<tenant>", "<thread>"))
	}
	if err := protocol.CheckToken("tenant (subject)", tenant); err != nil {
		return nil, refuse(400, ErrCodeInvalid, "%v", err)
	}
	if err := protocol.CheckToken("thread_id (subject)", thread); err != nil {
		return nil, refuse(400, ErrCodeInvalid, "%v", err)
	}
	principal, err := s.principal(tenant, m.Header)
	if err != nil {
		return nil, err
	}
	req, err := protocol.DecodeRunRequestFor(m.Data, s.cfg.Settings.MaxRequestBytes, tenant, thread)
	if err != nil {
		return nil, refuse(400, ErrCodeInvalid, "%v", err)
	}
	req.Normalize()
	if err := req.Validate(); err != nil {
		return nil, refuse(400, ErrCodeInvalid, "%v", err)
	}
	if req.Tenant != tenant {
		return nil, refuse(400, ErrCodeInvalid, "tenant: %q does not match the subject's tenant %q", clip(req.Tenant), tenant)
	}
	if req.ThreadID != thread {
		return nil, refuse(400, ErrCodeInvalid, "thread_id: %q does not match the subject's thread %q", req.ThreadID, thread)
	}
	if id := m.Header.Get(jetstream.MsgIDHeader); id != "" && id != req.RunID {
		if err := protocol.CheckRunMsgID(tenant, req.RunID, id); err != nil {
			return nil, refuse(400, ErrCodeInvalid, "%v (or the bare run id %q)", err, req.RunID)
		}
	}
	// The service stamps who submitted; what the body says is replaced.
	req.Principal = principal
	if principal != nil && req.Parent != nil {
		// A child run shares its parent's thread workdir: only the
		// subagent service (in the service account) starts one.
		return nil, refuse(403, ErrCodeForbidden, "parent: subagent runs are started by the subagent service, not submitted; leave parent out")
	}
	if principal != nil {
		if err := s.cfg.Authorize(ctx, tenant, principal, req); err != nil {
			return nil, refuse(403, ErrCodeForbidden, "%v", err)
		}
		if req.Config.UserID == "" {
			req.Config.UserID = principal.User
		}
	}
	data, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	if limit := s.cfg.Settings.MaxRequestBytes; limit > 0 && len(data) > limit {
		return nil, refuse(413, ErrCodeTooLarge, "run request is %d bytes with its principal, over the limit of %d bytes; put large content in files and reference it", len(data), limit)
	}
	return s.enqueue(ctx, req, data)
}

// admit applies the tenant's limits, with the gateway's codes: 400 for a
// bound, 507 for a quota, 429 for the rate (the answer says when to try
// again).
func (s *Service) admit(ctx context.Context, req *protocol.RunRequest) error {
	l := s.cfg.Limits
	if l == nil {
		return nil
	}
	if err := l.For(req.Tenant).CheckRequest(req); err != nil {
		return refuse(400, ErrCodeInvalid, "%v", err)
	}
	err := l.Admit(ctx, req.Tenant)
	var qe *limits.QuotaError
	var re *limits.RateError
	switch {
	case errors.As(err, &qe):
		return refuse(507, ErrCodeQuota, "%v", qe)
	case errors.As(err, &re):
		return refuse(429, ErrCodeRateLimited, "%v", re)
	}
	return err
}

// principal is the authenticated submitter from Nats-Request-Info. A
// request without it comes from inside the service account (a trusted
// service user, or a deployment without accounts): it has no principal.
func (s *Service) principal(tenant string, h nats.Header) (*protocol.Principal, error) {
	p, err := Requester(tenant, "submit runs of", h, s.cfg.Roles)
	if re, ok := errors.AsType[*RequesterError](err); ok {
		code := ErrCodeForbidden
		if re.Status == 400 {
			code = ErrCodeInvalid
		}
		return nil, refuse(re.Status, code, "%s", re.Msg)
	}
	return p, err
}

// RequesterError refuses a request that came through a tenant's service
// import: Status 400 (its request info does not decode) or 403 (another
// account's user, or no user named).
type RequesterError struct {
	Status int
	Msg    string
}

func (e *RequesterError) Error() string { return e.Msg }

// Requester is the authenticated user of a request to a service of
// tenant's (submit, cancel, delete), from the Nats-Request-Info header
// the server adds to a request that crossed a service import, with the
// roles roles gives (nil: none). A request without it comes from inside
// the service account (a trusted service user, or a deployment without
// accounts): (nil, nil). A requester of another account, or one naming
// no user, is refused with a *RequesterError; what names the action in
// its message ("cancel runs of"). The account check is defense in depth:
// the imports only let a tenant's account reach its own subjects.
func Requester(tenant, what string, h nats.Header, roles func(string, ClientInfo) []string) (*protocol.Principal, error) {
	raw := h.Get(HeaderRequestInfo)
	if raw == "" {
		return nil, nil
	}
	var info ClientInfo
	if err := json.Unmarshal([]byte(raw), &info); err != nil {
		return nil, &RequesterError{400, fmt.Sprintf("the %s header is not valid JSON: %v", HeaderRequestInfo, err)}
	}
	if !info.IsTenant(tenant) {
		if !nkeys.IsValidPublicAccountKey(info.Account) {
			return nil, &RequesterError{403, fmt.Sprintf("account %q may not %s tenant %q", clip(info.Account), what, tenant)}
		}
		return nil, &RequesterError{403, fmt.Sprintf("account %s may not %s tenant %q: its user's JWT has no tag %q (a user issued before natsagent tagged tenant users needs new creds: natsagent jwt user-rotate --account %s --user <user>, then push)",
			clip(info.Account), what, tenant, natsjwt.TenantTag(tenant), tenant)}
	}
	user := info.Principal()
	if user == "" {
		return nil, &RequesterError{403, fmt.Sprintf("the request names no NATS user; connect with a user of account %q", tenant)}
	}
	p := &protocol.Principal{User: user}
	if roles != nil {
		p.Roles = roles(tenant, info)
	}
	return p, nil
}

// IsTenant reports whether the requester is a user of tenant's account.
// With static accounts the account's name is the tenant. In JWT mode
// (natsjwt) the server names the account by its public key, and the
// user's JWT, signed by that account, carries the tenant's tag
// (natsjwt.TenantTag): an account key is never taken for a tenant name.
func (ci ClientInfo) IsTenant(tenant string) bool {
	if !nkeys.IsValidPublicAccountKey(ci.Account) {
		return ci.Account == tenant
	}
	return slices.Contains(ci.Tags, natsjwt.TenantTag(tenant))
}

// enqueue submits as the natsagent command does: a run id that already
// has a record on this thread is a retry, answered with its request's
// sequence; otherwise the thread record is created if missing and the
// request enqueued. The reject strategy is left to the worker.
func (s *Service) enqueue(ctx context.Context, req *protocol.RunRequest, data []byte) (*jetstream.PubAck, error) {
	runsStream := s.cfg.Settings.Names.RunsStream()
	rec, _, err := s.cfg.Stores.RunView(ctx, req.Tenant, req.ThreadID, req.RunID)
	switch {
	case err == nil:
		if rec.ThreadID != req.ThreadID {
			return nil, refuse(409, ErrCodeConflict, "run id %s is already used by a run on thread %s; choose another run_id", req.RunID, rec.ThreadID)
		}
		return &jetstream.PubAck{Stream: runsStream, Sequence: rec.MsgSeq, Duplicate: true}, nil
	case !errors.Is(err, kv.ErrNotFound):
		return nil, err
	}
	th, _, err := s.cfg.Stores.Threads.Get(ctx, req.Tenant, req.ThreadID)
	missing := errors.Is(err, kv.ErrNotFound)
	switch {
	case missing:
	case err != nil:
		return nil, err
	case !s.mayUseThread(th, req.Principal):
		// As for another tenant's thread: nothing says it exists.
		return nil, refuse(404, ErrCodeNotFound, "thread %s not found", req.ThreadID)
	case th.Status == protocol.ThreadDeleting:
		return nil, refuse(409, ErrCodeConflict, "thread %s is being deleted; a run submitted once the deletion ends starts a new thread", req.ThreadID)
	}
	// Limits last: a retry, or a run refused above, is not counted, and a
	// refused run leaves no thread behind.
	if err := s.admit(ctx, req); err != nil {
		return nil, err
	}
	if missing {
		now := time.Now().UTC()
		th := &protocol.Thread{ThreadID: req.ThreadID, Tenant: req.Tenant, CreatedAt: now, UpdatedAt: now, Status: protocol.ThreadIdle,
			Owner: principalUser(req.Principal)}
		_, err := s.cfg.Stores.Threads.Put(ctx, th, 0)
		if errors.Is(err, kv.ErrExists) {
			// Another submission created it meanwhile: whose is it?
			th, _, err = s.cfg.Stores.Threads.GetLatest(ctx, req.Tenant, req.ThreadID)
			if err == nil && !s.mayUseThread(th, req.Principal) {
				return nil, refuse(404, ErrCodeNotFound, "thread %s not found", req.ThreadID)
			}
			if err == nil && th.Status == protocol.ThreadDeleting {
				return nil, refuse(409, ErrCodeConflict, "thread %s is being deleted; a run submitted once the deletion ends starts a new thread", req.ThreadID)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("create thread %s: %w", req.ThreadID, err)
		}
	}
	out, err := s.cfg.Queue.Enqueue(ctx, req, data)
	switch {
	case errors.Is(err, submit.ErrRunIDTaken):
		return nil, refuse(409, ErrCodeConflict, "%v", err)
	case errors.Is(err, submit.ErrMaxPayload):
		return nil, refuse(413, ErrCodeTooLarge, "%v", err)
	case err != nil:
		return nil, err
	}
	s.log.Info("run submitted", zap.String("tenant", req.Tenant), zap.String("thread_id", req.ThreadID), zap.String("run_id", req.RunID),
		zap.String("user", principalUser(req.Principal)), zap.Uint64("msg_seq", out.Ack.Sequence), zap.Bool("duplicate", out.Ack.Duplicate))
	return out.Ack, nil
}

// mayUseThread applies the MayUseThread hook.
func (s *Service) mayUseThread(th *protocol.Thread, p *protocol.Principal) bool {
	return MayUse(s.cfg.MayUseThread, th, p)
}

// MayUse reports whether p may use th, by hook (Hooks.MayUseThread) when
// set, else when th has no owner or is p's. A request from inside the
// service account (p nil) may use any thread.
func MayUse(hook func(*protocol.Thread, *protocol.Principal) bool, th *protocol.Thread, p *protocol.Principal) bool {
	switch {
	case p == nil:
		return true
	case hook != nil:
		return hook(th, p)
	}
	return th.Owner == "" || th.Owner == p.User
}

func principalUser(p *protocol.Principal) string {
	if p == nil {
		return ""
	}
	return p.User
}

// apiError is a JetStream API error answer, which JetStream clients
// decode as such (nats.go: *jetstream.APIError).
type apiError struct {
	Error struct {
		Code        int    `json:"code"`
		ErrCode     int    `json:"err_code"`
		Description string `json:"description"`
	} `json:"error"`
}

func respondError(m *nats.Msg, r *refusal) {
	if m.Reply == "" {
		return
	}
	var body apiError
	body.Error.Code, body.Error.ErrCode, body.Error.Description = r.status, r.errCode, r.msg
	reply := nats.NewMsg(m.Reply)
	reply.Header.Set("Nats-Service-Error-Code", strconv.Itoa(r.status))
	reply.Header.Set("Nats-Service-Error", strings.Map(func(r rune) rune {
		if r == '\r' || r == '\n' {
			return ' '
		}
		return r
	}, r.msg))
	reply.Data, _ = json.Marshal(body)
	_ = m.RespondMsg(reply)
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
