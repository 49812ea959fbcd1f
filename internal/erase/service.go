package erase

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/intake"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/protocol"
)

// QueueGroup is the queue group of the delete service in every worker.
const QueueGroup = "natsagent-delete"

// ServiceConfig configures the delete service.
type ServiceConfig struct {
	Eraser *Eraser
	Logger *zap.Logger
	// Roles gives the roles of a NATS user of a tenant (nil: none).
	Roles func(tenant string, info intake.ClientInfo) []string
	// MayUseThread decides whether the principal may delete a thread
	// another user may own (nil: only the thread's owner, or any
	// principal on a thread without one): the submit service's rule.
	MayUseThread func(th *protocol.Thread, p *protocol.Principal) bool
	// Timeout bounds one deletion (default 2 minutes: a cancel's wait
	// and the settle delay fit in it).
	Timeout time.Duration
}

// Service answers P.ctl.<tenant>.<thread>.delete (a thread, ?cancel as
// the header Natsagent-Cancel: true) and P.ctl.<tenant>.<thread>.<run>.delete
// (a finished run). A tenant in its own NATS account reaches them through
// its service imports, with Nats-Request-Info naming its account and user,
// checked as the submit service checks a submission: the account must be
// the subject's tenant, and the thread the user's (another user's thread is
// not found). A request without Nats-Request-Info comes from inside the
// service account (the CLI, a trusted service) and may delete any thread.
// The answer is a protocol.DeleteReply, or a protocol.ErrorReply with
// Nats-Service-Error-Code and Nats-Service-Error headers; it goes only to
// m.Reply (m.Respond), which the server maps back to the requester.
type Service struct {
	cfg  ServiceConfig
	subs []*nats.Subscription
	wg   sync.WaitGroup
	stop sync.Once
}

// HeaderCancel on a thread delete request asks to cancel the thread's
// active run first (HTTP: ?cancel=true).
const HeaderCancel = "Natsagent-Cancel"

// Serve subscribes the delete service on nc in QueueGroup.
func Serve(nc *nats.Conn, cfg ServiceConfig) (*Service, error) {
	if cfg.Eraser == nil {
		return nil, errors.New("erase: the delete service needs an Eraser")
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Minute
	}
	s := &Service{cfg: cfg}
	names := cfg.Eraser.names
	for _, subj := range []string{names.ThreadDeleteSubjects(), names.RunDeleteSubjects()} {
		sub, err := nc.QueueSubscribe(subj, QueueGroup, func(m *nats.Msg) {
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				s.handle(m)
			}()
		})
		if err != nil {
			s.Stop()
			return nil, fmt.Errorf("subscribe to %s: %w", subj, err)
		}
		s.subs = append(s.subs, sub)
	}
	return s, nc.Flush()
}

// Stop unsubscribes and waits for the deletions in flight.
func (s *Service) Stop() {
	s.stop.Do(func() {
		for _, sub := range s.subs {
			_ = sub.Unsubscribe()
		}
		s.wg.Wait()
	})
}

// Error codes of the answers beyond protocol's (the cancel service's).
const (
	codeForbidden = "forbidden"
)

type refusal struct {
	status int
	code   string
	msg    string
}

func (r *refusal) Error() string { return r.msg }

func (s *Service) handle(m *nats.Msg) {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Timeout)
	defer cancel()
	tenant, thread, run, _ := s.cfg.Eraser.names.ParseDeleteSubject(m.Subject)
	err := s.serve(ctx, m)
	log := s.cfg.Logger.With(zap.String("tenant", tenant), zap.String("thread_id", thread), zap.String("run_id", run))
	if err != nil {
		r := refusalOf(err)
		if r.status >= 500 {
			log.Warn("delete request failed", zap.Error(err))
		} else {
			log.Info("delete request refused", zap.String("reason", r.msg))
		}
		respondError(m, r)
		return
	}
	data, _ := json.Marshal(protocol.DeleteReply{ThreadID: thread, RunID: run, Deleted: true})
	_ = m.Respond(data)
}

func (s *Service) serve(ctx context.Context, m *nats.Msg) error {
	e := s.cfg.Eraser
	tenant, thread, run, ok := e.names.ParseDeleteSubject(m.Subject)
	if !ok {
		return &refusal{400, protocol.CodeInvalid, "malformed delete subject"}
	}
	if err := checkIDs(tenant, thread); err != nil {
		return err
	}
	if run != "" {
		if err := checkIDs(run); err != nil {
			return err
		}
	}
	p, err := s.principal(tenant, m.Header)
	if err != nil {
		return err
	}
	th, _, err := e.stores.Threads.Get(ctx, tenant, thread)
	if errors.Is(err, kv.ErrNotFound) {
		return fmt.Errorf("thread %s: %w", thread, ErrNotFound)
	}
	if err != nil {
		return err
	}
	if !intake.MayUse(s.cfg.MayUseThread, th, p) {
		// As for another tenant's thread: nothing says it exists.
		return fmt.Errorf("thread %s: %w", thread, ErrNotFound)
	}
	if run != "" {
		return e.DeleteRun(ctx, tenant, thread, run)
	}
	cancelFirst, _ := strconv.ParseBool(m.Header.Get(HeaderCancel))
	return e.DeleteThread(ctx, tenant, thread, ThreadOptions{Cancel: cancelFirst})
}

// principal is the requester from Nats-Request-Info (nil: inside the
// service account), refused unless its account is the tenant's.
func (s *Service) principal(tenant string, h nats.Header) (*protocol.Principal, error) {
	p, err := intake.Requester(tenant, "delete threads of", h, s.cfg.Roles)
	if re, ok := errors.AsType[*intake.RequesterError](err); ok {
		code := codeForbidden
		if re.Status == 400 {
			code = protocol.CodeInvalid
		}
		return nil, &refusal{re.Status, code, re.Msg}
	}
	return p, err
}

// refusalOf maps an error of this package to the status and code it is
// answered with (HTTP and NATS alike).
func refusalOf(err error) *refusal {
	var r *refusal
	switch {
	case errors.As(err, &r):
		return r
	case errors.Is(err, ErrInvalid):
		return &refusal{400, protocol.CodeInvalid, err.Error()}
	case errors.Is(err, ErrNotFound):
		return &refusal{404, protocol.CodeNotFound, err.Error()}
	case errors.Is(err, ErrBusy):
		return &refusal{409, protocol.CodeBusy, err.Error()}
	}
	return &refusal{503, protocol.CodeUnavailable, fmt.Sprintf("the deletion did not finish: %v; try again", err)}
}

func respondError(m *nats.Msg, r *refusal) {
	if m.Reply == "" {
		return
	}
	reply := nats.NewMsg(m.Reply)
	reply.Header.Set("Nats-Service-Error-Code", strconv.Itoa(r.status))
	reply.Header.Set("Nats-Service-Error", strings.Map(func(c rune) rune {
		if c == '\r' || c == '\n' {
			return ' '
		}
		return c
	}, r.msg))
	reply.Data, _ = json.Marshal(protocol.ErrorReply{Error: protocol.ErrorBody{Code: r.code, Message: r.msg}})
	_ = m.RespondMsg(reply)
}
