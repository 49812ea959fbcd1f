package jobs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/protocol"
)

// Headers every job carries. They survive the schedule (the server strips
// only the schedule's own headers and Nats-Msg-Id).
const (
	// HeaderJobID is the job's id (the Nats-Msg-Id it was enqueued with).
	HeaderJobID = "Natsagent-Job-Id"
	// HeaderJobDue is when the job became due (RFC 3339).
	HeaderJobDue = "Natsagent-Job-Due"
)

// Spec is one job to enqueue.
type Spec struct {
	// Kind selects the handler; a subject token.
	Kind string
	// Tokens route the job: it is published to <prefix>.jobs.<kind>.<tokens>.
	Tokens []string
	// Key names the pending job among those with the same tokens: while a
	// job is scheduled, its schedule lives on <prefix>.schedules.jobs.<kind>.<tokens>.<key>.
	Key string
	// ID dedupes: a second job with the same id inside the jobs stream's
	// duplicate window is dropped (Nats-Msg-Id).
	ID string
	// Due is when the job may run; zero or past means now.
	Due  time.Time
	Data []byte
}

// Enqueued reports what Enqueue did.
type Enqueued struct {
	// Duplicate is true when a job with the same id was already enqueued.
	Duplicate bool
	Due       time.Time
}

// Enqueue publishes a job. A job due later is held by the jobs stream as a
// message schedule and published to its subject when due, so no worker
// holds a timer and no delivery is spent waiting.
func Enqueue(ctx context.Context, js jetstream.JetStream, names bus.Names, spec Spec) (Enqueued, error) {
	if !protocol.ValidToken(spec.Kind) {
		return Enqueued{}, fmt.Errorf("job kind %q is not a valid token", spec.Kind)
	}
	for _, t := range append(append([]string(nil), spec.Tokens...), spec.Key) {
		if !protocol.ValidToken(t) {
			return Enqueued{}, fmt.Errorf("job %s: token %q is not valid", spec.Kind, t)
		}
	}
	if spec.ID == "" {
		return Enqueued{}, errors.New("a job needs an id")
	}
	target := names.JobSubject(spec.Kind, spec.Tokens...)
	due := spec.Due
	now := time.Now()
	if due.IsZero() || due.Before(now) {
		due = now
	}
	subject := target
	opts := []jetstream.PublishOpt{jetstream.WithMsgID(spec.ID)}
	if due.After(now) {
		subject = names.JobScheduleSubject(spec.Kind, append(append([]string(nil), spec.Tokens...), spec.Key)...)
		opts = append(opts, jetstream.WithScheduleAt(due), jetstream.WithScheduleTarget(target))
	}
	m := nats.NewMsg(subject)
	m.Data = spec.Data
	m.Header.Set(HeaderJobID, spec.ID)
	m.Header.Set(HeaderJobDue, due.UTC().Format(time.RFC3339))
	ack, err := js.PublishMsg(ctx, m, opts...)
	if err != nil {
		return Enqueued{}, fmt.Errorf("enqueue %s job %s: %w", spec.Kind, spec.ID, err)
	}
	return Enqueued{Duplicate: ack.Duplicate, Due: due}, nil
}
