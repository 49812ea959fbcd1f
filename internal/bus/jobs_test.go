package bus

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

func TestProvisionJobsAndMemory(t *testing.T) {
	js := startServer(t)
	ctx := context.Background()
	n, _ := NewNames("gamma")
	if err := Provision(ctx, js, Settings{Names: n}); err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, "GAMMA_JOBS")
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	if cfg.Retention != jetstream.WorkQueuePolicy || !cfg.AllowMsgSchedules {
		t.Fatalf("jobs stream: retention %v, schedules %v", cfg.Retention, cfg.AllowMsgSchedules)
	}
	c, err := js.Consumer(ctx, "GAMMA_JOBS", JobsConsumer)
	if err != nil {
		t.Fatal(err)
	}
	if f := c.CachedInfo().Config.FilterSubject; f != "gamma.jobs.>" {
		t.Fatalf("jobs consumer filter %q: schedules must not be consumed", f)
	}
	if _, err := js.KeyValue(ctx, "gamma_memory"); err != nil {
		t.Fatal(err)
	}
	if got := n.JobSubject("memory", "t", "u"); got != "gamma.jobs.memory.t.u" {
		t.Fatal(got)
	}
	if got := n.JobScheduleSubject("memory", "t", "u", "h"); got != "gamma.schedules.jobs.memory.t.u.h" {
		t.Fatal(got)
	}
	if got := n.DLQJobSubject("memory"); got != "gamma.dlq.jobs.memory" {
		t.Fatal(got)
	}
	if err := Provision(ctx, js, Settings{Names: n}); err != nil {
		t.Fatalf("second provision: %v", err)
	}
}
