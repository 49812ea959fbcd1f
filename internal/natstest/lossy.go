package natstest

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// LossyAPI returns a JetStream context on nc whose API requests go
// through a proxy that forwards them to the server's JetStream API,
// except those drop matches (by the API subject after "$JS.API.", such as
// "CONSUMER.CREATE.<stream>..."): those are never answered, like a
// request lost with a node that went down. Publishes to streams
// (including KV puts) do not go through the proxy: use a plain context
// for them.
func LossyAPI(t testing.TB, nc *nats.Conn, drop func(api string) bool) jetstream.JetStream {
	t.Helper()
	const prefix = "natstest.lossy.API"
	sub, err := nc.Subscribe(prefix+".>", func(m *nats.Msg) {
		api := strings.TrimPrefix(m.Subject, prefix+".")
		if drop(api) {
			return
		}
		fwd := &nats.Msg{Subject: "$JS.API." + api, Data: m.Data, Header: m.Header}
		if resp, err := nc.RequestMsg(fwd, 5*time.Second); err == nil {
			_ = m.RespondMsg(&nats.Msg{Data: resp.Data, Header: resp.Header})
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	js, err := jetstream.NewWithAPIPrefix(nc, prefix)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// ConsumerCreate matches the API requests that create a consumer, for
// LossyAPI.
func ConsumerCreate(api string) bool {
	return strings.HasPrefix(api, "CONSUMER.CREATE.") || strings.HasPrefix(api, "CONSUMER.DURABLE.CREATE.")
}
