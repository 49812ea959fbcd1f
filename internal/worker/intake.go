package worker

import (
	"fmt"

	"github.com/natsagent/natsagent/internal/intake"
	"github.com/natsagent/natsagent/internal/submit"
)

// serveIntake starts the submit service (P.submit.>, one queue group over
// every worker): tenants in their own NATS accounts submit through it.
func (w *Worker) serveIntake() (stop func(), err error) {
	s, err := intake.Start(w.nc, intake.Config{
		Settings: w.cfg.Settings,
		Stores:   w.stores,
		Queue:    &submit.Queue{JS: w.js, Names: w.names, Stores: w.stores, Events: w.pub, Submitter: "intake"},
		Logger:   w.log,
		Limits:   w.cfg.Limits,
		Hooks:    w.cfg.Submit,
		Metrics:  w.cfg.Metrics,
	})
	if err != nil {
		return nil, fmt.Errorf("serve the submit service: %w", err)
	}
	return s.Stop, nil
}
