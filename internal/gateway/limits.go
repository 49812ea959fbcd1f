package gateway

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/natsagent/natsagent/internal/limits"
	"github.com/natsagent/natsagent/internal/protocol"
)

// admitRun applies the tenant's limits to a run about to be submitted:
// its timeout and step bounds (400 naming the field and the maximum),
// then its stored events (507 at max_event_bytes) and its submission rate
// (429 with Retry-After). Without limits
// configured only the protocol's bounds apply (protocol.Validate).
func (s *Server) admitRun(ctx context.Context, w http.ResponseWriter, req *protocol.RunRequest) error {
	l := s.cfg.Limits
	if l == nil {
		return nil
	}
	if err := l.For(req.Tenant).CheckRequest(req); err != nil {
		return err
	}
	err := l.Admit(ctx, req.Tenant)
	var re *limits.RateError
	var qe *limits.QuotaError
	if errors.As(err, &qe) {
		return errQuota(qe.Error())
	}
	if errors.As(err, &re) {
		w.Header().Set("Retry-After", strconv.Itoa(int((re.RetryAfter+time.Second-1)/time.Second)))
		return &apiError{status: http.StatusTooManyRequests, code: protocol.CodeRateLimited, msg: re.Error()}
	}
	return err
}

// errQuota refuses what would take a tenant's stored data over its quota
// (507 Insufficient Storage, code quota_exceeded).
func errQuota(msg string) *apiError {
	return &apiError{status: http.StatusInsufficientStorage, code: protocol.CodeQuotaExceeded, msg: msg}
}
