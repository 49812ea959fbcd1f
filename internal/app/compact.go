package app

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/compact"
	"github.com/natsagent/natsagent/internal/compact/compactjob"
	"github.com/natsagent/natsagent/internal/events"
	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/jobs"
	"github.com/natsagent/natsagent/internal/kv"
)

// JobsOption adds a job kind to a worker's job runner (Jobs).
type JobsOption func(ctx context.Context, js jetstream.JetStream, settings bus.Settings, stores *kv.Stores, log *zap.Logger, handlers map[string]jobs.Handler) error

// WithCompaction lets the runner take compaction jobs (POST
// /threads/{thread_id}/compact, or a job published to
// P.jobs.compact.<tenant>.<thread>): agents resolve the thread's agent and
// its context_compression settings, workdirs opens the thread's files
// (nil: none).
func WithCompaction(agents *agent.Agents, workdirs func(tenant, thread string) files.Workdir) JobsOption {
	return func(ctx context.Context, js jetstream.JetStream, settings bus.Settings, stores *kv.Stores, log *zap.Logger, handlers map[string]jobs.Handler) error {
		if agents == nil {
			return errors.New("compaction: no agents")
		}
		pub, err := events.NewPublisher(ctx, js, settings.Names, log)
		if err != nil {
			return err
		}
		handlers[compact.JobKind] = compactjob.NewHandler(stores, pub, agents, workdirs, log).Handle
		return nil
	}
}
