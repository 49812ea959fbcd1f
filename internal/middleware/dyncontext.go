package middleware

// Dynamic context. Boundary: prompt (request only). Reads nothing from
// state; writes nothing; emits nothing. It adds the current date to the
// system prompt of every model call, in the configured time zone, so the
// model knows "today" without the date ever being stored in the thread
// (where it would go stale). Later issues add memory here.

import (
	"context"
	"fmt"
	"time"
)

// DynamicContext injects the current date into each request.
type DynamicContext struct {
	// Timezone is an IANA name; UTC when empty.
	Timezone string `json:"timezone"`
	loc      *time.Location
	now      func() time.Time
}

// NewDynamicContext checks the time zone.
func NewDynamicContext(d DynamicContext) (*DynamicContext, error) {
	d.loc = time.UTC
	if d.Timezone != "" {
		loc, err := time.LoadLocation(d.Timezone)
		if err != nil {
			return nil, fmt.Errorf("timezone %q: %w", d.Timezone, err)
		}
		d.loc = loc
	}
	if d.now == nil {
		d.now = time.Now
	}
	return &d, nil
}

// Name implements Middleware.
func (*DynamicContext) Name() string { return "dynamic_context" }

// WrapModelCall implements WrapModelCall.
func (d *DynamicContext) WrapModelCall(ctx context.Context, rt *Runtime, req *ModelRequest, next ModelHandler) (*ModelResponse, error) {
	c := *req
	date := fmt.Sprintf("<current_date>%s</current_date>", d.now().In(d.loc).Format("2006-01-02, Monday"))
	if c.System == "" {
		c.System = date
	} else {
		c.System += "\n\n" + date
	}
	return next(ctx, &c)
}
