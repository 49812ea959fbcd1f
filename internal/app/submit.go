package app

import (
	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/intake"
	"github.com/natsagent/natsagent/internal/policy"
)

// SubmitHooks is the configured policy as the submit service applies it
// to NATS clients: the same checks as the gateway's (policy.Authorize and
// policy.MayUseThread), with a NATS user's roles from policy.nats_users
// and its JWT role tags. Give it to worker.Config.Submit.
func SubmitHooks(cfg config.Config) (intake.Hooks, error) {
	pol, err := policy.New(cfg.Policy)
	if err != nil {
		return intake.Hooks{}, err
	}
	return intake.Hooks{
		Authorize: pol.Authorize,
		Roles: func(tenant string, info intake.ClientInfo) []string {
			return pol.NATSRoles(tenant, info.Principal(), info.Tags)
		},
		MayUseThread: pol.MayUseThread,
	}, nil
}
