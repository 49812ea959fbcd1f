package bench

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// baseline is a raw JetStream work queue on the same server: what a run
// request costs the server with no natsagent at all. Its stream has the
// runs stream's retention, storage and duplicate window, and messages
// carry a Nats-Msg-Id like run requests.
type baseline struct {
	e       *env
	nc      *nats.Conn
	js      jetstream.JetStream
	stream  string
	subject string
	cons    jetstream.Consumer
}

func (e *env) newBaseline(ctx context.Context, suffix string) (*baseline, error) {
	nc, err := e.connect("natsagent-bench-baseline")
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	b := &baseline{e: e, nc: nc, js: js,
		stream:  strings.ToUpper(e.cfg.Prefix) + "_BASELINE_" + strings.ToUpper(suffix),
		subject: e.cfg.Prefix + ".baseline." + suffix,
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:       b.stream,
		Subjects:   []string{b.subject},
		Retention:  jetstream.WorkQueuePolicy,
		Storage:    jetstream.FileStorage,
		Duplicates: 10 * time.Minute,
	}); err != nil {
		b.close()
		return nil, fmt.Errorf("baseline stream: %w", err)
	}
	if b.cons, err = js.CreateOrUpdateConsumer(ctx, b.stream, jetstream.ConsumerConfig{
		Durable:       "baseline",
		AckPolicy:     jetstream.AckExplicitPolicy,
		MaxAckPending: 100000,
	}); err != nil {
		b.close()
		return nil, fmt.Errorf("baseline consumer: %w", err)
	}
	return b, nil
}

func (b *baseline) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = b.e.js.DeleteStream(ctx, b.stream)
	b.nc.Close()
}

func (b *baseline) msg(i int, payload []byte) *nats.Msg {
	m := nats.NewMsg(b.subject)
	m.Data = payload
	m.Header.Set(nats.MsgIdHdr, fmt.Sprintf("m%d", i))
	return m
}

// throughput publishes n messages one sync publish at a time, then pulls
// them in batches and acks each. It returns messages per second over both
// phases (and the number measured, fewer than n if ctx ended first).
func (b *baseline) throughput(ctx context.Context, n int, payload []byte) (float64, int, error) {
	start := time.Now()
	published := 0
	for ; published < n && ctx.Err() == nil; published++ {
		if _, err := b.js.PublishMsg(ctx, b.msg(published, payload)); err != nil {
			if ctx.Err() != nil {
				break
			}
			return 0, 0, fmt.Errorf("baseline publish: %w", err)
		}
	}
	consumed := 0
	for consumed < published && ctx.Err() == nil {
		batch, err := b.cons.Fetch(min(256, published-consumed), jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return 0, 0, fmt.Errorf("baseline fetch: %w", err)
		}
		for m := range batch.Messages() {
			_ = m.Ack()
			consumed++
		}
	}
	if err := b.nc.FlushTimeout(10 * time.Second); err != nil {
		return 0, 0, err
	}
	if consumed < n {
		return rate(consumed, time.Since(start)), consumed, errOutOfTime
	}
	return rate(consumed, time.Since(start)), consumed, nil
}

// roundTrips measures n sequential round trips: a sync publish, a fetch
// of that message and its ack.
func (b *baseline) roundTrips(ctx context.Context, n int, payload []byte) (durations, error) {
	var out durations
	for i := range n {
		if ctx.Err() != nil {
			return out, errOutOfTime
		}
		t0 := time.Now()
		if _, err := b.js.PublishMsg(ctx, b.msg(1_000_000+i, payload)); err != nil {
			return out, fmt.Errorf("baseline publish: %w", err)
		}
		batch, err := b.cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return out, fmt.Errorf("baseline fetch: %w", err)
		}
		got := false
		for m := range batch.Messages() {
			_ = m.Ack()
			got = true
		}
		if !got {
			return out, fmt.Errorf("baseline fetch returned nothing: %v", batch.Error())
		}
		out = append(out, time.Since(t0))
	}
	return out, nil
}
