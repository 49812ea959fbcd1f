package subagents_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsagent/natsagent/internal/protocol"
)

// An await's timeout_ms too large for a time.Duration waits the longest
// await, instead of overflowing into a negative timeout that answers at
// once.
func TestAwaitHugeTimeoutWaits(t *testing.T) {
	e := newEnv(t)
	heldLead(t, e)
	c := rawClient{t: t, nc: e.srv.Connect()}
	var blocked protocol.SubagentStarted
	c.ok(c.request("agent.subagent.default.start", map[string]any{"parent": map[string]string{"run_id": "lead1", "thread_id": "t1", "tool_call_id": "b"}, "subagent": "researcher", "task": "block"}, 10*time.Second), &blocked)
	for _, ms := range []int64{9300000000000, 9223372036854775807} {
		body, _ := json.Marshal(map[string]any{"run_id": blocked.RunID, "timeout_ms": ms})
		msg, err := c.nc.Request("agent.subagent.default.await", body, time.Second)
		if err == nil {
			t.Fatalf("timeout_ms %d: answered at once: %s", ms, msg.Data)
		}
		if err != nats.ErrTimeout {
			t.Fatalf("timeout_ms %d: %v", ms, err)
		}
	}
}
