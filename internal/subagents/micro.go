package subagents

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/telemetry"
)

// QueueGroup is the queue group every worker serves the service in.
const QueueGroup = "natsagent-subagents"

// MetaService marks the service in its metadata (remote tool discovery
// skips every service that is not natsagent=tools).
const MetaService = "natsagent"

// Await timeouts of the service.
const (
	DefaultAwaitTimeout = 30 * time.Second
	MaxAwaitTimeout     = 10 * time.Minute
)

// requestTimeout bounds the work of one start, status or cancel request.
const requestTimeout = 45 * time.Second

// Serve registers the micro service (discoverable with $SRV.PING, INFO and
// STATS) with its four endpoints. Handlers never wait for a run: each
// request is handled on its own goroutine (at most MaxInFlight per
// operation at once), and an await only registers a waiter that answers
// later.
func (s *Service) Serve() error {
	svc, err := micro.AddService(s.nc, micro.Config{
		Name:        protocol.SubagentService,
		Version:     protocol.SubagentServiceVersion,
		Description: "natsagent subagent runs: start, status, cancel, await",
		Metadata:    map[string]string{MetaService: "subagents", "prefix": s.names.Prefix},
		QueueGroup:  QueueGroup,
	})
	if err != nil {
		return err
	}
	for _, op := range []string{protocol.SubagentStartOp, protocol.SubagentStatusOp, protocol.SubagentCancelOp, protocol.SubagentAwaitOp} {
		if err := svc.AddEndpoint(op, micro.HandlerFunc(s.handler(op)), micro.WithEndpointSubject(s.names.SubagentEndpoint(op))); err != nil {
			_ = svc.Stop()
			return err
		}
	}
	s.svc = svc
	return nil
}

// Stop unregisters the service and answers the awaits still waiting with
// a 503, so their clients await again (on another worker).
func (s *Service) Stop() {
	if s.svc != nil {
		_ = s.svc.Stop()
	}
	s.hub.close()
}

func (s *Service) handler(op string) func(micro.Request) {
	return func(req micro.Request) {
		tenant, _, ok := s.names.ParseSubagentSubject(req.Subject())
		if !ok || !protocol.ValidToken(tenant) {
			s.respondError(req, errInvalid("tenant %q in the subject is not a valid id", clip(tenant, 40)))
			return
		}
		// Each operation has its own subscription and its own bound: a
		// burst waits in the subscription's buffer (back-pressure) instead
		// of being refused, and slow cancels never hold up status or
		// await requests.
		slots := s.inflight[op]
		slots <- struct{}{}
		go func() {
			defer func() { <-slots }()
			ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
			defer cancel()
			s.serve(ctx, op, tenant, req)
		}()
	}
}

func (s *Service) serve(ctx context.Context, op, tenant string, req micro.Request) {
	if op == protocol.SubagentStartOp {
		var in protocol.SubagentStart
		if err := json.Unmarshal(req.Data(), &in); err != nil {
			s.respondError(req, errInvalid("the body must be a JSON object like {\"parent\":{...},\"subagent\":\"...\",\"task\":\"...\"}: %v", err))
			return
		}
		// A start over NATS carries its caller's trace, which the child's
		// request then continues.
		out, err := s.StartSubagent(telemetry.Extract(ctx, nats.Header(req.Headers())), tenant, &in)
		s.respond(req, out, err)
		return
	}
	var q protocol.SubagentQuery
	if err := json.Unmarshal(req.Data(), &q); err != nil {
		s.respondError(req, errInvalid("the body must be a JSON object like {\"run_id\":\"...\"}: %v", err))
		return
	}
	switch op {
	case protocol.SubagentStatusOp:
		out, err := s.SubagentStatus(ctx, tenant, q)
		s.respond(req, out, err)
	case protocol.SubagentCancelOp:
		out, err := s.CancelSubagent(ctx, tenant, q)
		s.respond(req, out, err)
	case protocol.SubagentAwaitOp:
		s.await(ctx, tenant, q, req)
	}
}

// await answers at once for a finished child; otherwise it registers a
// waiter whose callback answers, and returns.
func (s *Service) await(ctx context.Context, tenant string, q protocol.SubagentQuery, req micro.Request) {
	timeout := DefaultAwaitTimeout
	switch {
	case q.TimeoutMS < 0:
		s.respondError(req, errInvalid("timeout_ms must not be negative"))
		return
	case q.TimeoutMS > 0:
		// Compared before converting: a large timeout_ms overflows a
		// time.Duration into a negative one that answers at once.
		timeout = MaxAwaitTimeout
		if q.TimeoutMS < int(MaxAwaitTimeout/time.Millisecond) {
			timeout = time.Duration(q.TimeoutMS) * time.Millisecond
		}
	}
	rec, err := s.child(ctx, tenant, q)
	if err != nil {
		s.respondError(req, err)
		return
	}
	if rec.Status.Terminal() {
		s.respond(req, s.view(ctx, rec), nil)
		return
	}
	_, err = s.hub.add(rec.Tenant, rec.ThreadID, rec.RunID, timeout, func(r *protocol.Run, timedOut bool, err error) {
		if err != nil {
			s.respondError(req, err)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		st := s.view(ctx, r)
		st.TimedOut = timedOut
		s.respond(req, st, nil)
	})
	if err != nil {
		s.respondError(req, err)
	}
}

func (s *Service) respond(req micro.Request, v any, err error) {
	if err != nil {
		s.respondError(req, err)
		return
	}
	body, err := json.Marshal(v)
	if err != nil {
		s.respondError(req, err)
		return
	}
	s.send(req, &nats.Msg{Data: body})
}

// respondError answers with the micro error headers (an HTTP-like code and
// the message) and a JSON body with the code and, for busy, the active run.
func (s *Service) respondError(req micro.Request, err error) {
	var se *protocol.SubagentError
	if !errors.As(err, &se) {
		s.log.Warn("subagent request failed", zap.String("subject", req.Subject()), zap.Error(err))
		se = &protocol.SubagentError{Code: protocol.CodeInternal, Message: err.Error()}
	}
	body, _ := json.Marshal(protocol.SubagentErrorReply{Error: *se})
	m := &nats.Msg{Data: body, Header: nats.Header{}}
	m.Header.Set(micro.ErrorCodeHeader, statusOf(se.Code))
	m.Header.Set(micro.ErrorHeader, se.Message)
	s.send(req, m)
}

// send publishes a reply to the request's inbox itself: replies leave
// after the micro handler returned, from other goroutines, where the
// request's own Respond would race with micro's bookkeeping of the
// handler (its stats then count no errors).
func (s *Service) send(req micro.Request, m *nats.Msg) {
	m.Subject = req.Reply()
	if m.Subject == "" {
		return // a publish without a reply subject: nobody listens
	}
	if err := s.nc.PublishMsg(m); err != nil {
		s.log.Debug("subagent service reply not sent", zap.Error(err))
	}
}

// statusOf maps an error code to the micro error code header.
func statusOf(code string) string {
	switch code {
	case protocol.CodeInvalid:
		return "400"
	case protocol.CodeNotFound:
		return "404"
	case protocol.CodeBusy, protocol.CodeConflict:
		return "409"
	case protocol.CodeUnavailable:
		return "503"
	}
	return "500"
}
