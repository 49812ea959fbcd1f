package worker

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
)

// BenchmarkBurst measures no-op runs through the public path: publish run
// requests, wait for every run.finished.
func BenchmarkBurst(b *testing.B) {
	for _, conc := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("concurrency=%d", conc), func(b *testing.B) {
			h := newHarnessWith(b, bus.Settings{})
			h.startWorker(model.NewFixed(model.Reply{Text: "ok"}), func(c *Config) {
				c.Concurrency = conc
				c.Logger = zap.NewNop()
			})
			var mu sync.Mutex
			done := make(map[string]bool)
			all := make(chan struct{})
			sub, err := h.nc.Subscribe("agent.events.*.*.*.lifecycle", func(m *nats.Msg) {
				var ev protocol.Event
				if json.Unmarshal(m.Data, &ev) != nil || ev.Type != protocol.EventRunFinished {
					return
				}
				mu.Lock()
				done[ev.RunID] = true
				if len(done) == b.N {
					close(all)
				}
				mu.Unlock()
			})
			if err != nil {
				b.Fatal(err)
			}
			defer sub.Unsubscribe()
			// The goroutines that handled the runs: fewer than the runs
			// when a goroutine done with one is handed the next.
			var hmu sync.Mutex
			handlers := map[string]bool{}
			testHookHandling = func() {
				id := goroutineID()
				hmu.Lock()
				handlers[id] = true
				hmu.Unlock()
			}
			defer func() { testHookHandling = nil }()
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				req := request(fmt.Sprintf("t%d", i), fmt.Sprintf("r%d", i), "hi")
				req.Normalize()
				data, _ := json.Marshal(req)
				m := nats.NewMsg(h.names.RunSubject(req.Tenant, req.ThreadID))
				m.Data = data
				m.Header.Set(nats.MsgIdHdr, protocol.RunMsgID(req.Tenant, req.RunID))
				if _, err := h.js.PublishMsgAsync(m); err != nil {
					b.Fatal(err)
				}
			}
			select {
			case <-all:
			case <-time.After(5 * time.Minute):
				b.Fatal("runs did not finish")
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "runs/s")
			hmu.Lock()
			b.ReportMetric(float64(len(handlers))/float64(b.N), "goroutines/run")
			hmu.Unlock()
		})
	}
}
