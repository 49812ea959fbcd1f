package middleware

// Dynamic context. Boundary: prompt (request only). Reads nothing from
// state; writes nothing; emits nothing. It adds the current date to the
// system prompt of every model call, in the configured time zone, so the
// model knows "today" without the date ever being stored in the thread
// (where it would go stale). The date in the system prompt is the one the
// run started on, so the prompt's cached prefix holds for the whole run
// (promptcontext.go); a run still going on a later day gets the new date
// in its trailing context as well.

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
	return next(ctx, d.request(rt, req))
}

// request is the call's request with the date (built apart: chain.go,
// "Frames").
func (d *DynamicContext) request(rt *Runtime, req *ModelRequest) *ModelRequest {
	today := d.now().In(d.loc).Format("2006-01-02, Monday")
	start := Scratch(rt, "dynamic_context:date", func() string { return today })
	c := *req
	c.appendShared("<current_date>" + start + "</current_date>")
	if today != start {
		return withContextSection(&c, "<current_date>"+today+"</current_date>\nThe date changed since this conversation's system prompt was written.")
	}
	return &c
}
