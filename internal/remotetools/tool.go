package remotetools

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/tools"
)

// Tool is one remote tool of one tenant, as a discovery found it. It is
// immutable: a later discovery that changes it makes a new Tool.
type Tool struct {
	nc      *nats.Conn
	tenant  string
	name    string // the endpoint's name; the model's is spec.Name
	subject string
	service string
	spec    model.ToolSpec
	// timeout is the endpoint's timeout_ms (0: defaultTimeout).
	timeout        time.Duration
	defaultTimeout time.Duration
}

// Spec implements tools.Tool.
func (t *Tool) Spec() model.ToolSpec { return t.spec }

// Tenant is the tenant whose runs may call the tool.
func (t *Tool) Tenant() string { return t.tenant }

// Subject is the endpoint's request subject.
func (t *Tool) Subject() string { return t.subject }

// Timeout bounds one call.
func (t *Tool) Timeout() time.Duration {
	if t.timeout > 0 {
		return t.timeout
	}
	return t.defaultTimeout
}

func (t *Tool) same(o *Tool) bool {
	return t.subject == o.subject && t.service == o.service && t.timeout == o.timeout &&
		t.spec.Description == o.spec.Description && bytes.Equal(t.spec.Parameters, o.spec.Parameters)
}

// Call implements tools.Tool: one request to the endpoint, bounded by the
// tool's timeout and by ctx. Whatever goes wrong on the tool's side (no
// server, no answer in time, an error header, a reply that is not text) is
// an error result the model reads; only the end of the run itself returns
// an error, and it stops the wait at once.
func (t *Tool) Call(ctx context.Context, call *tools.Call) (*tools.Result, error) {
	env := call.Env
	if env == nil {
		env = &tools.Env{}
	}
	if env.Tenant != t.tenant {
		// Prepare hands a run only its tenant's tools; this is the
		// second lock on that door.
		return failed("%s is not available to this run's tenant.", t.spec.Name), nil
	}
	timeout := t.Timeout()
	callCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	msg := nats.NewMsg(t.subject)
	msg.Data = call.Args
	if len(bytes.TrimSpace(msg.Data)) == 0 {
		msg.Data = []byte("{}")
	}
	msg.Header.Set(HeaderTenant, t.tenant)
	setIf(msg.Header, HeaderThread, env.Thread)
	setIf(msg.Header, HeaderRun, env.Run)
	setIf(msg.Header, HeaderUser, env.User)
	setIf(msg.Header, HeaderToolCall, call.ID)
	if deadline, ok := callCtx.Deadline(); ok {
		msg.Header.Set(HeaderDeadline, deadline.UTC().Format(time.RFC3339Nano))
	}
	reply, err := t.nc.RequestMsgWithContext(callCtx, msg)
	if err != nil {
		switch {
		case ctx.Err() != nil:
			return nil, context.Cause(ctx)
		case errors.Is(err, nats.ErrNoResponders):
			return failed("%s is not served right now (no service answers %s); try again later or do without it.", t.spec.Name, t.subject), nil
		case callCtx.Err() != nil || errors.Is(err, nats.ErrTimeout):
			return failed("%s did not answer within %s; it may still be working, so do not assume it had no effect.", t.spec.Name, timeout), nil
		}
		return failed("%s could not be called: %v", t.spec.Name, err), nil
	}
	desc, code := reply.Header.Get(micro.ErrorHeader), reply.Header.Get(micro.ErrorCodeHeader)
	if desc != "" || code != "" {
		if desc == "" {
			desc = "the tool reported an error without a description"
		}
		if code != "" {
			return failed("%s failed (code %s): %s", t.spec.Name, code, desc), nil
		}
		return failed("%s failed: %s", t.spec.Name, desc), nil
	}
	if !utf8.Valid(reply.Data) {
		return failed("%s answered with %d bytes that are not UTF-8 text; the tool must reply with its result as text.", t.spec.Name, len(reply.Data)), nil
	}
	out := string(reply.Data)
	if strings.TrimSpace(out) == "" {
		out = "The tool returned no content."
	}
	return tools.Text(out), nil
}

func setIf(h nats.Header, k, v string) {
	if v != "" {
		h.Set(k, v)
	}
}

func failed(format string, args ...any) *tools.Result {
	return &tools.Result{Content: fmt.Sprintf(format, args...), Error: true}
}

var _ tools.Tool = (*Tool)(nil)
