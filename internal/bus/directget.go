package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrNoDirectGet is a direct get nobody answered: the stream does not allow
// direct gets (or has no leader at the moment). The caller asks through
// the JetStream API instead (Stream.GetMsg, KeyValue.Get), which knows.
var ErrNoDirectGet = errors.New("no direct get responder")

// DirectGetLast reads the last message of subject in stream with a direct
// get, as Stream.GetLastMsgForSubject does for a stream that allows
// direct gets, without the context, the request body and the formatting
// nats.go spends on each call (RequestAck tells the bound and the
// cancellation). jetstream.ErrMsgNotFound: no message. Like any direct
// get it may be answered by a replica behind the leader
// (GetMsgFromLeader).
func DirectGetLast(ctx context.Context, js jetstream.JetStream, stream, subject string) (*jetstream.RawStreamMsg, error) {
	return directGet(ctx, js, &nats.Msg{Subject: apiPrefix(js) + "DIRECT.GET." + stream + "." + subject})
}

// DirectGetNext reads the first message of subject in stream at or after
// seq with a direct get, as Stream.GetMsg(seq, WithGetMsgSubject) does.
func DirectGetNext(ctx context.Context, js jetstream.JetStream, stream, subject string, seq uint64) (*jetstream.RawStreamMsg, error) {
	var body []byte
	if strings.ContainsAny(subject, "\\\"") || !isASCII(subject) {
		var err error
		if body, err = json.Marshal(struct {
			Seq     uint64 `json:"seq,omitempty"`
			NextFor string `json:"next_by_subj"`
		}{seq, subject}); err != nil {
			return nil, err
		}
	} else {
		body = make([]byte, 0, 48+len(subject))
		body = append(body, '{')
		if seq > 0 {
			body = append(body, `"seq":`...)
			body = strconv.AppendUint(body, seq, 10)
			body = append(body, ',')
		}
		body = append(body, `"next_by_subj":"`...)
		body = append(body, subject...)
		body = append(body, `"}`...)
	}
	return directGet(ctx, js, &nats.Msg{Subject: apiPrefix(js) + "DIRECT.GET." + stream, Data: body})
}

func directGet(ctx context.Context, js jetstream.JetStream, m *nats.Msg) (*jetstream.RawStreamMsg, error) {
	r, err := request(ctx, js.Conn(), m)
	if errors.Is(err, nats.ErrNoResponders) {
		return nil, ErrNoDirectGet
	}
	if err != nil {
		return nil, err
	}
	// What nats.go's direct get reads from the answer (its headers).
	if len(r.Data) == 0 {
		if status := r.Header.Get("Status"); status != "" {
			if status == "404" {
				return nil, jetstream.ErrMsgNotFound
			}
			desc := r.Header.Get("Description")
			if desc == "" {
				desc = "unable to get message"
			}
			return nil, fmt.Errorf("nats: %s", desc)
		}
	}
	if len(r.Header) == 0 {
		return nil, errors.New("nats: response should have headers")
	}
	if r.Header.Get(jetstream.StreamHeader) == "" {
		return nil, errors.New("nats: missing stream header")
	}
	seq, err := strconv.ParseUint(r.Header.Get(jetstream.SequenceHeader), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("nats: invalid sequence header: %w", err)
	}
	tm, err := time.Parse(time.RFC3339Nano, r.Header.Get(jetstream.TimeStampHeaer))
	if err != nil {
		return nil, fmt.Errorf("nats: invalid timestamp header: %w", err)
	}
	subj := r.Header.Get(jetstream.SubjectHeader)
	if subj == "" {
		return nil, errors.New("nats: missing subject header")
	}
	return &jetstream.RawStreamMsg{Subject: subj, Sequence: seq, Header: r.Header, Data: r.Data, Time: tm}, nil
}

// apiPrefix is js's JetStream API prefix, ending with a dot.
func apiPrefix(js jetstream.JetStream) string {
	p := js.Options().APIPrefix
	if p == "" {
		return jetstream.DefaultAPIPrefix
	}
	if !strings.HasSuffix(p, ".") {
		return p + "."
	}
	return p
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 || s[i] < 0x20 {
			return false
		}
	}
	return true
}
