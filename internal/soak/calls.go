package soak

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/natsagent/natsagent/internal/model"
)

// CallLog records the model calls of a soak's runs, by run and by the
// worker that made them, to find two attempts of a run calling the model
// at once (what the events cannot show: an attempt that lost its lease
// publishes nothing, but its model call would still have run). An
// attempt runs on one worker, and a worker runs one attempt of a run at
// a time, so calls of one run from two workers that overlap in time are
// calls of two attempts.
type CallLog struct {
	mu    sync.Mutex
	calls map[string][]modelCall // by run id
}

type modelCall struct {
	worker     string
	start, end time.Time
}

// Begin records the start of a model call of run on worker and returns
// the function that records its end.
func (l *CallLog) Begin(run, worker string) (end func()) {
	l.mu.Lock()
	if l.calls == nil {
		l.calls = map[string][]modelCall{}
	}
	i := len(l.calls[run])
	l.calls[run] = append(l.calls[run], modelCall{worker: worker, start: time.Now()})
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		l.calls[run][i].end = time.Now()
		l.mu.Unlock()
	}
}

// Overlaps lists the runs two workers of which called the model at the
// same time: "<run> (<worker> and <worker>, <how long>)". A call that
// has not returned counts as running until now.
func (l *CallLog) Overlaps() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	var out []string
	for run, calls := range l.calls {
		cs := append([]modelCall(nil), calls...)
		for i := range cs {
			if cs[i].end.IsZero() {
				cs[i].end = now
			}
		}
		sort.Slice(cs, func(i, j int) bool { return cs[i].start.Before(cs[j].start) })
		found := ""
		for i := 0; i < len(cs) && found == ""; i++ {
			for j := i + 1; j < len(cs) && cs[j].start.Before(cs[i].end); j++ {
				if cs[j].worker != cs[i].worker {
					end := cs[i].end
					if cs[j].end.Before(end) {
						end = cs[j].end
					}
					found = fmt.Sprintf("%s (%s and %s, %s)", run, cs[i].worker, cs[j].worker, end.Sub(cs[j].start).Round(time.Millisecond))
					break
				}
			}
		}
		if found != "" {
			out = append(out, found)
		}
	}
	sort.Strings(out)
	return out
}

// runOfRequest is the run a soak model call is for: its first user
// message is "soak run <run id>".
func runOfRequest(req *model.Request) string {
	for _, m := range req.Messages {
		if m.Role == model.RoleUser {
			return strings.TrimPrefix(m.Content, "soak run ")
		}
	}
	return ""
}

// logged wraps m so that its calls are recorded in l as worker's.
func (l *CallLog) logged(m model.Model, worker string) model.Model {
	return model.Func(func(ctx context.Context, req *model.Request, onDelta func(model.Delta)) (*model.Response, error) {
		defer l.Begin(runOfRequest(req), worker)()
		return m.Generate(ctx, req, onDelta)
	})
}
