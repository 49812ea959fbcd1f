package app

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/jobs"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/retention"
)

func TestRetentionPolicyAndKeyTTLsFollowTheConfiguration(t *testing.T) {
	cfg := config.Retention{Interval: config.Duration(time.Minute),
		Default: config.TenantRetention{Runs: config.Duration(time.Hour), Usage: config.Duration(2 * time.Hour)},
		Tenants: map[string]config.TenantRetention{"acme": {Runs: config.Duration(time.Minute), Checkpoints: 5}}}
	p := RetentionPolicy(cfg)
	if got := p.For("acme"); got != (retention.Rules{Runs: time.Minute, Usage: 2 * time.Hour, Checkpoints: 5}) {
		t.Errorf("acme's rules %+v", got)
	}
	if got := p.For("globex"); got != (retention.Rules{Runs: time.Hour, Usage: 2 * time.Hour}) {
		t.Errorf("the default rules %+v", got)
	}
	ttls := KeyTTLs(cfg)
	if ttls.Runs("acme") != time.Minute || ttls.Runs("globex") != time.Hour || ttls.Usage("acme") != 2*time.Hour {
		t.Errorf("key TTLs: runs %s/%s, usage %s", ttls.Runs("acme"), ttls.Runs("globex"), ttls.Usage("acme"))
	}
}

// A worker with retention configured schedules the sweeps; one without
// removes the schedule.
func TestWithRetentionSchedulesTheSweeps(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect()
	settings := bus.Settings{}.WithDefaults()
	natstest.Provision(t, nc, settings)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	schedule := func() error {
		_, err := bus.GetMsgFromLeader(ctx, js, settings.Names.JobsStream(), bus.MsgQuery{LastBySubject: settings.Names.JobScheduleSubject(retention.JobKind, "plan")})
		return err
	}
	install := func(cfg config.Retention) map[string]jobs.Handler {
		handlers := map[string]jobs.Handler{}
		if err := WithRetention(cfg, nil)(ctx, js, settings, nil, zaptest.NewLogger(t), handlers); err != nil {
			t.Fatal(err)
		}
		return handlers
	}
	on := config.Retention{Interval: config.Duration(time.Hour), Default: config.TenantRetention{Events: config.Duration(time.Hour)}}
	if h := install(on); h[retention.JobKind] == nil {
		t.Fatal("no retention handler")
	}
	if err := schedule(); err != nil {
		t.Fatalf("the schedule: %v", err)
	}
	install(config.Retention{Interval: config.Duration(time.Hour)})
	if err := schedule(); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("the schedule without retention: %v", err)
	}
}
