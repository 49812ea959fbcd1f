package bus

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// MsgQuery selects one stream message for GetMsgFromLeader.
type MsgQuery struct {
	// Seq is the sequence to get; with NextBySubject, where to start.
	Seq uint64
	// LastBySubject gets the last message of a subject.
	LastBySubject string
	// NextBySubject gets the first message of a subject at or after Seq
	// (or StartTime).
	NextBySubject string
	// StartTime gets the first message stored at or after it (instead of
	// Seq).
	StartTime time.Time
}

// GetMsgFromLeader reads a stream message through the stream's leader
// (the JetStream API's message get) instead of a direct get. Every
// replica of a replicated stream with direct gets allowed (all of
// natsagent's streams and buckets) answers direct gets, and a follower
// applies a write only after the leader acknowledged it: a direct get may
// miss a message that was just stored, or return one that was just
// replaced or removed. Use this where a stale answer would decide
// something: after a create or compare-and-set was refused, before
// concluding a message is gone. It returns jetstream.ErrMsgNotFound when
// no message matches.
func GetMsgFromLeader(ctx context.Context, js jetstream.JetStream, stream string, q MsgQuery) (*jetstream.RawStreamMsg, error) {
	var start *time.Time
	if !q.StartTime.IsZero() {
		start = &q.StartTime
	}
	body, err := json.Marshal(struct {
		Seq       uint64     `json:"seq,omitempty"`
		LastFor   string     `json:"last_by_subj,omitempty"`
		NextFor   string     `json:"next_by_subj,omitempty"`
		StartTime *time.Time `json:"start_time,omitempty"`
	}{q.Seq, q.LastBySubject, q.NextBySubject, start})
	if err != nil {
		return nil, err
	}
	prefix := apiPrefix(js)
	// Bounded even under a longer deadline: a request lost with a node
	// that went down is never answered.
	timeout := js.Options().DefaultTimeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	reply, err := js.Conn().RequestWithContext(ctx, prefix+"STREAM.MSG.GET."+stream, body)
	if err != nil {
		return nil, fmt.Errorf("stream %s: message get: %w", stream, err)
	}
	var resp struct {
		Error   *jetstream.APIError `json:"error,omitempty"`
		Message *struct {
			Subject  string    `json:"subject"`
			Sequence uint64    `json:"seq"`
			Header   []byte    `json:"hdrs,omitempty"`
			Data     []byte    `json:"data,omitempty"`
			Time     time.Time `json:"time"`
		} `json:"message,omitempty"`
	}
	if err := json.Unmarshal(reply.Data, &resp); err != nil {
		return nil, fmt.Errorf("stream %s: undecodable message get answer: %w", stream, err)
	}
	if resp.Error != nil {
		if resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound {
			return nil, jetstream.ErrMsgNotFound
		}
		return nil, resp.Error
	}
	if resp.Message == nil {
		return nil, jetstream.ErrInvalidJetStreamResponse
	}
	m := &jetstream.RawStreamMsg{Subject: resp.Message.Subject, Sequence: resp.Message.Sequence, Data: resp.Message.Data, Time: resp.Message.Time}
	if len(resp.Message.Header) > 0 {
		if m.Header, err = nats.DecodeHeadersMsg(resp.Message.Header); err != nil {
			return nil, err
		}
	}
	return m, nil
}
