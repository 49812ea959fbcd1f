package bus

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// RequestTimeout bounds one request to a stream when the caller's context
// allows longer: nats.go applies its own timeout only to a context without
// a deadline, and under a run's context (an hour by default) a request lost
// with a node that went down, or sent during a leader election, would wait
// for an answer that never comes.
const RequestTimeout = 5 * time.Second

// errTimedOut is a request that got no answer in time. It matches both
// nats.ErrTimeout and context.DeadlineExceeded, what js.PublishMsg returns
// for the same thing under a context with a deadline.
var errTimedOut = fmt.Errorf("%w: %w", nats.ErrTimeout, context.DeadlineExceeded)

// RequestAck publishes m to a stream and waits for the stream's ack, as
// js.PublishMsg does without options (a missing responder is asked again
// twice, 250 ms apart; an API error comes back as *jetstream.APIError), at
// a lower cost per publish: the wait is a request with a timeout (nats.go
// pools its timers) instead of a context and a timer made for each call,
// and a successful ack ({"stream":..,"seq":..}) is read without
// encoding/json. The wait is RequestTimeout at most, shorter if ctx's
// deadline comes first. A request already sent is not abandoned when ctx
// is cancelled while the connection is up: it is answered or times out
// within that bound, so a compare-and-set's outcome is known more often,
// not less. While the connection is down (reconnecting: the request sits
// in nats.go's reconnect buffer, or went out before the connection
// dropped) no answer can come before it is back, and a cancelled request
// returns at once with ctx's error, as one that timed out after its
// cancel does: whether it is stored is unknown (the buffer is sent when
// the connection is back).
func RequestAck(ctx context.Context, nc *nats.Conn, m *nats.Msg) (jetstream.PubAck, error) {
	var resp *nats.Msg
	var err error
	for try := 0; ; try++ {
		resp, err = request(ctx, nc, m)
		if !errors.Is(err, nats.ErrNoResponders) || try == jetstream.DefaultPubRetryAttempts {
			break
		}
		// A leader change between two stream leaders: ask again shortly.
		if !sleepCtx(ctx, jetstream.DefaultPubRetryWait) {
			return jetstream.PubAck{}, ctx.Err()
		}
	}
	if errors.Is(err, nats.ErrNoResponders) {
		return jetstream.PubAck{}, jetstream.ErrNoStreamResponse
	}
	if err != nil {
		return jetstream.PubAck{}, err
	}
	return ParsePubAck(resp.Data)
}

// request sends m and waits for one answer, RequestTimeout at most and no
// longer than ctx's deadline. A request is not sent once ctx has ended;
// one already sent is abandoned on ctx's cancel only while the connection
// is down (see RequestAck).
func request(ctx context.Context, nc *nats.Conn, m *nats.Msg) (*nats.Msg, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	limit := RequestTimeout
	if d, ok := ctx.Deadline(); ok {
		limit = min(limit, time.Until(d))
		if limit <= 0 {
			return nil, context.DeadlineExceeded
		}
	}
	if ctx.Done() == nil {
		// Never cancelled: nats.go's wait, with its pooled timer.
		resp, err := nc.RequestMsg(m, limit)
		if errors.Is(err, nats.ErrTimeout) {
			return nil, errTimedOut
		}
		return resp, err
	}
	w := newAckWait(nc, limit)
	stop := context.AfterFunc(ctx, w.cancelled)
	resp, err := nc.RequestMsgWithContext(w, m)
	waitEnded := err != nil && w.ended()
	w.release(stop())
	if waitEnded {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, errTimedOut
	}
	return resp, err
}

// ackWait is what nats.go waits on for the answer to one request under a
// context that can be cancelled: its Done closes when the request's time
// is up, or when its caller cancelled it while the connection was down (no
// answer comes over a connection that is down, and the caller has stopped
// waiting for one). It is a context for nats.go's wait only (no deadline,
// no values). Waits are pooled: a request costs the registration on its
// caller's context, not a context and a timer of its own.
type ackWait struct {
	nc        *nats.Conn
	done      chan struct{}
	closed    atomic.Bool
	err       error       // why done closed, written before it closes
	timer     *time.Timer // ends the wait when its time is up
	cancelled func()      // w.watch, bound once: the caller's cancel
}

var ackWaits = sync.Pool{New: func() any {
	w := &ackWait{done: make(chan struct{})}
	w.cancelled = w.watch
	return w
}}

func newAckWait(nc *nats.Conn, limit time.Duration) *ackWait {
	w := ackWaits.Get().(*ackWait)
	w.nc = nc
	if w.timer == nil {
		w.timer = time.AfterFunc(limit, w.timeUp)
	} else {
		w.timer.Reset(limit)
	}
	return w
}

func (w *ackWait) timeUp() { w.end(context.DeadlineExceeded) }

// end closes the wait once, with why.
func (w *ackWait) end(why error) {
	if w.closed.CompareAndSwap(false, true) {
		w.err = why
		close(w.done)
	}
}

func (w *ackWait) ended() bool { return w.closed.Load() }

// watch runs when the caller cancels: it ends the wait once the
// connection is not connected (at once when it is not), and returns when
// the wait ends.
func (w *ackWait) watch() {
	changed := w.nc.StatusChanged(nats.DISCONNECTED, nats.RECONNECTING, nats.CLOSED)
	defer w.nc.RemoveStatusListener(changed)
	for w.nc.IsConnected() {
		select {
		case <-changed:
		case <-w.done:
			return
		}
	}
	w.end(context.Canceled)
}

// release ends the use of w once its request returned; unwatched says the
// caller's cancel never ran watch (context.AfterFunc's stop). A wait that
// ended, or that watch may still use, is not used again.
func (w *ackWait) release(unwatched bool) {
	stopped := w.timer.Stop()
	if !unwatched {
		w.end(context.Canceled) // lets watch return
		return
	}
	if stopped && !w.ended() {
		w.nc = nil
		ackWaits.Put(w)
	}
}

func (w *ackWait) Deadline() (time.Time, bool) { return time.Time{}, false }
func (w *ackWait) Done() <-chan struct{}       { return w.done }
func (w *ackWait) Value(any) any               { return nil }

func (w *ackWait) Err() error {
	if !w.closed.Load() {
		return nil
	}
	<-w.done // err is written before done closes
	return w.err
}

// ParsePubAck reads a stream's answer to a publish. The answer of a stored
// message is a flat object of names and plain values, read by hand; one
// that carries an error, or anything unexpected (an escaped character, a
// missing field), is decoded by encoding/json as nats.go decodes it.
func ParsePubAck(data []byte) (jetstream.PubAck, error) {
	if bytes.IndexByte(data, '\\') < 0 && !bytes.Contains(data, []byte(`"error"`)) {
		var ack jetstream.PubAck
		stream, ok1 := ackString(data, `"stream":`)
		seq, ok2 := ackNumber(data, `"seq":`)
		if ok1 && ok2 && len(stream) > 0 {
			ack.Stream, ack.Sequence = string(stream), seq
			ack.Duplicate = ackTrue(data, `"duplicate":`)
			if d, ok := ackString(data, `"domain":`); ok {
				ack.Domain = string(d)
			}
			if v, ok := ackString(data, `"val":`); ok {
				ack.Value = string(v)
			}
			return ack, nil
		}
	}
	var resp struct {
		Error *jetstream.APIError `json:"error,omitempty"`
		*jetstream.PubAck
	}
	if err := json.Unmarshal(data, &resp); err != nil {
		return jetstream.PubAck{}, jetstream.ErrInvalidJSAck
	}
	if resp.Error != nil {
		return jetstream.PubAck{}, fmt.Errorf("nats: %w", resp.Error)
	}
	if resp.PubAck == nil || resp.Stream == "" {
		return jetstream.PubAck{}, jetstream.ErrInvalidJSAck
	}
	return *resp.PubAck, nil
}

// ackString is the string value after name in an ack without escapes
// (every quote in it delimits a string, so name can only match a name).
func ackString(data []byte, name string) ([]byte, bool) {
	i := bytes.Index(data, []byte(name))
	if i < 0 {
		return nil, false
	}
	rest := bytes.TrimLeft(data[i+len(name):], " ")
	if len(rest) == 0 || rest[0] != '"' {
		return nil, false
	}
	end := bytes.IndexByte(rest[1:], '"')
	if end < 0 {
		return nil, false
	}
	return rest[1 : 1+end], true
}

// ackNumber is the unsigned number after name in an ack without escapes.
func ackNumber(data []byte, name string) (uint64, bool) {
	i := bytes.Index(data, []byte(name))
	if i < 0 {
		return 0, false
	}
	rest := bytes.TrimLeft(data[i+len(name):], " ")
	var v uint64
	n := 0
	for ; n < len(rest) && rest[n] >= '0' && rest[n] <= '9'; n++ {
		if v > (math.MaxUint64-9)/10 {
			return 0, false // beyond any sequence
		}
		v = v*10 + uint64(rest[n]-'0')
	}
	if n == 0 || (n < len(rest) && rest[n] != ',' && rest[n] != '}' && rest[n] != ' ') {
		return 0, false
	}
	return v, true
}

// ackTrue reports whether the value after name in an ack is true (the
// server writes `"duplicate": true`, with a space).
func ackTrue(data []byte, name string) bool {
	i := bytes.Index(data, []byte(name))
	return i >= 0 && bytes.HasPrefix(bytes.TrimLeft(data[i+len(name):], " "), []byte("true"))
}

// sleepCtx waits d or until ctx ends; it reports whether d passed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
