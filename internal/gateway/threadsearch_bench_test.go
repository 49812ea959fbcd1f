package gateway

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/testdeploy"
)

// BenchmarkThreadsSearch measures POST /threads/search (limit 10, newest
// updated first, a metadata filter matching a tenth) over HTTP, with
// 100,000 threads in one tenant, and reports its p99.
func BenchmarkThreadsSearch(b *testing.B) {
	const threads = 100_000
	d := testdeploy.Start(b, bus.Settings{})
	ctx := context.Background()
	kvb, err := d.JS.KeyValue(ctx, d.Settings.Names.ThreadsBucket())
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now().UTC()
	var futures []jetstream.PubAckFuture // bounded: wait every 4,000
	for i := range threads {
		th := newThread("big", fmt.Sprintf("t%06d", i), map[string]any{"user": fmt.Sprintf("u%d", i%10)})
		th.UpdatedAt = now.Add(time.Duration(i) * time.Millisecond)
		data, err := protocol.AppendThreadJSON(nil, th)
		if err != nil {
			b.Fatal(err)
		}
		f, err := d.JS.PublishAsync("$KV."+kvb.Bucket()+"."+bus.Key("big", th.ThreadID), data)
		if err != nil {
			b.Fatal(err)
		}
		futures = append(futures, f)
		if len(futures) == 4000 {
			<-d.JS.PublishAsyncComplete()
			futures = futures[:0]
		}
	}
	<-d.JS.PublishAsyncComplete()
	gw, err := New(ctx, d.NC, Config{Settings: d.Settings, Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	hs := httptest.NewServer(gw.Handler())
	defer hs.Close()
	body := `{"limit": 10, "metadata": {"user": "u3"}}`
	search := func() time.Duration {
		start := time.Now()
		resp, err := hs.Client().Post(hs.URL+"/threads/search", "application/json", strings.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("status %d", resp.StatusCode)
		}
		return time.Since(start)
	}
	// The first search waits for the index to load the bucket.
	search()
	var took []time.Duration
	b.ResetTimer()
	for b.Loop() {
		took = append(took, search())
	}
	b.StopTimer()
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)*99/100].Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
}
