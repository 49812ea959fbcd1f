package bus

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// errCodeMsgIDInProcess is the stream's answer to a publish whose
// Nats-Msg-Id is still being stored by an earlier publish (409, "duplicate
// message id is in process"): a concurrent publish of the same message, or
// one that timed out during a leader election and is still being
// replicated. nats.go has no constant for it.
const errCodeMsgIDInProcess jetstream.ErrorCode = 10158

// The 503s of a cluster between leaders, which nats.go has no constants
// for either: "JetStream system temporarily unavailable" (no meta or
// stream leader yet), "expected last sequence per subject temporarily
// unavailable" (a KV compare-and-set on a new stream leader still
// catching up) and "incomplete results".
const (
	errCodeClusterNotAvailable       jetstream.ErrorCode = 10008
	errCodeLastSeqPerSubjectNotReady jetstream.ErrorCode = 10163
	errCodeClusterIncomplete         jetstream.ErrorCode = 10004
)

// maxPublishRetry bounds how long PublishMsg keeps retrying: beyond a
// leader election (a few seconds), the caller's own recovery takes over.
const maxPublishRetry = 15 * time.Second

// PublishMsg publishes m to a stream and waits for its ack, like
// js.PublishMsg. When m carries a Nats-Msg-Id, the stream stores it once
// however often it is sent, so PublishMsg also sends it again on what a
// leader election or a node loss answers: no responders, a timeout, the
// JetStream cluster temporarily unavailable, and the same id still being
// stored by an earlier attempt. It retries with a growing pause for at
// most 15s and while ctx lasts. A message without an id is sent once: a
// retry could store it twice.
func PublishMsg(ctx context.Context, js jetstream.JetStream, m *nats.Msg) (*jetstream.PubAck, error) {
	if m.Header.Get(jetstream.MsgIDHeader) == "" {
		return publishOnce(ctx, js, m)
	}
	deadline := time.Now().Add(maxPublishRetry)
	pause := 50 * time.Millisecond
	for {
		// One attempt waits RequestTimeout at most: a publish lost with a
		// node that went down is never answered, and under a long
		// deadline (a run's) it would otherwise wait for that deadline.
		ack, err := publishOnce(ctx, js, m)
		if err == nil || !Transient(err) || ctx.Err() != nil || time.Now().Add(pause).After(deadline) {
			return ack, err
		}
		if !sleepCtx(ctx, pause) {
			return nil, err
		}
		pause = min(2*pause, time.Second)
	}
}

// publishOnce is one attempt of PublishMsg (RequestAck).
func publishOnce(ctx context.Context, js jetstream.JetStream, m *nats.Msg) (*jetstream.PubAck, error) {
	ack, err := RequestAck(ctx, js.Conn(), m)
	if err != nil {
		return nil, err
	}
	return &ack, nil
}

// Transient reports an error that a JetStream request may not get again
// once the cluster has a leader for what it asked: no responders, a
// timeout, an unavailable cluster or stream leader, a connection that is
// reconnecting, or a message id still being stored.
func Transient(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case errCodeMsgIDInProcess, errCodeClusterNotAvailable, errCodeLastSeqPerSubjectNotReady, errCodeClusterIncomplete:
			return true
		}
		// Other 503s are limits and configuration (a full stream: 10077
		// "maximum bytes exceeded", JetStream disabled, no resources):
		// sending again would get the same answer.
		return false
	}
	return errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, nats.ErrDisconnected)
}
